"""Per-row fallback: the predicted goodput of drafting a set of rows, the choice, and the run's bookkeeping
(entering, re-probing with back-off, leaving)."""

import attrs
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark.protocols import RowFallback
from dspark.stats import StepRecord
from dspark.types import GenerationStart, SamplingConfig
from dspark.verify.fallback import GainPrior, GoodputFallback, best_drafted_rows, draft_depths, drafting_goodput, reach_depth, verified_gain
from tests.strategies import depth_cost_curves, fallback_problems


@attrs.frozen
class Costs:
    """T(R, w) = step + widen·(w − 1); D(k) = draft_base + draft_row·k."""

    step: float = 1.0
    widen: float = 0.0
    draft_base: float = 0.0
    draft_row: float = 0.0

    def step_time(self, rows: int, tokens: int) -> float:
        return self.step + self.widen * (tokens - 1)

    def draft_time(self, rows: int, depth: int | None = None) -> float:
        return self.draft_base + self.draft_row * rows


def start(rows: int, priority=None, prompt_length=None) -> GenerationStart:
    return GenerationStart(rows=rows, device=torch.device("cpu"), max_draft_tokens=4, max_length=64, sampling=SamplingConfig(), priority=priority,
                           prompt_length=prompt_length)


def record(rows, drafted, verify_lengths, accepted, survival=None, draft_seconds=0.0) -> StepRecord:
    """A StepRecord of one step as the loop makes it (no survival: the fallback reads the accepted counts)."""
    rows, drafted = torch.tensor(rows), torch.tensor(drafted)
    return StepRecord(rows=rows, verify_lengths=torch.tensor(verify_lengths), accepted=torch.tensor(accepted), emitted=torch.tensor(accepted) + 1,
                      drafted=torch.where(drafted, 4, 0), survival=survival, draft_seconds=draft_seconds, verify_seconds=1.0, cache_slots=0,
                      drafted_for=drafted)


def observe(run, rows, drafted, verify_lengths, accepted):
    run.observe(record(rows, drafted, verify_lengths, accepted))


# ----------------------------------------------------------------------------- the pure functions


def test_drafting_goodput_by_hand():
    """Three rows, gains (1, 0, 0.5), widths (2, 0, 1): Θ_k = (3 + gained) / (D(k) + T(3, 1 + max width))."""
    costs = Costs(step=1.0, widen=0.25, draft_base=0.2, draft_row=0.1)
    order, theta = drafting_goodput(torch.tensor([1.0, 0.0, 0.5], dtype=torch.float64), torch.tensor([2, 0, 1]), 3.0, 3, costs.step_time, costs.draft_time)
    assert order.tolist() == [0, 2, 1]
    expected = [3 / 1.0, 4 / (0.3 + 1.5), 4.5 / (0.4 + 1.5), 4.5 / (0.5 + 1.5)]
    assert torch.allclose(theta, torch.tensor(expected, dtype=torch.float64))


@pytest.mark.parametrize(
    "costs, expected",
    [
        (Costs(), [True, False, True]),  # drafting is free: every row that gains anything
        (Costs(draft_base=10.0), [False, False, False]),  # drafting costs ten steps: nobody
        (Costs(draft_base=0.3), [True, False, True]),  # Θ = 3, 3.05, 3.41, 3.38: the zero-gain row only adds cost
    ],
)
def test_best_drafted_rows(costs, expected):
    """The choice follows the cost of drafting: every row that gains when free, none when dear, the best in between."""
    costs = attrs.evolve(costs, draft_row=0.0 if costs.draft_base == 0 else 0.01)
    chosen = best_drafted_rows(torch.tensor([1.0, 0.0, 0.5], dtype=torch.float64), torch.tensor([1, 1, 1]), 3.0, 3, costs.step_time, costs.draft_time)
    assert chosen.tolist() == expected


def test_rows_that_gain_nothing_are_not_costed():
    """best_drafted_rows asks the cost model only about drafting the rows that gain something."""
    costs, asked = Costs(draft_base=0.01, draft_row=0.01), []

    def draft_time(count):
        asked.append(count)
        return costs.draft_time(count)

    gains = torch.tensor([0.0, 1.0, 0.0, 0.0, 0.5, 0.0], dtype=torch.float64)
    chosen = best_drafted_rows(gains, torch.ones(6, dtype=torch.long), 6.0, 6, costs.step_time, draft_time)
    assert sorted(asked) == [1, 2] and chosen.tolist() == [False, True, False, False, True, False]
    assert not best_drafted_rows(torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.long), 3.0, 3, costs.step_time, draft_time).any()


@given(fallback_problems())
@settings(max_examples=60, deadline=None)
def test_the_choice_is_a_prefix_by_gain_and_beats_both_extremes(problem):
    """A chosen row never gains less than an unchosen one, and the chosen set's Θ is at least that of none and of all."""
    gains, widths, costs = problem
    rows = gains.numel()
    chosen = best_drafted_rows(gains, widths, float(rows), rows, costs.step_time, costs.draft_time)
    if chosen.any() and (~chosen).any():
        assert float(gains[chosen].min()) >= float(gains[~chosen].max())
    _, theta = drafting_goodput(gains, widths, float(rows), rows, costs.step_time, costs.draft_time)
    picked = theta[int(chosen.sum())]
    assert picked >= theta[0] and picked >= theta[-1]


def test_bad_problems_are_refused():
    """Gains must be a float vector, widths integers shaped like it, rows at least the candidates."""
    costs = Costs()
    with pytest.raises(TypeError, match="gains"):
        drafting_goodput(torch.tensor([1, 2]), torch.tensor([1, 1]), 2.0, 2, costs.step_time, costs.draft_time)
    with pytest.raises(TypeError, match="widths"):
        drafting_goodput(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 1.0]), 2.0, 2, costs.step_time, costs.draft_time)
    with pytest.raises(ValueError, match="rows must be an int >= the 2"):
        drafting_goodput(torch.tensor([1.0, 2.0]), torch.tensor([1, 1]), 2.0, 1, costs.step_time, costs.draft_time)


@pytest.mark.parametrize(
    "arguments, match",
    [({"smoothing": 0.0}, "smoothing"), ({"smoothing": 1.5}, "smoothing"), ({"probe_after": 0}, "probe_after"), ({"probe_after": 8, "max_probe_interval": 4}, "max_probe_interval"),
     ({"generation_probe_after": 0}, "generation_probe_after"), ({"generation_min_gain": -0.1}, "generation_min_gain"),
     ({"generation_probe_after": 4, "max_generation_probe_interval": 2}, "max_generation_probe_interval")],
)
def test_bad_fallback_settings_are_refused(arguments, match):
    """Settings out of range are refused naming the field."""
    with pytest.raises((ValueError, TypeError), match=match):
        GoodputFallback(**arguments)


# ----------------------------------------------------------------------------- one generation's run


def test_goodput_fallback_is_a_row_fallback():
    """GoodputFallback implements the RowFallback protocol."""
    assert isinstance(GoodputFallback(), RowFallback)


def test_rows_are_drafted_until_observed():
    """A fresh run drafts every row: nothing is known about them yet."""
    run = GoodputFallback().start(start(3), Costs(draft_base=10.0))
    assert (run.draft_rows(torch.tensor([0, 1, 2])) > 0).tolist() == [True, True, True]


def test_a_row_that_gains_nothing_falls_back_and_is_reprobed_with_back_off():
    """Row 1 gains nothing for its drafting cost: it is skipped, re-probed after probe_after steps, then after
    twice as long when the probe shows it still does not pay; row 0 keeps drafting throughout."""
    run = GoodputFallback(probe_after=2, max_probe_interval=4, prior_weight=0.0).start(start(2), Costs(draft_base=0.2, draft_row=0.05, widen=0.1))
    rows = torch.tensor([0, 1])
    drafted_steps = []
    for step in range(12):
        drafted = run.draft_rows(rows) > 0
        drafted_steps.append(drafted.tolist())
        observe(run, [0, 1], drafted.tolist(), [3, 3 if drafted[1] else 0], [3, 0])
    row_1 = [step for step, drafted in enumerate(drafted_steps) if drafted[1]]
    assert all(drafted[0] for drafted in drafted_steps)
    # drafted at 0 (unobserved); skipped 1, 2; probe at 3; skipped 4..7 (interval 4); probe at 8; then every 4 (the cap).
    assert row_1 == [0, 3, 8]


