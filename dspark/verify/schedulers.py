"""Throughput-aware verify policies: the paper's hardware-aware prefix scheduler (§3.2.2, Algorithm 1)
and two engine rules to compare it with.

Notation, as in the paper: R rows; c_{r,k} the survival of row r's k-th draft token; a_{r,j} =
c_{r,1}·…·c_{r,j} its prefix survival; ℓ_r the verify length; τ = Σ_r (1 + Σ_{j≤ℓ_r} a_{r,j}) the
expected tokens the step emits (Σ_r w_r·(1 + Σ_{j≤ℓ_r} a_{r,j}) with priority weights w_r, which order the
candidates by w_r·a_{r,j}); T(R, w) = ``step_time(R, w)``, the seconds of one target forward over
R rows of w new tokens each; D the seconds of the drafting pass; the goodput

    Θ = τ / (D + T(R, 1 + max_r ℓ_r))        (tokens per second; τ · SPS with SPS = 1 / T when D = 0).

Two departures from the paper, both deliberate. dspark's verify forward is rectangular — every row
feeds its anchor and its ℓ_r drafts, padded to the longest — so a step costs T(R, 1 + max_r ℓ_r), not the
paper's SPS(B) of B = Σ_r (1 + ℓ_r) tokens: a candidate that does not raise max ℓ is free, one that
does pays for a whole new column. And D is in the denominator (the drafting pass is part of every step).
A consequence worth knowing: the first candidate of a column carries that column's whole cost, so
with many rows Algorithm 1 stops before a new column unless (D + T(R, w + 1)) / (D + T(R, w)) < 1 + a/τ
(τ ≥ R: a rise of less than a/R of a step), even where admitting the whole column would pay. Seeing past
such a step is what the retrospective search does, and why it is not lossless.

Column-wise admission (``column_schedule``, ``HardwareAwareScheduler(admission="columns")``) prices
what the rectangular forward actually buys: once column k is paid for, every row's k-th draft token is
verified at no further cost, so the decision is per column. Open columns k = 1, 2, … (every row up to
its limit) while

    Θ(k) = Σ_r w_r·(1 + Σ_{j ≤ min(k, limits_r)} a_{r,j}) / (D + T(R, 1 + k))

rises, and stop at the first column that does not raise it; ℓ_r = min(K, limits_r). With one row it is
Algorithm 1. It is lossless for the same reason: column k is decided from a_{·,≤k}, and for row r the
last of those, a_{r,k}, reads x_{r,1..k−1}, never x_{r,k} (other rows' tokens are independent of row
r's). It never gives up free candidates below a column's first one, and a column is opened when all
its rows together pay for it, not only its best.

Looking ahead (``column_schedule(look_ahead=True)``): where T falls again at a wider step, the stop above halts
before the dear width and never reaches the cheap one. Column k may instead be opened when some width K ≥ k beats
Θ(k − 1) on the survivals known when k is decided, a_{·,≤k}, continued past k by repeating c_{r,k}
(``projected_survival``). Each decision still reads a_{·,≤k} only, so it is as lossless as the plain stop, and
it opens every column the plain stop opens.

The candidates (r, j), j ≤ limits[r], are visited in descending a_{r,j}; ties go to the smaller j, then
the smaller r. Because a_{r,j+1} ≤ a_{r,j}, each row's candidates come in order of j, so the admitted
set of any prefix of this order is a per-row prefix and ℓ_r is simply the count of row r's admissions.

In a static batch — ``dspark.generate``'s, which runs until its last row is done — tokens are not all
worth the same. With n_(1) ≥ n_(2) ≥ … the rows' remaining budgets in descending order and rows advancing
alike, the batch's remaining forwards cost Σ_k n_(k)·(T(k, 1) − T(k − 1, 1)) (T(0, 1) = 0): the row
ranked k pays the k-th row's marginal cost for each of its steps, so a token of a row that will finish
early saves only a marginal row of a later forward, while one of the row furthest from its end shortens
the batch's tail. ``finishing_weights`` turns this into weights f_r with Σ_r f_r = R that multiply the
priorities (``HardwareAwareScheduler``'s default, ``static_batch=True``): rows that tie share their ranks' costs
alike, so at one row, or while every row has the same budget, f = 1 and Θ is the paper's. Continuous batching,
where a finished row is replaced at once, values every token alike: that is Θ without the weights
(``static_batch=False``).

Why the scheduler must stop early (paper Appendix A): lossless sampling needs every admission to be
non-anticipating — whether x_{r,k} is verified may depend only on what was known before x_{r,k} was
drawn. a_{r,k+1} depends on x_{r,k} (the confidence of position k+1 reads the token before it), and
(r, k+1) always comes after (r, k) in the order above. Stopping at the first admission that does not
raise Θ decides (r, k) from the candidates before it only. Choosing the best prefix of the order
afterwards (``early_stop=False``, the "retrospective" search, and vLLM's budget argmax computed from this
step's survival) lets a_{r,k+1} — hence x_{r,k} itself — decide whether x_{r,k} is verified.

Every function here stays on the survival's device and never copies to the host: ``step_time`` is
called with Python ints only (R and 1..γ+1, all known from shapes), and the stop, the argmax and the
per-row counts are tensor operations.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import attrs
import torch
import torch.nn.functional as F

from dspark.checks import int_at_least, unit_interval
from dspark.protocols import CostModel, RowFallback
from dspark.types import VerifyContext
from dspark.verify.confidence import survival_products
from dspark.verify.fallback import GoodputFallback

__all__ = [
    "ADMISSIONS",
    "Candidates",
    "HardwareAwareScheduler",
    "MinimumGainRule",
    "VllmArgmaxRule",
    "candidate_order",
    "column_schedule",
    "finishing_weights",
    "goodput_curve",
    "look_ahead_goodput",
    "minimum_gain_schedule",
    "prefix_schedule",
    "projected_survival",
]

StepTime = Callable[[int, int], float]
#: How ``HardwareAwareScheduler`` admits draft tokens: single candidates in the paper's order, or whole columns.
ADMISSIONS = ("candidates", "columns")


class Candidates(NamedTuple):
    """The candidates (r, j) in admission order, each a tensor [R·γ]: ``rows`` r, ``positions`` j (1-based),
    ``values`` w_r·a_{r,j} (a_{r,j} without weights), ``eligible`` j ≤ limits[r] (ineligible candidates come
    last and are never admitted)."""

    rows: torch.Tensor
    positions: torch.Tensor
    values: torch.Tensor
    eligible: torch.Tensor


def candidate_order(prefix_survival: torch.Tensor, limits: torch.Tensor, weights: torch.Tensor | None = None) -> Candidates:
    """All (r, j) sorted by w_r·a_{r,j} descending (``weights`` w [R] > 0, all 1 when None), ties to the
    smaller j and then the smaller r; those with j > limits[r] are moved to the end. a must lie in [0, 1]
    and be non-increasing in j (a cumulative product of survivals is), which makes each row's candidates
    appear in increasing j."""
    _check_problem(prefix_survival, limits)
    rows, gamma = prefix_survival.shape
    device = prefix_survival.device
    weighted = prefix_survival if weights is None else prefix_survival * _check_weights(weights, rows).to(device, prefix_survival.dtype)[:, None]
    # Flatten j-major (index (j−1)·R + r): a stable sort then breaks ties by j, then by r.
    values = weighted.T.reshape(-1)
    positions = torch.arange(1, gamma + 1, device=device).repeat_interleave(rows)
    row_ids = torch.arange(rows, device=device).repeat(gamma)
    eligible = positions <= limits.to(device).repeat(gamma)
    # −1 lies below every w·a ≥ 0, so ineligible candidates sort after all eligible ones.
    keys = torch.where(eligible, values, torch.full_like(values, -1.0))
    order = torch.sort(keys, descending=True, stable=True).indices
    return Candidates(row_ids[order], positions[order], values[order], eligible[order])


def goodput_curve(
    prefix_survival: torch.Tensor, limits: torch.Tensor, step_time: StepTime, draft_seconds: float = 0.0, weights: torch.Tensor | None = None
) -> torch.Tensor:
    """Θ_k for k = 0..R·γ: the goodput after admitting the first k candidates of ``candidate_order``
    (Θ_0 = Σ_r w_r / (D + T(R, 1)): every row emits one token anyway); −inf where candidate k is ineligible."""
    candidates = candidate_order(prefix_survival, limits, weights)
    rows, gamma = prefix_survival.shape
    draft_seconds = _check_seconds("draft_seconds", draft_seconds)
    seconds = _step_seconds(step_time, rows, gamma, draft_seconds, _compute_dtype(prefix_survival), prefix_survival.device)
    return _goodput(candidates, _base(weights, rows, seconds), seconds, draft_seconds)


def prefix_schedule(
    prefix_survival: torch.Tensor, limits: torch.Tensor, step_time: StepTime, draft_seconds: float = 0.0, early_stop: bool = True,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Algorithm 1 on dspark's rectangular forward: ℓ LongTensor[R] with 0 ≤ ℓ_r ≤ limits[r].

    Admit candidates in ``candidate_order``; with ``early_stop`` (the paper, and what keeps sampling
    lossless) stop at the first one that does not raise Θ; without it return the best prefix of the
    order (first maximum), the retrospective search of Appendix A that is not lossless. ``weights``:
    per-row priorities w_r > 0 (None: all 1), Θ then counts row r's tokens w_r times.
    """
    if not isinstance(early_stop, bool):
        raise TypeError(f"early_stop must be a bool, got {early_stop!r}")
    candidates = candidate_order(prefix_survival, limits, weights)
    rows, gamma = prefix_survival.shape
    if rows == 0 or gamma == 0:
        return torch.zeros(rows, dtype=torch.long, device=prefix_survival.device)
    draft_seconds = _check_seconds("draft_seconds", draft_seconds)
    seconds = _step_seconds(step_time, rows, gamma, draft_seconds, _compute_dtype(prefix_survival), prefix_survival.device)
    theta = _goodput(candidates, _base(weights, rows, seconds), seconds, draft_seconds)
    if early_stop:
        # Every admission so far raised Θ, so the best so far is the previous Θ.
        count = _leading_true(theta[1:] > theta[:-1])
    else:
        count = theta.argmax()  # the first maximum: ties keep the shorter prefix
    return _lengths(candidates.rows, count, rows)


