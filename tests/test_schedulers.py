"""Throughput-aware verify policies in dspark/verify/schedulers.py: Algorithm 1 on hand-made tables
(the paper's Appendix A numbers included), its order, limits and early stop, properties over random
problems, the vLLM and minimum-gain rules, and greedy equality with HF generate through the loop."""

import itertools
import math

import attrs
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import dspark
from dspark.cost_models import ConstantCostModel
from dspark.drafters import DraftModelDrafter
from dspark.protocols import POLICY_HOOKS, check_hooks, hook
from dspark.verify import DraftProbability, FixedLength
from dspark.verify.schedulers import (
    HardwareAwareScheduler,
    MinimumGainRule,
    VllmArgmaxRule,
    candidate_order,
    column_schedule,
    finishing_weights,
    goodput_curve,
    look_ahead_goodput,
    minimum_gain_schedule,
    prefix_schedule,
    projected_survival,
)
from tests.conftest import build_model, left_padded_batch
from tests.strategies import gentle_step_curves, schedule_problems, step_curves


def table(*seconds: float):
    """step_time(rows, tokens) = seconds[tokens − 1], whatever the rows."""
    return lambda rows, tokens: seconds[tokens - 1]


@attrs.frozen
class TableCostModel:
    """A cost model from a table of step seconds by tokens per row, with a fixed drafting time."""

    seconds: tuple[float, ...]
    draft_seconds: float = 0.0

    def step_time(self, rows: int, tokens: int) -> float:
        return self.seconds[tokens - 1]

    def draft_time(self, rows: int, depth: int | None = None) -> float:
        return self.draft_seconds


@attrs.frozen
class LinearCostModel:
    """T(R, w) = base + per_token · R · w: every token of the rectangular forward costs the same."""

    base: float = 1.0
    per_token: float = 0.01
    draft_seconds: float = 0.0

    def step_time(self, rows: int, tokens: int) -> float:
        return self.base + self.per_token * rows * tokens

    def draft_time(self, rows: int, depth: int | None = None) -> float:
        return self.draft_seconds


def full(rows: int, gamma: int) -> torch.Tensor:
    return torch.full((rows,), gamma, dtype=torch.long)


# Two rows, γ = 3: a = [[0.9, 0.72, 0.36], [0.6, 0.3, 0.27]], so the admission order is
# (0,1) 0.9, (0,2) 0.72, (1,1) 0.6, (0,3) 0.36, (1,2) 0.3, (1,3) 0.27.
TWO_ROWS = torch.tensor([[0.9, 0.8, 0.5], [0.6, 0.5, 0.9]], dtype=torch.float64).cumprod(dim=1)


# ----------------------------------------------------------------------------- Algorithm 1 by hand


@pytest.mark.parametrize("c2, goodputs, retrospective", [(0.9, [1.0, 0.9, 1.134], 2), (0.0, [1.0, 0.9, 0.81], 0)])
def test_appendix_a_counterexample(c2, goodputs, retrospective):
    """Appendix A (R = 1, a_1 = 0.8, SPS 1.0/0.5/0.45): Θ = 1.0, 0.9, then 1.134 or 0.81 by c_2; early stop
    returns ℓ = 0 either way, the retrospective search returns 2 or 0, so x_1's admission depends on x_1."""
    prefix = torch.tensor([[0.8, 0.8 * c2]], dtype=torch.float64)
    sps = table(1 / 1.0, 1 / 0.5, 1 / 0.45)
    assert goodput_curve(prefix, full(1, 2), sps).tolist() == pytest.approx(goodputs, rel=1e-12)
    assert prefix_schedule(prefix, full(1, 2), sps).tolist() == [0]
    assert prefix_schedule(prefix, full(1, 2), sps, early_stop=False).tolist() == [retrospective]


def test_algorithm_1_on_two_rows():
    """Θ rises through (0,1), (0,2), (1,1) and falls at (0,3), which needs a fourth column: ℓ = [2, 1]."""
    sps = table(1.0, 1.1, 1.2, 2.0)
    expected = [2 / 1.0, 2.9 / 1.1, 3.62 / 1.2, 4.22 / 1.2, 4.58 / 2.0, 4.88 / 2.0, 5.15 / 2.0]
    assert goodput_curve(TWO_ROWS, full(2, 3), sps).tolist() == pytest.approx(expected, rel=1e-12)
    assert prefix_schedule(TWO_ROWS, full(2, 3), sps).tolist() == [2, 1]


def test_early_stop_and_retrospective_differ_past_a_cliff():
    """The second column costs 50% more and the rest little: early stop verifies nothing, the best prefix everything."""
    sps = table(1.0, 1.5, 1.5, 1.6)
    assert prefix_schedule(TWO_ROWS, full(2, 3), sps).tolist() == [0, 0]
    assert prefix_schedule(TWO_ROWS, full(2, 3), sps, early_stop=False).tolist() == [3, 3]


def test_drafting_time_in_the_denominator_changes_the_decision():
    """With one second of drafting the same cliff no longer stops Algorithm 1 (Θ rises at every admission)."""
    cost = TableCostModel((1.0, 1.5, 1.5, 1.6), draft_seconds=1.0)
    survival = torch.tensor([[0.9, 0.8, 0.5], [0.6, 0.5, 0.9]])
    assert HardwareAwareScheduler(admission="candidates").lengths(survival, cost, full(2, 3)).tolist() == [3, 3]
    assert HardwareAwareScheduler(admission="candidates", include_draft_cost=False).lengths(survival, cost, full(2, 3)).tolist() == [0, 0]