def test_a_new_generation_starts_from_the_probe_interval_its_batch_size_reached():
    """A single row that gains once, then never, is probed after 2, then 4, then 8 steps (the cap); the next
    generation of one row is first-probed, then waits 8; a generation of another batch size waits probe_after."""
    fallback = GoodputFallback(smoothing=1.0, probe_after=2, max_probe_interval=8, prior=GainPrior(smoothing=1.0))
    costs = Costs(draft_row=0.3)

    def probes(batch: int, steps: int, gains_once: bool = False) -> list[int]:
        run = fallback.start(start(batch), costs)
        rows = torch.arange(batch)
        drafted_at = []
        for step in range(steps):
            drafted = (run.draft_rows(rows) > 0).tolist()
            if drafted[0]:
                drafted_at.append(step)
            accepted = [1 if step == 0 and gains_once else 0] * batch  # one token once: probes could pay, none do
            observe(run, rows.tolist(), drafted, [1 if flag else 0 for flag in drafted], accepted)
        return drafted_at

    assert probes(1, 20, gains_once=True) == [0, 1, 4, 9, 18]  # 0: nothing known; 1: chosen after gaining 1; then waits of 2, 4, 8
    assert fallback.prior.probe_interval("greedy", 1) == 8
    assert probes(1, 20) == [0, 9, 18]  # the first probe gains nothing: the prior's wait of 8 follows it
    assert probes(2, 6) == [0, 3] and fallback.prior.probe_interval("greedy", 2) == 4  # 2 drafted rows: too few to rule probes out


def test_a_new_generation_measures_its_rows_rather_than_inheriting_the_priors_estimate():
    """After generations whose rows gained little (the prior's estimate keeps a row out and its wait is 64), a new
    generation whose row gains 3 tokens a step is probed at its first step and drafted from then on: its own
    outcome replaces the prior's estimate (a chat prior must not lock out a code prompt)."""
    fallback = GoodputFallback(smoothing=0.3, max_probe_interval=64)
    fallback.prior.update("greedy", 1, torch.full((8,), 0.05, dtype=torch.float64), torch.ones(8, dtype=torch.long))
    fallback.prior.update("greedy", 1, torch.tensor([3.0], dtype=torch.float64), torch.tensor([3]))  # the ceiling: 3 once
    fallback.prior.remember_probe_interval("greedy", 1, 64)
    run = fallback.start(start(1), Costs(draft_row=0.3, widen=0.1))
    drafted = []
    for _ in range(4):
        drafted.append(bool(run.draft_rows(torch.tensor([0]))[0] > 0))
        observe(run, [0], [drafted[-1]], [3 if drafted[-1] else 0], [3 if drafted[-1] else 0])
    assert drafted == [True, True, True, True]
    assert float(run.gain[0]) == 3.0


def test_a_reprobed_row_that_gains_again_comes_back():
    """A skipped row whose probe accepts drafts again is drafted on the following steps and its wait starts over."""
    fallback = GoodputFallback(probe_after=1, smoothing=1.0, prior_weight=0.0)
    fallback.prior.update("greedy", 1, torch.tensor([2.0]), torch.tensor([2]))  # an earlier generation gained 2
    run = fallback.start(start(1), Costs(draft_base=0.2))
    rows = torch.tensor([0])
    assert (run.draft_rows(rows) > 0).tolist() == [True]
    observe(run, [0], [True], [2], [0])
    assert (run.draft_rows(rows) > 0).tolist() == [False]
    observe(run, [0], [False], [0], [0])
    assert (run.draft_rows(rows) > 0).tolist() == [True]  # the probe
    observe(run, [0], [True], [2], [2])
    assert (run.draft_rows(rows) > 0).tolist() == [True] and int(run.interval[0]) == 1


def test_priority_decides_which_row_pays():
    """Two rows with equal gains, drafting affordable for one row only: the higher-priority row is drafted."""
    costs = Costs(draft_base=0.0, draft_row=0.35)
    for priority, expected in (([1.0, 3.0], [False, True]), ([3.0, 1.0], [True, False])):
        run = GoodputFallback(smoothing=1.0).start(start(2, torch.tensor(priority)), costs)
        run.draft_rows(torch.tensor([0, 1]))
        observe(run, [0, 1], [True, True], [1, 1], [1, 1])
        assert (run.draft_rows(torch.tensor([0, 1])) > 0).tolist() == expected


def test_the_run_follows_a_shrinking_batch():
    """After row 1 leaves, draft_rows answers for the remaining rows, by their batch indices."""
    run = GoodputFallback(smoothing=1.0).start(start(3), Costs(draft_base=0.5, draft_row=0.05))
    run.draft_rows(torch.tensor([0, 1, 2]))
    observe(run, [0, 1, 2], [True, True, True], [2, 2, 2], [2, 2, 0])
    assert (run.draft_rows(torch.tensor([0, 2])) > 0).tolist() == [True, False]


def test_what_a_step_without_drafting_still_spends_is_not_counted_as_savings():
    """A drafter that costs 0.25 of a step per row, of which 0.2 is spent anyway (read on steps that draft for
    no row): a row gaining 0.1 tokens is skipped while that is unknown, and drafted once it is measured."""
    run = GoodputFallback(smoothing=1.0, probe_after=32, prior_weight=0.0).start(start(1), Costs(draft_row=0.25))
    rows = torch.tensor([0])
    run.draft_rows(rows)
    observe(run, [0], [True], [1], [0])  # g = 0: skipped from now on
    assert (run.draft_rows(rows) > 0).tolist() == [False]
    run.observe(record([0], [False], [0], [0], draft_seconds=0.2))
    assert run.idle_seconds == pytest.approx(0.2)
    run.gain[0] = 0.1  # as if probes had shown a small gain
    assert (run.draft_rows(rows) > 0).tolist() == [True]  # 1.1 / (0.05 + 1) > 1 / 1


def test_a_new_batch_starts_from_what_earlier_generations_showed_at_its_size():
    """Generations at R = 2 where drafting gains nothing: each new batch is probed at its first step until 8 drafted
    rows there rule probes out; then a new R = 2 batch is not drafted at its first step; a batch of another size,
    or in another sampling band, still is."""
    fallback = GoodputFallback(smoothing=1.0)
    costs = Costs(draft_row=0.3)
    first_steps = []
    for _ in range(5):
        run = fallback.start(start(2), costs)
        first_steps.append(run.draft_rows(torch.tensor([0, 1])).gt(0).tolist())
        observe(run, [0, 1], first_steps[-1], [0, 0], [0, 0])
    assert first_steps == [[True, True]] * 4 + [[False, False]]
    assert fallback.start(start(3), costs).draft_rows(torch.tensor([0, 1, 2])).gt(0).tolist() == [True, True, True]
    sampled = GenerationStart(rows=2, device=torch.device("cpu"), max_draft_tokens=4, max_length=64, sampling=SamplingConfig(do_sample=True))
    assert fallback.start(sampled, costs).draft_rows(torch.tensor([0, 1])).gt(0).tolist() == [True, True]


def test_the_choice_reads_the_rows_gain_pulled_towards_the_priors_by_prior_weight_pseudo_steps():
    """ĝ = (m·g + κ·ḡ) / (m + κ), m the row's own drafted steps up to (2 − α)/α; κ = 0 reads g alone."""
    fallback = GoodputFallback(smoothing=0.5, prior_weight=3.0)
    fallback.prior.update("greedy", 1, torch.tensor([0.8], dtype=torch.float64), torch.tensor([1]))  # ḡ = 0.8
    run = fallback.start(start(1), Costs())
    run.draft_rows(torch.tensor([0]))
    assert run.shrunk_gain([0], fallback.prior.get("greedy", 1))[0] == pytest.approx(0.8)  # no own step: the prior's
    for steps in range(1, 6):
        run.observe(record([0], [True], [1], [0], survival=torch.tensor([[0.2, 0.0, 0.0, 0.0]])))
        prior = fallback.prior.get("greedy", 1)
        own = min(steps, 3)  # the horizon (2 − 0.5) / 0.5
        assert run.shrunk_gain([0], prior)[0] == pytest.approx((own * run.gain[0] + 3.0 * prior[0]) / (own + 3.0))
    fresh = attrs.evolve(fallback, prior_weight=0.0).start(start(1), Costs())
    fresh.gain[0] = 0.1  # a g of its own, away from the prior's
    assert fresh.shrunk_gain([0], prior)[0] == pytest.approx(0.1) and prior[0] != pytest.approx(0.1)  # κ = 0: g alone


def test_skipped_steps_age_a_rows_own_evidence():
    """m_r = Σ over its drafted steps of (1 − α)^(steps skipped since): skipping pulls ĝ towards the prior's, and the next drafted
    step weighs 1/(m_r + 1), more than α after a long skip; with no skip m_r is the count of drafted steps."""
    fallback = GoodputFallback(smoothing=0.1, prior_weight=3.0)
    fallback.prior.update("greedy", 1, torch.tensor([0.8], dtype=torch.float64), torch.tensor([1]))
    run = fallback.start(start(1), Costs())
    for _ in range(12):
        run.observe(record([0], [True], [1], [0], survival=torch.tensor([[0.1, 0.0, 0.0, 0.0]])))
    assert run.aged_evidence(0) == pytest.approx(12.0) and run.gain[0] == pytest.approx(0.1)
    prior = fallback.prior.get("greedy", 1)
    before = run.shrunk_gain([0], prior)[0]
    for _ in range(10):
        run.observe(record([0], [False], [0], [0]))
    assert run.aged_evidence(0) == pytest.approx(12.0 * 0.9**10)
    assert before < run.shrunk_gain([0], prior)[0] < prior[0]
    run.observe(record([0], [True], [1], [0], survival=torch.tensor([[0.9, 0.0, 0.0, 0.0]])))
    assert run.gain[0] == pytest.approx(0.1 + (0.9 - 0.1) / (12.0 * 0.9**10 + 1.0))


