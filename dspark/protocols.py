"""The four extension points of a decoding step. Each is one or two methods, plus optional hooks
declared here with their defaults (``DRAFTER_HOOKS``, ``POLICY_HOOKS``) and checked at ``wrap``."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable

import attrs
import torch
from typing_extensions import Protocol, runtime_checkable

from dspark.types import Draft, DraftContext, GenerationStart, StepOutcome

__all__ = [
    "ConfidenceEstimator",
    "CostModel",
    "DRAFTER_HOOKS",
    "Drafter",
    "COST_MODEL_HOOKS",
    "ESTIMATOR_HOOKS",
    "FALLBACK_RUN_HOOKS",
    "Hook",
    "POLICY_HOOKS",
    "FallbackRun",
    "RowFallback",
    "VerifyPolicy",
    "check_draft_time",
    "check_hooks",
    "drafter_modules",
    "hook",
    "run_drafts",
]


@runtime_checkable
class Drafter(Protocol):
    """Proposes draft tokens, then learns from what the target kept.

    A generation's lifecycle, as the loop drives it: the optional ``start`` hook receives a
    ``GenerationStart`` (rows, device, γ, the longest context) before anything else; then every step
    calls ``propose`` for the rows still running (``DraftContext.rows``) and ``observe`` with the
    target's decision, whose ``StepOutcome.finished`` names the rows that leave the batch before the
    next ``propose``. A generation that drafts nothing (γ = 0, or a fallback run whose ``drafts`` is False)
    calls none of them. ``vocab_size`` is the size of the vocabulary the drafter's token ids live in
    (None when it only copies ids from the context, as n-gram lookup does); the loop refuses a
    mismatch with the target. The other optional hooks are listed in ``DRAFTER_HOOKS``.
    """

    vocab_size: int | None

    def propose(self, context: DraftContext, max_draft_tokens: int) -> Draft:
        """Return a draft of at most ``max_draft_tokens`` tokens (0 on a step where no row is drafted)
        for every row of ``context``; only the rows in ``context.draft_rows`` (all when None) are verified.
        The loop passes ``max_draft_tokens`` positionally, so an implementation may name it as it likes."""
        ...

    def observe(self, outcome: StepOutcome) -> None:
        """Learn the target's decision for each row: accepted counts, the new anchors, finished rows."""
        ...


@runtime_checkable
class ConfidenceEstimator(Protocol):
    """Estimates survival c_k = P(x_k accepted | x_1..x_{k-1} accepted) for every draft position.

    Estimators that adapt (to the sampling band, or online to what the target accepted) declare the
    optional hooks in ``ESTIMATOR_HOOKS``: ``start`` before a generation, ``observe`` with each step's
    outcome after its survival was used (so what they learn reaches only later steps), ``report``
    for what to record in the step's ``StepRecord.estimator``.
    """

    def survival(self, draft: Draft) -> torch.Tensor:
        """FloatTensor[R, γ] of c_k in (0, 1); c_k may use only what was known before x_k was drawn."""
        ...


@runtime_checkable
class CostModel(Protocol):
    """Knows what a target forward and a drafting pass cost on this machine."""

    def step_time(self, rows: int, tokens: int) -> float:
        """Seconds for one target forward over ``rows`` rows of ``tokens`` new tokens each."""
        ...

    def draft_time(self, rows: int, depth: int | None = None) -> float:
        """Seconds the drafter spends proposing ``depth`` tokens for each of ``rows`` rows (None: its whole
        block, γ). dspark always passes the depth of the pass it prices: a drafter's head and its choice run
        once per drafted position, so a pass one token deep costs less than a γ-deep one."""
        ...


@runtime_checkable
class VerifyPolicy(Protocol):
    """Chooses how many draft tokens ℓ_r of each row the target checks. Optional hooks: ``POLICY_HOOKS``;
    a policy that declares ``reads_context`` is called with a fourth argument, the step's ``VerifyContext``."""

    def lengths(self, survival: torch.Tensor | None, cost_model: CostModel, limits: torch.Tensor) -> torch.Tensor:
        """LongTensor[R] with 0 ≤ ℓ_r ≤ limits[r]; ``survival`` is None when no estimator is configured."""
        ...