def column_schedule(
    prefix_survival: torch.Tensor, limits: torch.Tensor, step_time: StepTime, draft_seconds: float = 0.0, weights: torch.Tensor | None = None,
    look_ahead: bool = False,
) -> torch.Tensor:
    """Column-wise admission on dspark's rectangular forward (module docstring): ℓ LongTensor[R],
    ℓ_r = min(K, limits[r]) for the first K columns each of which raised Θ. ``weights``: per-row
    priorities w_r > 0 (None: all 1).

    ``look_ahead``: open column k when some width K ≥ k would beat Θ(k − 1) on the survivals
    ``projected_survival`` makes from a_{·,≤k} (``look_ahead_goodput``), rather than only K = k: a step
    time that falls again further on (a wider forward that runs a faster kernel) is then reached across
    the dear width before it. Still non-anticipating, so still lossless (module docstring), and it opens
    at least the columns the plain stop opens, since K = k is among the widths it weighs."""
    if not isinstance(look_ahead, bool):
        raise TypeError(f"look_ahead must be a bool, got {look_ahead!r}")
    _check_problem(prefix_survival, limits)
    rows, gamma = prefix_survival.shape
    device = prefix_survival.device
    if rows == 0 or gamma == 0:
        return torch.zeros(rows, dtype=torch.long, device=device)
    draft_seconds = _check_seconds("draft_seconds", draft_seconds)
    seconds = _step_seconds(step_time, rows, gamma, draft_seconds, _compute_dtype(prefix_survival), device)
    limits = limits.to(device)
    if look_ahead:
        theta = _look_ahead_goodput(prefix_survival, limits, seconds, draft_seconds, weights)
        # Θ̂[k − 1] decides column k: its best width K ≥ k against Θ̂[k − 1, k − 1], which is Θ(k − 1)
        # (the first k columns of P[k − 1] hold the real survivals).
        widths = torch.arange(gamma + 1, device=device)
        ahead = widths[None, :] >= widths[1:, None]
        best = theta.masked_fill(~ahead, -math.inf).amax(dim=1)
        columns = _leading_true(best > theta[:, :-1].diagonal())
    else:
        theta = _column_goodput(_column_gains(prefix_survival.to(seconds.dtype), limits, weights), weights, rows, seconds, draft_seconds)
        columns = _leading_true(theta[1:] > theta[:-1])
    return torch.minimum(limits.long().clamp_min(0), columns)