def test_a_rows_priced_width_is_pulled_towards_the_priors_as_its_gain_is():
    """A row whose one step verified two tokens (ratio 1.13) where rows verified one (ratio 1.16): with prior_weight 3,
    (1·1.13 + 3·1.16) / 4 = 1.1525, priced at width 1; with 0, at its own width 2."""
    widths = []
    for weight in (3.0, 0.0):
        fallback = GoodputFallback(prior_weight=weight)
        for _ in range(8):  # earlier generations verified one token a step; the row's own step then moves λ̄ by 1/9
            fallback.prior.update("greedy", 1, torch.tensor([0.3], dtype=torch.float64), torch.tensor([1]))
        run = fallback.start(start(1), WidthTable())
        run.observe(record([0], [True], [2], [1]))
        widths.append(run.priced_widths([0], 1))
    assert widths == [[1], [2]]


def test_a_dip_below_break_even_does_not_drop_a_row_where_rows_like_it_pay():
    """Drafting costs 0.15 of a step; rows here have gained 0.4 a step. One step gaining 0.05 drops the row with prior_weight=0,
    not with the default, whose estimate is pulled towards what rows like it gain."""
    kept = []
    for weight in (0.0, 3.0):
        fallback = GoodputFallback(prior_weight=weight, probe_after=16)
        for _ in range(4):  # earlier generations: 0.4 a step
            fallback.prior.update("greedy", 1, torch.tensor([0.4], dtype=torch.float64), torch.tensor([1]), torch.tensor([0.4]))
        run = fallback.start(start(1), Costs(draft_base=0.15))
        rows = torch.tensor([0])
        run.draft_rows(rows)
        run.observe(record([0], [True], [1], [0], survival=torch.tensor([[0.05, 0.0, 0.0, 0.0]])))
        kept.append(bool(run.draft_rows(rows)[0] > 0))
    assert kept == [False, True]


def test_the_gain_of_a_step_is_the_expected_acceptance_of_what_was_verified():
    """With survival, a row's gain is Σ_{j≤ℓ} c_1·…·c_j (0 when nothing was verified); without, its accepted count."""
    survival = torch.tensor([[0.5, 0.5, 0.5], [0.9, 0.1, 0.9], [1.0, 1.0, 1.0]])
    step = record([0, 1, 2], [True, True, True], [2, 3, 0], [0, 1, 0], survival=survival)
    assert torch.allclose(verified_gain(step), torch.tensor([0.75, 0.9 + 0.09 + 0.081, 0.0], dtype=torch.float64))
    assert verified_gain(record([0], [True], [2], [1])).tolist() == [1.0]


def test_the_gain_at_a_depth_counts_only_the_first_positions():
    """At depth 1 a row's gain is c_1 where it verified a token (0 where it verified none), and without survival its
    accepted count capped at 1; a depth below 1 is refused."""
    survival = torch.tensor([[0.5, 0.5, 0.5], [0.9, 0.1, 0.9], [1.0, 1.0, 1.0]])
    step = record([0, 1, 2], [True, True, True], [2, 3, 0], [0, 1, 0], survival=survival)
    assert torch.allclose(verified_gain(step, depth=1), torch.tensor([0.5, 0.9, 0.0], dtype=torch.float64))
    assert torch.allclose(verified_gain(step, depth=2), torch.tensor([0.75, 0.99, 0.0], dtype=torch.float64))
    assert verified_gain(record([0], [True], [2], [2]), depth=1).tolist() == [1.0]
    with pytest.raises(ValueError, match="depth must be an int >= 1, got 0"):
        verified_gain(step, depth=0)


@given(rows=st.integers(1, 5), gamma=st.integers(1, 6), depth=st.one_of(st.none(), st.integers(1, 7)), seed=st.integers(0, 2**31 - 1))
@settings(max_examples=60, deadline=None)
def test_the_gain_is_the_masked_sum_of_prefix_survivals(rows, gamma, depth, seed):
    """On random steps (ℓ_r from 0 to γ), the gain is Σ_j a_{r,j}·1[j ≤ min(ℓ_r, depth)], a = cumprod(c), as one tensor
    expression computes it."""
    generator = torch.Generator().manual_seed(seed)
    survival = torch.rand((rows, gamma), generator=generator)
    lengths = torch.randint(0, gamma + 1, (rows,), generator=generator)
    step = record(list(range(rows)), [True] * rows, lengths.tolist(), [0] * rows, survival=survival)
    capped = lengths if depth is None else lengths.clamp_max(depth)
    expected = (survival.double().cumprod(dim=1) * (torch.arange(1, gamma + 1)[None, :] <= capped[:, None])).sum(dim=1)
    assert torch.allclose(verified_gain(step, depth=depth), expected, rtol=0, atol=1e-12)


def test_a_row_whose_own_depth_does_not_pay_is_offered_one_token_where_its_first_position_pays():
    """At T(1, w) = 1 + 0.3·(w − 1) and D(1, d) = 0.05·d, a row that gained 0.6 verifying 2 tokens a step
    (Θ = 1.6 / (0.1 + 1.6) < 1) and 0.45 from its first positions (Θ = 1.45 / (0.05 + 1.3) > 1) is drafted one token
    deep from its first step on; one whose first positions gained 0.3 (1.3 / 1.35) is probed at its first step (its own
    depth and the margin's exploring token) and not drafted after it."""
    for first_gain, first_step, expected in ((0.45, [1], [1]), (0.3, [3], [0])):
        fallback = GoodputFallback(probe_after=8)
        fallback.prior.update("greedy", 1, [0.6], [2], first_gains=[first_gain])
        run = fallback.start(start(1), DepthCosts(widen=0.3, per_depth=0.05))
        rows = torch.tensor([0])
        assert run.draft_rows(rows).tolist() == first_step
        survival = torch.tensor([[first_gain, 0.6 / first_gain - 1, 0.5]])  # a_1 = g¹, a_1 + a_2 = 0.6
        run.observe(record([0], [True], [2], [1], survival=survival))
        assert (run.gain[0], run.verify[0], run.first_gain[0]) == pytest.approx((0.6, 2.0, first_gain))
        assert run.draft_rows(rows).tolist() == expected
    assert run.predicted_gain([0], [True], [1], shallow=True) == pytest.approx(1.3 * fallback.prior.realised_ratio("greedy") / 1.35 - 1, abs=0.01)


def test_a_row_whose_own_depth_pays_is_drafted_that_deep():
    """The one-token offer is made only when the rows' own depths draft for none: a row that gained 1.2 verifying 2
    tokens a step (Θ = 2.2 / 1.7) is drafted 2 deep, though its first positions gained as much as one token can."""
    fallback = GoodputFallback(probe_after=8)
    fallback.prior.update("greedy", 1, [1.2], [2], first_gains=[1.0])
    run = fallback.start(start(1), DepthCosts(widen=0.3, per_depth=0.05))
    rows = torch.tensor([0])
    run.draft_rows(rows)
    run.observe(record([0], [True], [2], [2], survival=torch.tensor([[1.0, 0.2, 0.5]])))
    assert run.draft_rows(rows).tolist() == [2]


def test_rows_are_not_reprobed_where_enough_drafted_rows_gained_nothing():
    """Where 8 drafted rows at this batch size gained nothing, skipped rows are never probed again (after 7 they
    still are: too little to rule probes out); once a row there has gained enough to pay, probing resumes."""
    for evidence, probed in ((7, True), (8, False)):
        fallback = GoodputFallback(smoothing=1.0, probe_after=1)
        fallback.prior.update("greedy", 2, torch.zeros(evidence, dtype=torch.float64), torch.zeros(evidence, dtype=torch.long))
        run = fallback.start(start(2), Costs(draft_row=0.3))
        rows = torch.tensor([0, 1])
        drafted = []
        for _ in range(6):
            drafted.append((run.draft_rows(rows) > 0).tolist())
            observe(run, [0, 1], drafted[-1], [0, 0], [0, 0])
        assert any(any(step) for step in drafted) == probed
    fallback.prior.update("greedy", 2, torch.tensor([3.0]), torch.tensor([3]))
    assert (run.draft_rows(rows) > 0).tolist() == [True, True]


def _priced_out(fallback: GoodputFallback) -> GoodputFallback:
    """``fallback`` whose prior at 2 greedy rows holds 8 drafted rows that gained nothing: no row pays, no probe could."""
    fallback.prior.update("greedy", 2, torch.zeros(8, dtype=torch.float64), torch.zeros(8, dtype=torch.long))
    return fallback


