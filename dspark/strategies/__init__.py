"""Named presets that compose the parts into a Strategy."""

from __future__ import annotations

from dspark.protocols import ConfidenceEstimator, CostModel, Drafter
from dspark.strategy import Strategy
from dspark.cost_models.constant import ConstantCostModel
from dspark.verify.confidence import DraftProbability
from dspark.verify.policies import FixedLength, Threshold
from dspark.verify.schedulers import HardwareAwareScheduler, MinimumGainRule, VllmArgmaxRule

__all__ = ["autoregressive", "dspark", "fixed_length", "minimum_gain_rule", "mtp1", "threshold", "vllm_rule"]


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


def mtp1(drafter: Drafter) -> Strategy:
    """The MTP-1 baseline: draft one token, verify it every step (``FixedLength(1)``)."""
    return fixed_length(drafter, 1)


def _scheduled(policy, drafter: Drafter, max_draft_tokens: int, cost_model: CostModel, confidence: ConfidenceEstimator | None) -> Strategy:
    return Strategy(
        drafter=drafter, policy=policy, max_draft_tokens=max_draft_tokens, cost_model=cost_model,
        confidence=confidence if confidence is not None else DraftProbability(),
    )


def dspark(
    drafter: Drafter, max_draft_tokens: int, cost_model: CostModel, confidence: ConfidenceEstimator | None = None, admission: str = "columns",
    static_batch: bool = True, look_ahead: bool = False,
) -> Strategy:
    """The DSpark preset: the hardware-aware prefix scheduler (paper Algorithm 1, with drafting cost,
    admitting whole verify columns; ``admission="candidates"`` for the paper's single candidates;
    weighing rows' tokens by when the rows finish in ``dspark.generate``'s static batch, ``finishing_weights``,
    and ``static_batch=False`` for the paper's Θ, which values every token alike; ``look_ahead=True``
    opens a column when a wider step further on would pay, ``column_schedule``)
    on ``confidence`` (default: draft probability; a calibrated estimator is what it is meant for)
    and ``cost_model`` (e.g. ``dspark.profiled_cost_model(target, drafter, γ)``). ``wrap(target,
    calibrated_semi_ar_drafter)`` gives this with the drafter's calibrated estimator."""
    policy = HardwareAwareScheduler(max_draft_tokens=max_draft_tokens, admission=admission, static_batch=static_batch, look_ahead=look_ahead)
    return _scheduled(policy, drafter, max_draft_tokens, cost_model, confidence)


def vllm_rule(drafter: Drafter, max_draft_tokens: int, cost_model: CostModel, confidence: ConfidenceEstimator | None = None) -> Strategy:
    """vLLM's adaptive verification: the global argmax budget over all prefixes (no early stop)."""
    return _scheduled(VllmArgmaxRule(max_draft_tokens=max_draft_tokens), drafter, max_draft_tokens, cost_model, confidence)


def minimum_gain_rule(drafter: Drafter, max_draft_tokens: int, cost_model: CostModel, confidence: ConfidenceEstimator | None = None, min_gain: float = 0.04) -> Strategy:
    """Admit draft tokens while each one's predicted gain beats its cost by ``min_gain`` (``MinimumGainRule``)."""
    return _scheduled(MinimumGainRule(min_gain=min_gain, max_draft_tokens=max_draft_tokens), drafter, max_draft_tokens, cost_model, confidence)