def test_ties_go_to_the_smaller_position_then_the_smaller_row():
    """Equal a: (0,1), (1,1), (0,2), then (1,2); a stop at (0,2) leaves both rows at ℓ = 1, not [2, 0] or [1, 0]."""
    prefix = torch.tensor([[0.5, 0.5], [0.5, 0.25]])
    order = candidate_order(prefix, full(2, 2))
    assert list(zip(order.rows.tolist(), order.positions.tolist())) == [(0, 1), (1, 1), (0, 2), (1, 2)]
    assert prefix_schedule(prefix, full(2, 2), table(1.0, 1.0, 5.0)).tolist() == [1, 1]


def test_limits_are_respected():
    """A row with limit 0 (or below) verifies nothing however sure; others stop at their limit; limits past γ are fine."""
    prefix = torch.ones((4, 3))
    lengths = prefix_schedule(prefix, torch.tensor([0, -1, 2, 7]), table(1.0, 1.0, 1.0, 1.0))
    assert lengths.tolist() == [0, 0, 2, 3]


def test_flat_curve_admits_every_positive_survival():
    """Verification is free (ConstantCostModel): every eligible a > 0 is admitted, the zeros are not; by columns,
    every column with some a > 0 opens and every row rides it up to its limit (zeros cost nothing there either)."""
    survival = torch.tensor([[0.9, 0.5, 0.0], [0.2, 0.0, 0.7], [0.0, 0.5, 0.5], [1.0, 1.0, 1.0]])
    limits = torch.tensor([3, 3, 3, 2])
    assert HardwareAwareScheduler(admission="candidates").lengths(survival, ConstantCostModel(), limits).tolist() == [2, 1, 0, 2]
    assert HardwareAwareScheduler().lengths(survival, ConstantCostModel(), limits).tolist() == [2, 2, 2, 2]
    assert prefix_schedule(survival.cumprod(dim=1), limits, ConstantCostModel().step_time, early_stop=False).tolist() == [2, 1, 0, 2]


def test_steep_curve_admits_nothing():
    """A second column that costs a million steps is never worth it, early stop or not."""
    prefix = torch.ones((3, 4))
    for early_stop in (True, False):
        assert prefix_schedule(prefix, full(3, 4), lambda rows, tokens: 1.0 if tokens == 1 else 1e6, early_stop=early_stop).tolist() == [0, 0, 0]


def test_zero_rows_and_zero_width():
    """An empty batch or an empty draft gives ℓ = 0 without asking the cost model."""

    def refuse(rows, tokens):
        raise AssertionError("step_time must not be called")

    assert prefix_schedule(torch.zeros((0, 3)), torch.zeros(0, dtype=torch.long), refuse).shape == (0,)
    assert prefix_schedule(torch.zeros((2, 0)), full(2, 0), refuse).tolist() == [0, 0]
    assert minimum_gain_schedule(torch.zeros((2, 0)), full(2, 0), refuse).tolist() == [0, 0]


# ----------------------------------------------------------------------------- column-wise admission by hand


def test_columns_on_two_rows():
    """Θ by column on TWO_ROWS: 2/1.0, 3.5/1.1, 4.52/1.2, then 5.15/2.0 falls: K = 2, and row 1's second
    token (a = 0.3, below (0,3) in the candidate order where Algorithm 1 stopped) rides along: ℓ = [2, 2]."""
    sps = table(1.0, 1.1, 1.2, 2.0)
    assert column_schedule(TWO_ROWS, full(2, 3), sps).tolist() == [2, 2]
    assert prefix_schedule(TWO_ROWS, full(2, 3), sps).tolist() == [2, 1]


def test_a_column_that_pays_as_a_whole_is_opened():
    """Four rows with a_1 = 0.3 and a column costing 20% more: no single candidate pays ((4 + 0.3)/1.2 < 4), the
    column does ((4 + 1.2)/1.2 > 4)."""
    prefix = torch.full((4, 1), 0.3, dtype=torch.float64)
    sps = table(1.0, 1.2)
    assert prefix_schedule(prefix, full(4, 1), sps).tolist() == [0, 0, 0, 0]
    assert column_schedule(prefix, full(4, 1), sps).tolist() == [1, 1, 1, 1]
    assert HardwareAwareScheduler(admission="columns").lengths(prefix, TableCostModel((1.0, 1.2)), full(4, 1)).tolist() == [1, 1, 1, 1]


def test_columns_stop_at_the_first_column_that_does_not_pay():
    """Appendix A's curve with a_2 high enough that two columns would pay: the first column alone lowers Θ, so
    column-wise admission stops there (ℓ = 0), as Algorithm 1 does at one row."""
    prefix = torch.tensor([[0.8, 0.72]], dtype=torch.float64)
    sps = table(1 / 1.0, 1 / 0.5, 1 / 0.45)
    assert column_schedule(prefix, full(1, 2), sps).tolist() == [0]