def test_a_generation_whose_first_choice_drafts_for_no_row_runs_as_plain_decoding():
    """drafts is False where no row pays and no probe could; True for a batch size nothing is known about, where a row
    pays, and where drafting costs nothing to skip."""
    fallback = _priced_out(GoodputFallback(smoothing=1.0))
    assert fallback.start(start(2), Costs(draft_row=0.3)).drafts is False
    assert fallback.start(start(3), Costs(draft_row=0.3)).drafts is True  # nothing known at 3 rows
    assert fallback.start(start(2), Costs()).drafts is True  # free drafting: every row is drafted for
    fallback.prior.update("greedy", 2, torch.tensor([3.0], dtype=torch.float64), torch.tensor([3]))
    assert fallback.start(start(2), Costs(draft_row=0.3)).drafts is True  # rows here now gain 3 tokens a step


@pytest.mark.parametrize("draft_row, min_gain, drafts", [(0.2, 0.05, True), (0.23, 0.05, False), (0.23, 0.0, True)])
def test_a_generation_drafts_only_where_its_first_choice_gains_generation_min_gain(draft_row, min_gain, drafts):
    """Rows here gained 0.5 a step; drafting both costs 0.4 or 0.46 of a step, so Θ = 3 / 1.4 or 3 / 1.46 against 2
    tokens a step drafting none: +7.1% or +2.7%. The generation drafts at generation_min_gain=0.05 in the first case
    only, and in both at 0."""
    fallback = GoodputFallback(generation_min_gain=min_gain)
    fallback.prior.update("greedy", 2, torch.full((8,), 0.5, dtype=torch.float64), torch.ones(8, dtype=torch.long))
    run = fallback.start(start(2), Costs(draft_row=draft_row))
    rows = [0, 1]
    assert run.predicted_gain(rows, [True, True], run.depths(rows)[0]) == pytest.approx(3 / (1 + 2 * draft_row) / 2 - 1)
    assert run.predicted_gain(rows, [False, False], run.depths(rows)[0]) == 0.0  # drafting no row adds nothing
    assert run.drafts is drafts


@pytest.mark.parametrize("draft_row, drafts", [(0.45, True), (0.55, False)])
def test_a_one_row_generation_drafts_wherever_its_first_choice_drafts(draft_row, drafts):
    """One row that gained 0.5 a step: drafting it costs 0.45 or 0.55 of a step, so Θ = 1.5 / 1.45 (+3.4%, under the
    5% generation_min_gain) or 1.5 / 1.55 (a loss) against 1. At one row no margin is asked: at 0.45 the generation
    drafts, at 0.55 it runs as plain decoding."""
    fallback = GoodputFallback()
    fallback.prior.update("greedy", 1, torch.full((8,), 0.5, dtype=torch.float64), torch.ones(8, dtype=torch.long))
    run = fallback.start(start(1), Costs(draft_row=draft_row))
    rows = [0]
    assert run.predicted_gain(rows, [True], run.depths(rows)[0]) == pytest.approx(1.5 / (1 + draft_row) - 1)
    assert run.drafts is drafts


def test_after_generation_probe_after_plain_generations_one_is_probed_and_the_wait_doubles():
    """With generation_probe_after=2 and a cap of 4: two plain generations, a probed one, four plain, a probed one, four
    plain, ...; a probed generation's first step drafts every row though no probe could pay, later steps judge
    probes as usual; a generation whose first choice drafts starts the count over."""
    fallback = _priced_out(GoodputFallback(smoothing=1.0, generation_probe_after=2, max_generation_probe_interval=4))
    costs = Costs(draft_row=0.3)
    rows = torch.tensor([0, 1])
    pattern = []
    for _ in range(13):
        run = fallback.start(start(2), costs)
        pattern.append(run.drafts)
        if run.drafts:
            steps = []
            for _ in range(4):
                steps.append((run.draft_rows(rows) > 0).tolist())
                observe(run, [0, 1], steps[-1], [0, 0], [0, 0])
            assert steps == [[True, True]] + [[False, False]] * 3
    assert pattern == [False, False, True] + [False] * 4 + [True] + [False] * 4 + [True]
    assert fallback.start(start(2), Costs()).drafts is True  # free drafting: its first choice drafts
    assert [fallback.start(start(2), costs).drafts for _ in range(3)] == [False, False, True]  # the count started over


def test_cheap_probes_go_on_where_no_row_ever_gained_enough():
    """Where probing every probe_after steps costs less than the probe budget, 8 drafted rows that gained nothing
    do not stop the probes (prompt lookup finds a match only now and then)."""
    fallback = GoodputFallback(smoothing=1.0, probe_after=2)
    fallback.prior.update("greedy", 1, torch.zeros(8, dtype=torch.float64), torch.zeros(8, dtype=torch.long))
    run = fallback.start(start(1), Costs(draft_row=0.001))
    drafted = []
    for _ in range(9):
        drafted.append(bool(run.draft_rows(torch.tensor([0]))[0] > 0))
        observe(run, [0], [drafted[-1]], [1 if drafted[-1] else 0], [0])
    assert [step for step, flag in enumerate(drafted) if flag] == [0, 3, 6]  # a first probe, then every probe_after


def test_cheap_probes_do_not_start_a_generation_where_no_row_ever_gained_enough():
    """Probes too cheap to give up go on inside a drafting generation but do not start one: where 8 drafted rows at
    this batch size gained nothing, generations run as plain decoding however cheap the drafter, until a probed one
    (whose rows are then probed every probe_after steps) or a row that gained enough to pay."""
    fallback = _priced_out(GoodputFallback(smoothing=1.0, probe_after=2, generation_probe_after=2))
    costs = Costs(draft_row=0.001)
    runs = [fallback.start(start(2), costs) for _ in range(3)]
    assert [run.drafts for run in runs] == [False, False, True]
    rows, drafted = torch.tensor([0, 1]), []
    for _ in range(9):
        drafted.append((runs[-1].draft_rows(rows) > 0).tolist())
        observe(runs[-1], [0, 1], drafted[-1], [1 if flag else 0 for flag in drafted[-1]], [0, 0])
    assert [step for step, flags in enumerate(drafted) if any(flags)] == [0, 3, 6]
    fallback.prior.update("greedy", 2, torch.tensor([3.0], dtype=torch.float64), torch.tensor([3]))
    assert fallback.start(start(2), costs).drafts is True


def test_the_ceiling_counts_each_row_once_a_generation():
    """At one row the probe ceiling rests on prompts, not steps: after a generation that drafted 15 steps and had
    nothing accepted, the next still probes its row at its first step; after 8 such generations one runs as plain
    decoding."""
    fallback = GoodputFallback(smoothing=1.0)
    costs = Costs(draft_row=0.3)
    for generation in range(8):
        run = fallback.start(start(1), costs)
        assert run.drafts is True, f"generation {generation}"
        for _ in range(15):
            observe(run, [0], [True], [1], [0])
        assert fallback.prior.evidence("greedy", 1) == generation + 1
    assert fallback.start(start(1), costs).drafts is False


@pytest.mark.parametrize("first_steps", [-1, 3, True, 1.0])
def test_the_prior_refuses_first_steps_outside_the_drafted_rows(first_steps):
    """first_steps must be an int from 0 to the number of drafted rows; the error names the argument and the value."""
    with pytest.raises(ValueError, match=f"first_steps must be an int in \\[0, 2\\] \\(the drafted rows\\), got {first_steps!r}"):
        GainPrior().update("greedy", 2, [0.5, 0.5], [1, 1], [0, 1], first_steps=first_steps)


@attrs.frozen
class CountingFallback(GoodputFallback):
    """GoodputFallback that counts how often its rule is evaluated."""

    calls: list = attrs.field(factory=list, eq=False)

    def choose(self, *arguments):
        self.calls.append(1)
        return super().choose(*arguments)


@attrs.frozen
class OneAnswerFallback(GoodputFallback):
    """GoodputFallback whose rule answers one flag whatever the number of candidates."""

    def choose(self, *arguments):
        return torch.tensor([True])


def test_a_choose_answer_not_shaped_like_its_candidates_is_refused():
    """An overridden choose must return one flag per candidate row: a wrong shape is a TypeError naming it."""
    fallback = OneAnswerFallback()
    fallback.prior.update("greedy", 2, [0.5, 0.5], [1, 1])  # both rows start observed, so both are candidates
    with pytest.raises(TypeError, match=r"OneAnswerFallback.choose must return a BoolTensor\[2\]"):
        fallback.start(start(2), Costs(draft_row=0.1))


