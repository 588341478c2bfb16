"""Verify policies: how many draft tokens ℓ_r of each row the target checks this step."""

from __future__ import annotations

import attrs
import torch

from dspark.checks import int_at_least, unit_interval
from dspark.protocols import CostModel
from dspark.verify.acceptance import leading_true

__all__ = ["FixedLength", "Threshold"]


@attrs.frozen
class FixedLength:
    """Verify the first k draft tokens of every row (k = 0 is plain autoregressive decoding)."""

    k: int = attrs.field(validator=int_at_least(0))
    needs_survival = False

    @property
    def max_length(self) -> int:
        """The longest verify length this policy ever picks."""
        return self.k

    def lengths(self, survival: torch.Tensor | None, cost_model: CostModel, limits: torch.Tensor) -> torch.Tensor:
        """min(k, limits[r]) for every row."""
        return limits.clamp_max(self.k)


@attrs.frozen
class Threshold:
    """Verify up to (not including) the first draft position whose survival c_k falls below t."""

    t: float = attrs.field(validator=unit_interval())
    needs_survival = True

    def lengths(self, survival: torch.Tensor | None, cost_model: CostModel, limits: torch.Tensor) -> torch.Tensor:
        """min(limits[r], number of leading c_k ≥ t)."""
        if survival is None:
            raise ValueError("Threshold needs survival estimates; configure a confidence estimator (confidence=...)")
        return torch.minimum(leading_true(survival >= self.t), limits)