def test_column_limits_and_weights():
    """Rows stop at their limits inside an opened column; a heavy row can open a column the others ride."""
    prefix = torch.ones((2, 2), dtype=torch.float64)
    assert column_schedule(prefix, torch.tensor([2, 1]), table(1.0, 1.0, 1.0)).tolist() == [2, 1]
    # The column pays when the (weighted) mean a_1 exceeds 0.3: 0.25 unweighted, (0.1 + 9·0.4)/10 = 0.37 weighted.
    single = torch.tensor([[0.1], [0.4]], dtype=torch.float64)
    curve = table(1.0, 1.3)
    assert column_schedule(single, full(2, 1), curve).tolist() == [0, 0]
    assert column_schedule(single, full(2, 1), curve, weights=torch.tensor([1.0, 9.0])).tolist() == [1, 1]


# ----------------------------------------------------------------------------- look-ahead by hand


def test_projected_survival_repeats_the_last_known_survival():
    """P[k − 1] keeps a_{·,≤k} and continues with c_k = a_k / a_{k−1}; a row whose a_{k−1} is 0 projects 0."""
    prefix = torch.tensor([[0.8, 0.4, 0.1], [0.5, 0.0, 0.0]], dtype=torch.float64)
    projected = projected_survival(prefix)
    assert torch.allclose(projected[0], torch.tensor([[0.8, 0.64, 0.512], [0.5, 0.25, 0.125]], dtype=torch.float64))
    assert torch.allclose(projected[1], torch.tensor([[0.8, 0.4, 0.2], [0.5, 0.0, 0.0]], dtype=torch.float64))
    assert torch.equal(projected[2], prefix)


def test_look_ahead_crosses_a_dear_width_to_a_cheap_one():
    """One row, c = 0.15 at every position, a two-token step dearer than a four-token one (T = 1, 1.2, 1.1, 1.0): the
    plain stop verifies nothing (1.15/1.2 < 1); projected, three columns give 1.176/1.0, so the look-ahead opens
    column 1, and with the real a then columns 2 (1.176 > 1.15/1.2) and 3."""
    prefix = torch.full((1, 3), 0.15, dtype=torch.float64).cumprod(dim=1)
    curve = table(1.0, 1.2, 1.1, 1.0)
    assert column_schedule(prefix, full(1, 3), curve).tolist() == [0]
    assert column_schedule(prefix, full(1, 3), curve, look_ahead=True).tolist() == [3]
    cost = TableCostModel((1.0, 1.2, 1.1, 1.0))
    assert HardwareAwareScheduler(look_ahead=True).lengths(torch.full((1, 3), 0.15, dtype=torch.float64), cost, full(1, 3)).tolist() == [3]


def test_look_ahead_ignores_cheap_widths_past_every_limit():
    """A step time that falls only past every row's limit verifies nothing there (the forward never grows past max ℓ),
    so it cannot draw the look-ahead across the dear width before it."""
    prefix = torch.full((2, 3), 0.1, dtype=torch.float64).cumprod(dim=1)
    curve = table(1.0, 1.2, 0.5, 0.5)
    assert column_schedule(prefix, full(2, 1), curve, look_ahead=True).tolist() == [0, 0]
    assert column_schedule(prefix, full(2, 2), curve, look_ahead=True).tolist() == [2, 2]
    theta = look_ahead_goodput(prefix, full(2, 1), curve)
    assert theta.shape == (3, 4) and bool(torch.isinf(theta[:, 2:]).all()) and bool(torch.isfinite(theta[:, :2]).all())


def test_look_ahead_is_refused_with_candidate_admission():
    """look_ahead projects whole columns: with admission="candidates" it is a ValueError naming both; a non-bool is a TypeError."""
    with pytest.raises(ValueError, match="look_ahead.*'candidates'"):
        HardwareAwareScheduler(admission="candidates", look_ahead=True)
    with pytest.raises(TypeError, match="look_ahead"):
        HardwareAwareScheduler(look_ahead=1)
    with pytest.raises(TypeError, match="look_ahead"):
        column_schedule(torch.ones((1, 2)), full(1, 2), table(1.0, 1.0, 1.0), look_ahead="yes")


# ----------------------------------------------------------------------------- properties


@given(schedule_problems(), step_curves(), st.floats(0.0, 5.0), st.booleans())
@settings(max_examples=150, deadline=None)
def test_lengths_lie_within_limits(problem, curve, draft_seconds, early_stop):
    """0 ≤ ℓ_r ≤ min(limits[r], γ) for Algorithm 1 (both modes) and the minimum-gain rule, on any curve."""
    survival, limits = problem
    prefix = survival.cumprod(dim=1)
    seconds, _ = curve
    cap = limits.clamp(0, prefix.shape[1])
    for lengths in (
        prefix_schedule(prefix, limits, table(*seconds), draft_seconds, early_stop=early_stop),
        minimum_gain_schedule(prefix, limits, table(*seconds), min_gain=0.04),
    ):
        assert lengths.dtype == torch.long and bool((lengths >= 0).all()) and bool((lengths <= cap).all())


@given(schedule_problems())
@settings(max_examples=150, deadline=None)
def test_each_row_is_admitted_in_prefix_order(problem):
    """In the admission order every row's eligible positions appear as 1, 2, 3, … (so admitted sets are prefixes)."""
    survival, limits = problem
    prefix = survival.cumprod(dim=1)
    order = candidate_order(prefix, limits)
    eligible_count = int(order.eligible.sum())
    assert bool(order.eligible[:eligible_count].all()), "eligible candidates come first"
    for row in range(prefix.shape[0]):
        positions = order.positions[:eligible_count][order.rows[:eligible_count] == row].tolist()
        assert positions == list(range(1, len(positions) + 1))
    assert bool((order.values[:eligible_count][:-1] >= order.values[:eligible_count][1:]).all())