def projected_survival(prefix_survival: torch.Tensor) -> torch.Tensor:
    """P [γ, R, γ]: for each decision column k (P[k − 1]), the prefix survivals as known when column k is
    decided, a_{r,j} for j ≤ k, and beyond it a_{r,k}·c_{r,k}^{j−k}, the k-th survival c_{r,k} =
    a_{r,k} / a_{r,k−1} repeated (0 where a_{r,k−1} = 0). Reads a_{·,≤k} only, so a decision taken on P[k − 1]
    is non-anticipating."""
    if not isinstance(prefix_survival, torch.Tensor) or not prefix_survival.is_floating_point() or prefix_survival.dim() != 2:
        raise TypeError(f"prefix_survival must be a FloatTensor[R, γ] of a in [0, 1], got {_describe(prefix_survival)}")
    rows, gamma = prefix_survival.shape
    device = prefix_survival.device
    before = torch.cat([torch.ones_like(prefix_survival[:, :1]), prefix_survival[:, :-1]], dim=1)
    survival = torch.where(before > 0, prefix_survival / before.clamp_min(torch.finfo(prefix_survival.dtype).tiny), torch.zeros_like(before))
    decided = torch.arange(1, gamma + 1, device=device)
    beyond = (decided[None, :] - decided[:, None]).clamp_min(0)  # [k, j]: j − k past the decision column, else 0
    projected = prefix_survival.T[:, :, None] * survival.T[:, :, None] ** beyond[:, None, :].to(prefix_survival.dtype)
    return torch.where((beyond > 0)[:, None, :], projected, prefix_survival[None, :, :].expand(gamma, rows, gamma))