@runtime_checkable
class FallbackRun(Protocol):
    """One generation's row fallback (what ``RowFallback.start`` returns): before each proposal it names
    the rows worth drafting for, after each step it learns what drafting them gained. Both methods work
    on host (CPU) tensors, so the decision costs the loop no device synchronisation. Optional members:
    ``FALLBACK_RUN_HOOKS`` (``drafts``: False runs the whole generation as plain decoding)."""

    def draft_rows(self, rows: torch.Tensor) -> torch.Tensor | None:
        """For each row of this step (``rows``: the batch indices, LongTensor[R]): BoolTensor[R], draft for
        row i or not; or LongTensor[R], how many tokens to draft for it (0: none; more than γ counts as γ),
        which also caps its verify length; None: γ tokens for every row."""
        ...

    def observe(self, record) -> None:
        """The step's ``StepRecord`` (host tensors): which rows were drafted for (``drafted_for``), their
        ℓ_r, accepted counts and survival, and the step's time outside the target forward (``draft_seconds``)."""
        ...


@runtime_checkable
class RowFallback(Protocol):
    """A verify policy's per-row fallback (``POLICY_HOOKS["row_fallback"]``): rows whose drafting does
    not pay skip ``propose`` — their ℓ_r is 0 before any token is drawn — and are re-probed later."""

    def start(self, generation: GenerationStart, cost_model: CostModel) -> FallbackRun:
        """A fresh ``FallbackRun`` for a generation (its state lives there, not on the policy)."""
        ...


def _is_layer_indices(value) -> bool:
    return isinstance(value, (tuple, list)) and all(isinstance(index, int) and not isinstance(index, bool) and index >= 0 for index in value)


def _is_positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _is_hashable(value) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


@attrs.frozen
class Hook:
    """An optional member of a part: the value dspark assumes when it is absent, what a present one
    must satisfy (described in ``allowed`` for the error message), and what it is for."""

    default: object
    valid: Callable[[object], bool]
    allowed: str
    doc: str
    # Earlier names of the same member, still read (with a DeprecationWarning) when the current one is absent.
    deprecated_names: tuple[str, ...] = ()


#: Optional drafter members. Absent ones take their default.
DRAFTER_HOOKS: dict[str, Hook] = {
    "start": Hook(None, callable, "a method start(GenerationStart)", "called once per generation before the first propose"),
    "target_layers": Hook((), _is_layer_indices, "a tuple of hidden-state indices >= 0", "the target hidden states the loop hands over in DraftContext.features"),
    "max_draft_tokens": Hook(
        None, _is_positive_int, "an int >= 1", "γ when neither the policy nor the caller of wrap fixes one", deprecated_names=("default_draft_tokens",)
    ),
    "default_policy": Hook(None, lambda value: isinstance(value, VerifyPolicy), "a VerifyPolicy", "the policy wrap uses when given none"),
    "default_confidence": Hook(None, lambda value: isinstance(value, ConfidenceEstimator), "a ConfidenceEstimator", "the estimator wrap uses with default_policy"),
}

#: Optional verify-policy members. Absent ones take their default.
POLICY_HOOKS: dict[str, Hook] = {
    "needs_survival": Hook(False, lambda value: isinstance(value, bool), "a bool", "the policy reads survival, so a confidence estimator is required"),
    "needs_cost_model": Hook(
        False, lambda value: isinstance(value, bool), "a bool", "the policy reads the cost model, so wrap profiles one on this machine when given none"
    ),
    "max_draft_tokens": Hook(
        None, lambda value: isinstance(value, int) and not isinstance(value, bool) and value >= 0, "an int >= 0",
        "the longest verify length it picks; wrap uses it as γ", deprecated_names=("max_length",),
    ),
    "reads_context": Hook(
        False, lambda value: isinstance(value, bool), "a bool", "lengths takes a fourth argument, the step's VerifyContext (rows, priority, drafted rows)"
    ),
    "row_fallback": Hook(
        None, lambda value: isinstance(value, RowFallback), "a dspark.RowFallback", "decides before each proposal which rows to draft for"
    ),
}


#: Optional confidence-estimator members. Absent ones take their default.
ESTIMATOR_HOOKS: dict[str, Hook] = {
    "start": Hook(None, callable, "a method start(GenerationStart)", "called once per generation before the first survival"),
    "observe": Hook(None, callable, "a method observe(StepOutcome)", "the outcome of every step whose survival it gave, for online estimators"),
    "report": Hook(None, callable, "a method report() -> dict or None", "what to record in this step's StepRecord.estimator"),
}