@given(schedule_problems(), step_curves(), st.booleans())
@settings(max_examples=150, deadline=None)
def test_a_steeper_curve_never_admits_more(problem, curve, early_stop):
    """T'(w) = T(w)·2^{e_w} with e_w non-decreasing (every extra column relatively dearer): ℓ' ≤ ℓ row by row."""
    survival, limits = problem
    prefix = survival.cumprod(dim=1)
    seconds, doublings = curve
    steeper = [value * 2.0**exponent for value, exponent in zip(seconds, doublings)]
    cheap = prefix_schedule(prefix, limits, table(*seconds), early_stop=early_stop)
    dear = prefix_schedule(prefix, limits, table(*steeper), early_stop=early_stop)
    assert bool((dear <= cheap).all())


@given(schedule_problems(), step_curves(), st.floats(0.0, 5.0))
@settings(max_examples=150, deadline=None)
def test_early_stop_never_admits_more_than_the_retrospective_search(problem, curve, draft_seconds):
    """Θ rises strictly up to the early stop, so the best prefix is at least as long: ℓ_early ≤ ℓ_retrospective."""
    survival, limits = problem
    prefix = survival.cumprod(dim=1)
    seconds, _ = curve
    early = prefix_schedule(prefix, limits, table(*seconds), draft_seconds)
    retrospective = prefix_schedule(prefix, limits, table(*seconds), draft_seconds, early_stop=False)
    assert bool((early <= retrospective).all())


@given(schedule_problems(max_rows=1), step_curves(), st.floats(0.0, 5.0))
@settings(max_examples=150, deadline=None)
def test_columns_are_algorithm_1_at_one_row(problem, curve, draft_seconds):
    """With one row every column holds one candidate: column-wise admission returns Algorithm 1's ℓ."""
    survival, limits = problem
    prefix = survival.cumprod(dim=1)
    seconds, _ = curve
    assert torch.equal(column_schedule(prefix, limits, table(*seconds), draft_seconds), prefix_schedule(prefix, limits, table(*seconds), draft_seconds))


@given(schedule_problems(), step_curves(), st.floats(0.0, 5.0))
@settings(max_examples=150, deadline=None)
def test_columns_fill_the_rectangle_and_stop_early(problem, curve, draft_seconds):
    """ℓ_r = min(K, limits[r], γ) for one K, and K is the count of leading columns that each raised Θ (brute force)."""
    survival, limits = problem
    prefix = survival.cumprod(dim=1)
    seconds, _ = curve
    rows, gamma = prefix.shape
    lengths = column_schedule(prefix, limits, table(*seconds), draft_seconds)
    reach = [min(int(limit), gamma) for limit in limits]

    def goodput(columns: int) -> float:
        tokens = sum(1 + sum(prefix[row, : min(columns, reach[row])].tolist()) for row in range(rows))
        return tokens / (draft_seconds + seconds[columns])

    columns = 0
    while columns < gamma and goodput(columns + 1) > goodput(columns):
        columns += 1
    assert lengths.tolist() == [min(columns, reach[row]) for row in range(rows)]


@given(schedule_problems(), step_curves(), st.floats(0.0, 5.0))
@settings(max_examples=150, deadline=None)
def test_look_ahead_opens_columns_by_brute_force(problem, curve, draft_seconds):
    """ℓ_r = min(K, limits[r]) where K counts the leading columns k for which some width k ≤ K' ≤ max limit, on
    survivals projected from a_{·,≤k} (c_{r,k} repeated), beats Θ(k − 1) (brute force in Python)."""
    survival, limits = problem
    prefix = survival.cumprod(dim=1)
    seconds, _ = curve
    rows, gamma = prefix.shape
    reach = [min(int(limit), gamma) for limit in limits]

    def goodput(table_of_a, columns: int) -> float:
        tokens = sum(1 + sum(table_of_a[row][: min(columns, reach[row])]) for row in range(rows))
        return tokens / (draft_seconds + seconds[columns])

    def known_when_deciding(column: int) -> list[list[float]]:
        """a_{r,j} for j ≤ column, then a_{r,column}·c_{r,column}^{j − column}."""
        known = []
        for row in range(rows):
            a = prefix[row].tolist()
            before = a[column - 2] if column > 1 else 1.0
            survival_at_column = a[column - 1] / before if before > 0 else 0.0
            known.append(a[:column] + [a[column - 1] * survival_at_column ** (j + 1 - column) for j in range(column, gamma)])
        return known

    columns = 0
    while columns < min(gamma, max(reach)):
        known = known_when_deciding(columns + 1)
        if not max(goodput(known, width) for width in range(columns + 1, max(reach) + 1)) > goodput(known, columns):
            break
        columns += 1
    lengths = column_schedule(prefix, limits, table(*seconds), draft_seconds, look_ahead=True)
    assert lengths.tolist() == [min(columns, reach[row]) for row in range(rows)]


@given(schedule_problems(), step_curves(), st.floats(0.0, 5.0))
@settings(max_examples=150, deadline=None)
def test_look_ahead_opens_at_least_the_plain_stops_columns(problem, curve, draft_seconds):
    """K = k is among the widths the look-ahead weighs, so it never verifies less than the plain early stop."""
    survival, limits = problem
    prefix = survival.cumprod(dim=1)
    seconds, _ = curve
    plain = column_schedule(prefix, limits, table(*seconds), draft_seconds)
    ahead = column_schedule(prefix, limits, table(*seconds), draft_seconds, look_ahead=True)
    assert bool((ahead >= plain).all())


