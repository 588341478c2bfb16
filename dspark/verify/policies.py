"""Verify policies: how many draft tokens ℓ_r of each row the target checks this step."""

from __future__ import annotations

import attrs
import torch

from dspark.checks import deprecated_alias, int_at_least, unit_interval
from dspark.protocols import CostModel
from dspark.verify.acceptance import leading_true

__all__ = ["FixedLength", "Threshold"]


@attrs.frozen
class FixedLength:
    """Draft and verify γ = ``max_draft_tokens`` tokens of every row (0 is plain autoregressive decoding);
    the MTP-γ baseline. ``wrap`` reads ``max_draft_tokens`` as γ (``POLICY_HOOKS``)."""

    max_draft_tokens: int = attrs.field(validator=int_at_least(0))
    needs_survival = False
    k = deprecated_alias("max_draft_tokens", "k")
    max_length = deprecated_alias("max_draft_tokens", "max_length")

    def lengths(self, survival: torch.Tensor | None, cost_model: CostModel, limits: torch.Tensor) -> torch.Tensor:
        """min(γ, limits[r]) for every row."""
        return limits.clamp_max(self.max_draft_tokens)


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