def look_ahead_goodput(
    prefix_survival: torch.Tensor, limits: torch.Tensor, step_time: StepTime, draft_seconds: float = 0.0, weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Θ̂ [γ, γ + 1]: Θ̂[k − 1, K] the goodput of opening K columns on ``projected_survival``'s P[k − 1], what
    is known when column k is decided; −inf for K beyond every row's limit (those columns verify nothing, and
    the forward never grows past max ℓ). ``column_schedule(look_ahead=True)`` opens column k while
    max_{K ≥ k} Θ̂[k − 1, K] > Θ̂[k − 1, k − 1] = Θ(k − 1)."""
    _check_problem(prefix_survival, limits)
    rows, gamma = prefix_survival.shape
    draft_seconds = _check_seconds("draft_seconds", draft_seconds)
    seconds = _step_seconds(step_time, rows, gamma, draft_seconds, _compute_dtype(prefix_survival), prefix_survival.device)
    return _look_ahead_goodput(prefix_survival, limits.to(prefix_survival.device), seconds, draft_seconds, weights)


def _look_ahead_goodput(prefix_survival, limits, seconds, draft_seconds, weights) -> torch.Tensor:
    rows, gamma = prefix_survival.shape
    projected = projected_survival(prefix_survival.to(seconds.dtype))
    theta = _column_goodput(_column_gains(projected, limits, weights), weights, rows, seconds, draft_seconds)
    widest = limits.long().clamp(0, gamma).max()
    past_limits = torch.arange(gamma + 1, device=seconds.device) > widest
    return theta.masked_fill(past_limits, -math.inf)


def _column_gains(prefix_survival: torch.Tensor, limits: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """Σ_r w_r·a_{r,j} over the rows that may verify column j: [γ] for a [R, γ], [..., γ] for a [..., R, γ]."""
    rows, gamma = prefix_survival.shape[-2:]
    device = prefix_survival.device
    if weights is not None:
        prefix_survival = prefix_survival * _check_weights(weights, rows).to(device, prefix_survival.dtype)[:, None]
    reachable = torch.arange(1, gamma + 1, device=device)[None, :] <= limits[:, None]
    return (prefix_survival * reachable).sum(dim=-2)


def _column_goodput(gained: torch.Tensor, weights, rows: int, seconds: torch.Tensor, draft_seconds: float) -> torch.Tensor:
    """Θ(K), K = 0..γ, along the last axis of the column gains."""
    tau = _base(weights, rows, seconds) + F.pad(gained.cumsum(dim=-1), (1, 0))
    return tau / (draft_seconds + seconds)


def finishing_weights(remaining: torch.Tensor, step_time: StepTime) -> torch.Tensor:
    """Static-batch weights f_r ≥ 0 with Σ_r f_r = R from the rows' remaining budgets n_r (LongTensor[R]):

        f_r = R · (T(K_r, 1) − T(K_r − j_r, 1)) / (j_r · T(R, 1)),   K_r = #{n ≥ n_r},  j_r = #{n = n_r},

    T(0, 1) = 0 (module docstring). f = 1 for one row and wherever every row has the same budget; the
    rows furthest from their end weigh most. Float64 on ``remaining``'s device; ``step_time`` is called
    R times with Python ints only (k = 1..R, one token), so nothing is copied to the host, and not at all for
    one row, whose weight needs no step time (every one-row step of the DSpark preset asks for it).
    """
    if not isinstance(remaining, torch.Tensor) or remaining.dim() != 1 or remaining.is_floating_point() or remaining.dtype == torch.bool:
        raise TypeError(f"remaining must be an integer tensor [R] of the rows' remaining budgets, got {_describe(remaining)}")
    if not callable(step_time):
        raise TypeError(f"step_time must be a callable (rows, tokens) -> seconds, got {step_time!r}")
    rows = remaining.shape[0]
    if rows <= 1:
        return torch.ones(rows, dtype=torch.float64, device=remaining.device)
    seconds = [0.0] + [_check_seconds(f"step_time(R={count}, tokens=1)", step_time(count, 1)) for count in range(1, rows + 1)]
    if seconds[rows] <= 0:
        return torch.ones(rows, dtype=torch.float64, device=remaining.device)
    table = torch.tensor(seconds, dtype=torch.float64, device=remaining.device)
    ascending = remaining.sort().values
    below = torch.searchsorted(ascending, remaining, side="left")  # rows with n < n_r
    ahead = rows - below
    tied = torch.searchsorted(ascending, remaining, side="right") - below
    # A cost model that is not monotone in rows could make a share negative: such a row is worth nothing.
    return (rows * (table[ahead] - table[ahead - tied]) / (tied * table[rows])).clamp_min(0.0)


def minimum_gain_schedule(prefix_survival: torch.Tensor, limits: torch.Tensor, step_time: StepTime, min_gain: float = 0.04) -> torch.Tensor:
    """ℓ LongTensor[R]: admit candidates in ``candidate_order`` while a_{r,j} − ΔT / T(R, 1) ≥ ``min_gain``,
    ΔT the step time the admission adds (T(R, 1 + new max ℓ) − T(R, 1 + old max ℓ), 0 when max ℓ does not
    grow); stop at the first candidate that falls short, so the rule is non-anticipating like Algorithm 1."""
    if isinstance(min_gain, bool) or not isinstance(min_gain, (int, float)):
        raise TypeError(f"min_gain must be a finite number, got {min_gain!r}")
    if not math.isfinite(min_gain):
        raise ValueError(f"min_gain must be a finite number, got {min_gain!r}")
    candidates = candidate_order(prefix_survival, limits)
    rows, gamma = prefix_survival.shape
    if rows == 0 or gamma == 0:
        return torch.zeros(rows, dtype=torch.long, device=prefix_survival.device)
    # Gains are measured in one-token steps, so T(R, 1) itself must be positive (no drafting time here).
    seconds = _step_seconds(step_time, rows, gamma, 0.0, _compute_dtype(prefix_survival), prefix_survival.device)
    width = _widths(candidates)
    extra_steps = (seconds[width[1:]] - seconds[width[:-1]]) / seconds[0]
    gain = candidates.values.to(seconds.dtype) - extra_steps
    return _lengths(candidates.rows, _leading_true(candidates.eligible & (gain >= min_gain)), rows)


@attrs.frozen
class HardwareAwareScheduler:
    """DSpark's hardware-aware prefix scheduler (paper Algorithm 1): admission of whole verify columns (by
    default) or of single candidates by w_r·a_{r,j}, stopping at the first admission that does not raise the
    goodput Θ; lossless (see the module docstring).

    ``max_draft_tokens``: γ for ``wrap`` (``POLICY_HOOKS``) and a cap on ℓ; None leaves γ to the drafter.
    ``include_draft_cost``: count the cost model's ``draft_time`` of the rows drafted this step in Θ's
    denominator (beyond the paper, which leaves drafting out); a fixed cost per step makes verification
    relatively cheaper. ``row_fallback``: decides before each proposal which rows are worth drafting for
    at all (``dspark.verify.fallback``; beyond the paper); None drafts every row every step.
    ``admission``: "columns" (the default), whole verify columns (``column_schedule``), which is what dspark's
    rectangular forward pays for; or "candidates", the paper's order of single (r, j) (``prefix_schedule``).
    Both stop early and are lossless, and they agree at one row. ``static_batch`` (the default): weigh each
    row's tokens by ``finishing_weights`` of the rows' remaining budgets (``VerifyContext.remaining``), what they
    are worth in a batch that runs until its last row is done, as ``dspark.generate``'s does (beyond the paper;
    the weights read only budgets known before the step, so admission stays non-anticipating). False values
    every token alike, the paper's Θ, right for continuous batching. One row, rows with equal budgets, and a
    caller that reports no budgets get the same lengths either way. ``look_ahead``: with column admission, open
    a column when some wider step on survivals projected from what is known (``projected_survival``) would beat
    the goodput so far, not only the next one (``column_schedule``); lossless too. For a cost model whose step time falls again
    at a wider step, which the plain stop never crosses to.
    """

    max_draft_tokens: int | None = attrs.field(default=None, validator=int_at_least(0, optional=True))
    include_draft_cost: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    row_fallback: RowFallback | None = attrs.field(factory=GoodputFallback, validator=attrs.validators.optional(attrs.validators.instance_of(RowFallback)))
    admission: str = attrs.field(default="columns", validator=attrs.validators.in_(ADMISSIONS))
    static_batch: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    look_ahead: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    needs_survival = True
    needs_cost_model = True
    reads_context = True

    def __attrs_post_init__(self):
        if self.look_ahead and self.admission != "columns":
            raise ValueError(f"look_ahead=True needs admission='columns' (it projects whole columns), got admission={self.admission!r}")

    def lengths(self, survival: torch.Tensor | None, cost_model: CostModel, limits: torch.Tensor, context: VerifyContext | None = None) -> torch.Tensor:
        """``column_schedule`` (or ``prefix_schedule`` with early stop, by ``admission``) of a = cumprod(c),
        weighted by the context's priorities (times the finishing weights with ``static_batch``), on the
        cost model's step time."""
        prefix, limits = _prefix_and_limits(self, survival, limits)
        draft_seconds = _draft_seconds(cost_model, prefix, context) if self.include_draft_cost else 0.0
        weights = None
        if prefix.shape[0] > 1:  # at one row a weight scales every Θ alike, so it cannot move where Θ stops rising
            weights = _priority(context)
            if self.static_batch and context is not None and context.remaining is not None:
                finishing = finishing_weights(context.remaining, cost_model.step_time).to(prefix.device)
                weights = finishing if weights is None else finishing * weights.to(finishing.device, finishing.dtype)
        if self.admission == "columns":
            return column_schedule(prefix, limits, cost_model.step_time, draft_seconds, weights=weights, look_ahead=self.look_ahead)
        return prefix_schedule(prefix, limits, cost_model.step_time, draft_seconds, early_stop=True, weights=weights)