@given(schedule_problems(), gentle_step_curves(), st.booleans(), st.integers(0, 2**31 - 1))
@settings(max_examples=200, deadline=None)
def test_column_decisions_never_read_the_survival_of_a_later_column(problem, seconds, look_ahead, seed):
    """Non-anticipation, the property that keeps sampling lossless: with K columns opened, redrawing every survival
    c_{·,j} for j ≥ K + 2 (read only by decisions after the one that closed column K + 1) as all 0, all 1 or at
    random leaves ℓ unchanged."""
    survival, limits = problem
    lengths = column_schedule(survival.cumprod(dim=1), limits, table(*seconds), look_ahead=look_ahead)
    later = survival[:, int(lengths.max()) + 1 :]
    for fill in (torch.zeros_like(later), torch.ones_like(later), torch.rand(later.shape, generator=torch.Generator().manual_seed(seed), dtype=later.dtype)):
        redrawn = torch.cat([survival[:, : survival.shape[1] - later.shape[1]], fill], dim=1)
        assert torch.equal(column_schedule(redrawn.cumprod(dim=1), limits, table(*seconds), look_ahead=look_ahead), lengths)


def test_look_ahead_does_not_read_the_survival_of_the_column_it_decides_past():
    """Appendix A's trap, for the look-ahead: one row, a_1 = 0.15, T = 1, 1.2, 1.25. Column 1 is decided on a_2
    projected as 0.15² (Θ̂ 1.1725/1.25 < 1: closed), whatever the real c_2; a search that read c_2 = 1 would open
    both columns (1.3/1.25 > 1) and so verify x_1 exactly when the token after it looks good."""
    curve = table(1.0, 1.2, 1.25)
    for later in (0.0, 0.15, 1.0):
        prefix = torch.tensor([[0.15, 0.15 * later]], dtype=torch.float64)
        assert column_schedule(prefix, full(1, 2), curve, look_ahead=True).tolist() == [0]


@given(schedule_problems(), step_curves())
@settings(max_examples=150, deadline=None)
def test_a_steeper_curve_never_opens_more_columns(problem, curve):
    """T'(w) = T(w)·2^{e_w} with e_w non-decreasing: column-wise admission gives ℓ' ≤ ℓ row by row."""
    survival, limits = problem
    prefix = survival.cumprod(dim=1)
    seconds, doublings = curve
    steeper = [value * 2.0**exponent for value, exponent in zip(seconds, doublings)]
    assert bool((column_schedule(prefix, limits, table(*steeper)) <= column_schedule(prefix, limits, table(*seconds))).all())


@given(schedule_problems(), step_curves(), st.floats(0.0, 5.0))
@settings(max_examples=100, deadline=None)
def test_vllm_rule_is_the_argmax_over_budgets(problem, curve, draft_seconds):
    """VllmArgmaxRule equals a brute-force first argmax over b of (R + top-b sum) / (D + T(R, 1 + widest of the top b))."""
    survival, limits = problem
    seconds, _ = curve
    order = candidate_order(survival.cumprod(dim=1), limits)
    rows = survival.shape[0]
    best, best_budget = -math.inf, 0
    for budget in range(int(order.eligible.sum()) + 1):
        width = max(order.positions[:budget].tolist(), default=0)
        goodput = (rows + sum(order.values[:budget].tolist())) / (draft_seconds + seconds[width])
        if goodput > best:
            best, best_budget = goodput, budget
    expected = torch.zeros(rows, dtype=torch.long).index_add_(0, order.rows[:best_budget], torch.ones(best_budget, dtype=torch.long))
    assert torch.equal(VllmArgmaxRule().lengths(survival, TableCostModel(tuple(seconds), draft_seconds), limits), expected)


# ----------------------------------------------------------------------------- the engine rules by hand


def test_vllm_rule_looks_past_the_cliff_that_stops_algorithm_1():
    """A dear second column: Algorithm 1 stops at once, vLLM's argmax over budgets takes the best three candidates, and
    column-wise admission sees that the first two columns pay as wholes (Θ 2/1.2, 3.5/2.0, 4.52/2.0, then 5.15/3.2)."""
    cost = TableCostModel((1.0, 1.8, 1.8, 3.0), draft_seconds=0.2)
    survival = torch.tensor([[0.9, 0.8, 0.5], [0.6, 0.5, 0.9]], dtype=torch.float64)
    # Θ_b = 2/1.2, 2.9/2.0, 3.62/2.0, 4.22/2.0, 4.58/3.2, 4.88/3.2, 5.15/3.2: the maximum is at b = 3.
    assert VllmArgmaxRule().lengths(survival, cost, full(2, 3)).tolist() == [2, 1]
    assert HardwareAwareScheduler(admission="candidates").lengths(survival, cost, full(2, 3)).tolist() == [0, 0]
    assert HardwareAwareScheduler().lengths(survival, cost, full(2, 3)).tolist() == [2, 2]