def test_a_choice_to_draft_nothing_stands_until_what_it_read_changes():
    """Once no row is worth drafting, later steps reuse that choice without evaluating the rule, until the idle
    time or the prior changes or a row is due a probe; then the rule is evaluated again."""
    fallback = CountingFallback(smoothing=1.0, probe_after=8)
    run = fallback.start(start(2), Costs(draft_row=0.3))
    rows = torch.tensor([0, 1])

    def step():
        drafting = (run.draft_rows(rows) > 0).tolist()
        observe(run, [0, 1], drafting, [1 if drafted else 0 for drafted in drafting], [0, 0])
        return drafting

    assert step() == [True, True]  # nothing known yet; g = 0 from now on
    assert step() == [False, False]  # this step also learns the idle time
    fallback.calls.clear()
    # One choice evaluates the rule twice: at the rows' own depths, then the one-token offer.
    assert [step() for _ in range(3)] == [[False, False]] * 3 and len(fallback.calls) == 2
    fallback.prior.update("greedy", 2, torch.tensor([0.5]), torch.tensor([1]))
    assert [step() for _ in range(3)] == [[False, False]] * 3 and len(fallback.calls) == 4
    # due after 8 skipped steps, and a probe could now pay
    assert [step() for _ in range(2)] == [[False, False], [True, True]] and len(fallback.calls) >= 5


def test_draft_depths_reads_every_form_of_answer():
    """None is γ for every row, a BoolTensor γ or 0, an integer tensor its values clamped to 0..γ; anything else is refused."""
    assert draft_depths(None, 3, 4).tolist() == [4, 4, 4]
    assert draft_depths(torch.tensor([True, False, True]), 3, 4).tolist() == [4, 0, 4]
    assert draft_depths(torch.tensor([2, 0, 9]), 3, 4).tolist() == [2, 0, 4]
    for bad in (torch.tensor([0.5, 1.0, 2.0]), torch.tensor([1, 2]), [1, 2, 3]):
        with pytest.raises(TypeError, match="draft_rows"):
            draft_depths(bad, 3, 4)


@pytest.mark.parametrize("margin", [0, 1, 2, None])
def test_a_drafted_row_is_drafted_as_deep_as_it_has_been_verified_and_deeper_on_one_step_in_probe_after(margin):
    """Depth ⌈λ_r⌉, at least 1 and at most γ, plus depth_margin on every probe_after-th drafted step of the row's own;
    γ for a row never observed or with depth_margin None."""
    run = GoodputFallback(smoothing=1.0, depth_margin=margin, probe_after=2, prior_weight=0.0).start(start(3), DepthCosts(per_depth=0.05))
    rows = torch.tensor([0, 1, 2])
    assert run.draft_rows(rows).tolist() == [4, 4, 4]
    run.observe(record([0, 1], [True, True], [1, 2], [1, 1], survival=torch.full((2, 4), 0.9)))
    assert run.draft_rows(rows).tolist() == ([4, 4, 4] if margin is None else [1, 2, 4])  # the rows' first own step: no margin
    run.observe(record([0, 1], [True, True], [1, 2], [1, 1], survival=torch.full((2, 4), 0.9)))
    explored = [4, 4, 4] if margin is None else [max(1, min(4, 1 + margin)), min(4, 2 + margin), 4]
    assert run.draft_rows(rows).tolist() == explored  # their second: one in probe_after = 2 explores deeper


@attrs.frozen
class DepthCosts(Costs):
    """Costs whose drafting pass costs ``per_depth`` per drafted token, and records the depths it priced."""

    per_depth: float = 0.0
    priced: list = attrs.field(factory=list, eq=False)

    def draft_time(self, rows: int, depth: int | None = None) -> float:
        self.priced.append(depth)
        return self.per_depth * (4 if depth is None else depth)


@pytest.mark.parametrize("margin, drafted", [(0, True), (None, False)])
def test_drafting_is_priced_at_the_depth_the_row_would_be_drafted(margin, drafted):
    """A row verified one token a step gains 0.2 of a step: one token deep (0.1 of a step) pays, a 4-deep pass (0.4) does not."""
    costs = DepthCosts(per_depth=0.1)
    run = GoodputFallback(smoothing=1.0, depth_margin=margin, probe_after=64).start(start(1), costs)
    rows = torch.tensor([0])
    run.draft_rows(rows)  # unobserved: drafted
    run.observe(record([0], [True], [1], [0], survival=torch.tensor([[0.2, 0.0, 0.0, 0.0]])))
    assert bool(run.draft_rows(rows)[0] > 0) is drafted
    assert costs.priced[-1] == (1 if margin == 0 else 4)


@pytest.mark.parametrize("per_depth, depth", [(0.001, 4), (0.1, 1)])
def test_a_row_is_drafted_a_whole_block_deep_where_the_deeper_tokens_cost_next_to_nothing(per_depth, depth):
    """Three more tokens at 0.001 of a step each (within the 0.5% budget) are drafted rather than cut; at 0.1 each they are not."""
    costs = DepthCosts(per_depth=per_depth)
    run = GoodputFallback(smoothing=1.0, depth_margin=0, prior_weight=0.0).start(start(1), costs)
    rows = torch.tensor([0])
    run.draft_rows(rows)
    run.observe(record([0], [True], [1], [1], survival=torch.tensor([[0.9, 0.0, 0.0, 0.0]])))
    assert run.draft_rows(rows).tolist() == [depth]


def test_reach_depth_by_hand():
    """T(1, 2..6) = 1.2, 1.1, 0.95, 1.0, 1.3 with D = 0.01 a token: from depths 1 (1.21) and 2 (1.12) the deepest step no
    dearer is 4 (1.04); from 3 (0.98) it stays; rising costs keep every depth; a row not drafted stays at 0; a depth
    past γ is refused."""
    step_costs = [0.01 * depth + step for depth, step in enumerate([1.2, 1.1, 0.95, 1.0, 1.3], start=1)]
    assert [reach_depth(depth, step_costs) for depth in range(6)] == [0, 4, 4, 3, 4, 5]
    assert [reach_depth(depth, [1.0, 2.0, 3.0]) for depth in range(1, 4)] == [1, 2, 3]
    with pytest.raises(ValueError, match="depth must be at most"):
        reach_depth(4, [1.0, 2.0, 3.0])


@settings(max_examples=300, deadline=None)
@given(depth_cost_curves())
def test_reach_depth_is_the_deepest_step_no_dearer(curves):
    """Whatever the shapes of T and D: the reached depth is in depth..γ, costs no more than depth's step, no deeper
    one does, and reaching again from it stays there."""
    gamma, steps, drafts = curves
    step_costs = [drafts[depth - 1] + steps[depth] for depth in range(1, gamma + 1)]
    for depth in range(1, gamma + 1):
        reached = reach_depth(depth, step_costs)
        assert depth <= reached <= gamma and step_costs[reached - 1] <= step_costs[depth - 1]
        assert all(step_costs[deeper - 1] > step_costs[depth - 1] for deeper in range(reached + 1, gamma + 1))
        assert reach_depth(reached, step_costs) == reached


@pytest.mark.parametrize("reach, depth", [(True, 3), (False, 1)])
def test_a_row_verified_one_token_deep_is_drafted_to_the_cheaper_wider_step(reach, depth):
    """Steps of 1.0, 1.3, 1.1, 0.9 and 1.1 for one to five tokens, drafting 0.1 a token deep: a row verified one token a
    step (λ = 1) is drafted 3 deep, where a four-token step (0.9 + 0.3) costs less than a two-token one (1.3 + 0.1), and
    1 deep with ``reach_cheaper_widths=False``."""
    dipping = WidthTable(seconds=(1.0, 1.3, 1.1, 0.9, 1.1), draft_row=0.0, draft_depth=0.1)
    run = GoodputFallback(smoothing=1.0, depth_margin=0, prior_weight=0.0, reach_cheaper_widths=reach).start(start(1), dipping)
    rows = torch.tensor([0])
    run.draft_rows(rows)
    run.observe(record([0], [True], [1], [1], survival=torch.tensor([[0.9, 0.5, 0.5, 0.5]])))
    assert run.draft_rows(rows).tolist() == [depth]


@pytest.mark.parametrize(("verify_lengths", "depth"), [([1] * 12 + [2], 1), ([1] * 11 + [2, 2], 2), ([2], 2)])
def test_one_deeper_verification_in_a_smoothed_verify_length_does_not_deepen_the_draft(verify_lengths, depth):
    """At α = 0.1, λ_r 1.1 after twelve one-token steps and one two-token step drafts one deep (within the tolerance α);
    two two-token steps in a row (λ_r 1.19) draft two deep, and so does a first step of two (λ_r 2)."""
    costs = DepthCosts(per_depth=0.01)
    run = GoodputFallback(probe_after=64, reach_cheaper_widths=False).start(start(1), costs)
    rows = torch.tensor([0])
    for verify_length in verify_lengths:
        run.draft_rows(rows)
        run.observe(record([0], [True], [verify_length], [verify_length], survival=torch.full((1, 4), 0.9)))
    assert run.depths([0])[0] == [depth]