@attrs.frozen
class VllmArgmaxRule:
    """vLLM's adaptive verification (``vllm/v1/worker/gpu/spec_decode/adaptive_verification.py``,
    ``AdaptiveVerificationManager.get_num_tokens``): the draft budget b* = argmax_b (R + sum of the top-b
    prefix survivals) / (draft time + verify time), over every b with no early stop; then the b* best
    (r, j) are admitted. Here the verify time is this module's rectangular T(R, 1 + max ℓ) and the draft
    time is ``draft_time`` of the rows drafted; the top-b entries are the first b of ``candidate_order``,
    so the rule is exactly ``prefix_schedule(early_stop=False)``.

    vLLM computes b* from the survivals of an earlier step (a snapshot copied to the host a step before;
    only the ranking reads this step's), which keeps the budget from seeing this step's tokens (paper
    §5.2). This policy computes it from this step's survival — the retrospective search of Appendix A,
    which is NOT lossless: tests/test_lossless_sampling.py shows the bias at small batch.
    """

    max_draft_tokens: int | None = attrs.field(default=None, validator=int_at_least(0, optional=True))
    needs_survival = True
    needs_cost_model = True
    reads_context = True

    def lengths(self, survival: torch.Tensor | None, cost_model: CostModel, limits: torch.Tensor, context: VerifyContext | None = None) -> torch.Tensor:
        """The b* best candidates of this step, b* the argmax of expected goodput over all budgets."""
        prefix, limits = _prefix_and_limits(self, survival, limits)
        draft_seconds = _draft_seconds(cost_model, prefix, context)
        return prefix_schedule(prefix, limits, cost_model.step_time, draft_seconds, early_stop=False, weights=_priority(context))


