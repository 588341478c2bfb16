"""A Strategy composes the four parts of a decoding step."""

from __future__ import annotations

import attrs

from dspark.checks import check_int, int_at_least
from dspark.cost_models.constant import ConstantCostModel
from dspark.protocols import COST_MODEL_HOOKS, DRAFTER_HOOKS, ESTIMATOR_HOOKS, POLICY_HOOKS, ConfidenceEstimator, CostModel, Drafter, VerifyPolicy, check_draft_time, check_hooks, hook

__all__ = ["Strategy", "check_max_draft_tokens"]


def _instance_of(protocol, optional: bool = False):
    def check(instance, attribute, value):
        if value is None and optional:
            return
        if not isinstance(value, protocol):
            raise TypeError(f"{attribute.name} must implement dspark.{protocol.__name__}, got {type(value).__name__}")

    return check


def check_max_draft_tokens(value) -> int:
    """Return ``value`` if it is a valid block width γ (an int >= 0), else raise naming max_draft_tokens."""
    return check_int("max_draft_tokens", value, 0)


@attrs.frozen
class Strategy:
    """A drafter, an optional confidence estimator, a cost model, a verify policy and the block width γ."""

    drafter: Drafter = attrs.field(validator=_instance_of(Drafter))
    policy: VerifyPolicy = attrs.field(validator=_instance_of(VerifyPolicy))
    max_draft_tokens: int = attrs.field(validator=int_at_least(0))
    confidence: ConfidenceEstimator | None = attrs.field(default=None, validator=_instance_of(ConfidenceEstimator, optional=True))
    cost_model: CostModel = attrs.field(factory=ConstantCostModel, validator=_instance_of(CostModel))

    @property
    def target_layers(self) -> tuple[int, ...]:
        """Indices into the target's ``hidden_states`` the drafter reads (empty: no features needed, as when
        ``max_draft_tokens`` is 0: the drafter is never asked to propose, so plain decoding pays for no hidden states)."""
        if self.max_draft_tokens == 0:
            return ()
        return tuple(hook(self.drafter, "target_layers", DRAFTER_HOOKS))

    def __attrs_post_init__(self):
        check_hooks(self.drafter, DRAFTER_HOOKS, "drafter")
        check_hooks(self.policy, POLICY_HOOKS, "policy")
        if self.confidence is not None:
            check_hooks(self.confidence, ESTIMATOR_HOOKS, "confidence")
        check_hooks(self.cost_model, COST_MODEL_HOOKS, "cost_model")
        check_draft_time(self.cost_model)
        if hook(self.policy, "needs_survival", POLICY_HOOKS) and self.confidence is None:
            raise ValueError(f"policy {self.policy!r} needs survival estimates: pass confidence=... (e.g. DraftProbability())")
