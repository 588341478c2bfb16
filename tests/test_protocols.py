"""dspark/protocols.py: the declared optional hooks, their defaults, and their checks at wrap."""

import attrs
import pytest

import dspark
from dspark.drafters import PromptLookupDrafter
from dspark.cost_models import ConstantCostModel
from dspark.protocols import COST_MODEL_HOOKS, DRAFTER_HOOKS, POLICY_HOOKS, check_hooks, hook
from dspark.verify import FixedLength, Threshold


def test_absent_hooks_take_their_declared_defaults():
    """A part without an optional member (or with it set to None) gets the default declared for it."""
    lookup = PromptLookupDrafter()
    assert hook(lookup, "target_layers", DRAFTER_HOOKS) == ()
    assert hook(lookup, "start", DRAFTER_HOOKS) is None
    assert hook(lookup, "max_draft_tokens", DRAFTER_HOOKS) == 4  # present: its own value
    assert hook(FixedLength(3), "needs_survival", POLICY_HOOKS) is False
    assert hook(Threshold(0.5), "max_draft_tokens", POLICY_HOOKS) is None
    assert hook(FixedLength(3), "max_draft_tokens", POLICY_HOOKS) == 3


@attrs.frozen
class _OldPolicy:
    """A policy written against the earlier hook name for γ."""

    max_length: int = 2

    def lengths(self, survival, cost_model, limits):
        return limits.clamp_max(self.max_length)


def test_earlier_hook_names_still_work_with_a_deprecation_warning(llama):
    """A part that declares γ under its earlier name (max_length, default_draft_tokens) is read, checked and warned about."""
    with pytest.warns(DeprecationWarning, match="_OldPolicy.max_length is deprecated: name it max_draft_tokens"):
        assert hook(_OldPolicy(), "max_draft_tokens", POLICY_HOOKS) == 2
    with pytest.warns(DeprecationWarning):
        assert dspark.wrap(llama, PromptLookupDrafter(), policy=_OldPolicy()).strategy.max_draft_tokens == 2
    with pytest.warns(DeprecationWarning), pytest.raises(TypeError, match="policy.max_draft_tokens of _OldPolicy must be an int >= 0"):
        check_hooks(_OldPolicy(max_length=-1), POLICY_HOOKS, "policy")


def test_only_declared_hooks_can_be_read():
    """Asking for an undeclared hook is a ValueError naming it and the declared ones."""
    with pytest.raises(ValueError, match="name must be a declared hook, one of .*'target_layers'.*got 'target_layer'"):
        hook(PromptLookupDrafter(), "target_layer", DRAFTER_HOOKS)


@attrs.define
class _Drafter(PromptLookupDrafter):
    """Prompt lookup with one optional member overridden."""

    target_layers: object = None
    start: object = None


@attrs.frozen
class _Policy:
    needs_survival: object = False
    max_draft_tokens: object = None

    def lengths(self, survival, cost_model, limits):
        return limits


@pytest.mark.parametrize(
    "part, hooks, message",
    [
        (_Drafter(target_layers="1,2"), DRAFTER_HOOKS, "drafter.target_layers of _Drafter must be a tuple of hidden-state indices >= 0"),
        (_Drafter(target_layers=(1, -2)), DRAFTER_HOOKS, "drafter.target_layers"),
        (_Drafter(start="begin"), DRAFTER_HOOKS, "drafter.start of _Drafter must be a method start"),
        (_Policy(needs_survival="yes"), POLICY_HOOKS, "policy.needs_survival of _Policy must be a bool"),
        (_Policy(max_draft_tokens=-1), POLICY_HOOKS, "policy.max_draft_tokens of _Policy must be an int >= 0"),
    ],
)
def test_bad_hooks_are_refused_at_wrap(llama, part, hooks, message):
    """A present hook of the wrong kind is a TypeError at wrap naming the part, the hook and what is allowed."""
    with pytest.raises(TypeError, match=message):
        check_hooks(part, hooks, "drafter" if hooks is DRAFTER_HOOKS else "policy")
    drafter, policy = (part, None) if hooks is DRAFTER_HOOKS else (PromptLookupDrafter(), part)
    with pytest.raises(TypeError, match=message):
        dspark.wrap(llama, drafter, policy=policy)


class _ListKeyed(ConstantCostModel):
    """A cost model that names its table with an unhashable list."""

    table_key = ["base"]


def test_a_cost_model_table_key_must_be_hashable(llama):
    """table_key is None by default and refused at wrap, naming the hook, when it cannot key a dict."""
    assert hook(ConstantCostModel(step_seconds=0.1), "table_key", COST_MODEL_HOOKS) is None
    with pytest.raises(TypeError, match="cost_model.table_key of _ListKeyed must be a hashable value"):
        check_hooks(_ListKeyed(step_seconds=0.1), COST_MODEL_HOOKS, "cost_model")
    with pytest.raises(TypeError, match="cost_model.table_key of _ListKeyed must be a hashable value"):
        dspark.wrap(llama, PromptLookupDrafter(), cost_model=_ListKeyed(step_seconds=0.1))


def test_a_policy_that_needs_survival_is_refused_at_wrap_without_an_estimator(llama):
    """needs_survival=True without confidence= fails at wrap, not inside generate."""
    with pytest.raises(ValueError, match="needs survival estimates"):
        dspark.wrap(llama, PromptLookupDrafter(), policy=Threshold(0.5))


class _OneArgumentCostModel:
    """A cost model written before drafting depth was priced: draft_time(rows)."""

    def step_time(self, rows, tokens):
        return 0.01

    def draft_time(self, rows):
        return 0.001


def test_a_cost_model_whose_draft_time_takes_no_depth_is_refused_at_wrap(llama):
    """draft_time(rows) without depth is a TypeError at wrap naming what it must take, not a failure inside generate."""
    with pytest.raises(TypeError, match=r"cost_model.draft_time of _OneArgumentCostModel must take \(rows, depth\)"):
        dspark.wrap(llama, PromptLookupDrafter(), cost_model=_OneArgumentCostModel())


def test_declared_hooks_document_themselves():
    """Every declared hook names what it is for and what is allowed."""
    for hooks in (DRAFTER_HOOKS, POLICY_HOOKS):
        assert all(declared.doc and declared.allowed for declared in hooks.values())


def test_drafter_modules_reach_a_cascades_parts(llama):
    """drafter_modules: a module drafter is itself, a cascade runs its parts' modules, prompt lookup none."""
    from dspark.drafters import CascadeDrafter, DraftModelDrafter
    from dspark.protocols import drafter_modules
    from dspark.verify import DraftProbability
    from tests.conftest import tiny_semi_ar_drafter

    semi_ar = tiny_semi_ar_drafter(llama)
    cascade = CascadeDrafter([(PromptLookupDrafter(), DraftProbability()), (semi_ar, DraftProbability())])
    assert drafter_modules(semi_ar) == [semi_ar]
    assert drafter_modules(cascade) == [semi_ar]
    assert drafter_modules(DraftModelDrafter(llama)) == [llama]
    assert drafter_modules(PromptLookupDrafter()) == []