#: Optional members of a ``FallbackRun``. Absent ones take their default.
FALLBACK_RUN_HOOKS: dict[str, Hook] = {
    "drafts": Hook(
        True, lambda value: isinstance(value, bool), "a bool",
        "read once, before the prefill: False runs the generation as plain decoding (no target features, no propose, no draft_rows)",
    ),
}


#: Optional cost-model members. Absent ones take their default.
COST_MODEL_HOOKS: dict[str, Hook] = {
    "start": Hook(
        None, callable, "a method start(GenerationStart) -> bool",
        "called once per generation before anything reads the model; True when its answers may have changed (e.g. another profiled table)",
    ),
    "observe_step": Hook(None, callable, "a method observe_step(rows, tokens, seconds)", "each step's measured target forward, to correct the model online"),
    "observe_draft": Hook(
        None, callable, "a method observe_draft(rows, seconds, depth)",
        "each step's measured drafting time for rows rows drafted depth tokens deep, to correct the model online",
    ),
    "table_key": Hook(
        None, _is_hashable, "a hashable value (an attribute or a property)",
        "names the table the model answers from now, read after start (equal keys must mean equal answers); a wrapper that "
        "corrects the model online keeps its corrections per key, so a generation back on an earlier table resumes them",
    ),
}


def drafter_modules(drafter, depth: int = 3) -> list[torch.nn.Module]:
    """The modules a drafter runs: the drafter itself when it is one, else the modules among its
    attributes and inside tuples, lists and dicts there, ``depth`` levels down (``DraftModelDrafter``'s
    small model; a ``CascadeDrafter``'s parts, kept as (drafter, estimator) pairs in a tuple)."""
    if isinstance(drafter, torch.nn.Module):
        return [drafter]
    if depth == 0:
        return []
    if isinstance(drafter, (tuple, list)):
        children = list(drafter)
    elif isinstance(drafter, dict):
        children = list(drafter.values())
    else:
        children = list(vars(drafter).values()) if hasattr(drafter, "__dict__") else []
    return [module for child in children for module in drafter_modules(child, depth - 1)]


def hook(part, name: str, hooks: dict[str, Hook]):
    """The value of the optional member ``name`` of ``part``, or its declared default when absent
    (or None)."""
    if name not in hooks:
        raise ValueError(f"name must be a declared hook, one of {sorted(hooks)}, got {name!r}")
    value = _member(part, name, hooks[name])
    return hooks[name].default if value is None else value


def _member(part, name: str, declared: Hook):
    """``part.name``, else the first of its deprecated names that ``part`` has (with a warning), else None."""
    value = getattr(part, name, None)
    if value is not None:
        return value
    for old_name in declared.deprecated_names:
        value = getattr(part, old_name, None)
        if value is not None:
            warnings.warn(f"{type(part).__name__}.{old_name} is deprecated: name it {name}", DeprecationWarning, stacklevel=3)
            return value
    return None


def check_draft_time(cost_model, role: str = "cost_model") -> None:
    """Refuse a cost model whose ``draft_time`` cannot be called as ``draft_time(rows, depth)`` (the one-argument
    form of the protocol before drafting depth was priced)."""
    try:
        inspect.signature(cost_model.draft_time).bind(1, 1)
    except TypeError as error:
        raise TypeError(f"{role}.draft_time of {type(cost_model).__name__} must take (rows, depth): {error}") from error
    except ValueError:  # a builtin without a readable signature: trusted
        return


def check_hooks(part, hooks: dict[str, Hook], role: str) -> None:
    """Refuse a part whose optional members are present but not what their hook allows."""
    for name, declared in hooks.items():
        value = _member(part, name, declared)
        if value is not None and not declared.valid(value):
            raise TypeError(f"{role}.{name} of {type(part).__name__} must be {declared.allowed} ({declared.doc}), got {value!r}")


def run_drafts(run) -> bool:
    """Whether a ``FallbackRun``'s generation drafts at all: its optional ``drafts`` (``FALLBACK_RUN_HOOKS``), refused
    with a ``TypeError`` naming it when it is not a bool."""
    check_hooks(run, FALLBACK_RUN_HOOKS, "row fallback run")
    return hook(run, "drafts", FALLBACK_RUN_HOOKS)
