"""Named presets that compose the parts into a Strategy."""

from __future__ import annotations

from dspark.protocols import ConfidenceEstimator, CostModel, Drafter
from dspark.strategy import Strategy
from dspark.cost_models.constant import ConstantCostModel
from dspark.verify.confidence import DraftProbability
from dspark.verify.policies import FixedLength, Threshold

__all__ = ["autoregressive", "fixed_length", "threshold"]


def autoregressive(drafter: Drafter) -> Strategy:
    """Plain decoding through the speculative loop: nothing is drafted or verified (ℓ = 0)."""
    return Strategy(drafter=drafter, policy=FixedLength(0), max_draft_tokens=0)


def fixed_length(drafter: Drafter, max_draft_tokens: int, cost_model: CostModel | None = None) -> Strategy:
    """Classic speculative decoding (MTP-γ style): draft γ = ``max_draft_tokens`` tokens, verify all of them."""
    return Strategy(
        drafter=drafter, policy=FixedLength(max_draft_tokens), max_draft_tokens=max_draft_tokens, cost_model=cost_model or ConstantCostModel()
    )


def threshold(
    drafter: Drafter, max_draft_tokens: int, t: float, confidence: ConfidenceEstimator | None = None
) -> Strategy:
    """Draft ``max_draft_tokens`` tokens, verify up to the first one whose survival is below ``t``."""
    return Strategy(
        drafter=drafter, policy=Threshold(t), max_draft_tokens=max_draft_tokens, confidence=confidence or DraftProbability()
    )