@pytest.mark.parametrize("min_gain, expected", [(0.04, [2, 1]), (0.65, [2, 0]), (0.75, [1, 0]), (0.0, [2, 1]), (1.0, [0, 0])])
def test_minimum_gain_rule_by_hand(min_gain, expected):
    """Gains a − ΔT/T(R,1) in order (T(R,1) = 2 s): 0.9 − 0.1, 0.72, 0.6, then 0.36 − 0.4 for the fourth column;
    stop at the first below min_gain."""
    cost = TableCostModel((2.0, 2.2, 2.2, 3.0))
    survival = torch.tensor([[0.9, 0.8, 0.5], [0.6, 0.5, 0.9]], dtype=torch.float64)
    assert MinimumGainRule(min_gain).lengths(survival, cost, full(2, 3)).tolist() == expected


def test_policies_cap_lengths_at_their_max_draft_tokens(target):
    """max_draft_tokens caps ℓ (and is what wrap reads as γ)."""
    survival = torch.ones((2, 4))
    for policy in (HardwareAwareScheduler(max_draft_tokens=2), VllmArgmaxRule(max_draft_tokens=2), MinimumGainRule(max_draft_tokens=2)):
        assert policy.lengths(survival, ConstantCostModel(), full(2, 4)).tolist() == [2, 2]
        check_hooks(policy, POLICY_HOOKS, "policy")
        assert hook(policy, "needs_survival", POLICY_HOOKS) is True and hook(policy, "max_draft_tokens", POLICY_HOOKS) == 2
    speculative = dspark.wrap(target, DraftModelDrafter(target), policy=HardwareAwareScheduler(max_draft_tokens=3), confidence=DraftProbability())
    assert speculative.strategy.max_draft_tokens == 3


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("policy", [HardwareAwareScheduler(), VllmArgmaxRule(), MinimumGainRule()])
def test_policies_need_survival(policy):
    """Without a confidence estimator the policies refuse, naming themselves."""
    with pytest.raises(ValueError, match=type(policy).__name__):
        policy.lengths(None, ConstantCostModel(), torch.tensor([2]))


@pytest.mark.parametrize(
    "arguments, error, match",
    [
        ((torch.tensor([[1, 1]]), full(1, 2)), TypeError, "prefix_survival"),
        ((torch.ones(3), full(3, 1)), ValueError, "prefix_survival"),
        ((torch.ones((2, 2)), torch.ones(2)), TypeError, "limits"),
        ((torch.ones((2, 2)), full(3, 2)), ValueError, r"limits must have shape \(2,\)"),
    ],
)
def test_bad_problems_are_refused(arguments, error, match):
    """Wrong types and shapes of prefix_survival and limits are refused by name."""
    with pytest.raises(error, match=match):
        prefix_schedule(*arguments, table(1.0, 1.0, 1.0))


@pytest.mark.parametrize(
    "step_time, draft_seconds, match",
    [
        (table(1.0, math.nan, 1.0), 0.0, r"step_time\(R=2, tokens=2\)"),
        (table(1.0, -1.0, 1.0), 0.0, r"step_time\(R=2, tokens=2\)"),
        (table(0.0, 1.0, 1.0), 0.0, "must be > 0"),
        (table(1.0, 1.0, 1.0), -0.5, "draft_seconds"),
        (table(1.0, 1.0, 1.0), math.inf, "draft_seconds"),
    ],
)
def test_bad_costs_are_refused(step_time, draft_seconds, match):
    """Step times must be finite and ≥ 0, drafting time too, and a step must take some time."""
    with pytest.raises(ValueError, match=match):
        prefix_schedule(torch.ones((2, 2)), full(2, 2), step_time, draft_seconds)


def test_bad_arguments_are_refused():
    """A non-callable step_time, a non-bool early_stop and a non-finite min_gain are refused."""
    with pytest.raises(TypeError, match="step_time"):
        prefix_schedule(torch.ones((1, 2)), full(1, 2), 1.0)
    with pytest.raises(TypeError, match="early_stop"):
        prefix_schedule(torch.ones((1, 2)), full(1, 2), table(1.0, 1.0, 1.0), early_stop=1)
    with pytest.raises(ValueError, match="min_gain"):
        minimum_gain_schedule(torch.ones((1, 2)), full(1, 2), table(1.0, 1.0, 1.0), min_gain=math.nan)
    with pytest.raises(ValueError, match="must be > 0"):
        minimum_gain_schedule(torch.ones((1, 2)), full(1, 2), table(0.0, 1.0, 1.0))


@pytest.mark.parametrize(
    "factory, value, error",
    [
        (lambda value: HardwareAwareScheduler(max_draft_tokens=value), -1, ValueError),
        (lambda value: HardwareAwareScheduler(max_draft_tokens=value), 1.5, TypeError),
        (lambda value: HardwareAwareScheduler(include_draft_cost=value), "yes", TypeError),
        (lambda value: HardwareAwareScheduler(admission=value), "rows", ValueError),
        (lambda value: VllmArgmaxRule(max_draft_tokens=value), -2, ValueError),
        (lambda value: MinimumGainRule(min_gain=value), 1.5, ValueError),
        (lambda value: MinimumGainRule(min_gain=value), -0.1, ValueError),
    ],
)
def test_bad_policy_fields_are_refused(factory, value, error):
    """Bad fields raise (TypeError for a wrong type, ValueError out of range) with the value in the message."""
    with pytest.raises(error, match=repr(value)):
        factory(value)


# ----------------------------------------------------------------------------- through the loop


@pytest.fixture(scope="module")
def target():
    return build_model("llama")


