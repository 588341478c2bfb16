"""A cost model that charges the same time for every forward."""

from __future__ import annotations

import attrs

__all__ = ["ConstantCostModel"]


def _non_negative(instance, attribute, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"{attribute.name} must be a number >= 0 (seconds), got {value!r}")


@attrs.frozen
class ConstantCostModel:
    """Every target forward costs ``step_seconds`` and every drafting pass ``draft_seconds``,
    whatever the batch: the right model when verification is free (memory-bound, tiny batches)."""

    step_seconds: float = attrs.field(default=1.0, validator=_non_negative)
    draft_seconds: float = attrs.field(default=0.0, validator=_non_negative)

    def step_time(self, rows: int, tokens: int) -> float:
        """``step_seconds``, independent of rows and tokens."""
        return self.step_seconds

    def draft_time(self, rows: int, depth: int | None = None) -> float:
        """``draft_seconds``, independent of rows and depth."""
        return self.draft_seconds