def test_the_margins_exploring_steps_do_not_price_a_row_out():
    """A row gaining 0.15 a step pays for a one-deep pass (0.1 of a step) but not a two-deep one (0.2): it is drafted on
    every step, two deep on each fourth (the margin explores), because the choice prices the depth without the margin."""
    costs = DepthCosts(per_depth=0.1)
    run = GoodputFallback(smoothing=1.0, prior_weight=0.0, probe_after=4, reach_cheaper_widths=False).start(start(1), costs)
    rows = torch.tensor([0])
    depths = []
    for _ in range(9):
        depths.append(int(run.draft_rows(rows)[0]))
        run.observe(record([0], [depths[-1] > 0], [1], [0], survival=torch.tensor([[0.15, 0.0, 0.0, 0.0]])))
    assert depths == [4, 1, 1, 1, 2, 1, 1, 1, 2]


def test_the_realised_ratio_is_accepted_over_expected_with_pseudo_tokens_and_a_discount():
    """ρ starts at 1, is (accepted + 32) / (expected + 32) over the drafted rows, discounts older steps by its
    discount (0.98 here) and ignores updates without accepted counts."""
    prior = GainPrior(realised_discount=0.98)
    assert prior.realised_ratio("greedy") == 1.0
    prior.update("greedy", 2, torch.tensor([2.0, 2.0]), torch.tensor([2, 2]), torch.tensor([1, 0]))
    assert prior.realised_ratio("greedy") == pytest.approx(33 / 36)
    prior.update("greedy", 2, torch.tensor([1.0]), torch.tensor([1]), torch.tensor([1]))
    prior.update("greedy", 2, torch.tensor([5.0]), torch.tensor([1]))
    assert prior.realised_ratio("greedy") == pytest.approx((0.98 * 1 + 1 + 32) / (0.98 * 4 + 1 + 32))
    assert prior.realised_ratio("sampling") == 1.0


def test_the_realised_ratio_ages_towards_one_over_steps_that_draft_nothing():
    """Ageing by k steps discounts ρ's sums by discount^k without counting as an update: 3 accepted of 13 expected
    gives (3 + 32) / (13 + 32) = 0.78, and 300 steps at 0.99 later ρ is back above 0.95; an unknown band stays at 1."""
    prior = GainPrior(realised_discount=0.99)
    prior.update("sampling", 1, torch.tensor([13.0]), torch.tensor([1]), torch.tensor([3]))
    version = prior.version
    assert prior.realised_ratio("sampling") == pytest.approx(35 / 45)
    prior.age("sampling", 300)
    factor = 0.99 ** 300
    assert prior.realised_ratio("sampling") == pytest.approx((3 * factor + 32) / (13 * factor + 32))
    assert 0.95 < prior.realised_ratio("sampling") < 1.0 and prior.version == version
    prior.age("greedy", 5)
    assert prior.realised_ratio("greedy") == 1.0


def test_steps_and_generations_that_draft_nothing_age_the_realised_ratio():
    """A step that drafts for no row ages ρ's sums by one step, and a one-row generation run as plain decoding (its
    drafting priced far above any gain, with enough evidence for the ceiling to keep probes out) by its 64 steps."""
    prior = GainPrior(realised_discount=0.9)
    for _ in range(8):
        prior.update("greedy", 1, torch.tensor([1.0], dtype=torch.float64), torch.tensor([1]), torch.tensor([0]))
    run = GoodputFallback(prior=prior).start(start(1), Costs(draft_row=0.3))
    before = prior.realised["greedy"]
    run.observe(record([0], [False], [0], [0]))
    assert prior.realised["greedy"] == pytest.approx(tuple(0.9 * value for value in before))
    before = prior.realised["greedy"]
    plain = GoodputFallback(prior=prior).start(start(1), Costs(draft_row=100.0))
    assert not plain.drafts
    assert prior.realised["greedy"] == pytest.approx(tuple(0.9 ** 64 * value for value in before))


def test_the_priors_gain_is_the_mean_of_its_first_steps_then_smoothed():
    """With smoothing 0.25 the prior's (g, λ) is the mean of the first 4 steps at a batch size, then moves a quarter of
    the way to each new step; with the default 0.01, one first step of gain 1 followed by 20 of gain 0 leaves the
    mean 1/21, not a first step that still weighs 0.99^20."""
    prior = GainPrior(smoothing=0.25)
    for gain, expected in ((1.0, 1.0), (0.0, 0.5), (0.5, 0.5), (0.5, 0.5), (1.0, 0.625)):
        prior.update("greedy", 2, torch.tensor([gain], dtype=torch.float64), torch.tensor([1]))
        assert prior.get("greedy", 2) == pytest.approx((expected, 1.0))
    prior = GainPrior()
    for gain in [1.0] + [0.0] * 20:
        prior.update("greedy", 16, torch.tensor([gain], dtype=torch.float64), torch.tensor([1]))
    assert prior.get("greedy", 16)[0] == pytest.approx(1 / 21)


def test_the_priors_first_position_gain_is_smoothed_like_its_gain():
    """g¹ is the mean of the first steps' first-position gains, then smoothed with g's weight; None until an update
    passes some; one value per drafted row or a ValueError naming the count."""
    prior = GainPrior(smoothing=0.25)
    prior.update("greedy", 2, [1.0], [1])
    assert prior.first_gain("greedy", 2) is None
    for first, expected in ((0.4, 0.4), (0.0, 0.2), (0.5, 0.3), (1.0, 0.475), (0.0, 0.35625)):
        prior.update("greedy", 2, [1.0], [1], first_gains=[first])
        assert prior.first_gain("greedy", 2) == pytest.approx(expected)
    with pytest.raises(ValueError, match=r"first_gains must hold one value per drafted row \(2\), got 1"):
        prior.update("greedy", 2, [1.0, 1.0], [1, 1], first_gains=[0.5])


def test_the_first_positions_realised_ratio_is_kept_apart_and_ages_alike():
    """ρ¹ counts min(n_r, 1) against g¹ where ρ counts n_r against g: ten steps that expected 2 tokens (0.8 of them from
    the first position) and accepted 1 read ρ = 42/52 and ρ¹ = 42/40; steps that draft nothing age both sums alike."""
    prior = GainPrior(realised_discount=1.0)
    for _ in range(10):
        prior.update("greedy", 1, [2.0], [3], [1], first_gains=[0.8])
    assert prior.realised_ratio("greedy") == pytest.approx(42 / 52)
    assert prior.realised_ratio("greedy", first=True) == pytest.approx(42 / 40)
    prior = GainPrior(realised_discount=0.5)
    prior.update("greedy", 1, [2.0], [3], [1], first_gains=[0.8])
    prior.age("greedy", steps=2)
    assert prior.realised_first["greedy"] == pytest.approx((0.25, 0.2)) and prior.realised["greedy"] == pytest.approx((0.25, 0.5))


def test_the_selection_ratio_is_what_chosen_rows_gained_over_what_their_choice_read():
    """φ starts at 1 and is (gained + 32) / (read + 32) per band and batch-size bucket, discounted as ρ's sums are
    before each update and aged by steps that draft nothing in its band; a bad sum is refused, naming it."""
    prior = GainPrior(realised_discount=0.9)
    assert prior.selection_ratio("greedy", 2) == 1.0
    version = prior.version
    prior.update_selection("greedy", 2, 1.0, 3.0)
    assert prior.selection_ratio("greedy", 2) == pytest.approx(33 / 35) and prior.version == version + 1
    prior.update_selection("greedy", 2, 0.0, 2.0)
    assert prior.selection_ratio("greedy", 2) == pytest.approx((0.9 * 1 + 32) / (0.9 * 3 + 2 + 32))
    assert prior.selection_ratio("greedy", 1) == prior.selection_ratio("greedy", 4) == prior.selection_ratio("sampling", 2) == 1.0
    assert prior.selection_ratio("greedy", 3) == pytest.approx(prior.selection_ratio("greedy", 4)) == 1.0  # 3 rows: bucket 4
    prior.age("sampling", 50)
    assert prior.selection_ratio("greedy", 2) == pytest.approx((0.9 * 1 + 32) / (0.9 * 3 + 2 + 32))
    prior.age("greedy", 2)
    assert prior.selection_ratio("greedy", 2) == pytest.approx((0.81 * 0.9 + 32) / (0.81 * (0.9 * 3 + 2) + 32))
    for gained, read, name in ((-0.1, 1.0, "gained"), (1.0, float("inf"), "read"), (True, 1.0, "gained")):
        with pytest.raises(ValueError, match=f"{name} must be a finite number >= 0, got {gained if name == 'gained' else read!r}"):
            prior.update_selection("greedy", 2, gained, read)