@attrs.frozen
class MinimumGainRule:
    """Admit (r, j) in descending a_{r,j} while its marginal predicted gain a_{r,j} − ΔT / T(R, 1) is at
    least ``min_gain`` (ΔT: the step time the admission adds on the rectangular forward); stop at the first
    that is not (``minimum_gain_schedule``). Non-anticipating, hence lossless.

    Its source, honestly: the issue called this a TensorRT-LLM rule. What TensorRT-LLM has
    (``tensorrt_llm/_torch/speculative/dspark_planner.py``, ``compute_verify_token_budget``; NVIDIA/TensorRT-LLM
    PR #17056) is different: a global argmax over budgets n of τ(n) / T(tokens) on the survival-sorted
    candidates, which keeps the full block unless the argmax beats its goodput by the relative margin
    ``minimum_predicted_gain`` (0.0 for direct constructors, 0.01 in profiled artifacts), computed from a
    lagged host snapshot of the confidences. No per-candidate threshold and no 0.04 was found there; the
    rule here is the per-candidate marginal-gain rule the issue described, with its default 0.04.
    """

    min_gain: float = attrs.field(default=0.04, validator=unit_interval())
    max_draft_tokens: int | None = attrs.field(default=None, validator=int_at_least(0, optional=True))
    needs_survival = True
    needs_cost_model = True

    def lengths(self, survival: torch.Tensor | None, cost_model: CostModel, limits: torch.Tensor) -> torch.Tensor:
        """``minimum_gain_schedule`` of a = cumprod(c) on the cost model's step time."""
        prefix, limits = _prefix_and_limits(self, survival, limits)
        return minimum_gain_schedule(prefix, limits, cost_model.step_time, self.min_gain)