@pytest.mark.parametrize("drafter_kind", ["other-model", "self"])
@pytest.mark.parametrize(
    "policy_type",
    [HardwareAwareScheduler, lambda: HardwareAwareScheduler(admission="candidates"), lambda: HardwareAwareScheduler(look_ahead=True),
     VllmArgmaxRule, MinimumGainRule],
    ids=["hardware-aware", "hardware-aware-candidates", "hardware-aware-look-ahead", "vllm-argmax", "minimum-gain"],
)
def test_greedy_output_equals_hf_generate(target, policy_type, drafter_kind):
    """Mixed prompt lengths, a linear cost curve: ℓ takes several values and the output equals HF greedy generate."""
    policy = policy_type()  # a fresh one per drafter: the scheduler's row fallback learns across generations
    drafter = DraftModelDrafter(build_model("llama", seed=2) if drafter_kind == "other-model" else target)
    input_ids, attention_mask = left_padded_batch([5, 9, 3, 7], seed=1)
    result = dspark.wrap(target, drafter, policy=policy, confidence=DraftProbability(), cost_model=LinearCostModel(), max_draft_tokens=4).generate(
        input_ids, attention_mask=attention_mask, max_new_tokens=24, eos_token_id=[]
    )
    expected = target.generate(input_ids, attention_mask=attention_mask, max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(result.sequences, expected)
    assert torch.cat(result.stats.verify_lengths).unique().numel() >= 2, "the policy must vary ℓ"
    if drafter_kind == "self":
        assert result.stats.tau > 1.5, "self-drafting must accept drafts, exercising the cache rollback of partial verification"


def test_greedy_output_with_a_flat_curve_verifies_every_draft(target):
    """ConstantCostModel: Algorithm 1 verifies, step by step, exactly what FixedLength(γ) verifies, and equals HF greedy."""
    input_ids, attention_mask = left_padded_batch([6, 2], seed=3)
    drafter_model = build_model("llama", seed=2)
    results = [
        dspark.wrap(target, DraftModelDrafter(drafter_model), policy=policy, confidence=DraftProbability(), cost_model=ConstantCostModel(), max_draft_tokens=3)
        .generate(input_ids, attention_mask=attention_mask, max_new_tokens=10, eos_token_id=[])
        for policy in (HardwareAwareScheduler(), FixedLength(3))
    ]
    expected = target.generate(input_ids, attention_mask=attention_mask, max_new_tokens=10, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(results[0].sequences, expected)
    scheduled, fixed = (torch.cat(result.stats.verify_lengths) for result in results)
    assert torch.equal(scheduled, fixed) and int(scheduled.max()) == 3


# ----------------------------------------------------------------------------- priorities


def test_a_high_priority_row_opens_a_column_an_equal_weight_batch_would_not():
    """Two rows with a_1 = 1 and a second column costing 60% more: unweighted, Θ falls (3/1.6 < 2), so ℓ = 0;
    with w = (1, 3) the first candidate is row 1's, Θ rises (7/1.6 > 4), and row 0 then rides along for free."""
    prefix = torch.ones((2, 1), dtype=torch.float64)
    curve = table(1.0, 1.6)
    assert prefix_schedule(prefix, full(2, 1), curve).tolist() == [0, 0]
    assert prefix_schedule(prefix, full(2, 1), curve, weights=torch.tensor([1.0, 3.0])).tolist() == [1, 1]


def test_weights_order_the_candidates():
    """Candidates are admitted by w_r·a_{r,j}: a doubled row's 0.4 comes before an unweighted 0.6."""
    prefix = torch.tensor([[0.6], [0.4]], dtype=torch.float64)
    order = candidate_order(prefix, full(2, 1), weights=torch.tensor([1.0, 2.0]))
    assert order.rows.tolist() == [1, 0] and torch.allclose(order.values, torch.tensor([0.8, 0.6], dtype=torch.float64))


def test_weights_of_the_wrong_shape_are_refused():
    """Weights must be one float per row."""
    with pytest.raises(TypeError, match=r"weights must be a FloatTensor\[2\]"):
        prefix_schedule(TWO_ROWS, full(2, 3), table(1.0, 1.0, 1.0, 1.0), weights=torch.tensor([1.0]))


def test_the_scheduler_reads_priority_and_drafted_rows_from_the_context():
    """Through a VerifyContext the scheduler weighs rows by priority and charges draft_time of the drafted rows only."""
    survival = torch.ones((2, 1), dtype=torch.float64)
    policy = HardwareAwareScheduler(admission="candidates")  # one candidate alone does not pay for the column
    costs = TableCostModel((1.0, 1.6))
    rows = torch.arange(2)
    assert policy.lengths(survival, costs, full(2, 1)).tolist() == [0, 0]
    context = dspark.VerifyContext(rows=rows, priority=torch.tensor([1.0, 3.0]), drafted_rows=2)
    assert policy.lengths(survival, costs, full(2, 1), context).tolist() == [1, 1]
    charged = []

    class CountingCosts(TableCostModel):
        def draft_time(self, rows: int, depth: int | None = None) -> float:
            charged.append(rows)
            return 0.0

    policy.lengths(survival, CountingCosts((1.0, 1.6)), full(2, 1), dspark.VerifyContext(rows=rows, priority=torch.ones(2), drafted_rows=1))
    assert charged == [1]


def test_finishing_weights_by_hand():
    """Budgets [10, 5, 5] on T(1..3, 1) = 1, 1.5, 1.8: the row furthest from its end gets 3·1/1.8, the tied pair 3·0.8/(2·1.8) each."""
    table = {1: 1.0, 2: 1.5, 3: 1.8}
    weights = finishing_weights(torch.tensor([10, 5, 5]), lambda rows, tokens: table[rows])
    assert weights.tolist() == pytest.approx([3 / 1.8, 3 * 0.8 / 3.6, 3 * 0.8 / 3.6])


@given(st.lists(st.integers(1, 6), min_size=1, max_size=12), st.lists(st.floats(0.0, 5.0), min_size=12, max_size=12))
def test_finishing_weights_sum_to_the_rows_and_are_one_when_budgets_tie(budgets, increments):
    """For any non-decreasing T(k, 1) > 0, Σ f = R; rows with equal budgets weigh alike, and all-equal budgets give f = 1."""
    table = list(itertools.accumulate([0.5 + increments[0], *increments[1:]]))
    step_time = lambda rows, tokens: table[rows - 1]  # noqa: E731
    remaining = torch.tensor(budgets)
    weights = finishing_weights(remaining, step_time)
    assert float(weights.sum()) == pytest.approx(len(budgets))
    for value in set(budgets):
        tied = weights[remaining == value]
        assert torch.allclose(tied, tied[:1].expand_as(tied))
    assert torch.allclose(finishing_weights(torch.full((len(budgets),), 3), step_time), torch.ones(len(budgets), dtype=torch.float64))


def test_finishing_weights_refuse_a_float_budget():
    """remaining must be an integer tensor [R]: a float one is a TypeError naming it."""
    with pytest.raises(TypeError, match="remaining"):
        finishing_weights(torch.tensor([1.0, 2.0]), lambda rows, tokens: 1.0)


def test_one_row_finishing_weight_is_one_without_asking_the_step_time():
    """One row's finishing weight is 1 with no step time read (a cost model asked anything fails here), so a one-row
    step of the preset chooses what it would without the weights; from two rows the step times are read."""
    def refused(rows, tokens):
        raise RuntimeError(f"step time asked for {rows} row(s)")

    assert finishing_weights(torch.tensor([3]), refused).tolist() == [1.0]
    with pytest.raises(RuntimeError, match="row"):
        finishing_weights(torch.tensor([3, 4]), refused)
    costs = LinearCostModel(base=1.0, per_token=0.1)
    context = dspark.VerifyContext(rows=torch.arange(1), priority=torch.ones(1), drafted_rows=1, remaining=torch.tensor([3]))
    survival, limits = torch.tensor([[0.9, 0.6]]), torch.tensor([2])
    static, goodput = HardwareAwareScheduler(row_fallback=None), HardwareAwareScheduler(row_fallback=None, static_batch=False)
    assert static.lengths(survival, costs, limits, context).tolist() == goodput.lengths(survival, costs, limits, context).tolist()


def test_static_batch_skips_a_column_only_rows_about_to_finish_would_fill():
    """Two rows near their end draft well, two far from it draft nothing: Θ opens column 1, the finishing weights do not;
    with equal budgets both give the same lengths."""
    costs = LinearCostModel(base=1.0, per_token=0.1)  # Θ_0 = 4 / 1.4, Θ_1 = 5.8 / 1.8; weighted (f = 0.29 there): 4.51 / 1.8
    survival = torch.tensor([[0.9], [0.9], [0.0], [0.0]])
    limits = torch.tensor([1, 1, 0, 0])
    context = lambda remaining: dspark.VerifyContext(rows=torch.arange(4), priority=torch.ones(4), drafted_rows=0, remaining=torch.tensor(remaining))  # noqa: E731
    goodput, static = HardwareAwareScheduler(row_fallback=None, static_batch=False), HardwareAwareScheduler(row_fallback=None)
    assert goodput.lengths(survival, costs, limits, context([3, 3, 9, 9])).tolist() == [1, 1, 0, 0]
    assert static.lengths(survival, costs, limits, context([3, 3, 9, 9])).tolist() == [0, 0, 0, 0]
    assert static.lengths(survival, costs, limits, context([5, 5, 5, 5])).tolist() == [1, 1, 0, 0]


@given(survival=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=6), priority=st.floats(0.01, 100.0), admission=st.sampled_from(["columns", "candidates"]))
@settings(max_examples=60, deadline=None)
def test_one_row_lengths_are_the_unweighted_schedule_whatever_the_priority(survival, priority, admission):
    """At one row a priority scales every Θ alike, so the preset verifies exactly what the unweighted schedule does on
    a = cumprod(c): the scheduler leaves the weight out there (a step's worth of tensor ops saved, at no change)."""
    costs = LinearCostModel(base=1.0, per_token=0.15)
    row = torch.tensor([survival])
    limits = torch.tensor([len(survival)])
    context = dspark.VerifyContext(rows=torch.arange(1), priority=torch.tensor([priority]), drafted_rows=1, remaining=torch.tensor([9]))
    scheduled = HardwareAwareScheduler(row_fallback=None, admission=admission).lengths(row, costs, limits, context)
    schedule = column_schedule if admission == "columns" else prefix_schedule
    assert scheduled.tolist() == schedule(row.cumprod(dim=1), limits, costs.step_time, costs.draft_time(1, len(survival))).tolist()