def test_rows_chosen_at_their_own_depth_teach_the_selection_ratio_and_offered_or_probed_rows_do_not():
    """A row the rule chooses on ĝ = 1.2 (the prior's) whose step then gains 0.6 (a = 0.5 and 0.5·0.2 over its two
    verified tokens) adds (0.6, 1.2) to φ's sums; a first probe of a row the prior knows nothing of, and a row drafted
    on the one-token offer, add nothing."""
    fallback = GoodputFallback(probe_after=8)
    fallback.prior.update("greedy", 1, [1.2], [2], first_gains=[1.0])
    run = fallback.start(start(1), DepthCosts(widen=0.3, per_depth=0.05))
    assert run.draft_rows(torch.tensor([0])).tolist() == [3]  # its own depth and the margin's exploring token
    run.observe(record([0], [True], [2], [1], survival=torch.tensor([[0.5, 0.2, 0.1]])))
    assert fallback.prior.selected == {("greedy", 1): pytest.approx((0.6, 1.2))}
    probed = GoodputFallback(probe_after=8)
    run = probed.start(start(2), Costs(draft_row=0.1))
    assert run.draft_rows(torch.tensor([0, 1])).tolist() == [4, 4]  # unobserved: probed
    run.observe(record([0, 1], [True, True], [1, 1], [1, 0], survival=torch.full((2, 4), 0.5)))
    assert probed.prior.selected == {}
    offered = GoodputFallback(probe_after=8)
    offered.prior.update("greedy", 1, [0.6], [2], first_gains=[0.45])
    run = offered.start(start(1), DepthCosts(widen=0.3, per_depth=0.05))
    assert run.draft_rows(torch.tensor([0])).tolist() == [1]  # the one-token offer
    run.observe(record([0], [True], [1], [1], survival=torch.tensor([[0.45, 0.3, 0.5]])))
    assert offered.prior.selected == {}


def test_a_rows_read_estimate_serves_only_the_step_it_was_chosen_for():
    """Two rows chosen on ĝ = 1; the second then gains nothing, is left out, and is probed two steps later: that probe
    adds nothing to φ's sums, though the choice that last chose it read 1 for it."""
    fallback = GoodputFallback(smoothing=1.0, prior_weight=0.0, probe_after=1, prior=GainPrior(realised_discount=1.0))
    run = fallback.start(start(2), Costs(draft_row=0.2))
    rows = torch.tensor([0, 1])
    choices = []
    for second_row_confidence in (1.0, 0.0, 0.0, 0.5):  # a probe, both chosen, the first alone, the second probed
        depths = run.draft_rows(rows)
        choices.append(depths.gt(0).tolist())
        survival = torch.tensor([[1.0, 0, 0, 0], [second_row_confidence, 0, 0, 0]])
        run.observe(record([0, 1], choices[-1], [1, 1], [1, int(second_row_confidence == 1.0)], survival=survival))
    assert choices == [[True, True], [True, True], [True, False], [True, True]]
    assert run.read_gain == [1.0, None]
    assert fallback.prior.selected == {("greedy", 2): pytest.approx((1.0 + 0.0 + 1.0 + 1.0, 2.0 + 1.0 + 1.0))}


@pytest.mark.parametrize("selected, drafts", [(None, True), ((32.0, 96.0), False)])
def test_a_selection_ratio_below_one_keeps_out_a_row_that_pays_only_on_what_its_choice_reads(selected, drafts):
    """At T = 1 and D = 0.3 a row estimated at ĝ = 0.5 pays on its estimate (Θ = 1.5 / 1.3), but not where chosen rows
    have gone on to gain half what their choice read (φ = 64 / 128: Θ = 1.25 / 1.3)."""
    fallback = GoodputFallback(prior_weight=0.0)
    fallback.prior.update("greedy", 1, [0.5], [1])
    if selected is not None:
        fallback.prior.update_selection("greedy", 1, *selected)
    run = fallback.start(start(1), Costs(draft_row=0.3))
    phi = fallback.prior.selection_ratio("greedy", 1)
    assert phi == pytest.approx(1.0 if selected is None else 0.5)
    assert run.predicted_gain([0], [True], [1]) == pytest.approx((1 + 0.5 * phi) / 1.3 - 1)
    assert run._rule_choice([0], [True], [1]) == [drafts]  # the rule itself: draft_rows would first-probe the row


def test_drafting_steps_that_choose_no_row_age_the_selection_ratio():
    """A φ of 0.5 keeps a row out; steps that draft only a probe still discount φ's sums (by 0.9 each here), so φ
    drifts back towards 1, as ρ does."""
    prior = GainPrior(realised_discount=0.9)
    prior.update_selection("greedy", 1, 32.0, 96.0)
    run = GoodputFallback(prior=prior).start(start(1), Costs(draft_row=0.3))
    for _ in range(10):
        run.observe(record([0], [True], [1], [0], survival=torch.full((1, 4), 0.5)))  # a probe: no read estimate
    assert prior.selection_ratio("greedy", 1) == pytest.approx((0.9 ** 10 * 32 + 32) / (0.9 ** 10 * 96 + 32))


def test_a_probe_near_break_even_is_priced_at_what_it_loses_not_its_drafting_time():
    """At T = 1 s and D = 0.3 s, drafting a row estimated to gain 0.29 a step loses 1.29·(1.3/1.29 − 1) = 0.01 s, so its
    probes wait at most probe_after steps; one estimated to gain nothing loses the whole 0.3 s, so its waits grow to
    max_probe_interval (D / (0.005·T) = 60 steps, above it)."""
    for gain, loss, interval in ((0.29, 0.01, 2), (0.0, 0.3, 8)):
        fallback = GoodputFallback(smoothing=1.0, probe_after=2, max_probe_interval=8, prior_weight=0.0)
        run = fallback.start(start(1), Costs(draft_row=0.3))
        run.observed[0], run.gain[0], run.verify[0] = True, gain, 1.0
        assert run.probe_loss([0], [False], [1]) == pytest.approx(loss)
        assert run.probe_loss([0], [True], [1]) is None  # nothing to probe beside the chosen rows
        assert run.probe_interval_cap(1, 1, loss) == interval
    assert run.probe_interval_cap(1, 1) == 8  # without a loss, D prices the probe


@pytest.mark.parametrize(("memory", "drafted"), [((0.05, 0.98), False), (None, True)])
def test_one_prompt_that_accepts_nothing_does_not_price_the_next_prompts_rows_out(memory, drafted):
    """After 150 drafted steps that accepted the 0.5 a step predicted, then 60 that accepted none of it, a new row
    (first probed, then predicted 0.5 again) is drafted at its second step (D = 0.36, T = 1: it pays where ρ > 0.72)
    with the default memory (ρ over about 500 steps: 0.76), and skipped with ρ over about 50 steps (0.69)."""
    prior = GainPrior() if memory is None else GainPrior(smoothing=memory[0], realised_discount=memory[1])
    for step in range(210):
        # One token verified a step: its first position is all it gains, so ρ¹ (the one-token offer's) reads as ρ.
        prior.update("greedy", 1, torch.tensor([0.5], dtype=torch.float64), torch.tensor([1]), torch.tensor([step % 2 if step < 150 else 0]),
                     first_gains=[0.5])
    run = GoodputFallback(prior=prior).start(start(1), Costs(draft_row=0.36))
    rows = torch.tensor([0])
    assert run.draft_rows(rows).tolist() != [0]
    run.observe(record([0], [True], [1], [0], survival=torch.tensor([[0.5, 0.0, 0.0, 0.0]])))
    assert (run.draft_rows(rows).tolist() != [0]) == drafted


@pytest.mark.parametrize("argument", ["smoothing", "realised_discount"])
@pytest.mark.parametrize("value", [0.0, 1.5, True, "0.1"])
def test_the_prior_refuses_a_memory_outside_its_range(argument, value):
    """smoothing and realised_discount must be numbers in (0, 1]; the error names the argument and the value."""
    with pytest.raises(ValueError, match=f"{argument} must be a number in \\(0, 1\\], got {value!r}"):
        GainPrior(**{argument: value})


def test_a_row_whose_drafts_yield_less_than_predicted_stops_being_drafted_and_is_still_probed():
    """A row predicted to gain 0.5 a step (survival 0.5) that never has a token accepted is drafted while
    ρ·0.5 pays for D = 0.3 (ρ = 32 / (32 + 0.5·n), n such steps discounted: about 45), then skipped; the probe ceiling is not
    scaled by ρ, so it is still re-probed."""
    fallback = GoodputFallback(smoothing=1.0, probe_after=4, max_probe_interval=4)
    run = fallback.start(start(1), Costs(draft_row=0.3))
    rows = torch.tensor([0])
    drafted = []
    for _ in range(60):
        drafted.append(bool(run.draft_rows(rows)[0] > 0))
        verify = 1 if drafted[-1] else 0
        run.observe(record([0], [drafted[-1]], [verify], [0], survival=torch.full((1, 4), 0.5)))
    first_skip = drafted.index(False)
    assert 40 <= first_skip <= 50 and fallback.prior.realised_ratio("greedy") * 0.5 < 0.3
    assert drafted[first_skip : first_skip + 5] == [False] * 4 + [True]