def _draft_seconds(cost_model: CostModel, prefix_survival: torch.Tensor, context: VerifyContext | None) -> float:
    """D: the drafting time of the rows drafted this step (every row of ``prefix_survival`` without a context),
    as deep as the draft (its γ columns), 0 for none."""
    rows, depth = prefix_survival.shape
    drafted = rows if context is None else context.drafted_rows
    return cost_model.draft_time(drafted, depth) if drafted > 0 and depth > 0 else 0.0


def _priority(context: VerifyContext | None) -> torch.Tensor | None:
    return None if context is None else context.priority


def _check_weights(weights: torch.Tensor, rows: int) -> torch.Tensor:
    if not isinstance(weights, torch.Tensor) or not weights.is_floating_point() or tuple(weights.shape) != (rows,):
        raise TypeError(f"weights must be a FloatTensor[{rows}] of row priorities > 0, got {_describe(weights)}")
    return weights


def _base(weights: torch.Tensor | None, rows: int, seconds: torch.Tensor) -> torch.Tensor | int:
    """Σ_r w_r, the tokens the step emits with no draft accepted (weighted), R without weights."""
    return rows if weights is None else weights.to(seconds.device, seconds.dtype).sum()


def _prefix_and_limits(policy, survival: torch.Tensor | None, limits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """a = cumprod(c) and the limits capped at the policy's ``max_draft_tokens``."""
    name = type(policy).__name__
    if survival is None:
        raise ValueError(f"{name} needs survival estimates; configure a confidence estimator (confidence=...)")
    if not isinstance(survival, torch.Tensor) or not survival.is_floating_point():
        raise TypeError(f"survival must be a FloatTensor[R, γ] of c in [0, 1], got {_describe(survival)}")
    if survival.dim() != 2:
        raise ValueError(f"survival must be a FloatTensor[R, γ], got shape {tuple(survival.shape)}")
    if not isinstance(limits, torch.Tensor):
        raise TypeError(f"limits must be an integer tensor [R], got {_describe(limits)}")
    if policy.max_draft_tokens is not None:
        limits = limits.clamp_max(policy.max_draft_tokens)
    return survival_products(survival), limits


def _check_problem(prefix_survival: torch.Tensor, limits: torch.Tensor) -> None:
    if not isinstance(prefix_survival, torch.Tensor) or not prefix_survival.is_floating_point():
        raise TypeError(f"prefix_survival must be a FloatTensor[R, γ] of a in [0, 1], got {_describe(prefix_survival)}")
    if prefix_survival.dim() != 2:
        raise ValueError(f"prefix_survival must be a FloatTensor[R, γ], got shape {tuple(prefix_survival.shape)}")
    if not isinstance(limits, torch.Tensor) or limits.is_floating_point() or limits.is_complex() or limits.dtype == torch.bool:
        raise TypeError(f"limits must be an integer tensor [R], got {_describe(limits)}")
    if tuple(limits.shape) != (prefix_survival.shape[0],):
        raise ValueError(f"limits must have shape ({prefix_survival.shape[0]},) to match prefix_survival, got {tuple(limits.shape)}")


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"{value.dtype} of shape {tuple(value.shape)}"
    return repr(value)


def _check_seconds(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


def _compute_dtype(prefix_survival: torch.Tensor) -> torch.dtype:
    # Half-precision survival would round τ (up to R·(1+γ)) too coarsely to compare goodputs.
    return torch.promote_types(prefix_survival.dtype, torch.float32)


def _step_seconds(step_time: StepTime, rows: int, gamma: int, draft_seconds: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[T(R, 1), …, T(R, 1 + γ)] on ``device``, checked as Python floats before they move there."""
    if not callable(step_time):
        raise TypeError(f"step_time must be a callable (rows, tokens) -> seconds, got {step_time!r}")
    seconds = [_check_seconds(f"step_time(R={rows}, tokens={1 + width})", step_time(rows, 1 + width)) for width in range(gamma + 1)]
    if draft_seconds + seconds[0] <= 0:
        raise ValueError(f"draft_seconds + step_time(R={rows}, 1) must be > 0 seconds, got {draft_seconds!r} + {seconds[0]!r}")
    return torch.tensor(seconds, dtype=dtype, device=device)


def _widths(candidates: Candidates) -> torch.Tensor:
    """max ℓ after each prefix of the order, k = 0..N (ineligible candidates never widen the forward)."""
    reached = torch.where(candidates.eligible, candidates.positions, torch.zeros_like(candidates.positions))
    return torch.cat([reached.new_zeros(1), reached.cummax(dim=0).values])


def _goodput(candidates: Candidates, base, seconds: torch.Tensor, draft_seconds: float) -> torch.Tensor:
    zero = torch.zeros(1, dtype=seconds.dtype, device=seconds.device)
    gained = torch.where(candidates.eligible, candidates.values.to(seconds.dtype), zero)
    tau = base + torch.cat([zero, gained.cumsum(dim=0)])
    theta = tau / (draft_seconds + seconds[_widths(candidates)])
    ineligible = torch.cat([torch.zeros(1, dtype=torch.bool, device=seconds.device), ~candidates.eligible])
    return theta.masked_fill(ineligible, -math.inf)


def _leading_true(flags: torch.Tensor) -> torch.Tensor:
    """How many leading entries of a 1-D bool tensor are True (a 0-d LongTensor, on its device)."""
    return flags.long().cumprod(dim=0).sum()


def _lengths(order_rows: torch.Tensor, count: torch.Tensor, rows: int) -> torch.Tensor:
    """ℓ_r = how many of the first ``count`` candidates belong to row r (they form a prefix of its positions)."""
    admitted = (torch.arange(order_rows.numel(), device=order_rows.device) < count).long()
    return torch.zeros(rows, dtype=torch.long, device=order_rows.device).scatter_add_(0, order_rows, admitted)