def test_a_pass_after_skipped_steps_teaches_their_catch_up_which_then_prices_resuming():
    """Passes that end 4 and 2 skipped steps took 0.4 s and 0.2 s over the drafting time: 0.1 s per skipped step
    (one pass alone teaches nothing yet). Three skipped steps later resuming costs D + 0.3, so a row gaining 0.3 a
    step is not drafted, and is right after a drafted step."""
    run = GoodputFallback(smoothing=1.0, prior_weight=0.0).start(start(1), Costs(draft_row=0.1))
    run.observe(record([0], [True], [1], [1], draft_seconds=0.1))
    for skipped, teaches in ((4, None), (2, pytest.approx(0.1))):
        for _ in range(skipped):
            run.observe(record([0], [False], [0], [0], draft_seconds=0.0))
        run.observe(record([0], [True], [1], [1], draft_seconds=0.1 + 0.1 * skipped))
        assert run.catch_up_seconds == teaches
    assert run.resume_draft_time(1) == pytest.approx(0.1)
    for _ in range(3):
        run.observe(record([0], [False], [0], [0], draft_seconds=0.0))
    assert run.resume_draft_time(1) == pytest.approx(0.4) and run.avoidable_draft_time(1) == pytest.approx(0.1)
    run.gain[0] = run.first_gain[0] = 0.3  # one token verified a step: its first position is all it gains
    assert run.draft_rows(torch.tensor([0])).tolist() == [0]
    run.observe(record([0], [True], [1], [1], draft_seconds=0.1 + 0.3))
    run.gain[0] = run.first_gain[0] = 0.3
    assert run.draft_rows(torch.tensor([0])).tolist() != [0]


def test_the_first_pass_teaches_what_reading_the_prompt_costs_per_row_and_column():
    """First passes over a 50-token prompt of 2 rows that took 0.1 s over D(2) teach 0.001 s per row and column
    (from the second generation on: one pass may be a cold process's), kept by the prior for the next
    generation; once read, the prompt adds nothing to later passes."""
    fallback = GoodputFallback(smoothing=1.0)
    for teaches in (None, pytest.approx(0.001)):
        run = fallback.start(start(2, prompt_length=50), Costs(draft_row=0.1))
        assert run.resume_draft_time(2) == pytest.approx(0.2)
        run.observe(record([0, 1], [True, True], [1, 1], [1, 1], draft_seconds=0.3))
        assert fallback.prior.catch_up == teaches and run.resume_draft_time(2) == pytest.approx(0.2)
    later = fallback.start(start(2, prompt_length=50), Costs(draft_row=0.1))
    assert later.resume_draft_time(2) == pytest.approx(0.2 + 0.001 * 2 * 50 / 14)  # spread over the 14 steps left at most
    assert later.probe_draft_time(2) == pytest.approx(0.2 + 0.001 * 2 * 50)


def test_the_catch_up_is_the_lower_median_of_the_latest_rates_so_one_cold_pass_does_not_set_it():
    """A first pass 50 times slower per column than the next (a cold process) sets no catch-up alone, and with one
    more rate leaves it at that rate; only the latest 15 rates count."""
    prior = GainPrior()
    for rate, catch_up in ((0.05, None), (0.001, 0.001), (0.002, 0.002), (0.001, 0.001)):
        prior.remember_catch_up(rate)
        assert prior.catch_up == catch_up
    for _ in range(15):
        prior.remember_catch_up(0.002)
    assert prior.catch_up == 0.002


@pytest.mark.parametrize(("prompt_length", "probed"), [(60, False), (5, True)])
def test_a_probe_pays_for_reading_the_prompt_while_it_is_unread(prompt_length, probed):
    """With a ceiling that pays for a row's drafting (gain 3, D = 0.3, T = 1), skipped rows are probed after a
    5-token prompt but not after a 60-token one whose reading (0.02 s per row and column) no gain pays for."""
    fallback = GoodputFallback(smoothing=1.0, probe_after=1)
    for _ in range(20):
        fallback.prior.update("greedy", 2, torch.zeros(8, dtype=torch.float64), torch.zeros(8, dtype=torch.long))
    fallback.prior.update("greedy", 2, torch.tensor([3.0]), torch.tensor([3]))  # g = 3 / 21, ceiling 3
    for _ in range(2):
        fallback.prior.remember_catch_up(0.02)
    run = fallback.start(start(2, prompt_length=prompt_length), Costs(draft_row=0.3))
    rows, drafted = torch.tensor([0, 1]), []
    for _ in range(3):
        drafted.append((run.draft_rows(rows) > 0).tolist())
        observe(run, [0, 1], drafted[-1], [0, 0], [0, 0])
    assert any(any(step) for step in drafted) == probed


def test_where_drafting_costs_nothing_to_skip_every_row_is_drafted_for():
    """With a drafting time no greater than what an idle step spends (prompt lookup), rows that gained nothing
    are still drafted for, γ deep (a shallower draft would save nothing and cut matches short); with a drafting
    time above it, they are skipped."""
    for draft_row, expected in ((0.0, [4, 4]), (0.3, [0, 0])):
        run = GoodputFallback(smoothing=1.0).start(start(2), Costs(draft_row=draft_row))
        rows = torch.tensor([0, 1])
        run.draft_rows(rows)
        observe(run, [0, 1], [True, True], [1, 1], [0, 0])
        run.observe(record([0, 1], [False, False], [0, 0], [0, 0], draft_seconds=0.0))
        assert run.draft_rows(rows).tolist() == expected


@pytest.mark.parametrize("draft_row, cap", [(0.001, 2), (0.03, 6), (0.3, 8)])
def test_a_probes_wait_doubles_only_while_probing_stays_within_its_budget(draft_row, cap):
    """A row that never pays is probed after waits that double from 2 up to where probing costs 0.5% of the time
    (D / 0.005·T, T = 1 s) or max_probe_interval (8): a nearly free drafter keeps being probed every 2 steps."""
    fallback = GoodputFallback(smoothing=1.0, probe_after=2, max_probe_interval=8, prior_weight=0.0)
    run = fallback.start(start(1), Costs(draft_row=draft_row))
    assert run.probe_interval_cap(1) == cap
    rows = torch.tensor([0])
    for step in range(40):
        drafted = (run.draft_rows(rows) > 0).tolist()
        observe(run, [0], drafted, [1 if drafted[0] else 0], [1 if step == 0 else 0])
    assert int(run.interval[0]) == cap


@attrs.frozen
class WidthTable:
    """T(R, w) = seconds[w − 1] at any R: by default a step verifying four tokens costs 10% over one token, one verifying
    a single token 16% over (the shape measured on a CPU where two-row products are slow); D(k, d) = draft_row·k +
    draft_depth·d (d = 4, the whole block, when None)."""

    seconds: tuple[float, ...] = (1.0, 1.16, 1.13, 1.12, 1.10)
    draft_row: float = 0.02
    draft_depth: float = 0.0

    def step_time(self, rows: int, tokens: int) -> float:
        return self.seconds[tokens - 1]

    def draft_time(self, rows: int, depth: int | None = None) -> float:
        return self.draft_row * rows + self.draft_depth * (4 if depth is None else depth)


def _bursty_run(verify_lengths: list[int], accepted: list[int]):
    run = GoodputFallback(prior_weight=0.0).start(start(1), WidthTable())
    for verify_length, accepted_count in zip(verify_lengths, accepted):
        run.observe(record([0], [True], [verify_length], [accepted_count]))
    return run


def test_a_row_is_priced_at_the_width_its_steps_cost_on_average():
    """Four tokens verified on two of eight steps: λ = 1, but the steps cost 1.025 of a one-token step on average,
    nearest width 0 (1.0) rather than width 1 (1.16); a row verifying one token every step is priced at width 1."""
    bursty = _bursty_run([4, 0, 0, 0, 4, 0, 0, 0], [0] * 8)
    assert round(bursty.verify[0]) == 1 and bursty.step_ratio[0] == pytest.approx(1.025)
    assert bursty.priced_widths([0], 1) == [0]
    steady = _bursty_run([1] * 8, [0] * 8)
    assert steady.priced_widths([0], 1) == [1]
    fresh = GoodputFallback(prior_weight=0.0).start(start(1), WidthTable())
    assert fresh.priced_widths([0], 1) == [0], "before its first drafted step a row is priced at round(λ)"


def test_a_bursty_row_that_pays_on_average_is_drafted():
    """Gain 1/8 a step, D = 0.02: priced at the mean step (1.025 → width 0) drafting pays (1.125 / 1.02 > 1); priced
    at T(1, 1 + round(λ)) = 1.16 it would not (1.125 / 1.18 < 1). The bursty row is drafted; a row with the same gain
    verifying one token every step is not."""
    bursty = _bursty_run([4, 0, 0, 0, 4, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0])
    assert bursty.draft_rows(torch.tensor([0])).tolist() != [0]
    steady = _bursty_run([1] * 8, [1, 0, 0, 0, 0, 0, 0, 0])
    assert steady.draft_rows(torch.tensor([0])).tolist() == [0]
