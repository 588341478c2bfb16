"""Per-row fallback: before each proposal, draft only for the rows whose drafting pays for itself.

Notation (one step, R rows in the target's forward): w_r the row's priority weight; g_r the tokens
drafting gained it over the steps it was drafted for (their mean while it has fewer than 1/α of them,
then smoothed by α = ``smoothing``): the expected accepted count of what was
verified, Σ_{j≤ℓ_r} a_{r,j} with a = c_1·…·c_j the estimator's survival (calibrated, it is unbiased and
far less noisy than the realised n_r, mostly 0 or 1), or n_r itself without an estimator; 0 when the
scheduler verified none of the row's draft; ĝ_r = (m_r·g_r + κ·ḡ) / (m_r + κ) what the choice reads: g_r
pulled towards ḡ, the gain drafted rows have shown at this batch size and band (``GainPrior``, below), by
κ = ``prior_weight`` pseudo-steps against m_r, the row's own drafted steps in this generation, each weighing
(1 − α)^k, k the steps skipped since it, counted up to the smoothing's horizon (2 − α)/α (an exponential average over
more steps is no surer). A skipped step observes nothing, so the row's own evidence ages as the smoothing ages
an observation: a row kept out drifts back towards what rows like it gain, and the step that next measures it
weighs 1/(m_r + 1) (at least α) in g_r, so that one probe after a long wait counts for more than α of an
estimate that stale (at one row, rows kept out after a poor start came back only after two or three probes, on
prompts where drafting every step, MTP-1, ran 1.07–1.44× plain decoding: a probe, not kept). A smoothed
estimate that has just fallen below what drafting costs overstates how far: the row's next steps regress
towards what rows like it gain, so a choice on the raw g_r skips steps whose drafting pays, most where
the average row is near break-even (batch 1); where drafting pays for no row (under load, ḡ near 0)
the pull only keeps rows out sooner; ρ the realised ratio, accepted tokens over their expected
count Σ a over the drafted rows of about the last 500 steps, drafted or not (``GainPrior.realised_ratio``; a step or a
plain generation that drafts nothing ages the sums, ``GainPrior.age``, so a ρ that kept rows out drifts back towards 1,
where it would otherwise stand for as long as it keeps them out), which scales every g_r when the
choice is made: the scheduler verifies the prefixes the estimator rates highest, and a calibration
fitted on other prompts can overstate what exactly those yield, by a steady factor, while a drafting
decision is taken on the margin (ρ does not scale the probe ceiling below: a probe is what measures
ρ again, and a ρ that kept probes out could never recover); φ the selection ratio, what the rows a choice drafted
gained in the step they were chosen for (their g, as g_r counts it) over the ĝ_r the choice read for them, with ρ's
pseudo tokens and discount, per sampling band and batch-size bucket (``GainPrior.selection_ratio``; its sums are
discounted on every drafting step of the bucket, chosen rows or none, and aged with ρ's, so a φ that keeps rows out
drifts back towards 1), which scales ĝ_r beside ρ: a row is chosen when its estimate stands high, an estimate stands
high partly by chance, and the steps after a chance high regress towards the row's mean, so a choice on estimates
overstates what it chose, the more so the more it selects (the optimizer's curse; ĝ_r's pull towards ḡ corrects part
of it, φ measures what is left, pooled over the chosen rows): at one row nearly every step drafts, at two rows far
fewer (at c = 2, greedy, rows drafted on a ρ·ĝ of 0.49 a row went on to a ρ·g of 0.44: a probe, not kept). Only
rows the rule chose at their own depth feed it, and the rows of a batch drafted whole because drafting is free (chosen
without selection, they pull φ towards 1 there); a probe and the one-token offer do not; ρ, not φ, says how far the
estimator's own expectation overstates; λ_r its verify length ℓ_r, averaged as g_r is; v_r the
width its steps cost on average: the w whose T(R, 1 + w) / T(R, 1) lies nearest the mean of T(R, 1 + ℓ_r) / T(R, 1)
over its drafted steps, averaged alike (``GoodputFallbackRun.priced_widths``; round(λ_r) before its first), because
a row whose verify length is often 0 and sometimes γ (prompt lookup, between and on matches) widens few steps, where
T at its mean ℓ would price every step wider; that mean ratio pulled towards the ratio of round(λ̄), the prior's verify
length, as g_r is towards ḡ: a gain pulled towards what rows verifying λ̄ tokens gain must be priced at a width pulled
towards theirs (a row whose first step verified two tokens, on a CPU where a third token costs 18% more than a
second, was priced two wide with a gain shrunk to one token's, and drafted on a third of the steps of a prompt
where MTP-1 ran 1.44× plain decoding: a probe, not kept);
D(k) the seconds that drafting k rows adds to a step, the cost model's ``draft_time(k, depth)`` at the depth the
rows would be drafted (the deepest of the candidates: one pass drafts every chosen row that deep), the margin's
exploring depth left out (``GoodputFallbackRun.depths``: exploration is for later steps, not this one's decision), less what a
step that drafts for no row still spends outside the target forward (a stateful drafter reads the features, the loop keeps
its books), the least the run has measured on such steps (the least, because the first such step also
reads the whole prompt's features), plus the catch-up: a drafter that reads target features lazily reads
every column it has not read yet, for every row, in its next pass: the prompt's before its first pass,
then one per step that drafted for no row. The seconds per row and unread column are learnt from the
passes that end such runs: the lower median rate of the last ``_CATCH_UP_WINDOW`` such passes, none before two
(``GainPrior.catch_up``, kept across generations, so that a generation knows what its prompt costs before its
first pass). A median, because one pass can be far off: the process's first drafting pass touches every weight
for the first time and can take many times a steady pass's rate, and a pass after a few skipped steps divides its
noise by few columns. The lower one, and none from a single pass, because a rate too high can keep a row out of
a whole generation (a probe priced at a cold pass's rate over even a short prompt can cost more than any gain
pays for, and the prompt then stays unread), while one too low costs at most a probe. A pass's D(k) carries the skipped steps' columns in full
and the prompt's spread over the steps the generation has left at most (its ingest is paid once for
every later drafted step) (``GoodputFallbackRun.resume_draft_time``). A probe is judged without the
skipped steps' columns, or a long run of skipped steps would keep every probe out, but with everything
unread while the prompt is: under load, where no row has paid for its drafting, that first pass alone
can cost more than a target step. D(0) = 0; T(R, w) the seconds of the target forward
over R rows of w new tokens. Drafting the set S of rows is predicted to yield::

    Θ(S) = (Σ_r w_r + ρ·φ·Σ_{r∈S} w_r·ĝ_r) / (D(|S|) + T(R, 1 + max_{r∈S} v_r))

weighted tokens per second. ``drafting_goodput`` evaluates Θ for S = the k rows of largest ρ·φ·w_r·ĝ_r,
k = 0..n, and ``best_drafted_rows`` drafts the best such S (the first maximum: it never drafts a row that
is predicted to gain nothing).
A row is therefore drafted only when what it gains exceeds what the whole batch would have produced
in the time its drafting (and any widening of the forward) costs. Where D(R) = 0 — drafting costs
nothing a skipped step saves — every row is drafted for: skipping would save nothing and would stop the
row's gain from being measured. Prompt lookup comes close but is not free on this CPU: at two rows its
pass was priced at 0.8 ms where a step that drafted for no row spent 0.23 ms outside the target forward
(a probe, not kept), so its rows are judged by Θ like any other's.

Rows outside S get ℓ_r = 0 before any of this step's draft tokens exist, so the choice reads only
earlier steps' outcomes and cannot bias the sampled law. A skipped row learns nothing new, so it is
re-probed (drafted once regardless) after ``probe_after`` skipped steps; each probe that does not bring
it back doubles its wait, up to ``max_probe_interval`` and no further than where probing the whole batch
costs ``_PROBE_BUDGET`` (0.5%) of plain decoding's time (``GoodputFallbackRun.probe_interval_cap``: a nearly
free drafter such as prompt lookup keeps being probed every ``probe_after`` steps, which its bursts of
matches need). What a probe costs is what it is predicted to lose beside the chosen rows,
(Σ w + G')·(1/Θ(S') − 1/Θ(S)) with S' the chosen and the probed rows (``GoodputFallbackRun.probe_loss``), not its D:
near break-even a probe costs little whatever it costs to draft, and a choice decided by a margin within the machine's
noise must be measured again soon, for the row's estimate and for the cost model's cells its drafted steps observe.
At one row and temperature 1, the online cost model priced a two-token step 10% above a one-token one after a slow
spell (MTP-1's steps, timed alongside, took the same at both widths), a drafting step at 1.26 one-token steps against
a predicted gain of 0.24 tokens: the row was kept out and probed after waits of about 31 steps (D's cap), and nine
prompts in a row drafted on 2–15 of their 60–64 steps (a probe, not kept). A row the estimate brings back starts over. A new
generation's rows start with the wait its batch size and sampling band last reached (the shortest in the
batch, ``GainPrior.probe_interval``): where probes have stopped paying, each generation would otherwise
pay its first probes again. That wait runs from a first probe: a row the choice leaves out at its first step is
probed there (when a probe could pay, below), and its first own outcome replaces the prior's estimate. What a
drafter gains depends on the prompt (code against chat), so an estimate inherited from other prompts would
otherwise keep a row out for a whole wait, and a later probe would only nudge the inherited estimate.

A drafted row is drafted ⌈λ_r⌉ tokens deep (within a tolerance of α), and ⌈λ_r⌉ + ``depth_margin`` on one of every ``probe_after``
of its drafted steps (``GoodputFallbackRun.depths``, whose second list, the depths the choice to draft it prices, leaves
that exploring token out): the run answers with per-row depths, and the loop
asks the drafter for no more than the deepest, so a scheduler that verifies one token a step does not
pay for drafting γ. The margin explores: a step whose scheduler verifies the deeper token raises λ_r,
and the row is drafted deeper from then on, while a margin on every step paid, on every step, for a
deeper pass and for the positions the scheduler then verified, where they were rarely worth it. Where a
whole block costs no more than ``_PROBE_BUDGET`` of a one-token step over the depths chosen (prompt
lookup), every drafted row is drafted γ deep: a shallower draft would only cut a long match short.
With ``reach_cheaper_widths``, a depth d then grows to the deepest d' ≤ γ whose step, drafted d' deep and
verified whole, costs no more than the d-deep one verified whole, D(R, d') + T(R, 1 + d') ≤ D(R, d) + T(R, 1 + d)
(``reach_depth``): where the target's forward is cheaper at a wider step (a few-row matrix product takes a
slow path on some CPUs), a shallow draft would keep the scheduler from the cheaper width, and what the
deeper positions cost to draft is less than what that width saves.

A row kept out at its own depth is offered one token: when the choice above drafts for no row, it is made again
(``GoodputFallbackRun._shallow_choice``) with every row one token deep, on ĝ¹_r, what its first positions alone
gained (g¹_r: ``verified_gain`` at depth 1, a_{r,1} on steps where the scheduler verified a token, min(n_r, 1) without
an estimator; smoothed like g_r and pulled towards the prior's g¹ as g_r is towards ḡ), scaled by ρ¹, the realised
ratio of the first positions alone (min(n_r, 1) against g¹, ``GainPrior.realised_ratio(first=True)``), at widths
min(v_r, 1) and D one token deep; the rows it chooses are drafted one token deep, with no exploring token. Because
λ_r and g_r describe the depth the scheduler has been verifying, and a row kept out learns nothing: estimates formed
where deeper tokens were overrated keep a row out at a depth where one token would pay. At one row and temperature 1,
one prompt whose survivals overstated its drafts about fourfold (12 tokens accepted of about 50 expected) left the
prior at g 0.62, λ 1.55 and ρ 0.65; priced at a three-token step, the next four prompts drafted on 4, 2, 2 and 24 of
their 63, 63, 64 and 56 steps, where MTP-1, one token on every step, ran ahead of plain decoding on them (a probe,
not kept). Drafted one deep, the row's own λ_r falls to what it verifies and the rule at its own depth takes over.

A row's first estimate is the gain drafted rows have shown at this batch size and sampling band in
earlier generations (``GainPrior``, kept by the ``GoodputFallback``): what a drafting pass gains depends
on how much the scheduler verifies, which depends on R, and probing every row of a new batch costs a
whole drafting pass. When nothing is known there yet, a batch's rows are drafted for at its first step;
otherwise the rows the estimate leaves out are first-probed there only if a probe could pay. The prior also keeps the largest gain one row has shown in a step there, the ceiling: a skipped
row is re-probed only if a row gaining that much would pay for its drafting, so where no row has ever
gained enough (under load, where the scheduler verifies nothing) nothing is drafted at all, once
``_CEILING_EVIDENCE`` rows have drafted there, each counted once a generation: a ceiling of one step's rows says little (prompt
lookup's first step usually finds no match, and a ceiling of 0 from it kept lookup out for good), nor does one
prompt's at one row (what a drafter gains depends on the prompt: a band's first prompt drafted 15 steps, predicted to
gain 0.2 tokens a step, and had none accepted; its estimate left the next rows out and its ceiling ruled their first
probes out, so the next four generations ran as plain decoding where MTP-1 ran 1.03–1.28× plain decoding on them; a
probe, not kept), and
only where probes are dear: where probing every ``probe_after`` steps stays within the budget below,
probes go on whatever the ceiling, inside a drafting generation. A generation's first choice judges its probes by the
ceiling alone: a drafting generation costs more than its probes, the scheduler's and this rule's bookkeeping on
every step (prompt lookup at four rows, where nothing it drafted was verified: 0.5–1.3 ms over plain decoding's
median step of 37–42 ms, a probe, not kept).

A generation runs as plain decoding (``GoodputFallbackRun.drafts`` False, read by the loop before the prefill:
the target returns no hidden states, for the prompt or the steps, and the drafter never runs) when its first
choice probes no row and drafts for none, or only for rows predicted to raise Θ by less than
``generation_min_gain`` (5%) over drafting none (``predicted_gain``); a one-row generation needs no margin,
only a choice that drafts. A first choice that drafts for no row is mostly the whole generation's: a skipped
row's estimate changes only by drafting, and the catch-up a later probe pays only grows. The margin, because a drafting generation pays for what that choice does not price: the
target's features for every column (at 16 rows on a CPU, the prompt's alone took the chunked prefill from
12.39 s to 12.85 s, ``benchmarks/results/bench_prefill.json``), the first pass's reading of the prompt, priced
spread over every step left though not all of them may draft, and, in a static batch, tokens gained by rows that
finish before the longest, which do not shorten it; and because the choice reads other generations' estimates.
At one row the margin would price little: the prompt's features did not measurably slow the prefill
(``bench_prefill.json``, one row: 0.129–0.133 s either way), and no row finishes before another. What is left is the
first pass's reading of the prompt, which a row that stops drafting early does not earn back; and the row's own
outcomes outweigh the prior's estimate within a few drafted steps (κ = ``prior_weight`` pseudo-steps), so a drafting
generation where drafting does not pay stops drafting soon. A plain generation, though, learns nothing; at one row,
where drafting every step gained 4–11% over plain decoding (prompt lookup's fixed γ at c = 1 in
``bench_load_grid_prompt_lookup.json``), estimates near the margin kept generations plain: DSpark reached τ 1.01
there, where fixed γ reached 1.17.
To notice when drafting starts to pay again, after ``generation_probe_after`` such generations in a row at one
batch size and band one is probed: its first step drafts for every row, and the rows go on by the rules above;
the wait doubles after each probed one, up to ``max_generation_probe_interval`` (``GainPrior.idle_generation``),
and a generation whose first choice drafts starts the count and the wait over.

The prior belongs to one drafter and target: give each wrapped model its own scheduler (``wrap`` and the presets in
``dspark.strategies`` make a new one each time).
"""

from __future__ import annotations

import collections
import functools
import itertools
import math
import operator
import statistics
from collections.abc import Callable, Sequence

import attrs
import torch

from dspark.checks import check_int, check_non_negative, int_at_least
from dspark.protocols import CostModel
from dspark.stats import StepRecord
from dspark.types import GenerationStart
from dspark.verify.calibration import band_of

__all__ = [
    "GainPrior", "GoodputFallback", "GoodputFallbackRun", "best_drafted_rows", "draft_depths", "drafting_goodput", "reach_depth", "verified_gain",
]


def draft_depths(answer: torch.Tensor | None, rows: int, max_draft_tokens: int) -> torch.Tensor:
    """A ``FallbackRun.draft_rows`` answer as host LongTensor[R] of draft depths in 0..γ: None gives γ for every
    row, a BoolTensor γ or 0 per row, an integer tensor its values clamped to 0..γ."""
    if answer is None:
        return torch.full((rows,), max_draft_tokens, dtype=torch.long)
    if not isinstance(answer, torch.Tensor) or answer.is_floating_point() or answer.is_complex() or tuple(answer.shape) != (rows,):
        raise TypeError(f"FallbackRun.draft_rows must return None, a BoolTensor[{rows}] or an integer tensor [{rows}], got {answer!r}")
    answer = answer.cpu()
    if answer.dtype == torch.bool:
        return answer.long() * max_draft_tokens
    return answer.long().clamp(0, max_draft_tokens)


def reach_depth(depth: int, step_costs: Sequence[float]) -> int:
    """The deepest d' ≥ d = ``depth`` whose step costs no more than d's: ``step_costs[k − 1]`` is what drafting k tokens
    deep and verifying them all costs, D(R, k) + T(R, 1 + k), for k = 1..γ. ``depth`` itself where no deeper step is
    as cheap, as where T and D grow with the width; a depth below 1 (a row not drafted) is returned unchanged."""
    if depth < 1:
        return depth
    if depth > len(step_costs):
        raise ValueError(f"depth must be at most γ = len(step_costs) = {len(step_costs)}, got {depth!r}")
    bound = step_costs[depth - 1]
    return max(deeper for deeper in range(depth, len(step_costs) + 1) if step_costs[deeper - 1] <= bound)


def verified_gain(record: StepRecord, depth: int | None = None) -> torch.Tensor:
    """Per row of a step, DoubleTensor[R]: Σ_{j≤ℓ_r} a_{r,j} from the record's survival, else the accepted count;
    with ``depth``, of the first ``depth`` positions only (what a draft that deep would have gained: ℓ_r and n_r
    capped at it)."""
    if depth is not None:
        check_int("depth", depth, 1)
    gains = _verified_gains(_host_survival(record), record.verify_lengths.tolist(), record.accepted.tolist(), depth)
    return torch.tensor(gains, dtype=torch.float64)


def _host_survival(record: StepRecord) -> list[list[float]] | None:
    """The step's survival as host lists, one per row; None where it has none (no estimator, or no draft)."""
    return None if record.survival is None or record.survival.shape[1] == 0 else record.survival.tolist()


def _verified_gains(survival: list[list[float]] | None, verify_lengths: list[int], accepted: list[int], depth: int | None) -> list[float]:
    """``verified_gain`` on host lists (each row's survival c_{r,1..γ}, or None; its ℓ_r and n_r). In plain Python, because
    the fallback's ``observe`` reads it twice a step on a handful of rows, where a tensor op costs more than its arithmetic."""
    if survival is None:
        return [float(count if depth is None else min(count, depth)) for count in accepted]
    return [
        sum(itertools.accumulate(row[: max(length if depth is None else min(length, depth), 0)], operator.mul), 0.0)
        for row, length in zip(survival, verify_lengths)
    ]


def _check_rows_problem(gains: torch.Tensor, widths: torch.Tensor, rows: int) -> None:
    if not isinstance(gains, torch.Tensor) or not gains.is_floating_point() or gains.dim() != 1:
        raise TypeError(f"gains must be a 1-D FloatTensor of w_r·g_r, got {gains!r}")
    if not isinstance(widths, torch.Tensor) or widths.is_floating_point() or tuple(widths.shape) != tuple(gains.shape):
        raise TypeError(f"widths must be an integer tensor shaped like gains {tuple(gains.shape)}, got {widths!r}")
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < gains.numel():
        raise ValueError(f"rows must be an int >= the {gains.numel()} candidate rows (every row in the forward), got {rows!r}")


def drafting_goodput(
    gains: torch.Tensor, widths: torch.Tensor, base: float, rows: int,
    step_time: Callable[[int, int], float], draft_time: Callable[[int], float],
) -> tuple[torch.Tensor, torch.Tensor]:
    """(order, Θ): ``order`` the candidate rows by w_r·g_r descending (ties to the smaller index), Θ[k] the
    predicted goodput of drafting its first k, k = 0..n (module docstring). ``gains`` [n]: w_r·g_r;
    ``widths`` [n]: the widths v_r the rows are priced at; ``base``: Σ_r w_r over all ``rows`` rows of the forward. CPU tensors."""
    _check_rows_problem(gains, widths, rows)
    order, theta = _goodput_curve(gains.tolist(), widths.tolist(), base, rows, step_time, draft_time)
    return torch.tensor(order, dtype=torch.long), torch.tensor(theta, dtype=gains.dtype)


def _goodput_curve(
    gains: list[float], widths: list[int], base: float, rows: int, step_time: Callable[[int, int], float], draft_time: Callable[[int], float]
) -> tuple[list[int], list[float]]:
    """``drafting_goodput`` on host lists. In plain Python, because the choice runs before every step on a handful of
    rows, where a tensor op costs more than its arithmetic."""
    order = sorted(range(len(gains)), key=gains.__getitem__, reverse=True)  # a stable sort: ties keep the smaller index first
    gained, reach, theta = 0.0, 0, [base / step_time(rows, 1)]
    for count, row in enumerate(order, start=1):
        gained, reach = gained + gains[row], max(reach, widths[row])
        theta.append((base + gained) / (draft_time(count) + step_time(rows, 1 + reach)))
    return order, theta


def best_drafted_rows(
    gains: torch.Tensor, widths: torch.Tensor, base: float, rows: int,
    step_time: Callable[[int, int], float], draft_time: Callable[[int], float],
) -> torch.Tensor:
    """BoolTensor[n]: the candidates in the first maximum of ``drafting_goodput`` (fewest rows on a tie).
    Rows expected to gain nothing are never drafted for, so only the others are costed."""
    _check_rows_problem(gains, widths, rows)
    values, reaches = gains.tolist(), widths.tolist()
    paying = [index for index, value in enumerate(values) if value > 0]
    chosen = [False] * len(values)
    if paying:
        order, theta = _goodput_curve([values[index] for index in paying], [reaches[index] for index in paying], base, rows, step_time, draft_time)
        for position in order[: theta.index(max(theta))]:
            chosen[paying[position]] = True
    return torch.tensor(chosen, dtype=torch.bool)


def _new_step_weight(steps: float, smoothing: float) -> float:
    """The weight of the newest of ``steps`` observations in an estimate that is their mean while they are fewer than
    1/``smoothing``, then exponential smoothing by ``smoothing``."""
    return max(1 / steps, smoothing)


def _size_bucket(rows: int) -> int:
    return 1 << max(rows - 1, 0).bit_length()


#: The share of plain decoding's time that probing a whole batch may take; it caps how far a probe's wait doubles.
_PROBE_BUDGET = 0.005
#: Rows a batch size and band must have seen drafted, each once a generation, before a ceiling that does not pay keeps
#: probes out: at one row, as many prompts.
_CEILING_EVIDENCE = 8
#: ρ = (accepted + this) / (expected + this): until some tokens were drafted, ρ stays near 1. At one row and temperature 1
#: a drafted token is accepted with a chance of about 0.29, so after E expected tokens the accepted count spreads by
#: about √(0.7·E), and ρ by √(0.7·E) / (E + this), most at E = this: 0.10 with 16, 0.07 with 32, while drafting there
#: pays down to a ρ of about 0.8. With 8, one generation that accepted 5 of 13 took ρ from 1 to 0.6–0.76; with 16, the
#: first generations of a band took it to 0.70–0.76 (probes, not kept). Thirty-two roughly doubles the steps a steady
#: overstatement takes to show: drafts yielding 0.74 of a Σ a of 0.5 a step take ρ below 0.85 in 96 steps, against 46.
_REALISED_PSEUDO_TOKENS = 32.0
#: The catch-up rate is the lower median of the rates of this many latest passes that read unread columns.
_CATCH_UP_WINDOW = 15


class GainPrior:
    """Per sampling band and batch-size bucket (``band_of``; R rounded up to a power of two, so that a batch
    whose rows finish one by one keeps its prior), over every generation of
    one ``GoodputFallback``: the smoothed gain g and verify length λ of drafted rows (a new row's first
    estimate) and the gain g¹ of their first positions alone (the one-token offer's), and the largest gain one
    row showed in a step, with its verify length (the probe ceiling); the probe interval its rows last reached;
    how many generations in a row ran as plain decoding, and how many may before one is probed (module docstring);
    per sampling band, the realised ratio ρ of accepted tokens to their expected count, and ρ¹ of the first positions
    alone; per band and bucket, the selection ratio φ of what chosen rows gained to what their choice read; the catch-up
    rates of the latest passes.

    ``smoothing``: the weight of each step's drafted rows in g and λ (their mean over the first 1/``smoothing``
    steps at a batch size and band, then exponential smoothing); ``realised_discount``: what ρ's (and φ's) sums are
    multiplied by before each drafting step joins them, and by each step that drafts nothing (``age``). Both are
    slow, g over about 100 drafting steps and ρ over about 500 steps: at batch 1 about two and eight generations, so
    that they say what rows like a new one gain rather than how the last prompt ended. With g over 20 steps and ρ over
    50, one prompt where the drafter did poorly left the next prompts' rows inheriting an estimate below break-even;
    skipped, those rows barely updated it, and later generations drafted on few of their steps. ρ's is the longer
    because at temperature 1 prompts differ in what they accept far more than one generation's draws do (MTP-1 at one
    row: acceptance spread by 0.096 over 48 generations, against 0.065 from the draws alone), and ρ over about 200 steps,
    three or four prompts, fell to 0.78–0.82 after two poor ones, below break-even, where its mean was about 0.93: the
    next generations drafted on 5–19 of their 57–64 steps (a probe, not kept)."""

    def __init__(self, smoothing: float = 0.01, realised_discount: float = 0.998):
        for name, value in (("smoothing", smoothing), ("realised_discount", realised_discount)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise ValueError(f"{name} must be a number in (0, 1], got {value!r}")
        self.smoothing, self.realised_discount = smoothing, realised_discount
        self.estimates: dict[tuple[str, int], tuple[float, float]] = {}
        self.first_estimates: dict[tuple[str, int], float] = {}  # the gain of drafted rows' first positions alone
        self.first_updates: dict[tuple[str, int], int] = {}  # steps with first-position gains observed per key
        self.ceilings: dict[tuple[str, int], tuple[float, float]] = {}
        self.realised: dict[str, tuple[float, float]] = {}  # per band: discounted sums of (accepted, expected)
        self.realised_first: dict[str, tuple[float, float]] = {}  # the same of the first positions alone
        self.selected: dict[tuple[str, int], tuple[float, float]] = {}  # per key: discounted sums of (gained, read) of chosen rows
        self.intervals: dict[tuple[str, int], int] = {}
        self.drafted: dict[tuple[str, int], int] = {}  # rows drafted per key, each once a generation: the ceiling's evidence
        self.updates: dict[tuple[str, int], int] = {}  # steps with drafted rows observed per key
        self.catch_up_rates: collections.deque[float] = collections.deque(maxlen=_CATCH_UP_WINDOW)
        self.idle_generations: dict[tuple[str, int], int] = {}  # generations in a row run as plain decoding, per key
        self.generation_intervals: dict[tuple[str, int], int] = {}  # how many of those before one drafts again
        self.version = 0  # counts updates, so that a run can tell the prior has changed

    def get(self, band: str, rows: int) -> tuple[float, float] | None:
        """(g, λ) in this band at this batch size, None before any drafted row was observed there."""
        return self.estimates.get((band, _size_bucket(rows)))

    def first_gain(self, band: str, rows: int) -> float | None:
        """g¹ in this band at this batch size: what drafted rows' first positions gained (``verified_gain`` at depth 1),
        None before any update passed ``first_gains``."""
        return self.first_estimates.get((band, _size_bucket(rows)))

    def ceiling(self, band: str, rows: int) -> tuple[float, float] | None:
        """(the largest gain of one row in one step, its verify length) there, None before any was observed."""
        return self.ceilings.get((band, _size_bucket(rows)))

    def evidence(self, band: str, rows: int) -> int:
        """How many rows have drafted at this size and band, each counted once a generation (what its ceiling rests on)."""
        return self.drafted.get((band, _size_bucket(rows)), 0)

    def probe_interval(self, band: str, rows: int) -> int | None:
        """The shortest probe interval of a batch of this size and band at its latest choice, None before any."""
        return self.intervals.get((band, _size_bucket(rows)))

    def idle_generation(self, band: str, rows: int, probe_after: int, max_interval: int) -> bool:
        """A generation of this size and band that is not to draft (``GoodputFallbackRun.drafts``): True if it is to be probed
        anyway (its first step drafted for every row) because as many such generations as the current interval
        (``probe_after`` at first, doubled by each such probe up to ``max_interval``) ran as plain decoding before
        it; else False, counting it."""
        key = (band, _size_bucket(rows))
        interval = self.generation_intervals.get(key, probe_after)
        idle = self.idle_generations.get(key, 0)
        if idle >= interval:
            self.idle_generations[key] = 0
            self.generation_intervals[key] = min(2 * interval, max_interval)
            return True
        self.idle_generations[key] = idle + 1
        return False

    def drafting_generation(self, band: str, rows: int) -> None:
        """A generation of this size and band whose first choice probes or clears the margin (``GoodputFallbackRun.drafts``):
        the count of plain ones and the wait start over."""
        key = (band, _size_bucket(rows))
        self.idle_generations.pop(key, None)
        self.generation_intervals.pop(key, None)

    def remember_probe_interval(self, band: str, rows: int, interval: int) -> None:
        """Keep ``interval`` as this size and band's probe interval (a run calls it after each choice)."""
        self.intervals[(band, _size_bucket(rows))] = interval

    @property
    def catch_up(self) -> float | None:
        """Seconds per row and unread feature column of the pass that reads them: the lower median of the latest
        rates (module docstring), None before two."""
        return statistics.median_low(self.catch_up_rates) if len(self.catch_up_rates) > 1 else None

    def remember_catch_up(self, seconds: float) -> None:
        """Keep ``seconds`` per row and unread column (what a pass took over its steady cost) among the latest rates."""
        self.catch_up_rates.append(seconds)
        self.version += 1

    def age(self, band: str, steps: int = 1) -> None:
        """Discount ρ's sums in ``band``, and φ's at every batch size there, as ``steps`` steps that drafted for no
        row: evidence ages whether or not a step drafts, so a ρ that kept rows out drifts back towards 1, what the
        calibration claims, instead of standing wherever the last drafted steps left it. Not counted as an update
        (``version``): a standing choice not to draft is revisited at the next probe or generation, not at every step."""
        factor = self.realised_discount ** steps
        for sums in (self.realised, self.realised_first):
            if band in sums:
                sums[band] = tuple(factor * value for value in sums[band])
        for key in [key for key in self.selected if key[0] == band]:
            self.selected[key] = tuple(factor * value for value in self.selected[key])

    def realised_ratio(self, band: str, first: bool = False) -> float:
        """ρ in this band: (accepted + P) / (expected + P), P = ``_REALISED_PSEUDO_TOKENS``, over the discounted sums of
        drafted rows (1 before any); ``first``: ρ¹, the same of their first positions alone (min(n_r, 1) against g¹),
        which the one-token offer reads: a calibration that overstates deeper positions lowers ρ, not ρ¹."""
        accepted, expected = (self.realised_first if first else self.realised).get(band, (0.0, 0.0))
        return (accepted + _REALISED_PSEUDO_TOKENS) / (expected + _REALISED_PSEUDO_TOKENS)

    def selection_ratio(self, band: str, rows: int) -> float:
        """φ in this band at this batch size: (gained + P) / (read + P), P = ``_REALISED_PSEUDO_TOKENS``, over the
        discounted sums of the rows the rule chose, what their steps gained against the ĝ_r the choice read (1 before
        any; module docstring)."""
        gained, read = self.selected.get((band, _size_bucket(rows)), (0.0, 0.0))
        return (gained + _REALISED_PSEUDO_TOKENS) / (read + _REALISED_PSEUDO_TOKENS)

    def update_selection(self, band: str, rows: int, gained: float, read: float) -> None:
        """Discount φ's sums at this batch size as ρ's are, then add one drafting step's chosen rows: ``gained``, the sum
        of their steps' gains, and ``read``, the sum of the ĝ_r their choice read (both finite and >= 0; 0 and 0 for a
        step that chose none, which only discounts)."""
        gained, read = check_non_negative("gained", gained), check_non_negative("read", read)
        key = (band, _size_bucket(rows))
        if key not in self.selected and read == 0 and gained == 0:
            return  # nothing to discount or add
        known_gained, known_read = self.selected.get(key, (0.0, 0.0))
        self.selected[key] = (self.realised_discount * known_gained + gained, self.realised_discount * known_read + read)
        self.version += 1

    def update(
        self, band: str, rows: int, gains: Sequence[float] | torch.Tensor, verify_lengths: Sequence[float] | torch.Tensor,
        accepted: Sequence[float] | torch.Tensor | None = None, first_steps: int | None = None,
        first_gains: Sequence[float] | torch.Tensor | None = None,
    ) -> None:
        """Smooth in the mean outcome of one step's drafted rows of a batch of ``rows`` rows (``gains``, ``verify_lengths``:
        one value per drafted row, lists or 1-D tensors); raise the ceiling; with ``accepted`` (the rows' accepted
        counts n_r), add them and the expected ``gains`` to ρ's sums. ``first_steps``: how many of these rows drafted
        for the first time in their generation, what the ceiling's evidence counts (None: all of them).
        ``first_gains``: the same rows' gains from their first positions alone, smoothed alike into g¹ (``first_gain``),
        and with ``accepted`` added to ρ¹'s sums (``realised_ratio(first=True)``)."""
        gains, verify_lengths = _host_values(gains), _host_values(verify_lengths)
        first_gains = None if first_gains is None else _host_values(first_gains)
        if first_gains is not None and len(first_gains) != len(gains):
            raise ValueError(f"first_gains must hold one value per drafted row ({len(gains)}), got {len(first_gains)}")
        if first_steps is not None and (isinstance(first_steps, bool) or not isinstance(first_steps, int) or not 0 <= first_steps <= len(gains)):
            raise ValueError(f"first_steps must be an int in [0, {len(gains)}] (the drafted rows), got {first_steps!r}")
        if accepted is not None:
            accepted = _host_values(accepted)
            realised, expected = self.realised.get(band, (0.0, 0.0))
            self.realised[band] = (self.realised_discount * realised + float(sum(accepted)), self.realised_discount * expected + float(sum(gains)))
            if first_gains is not None:
                realised, expected = self.realised_first.get(band, (0.0, 0.0))
                self.realised_first[band] = (self.realised_discount * realised + float(sum(min(count, 1) for count in accepted)),
                                             self.realised_discount * expected + float(sum(first_gains)))
        observed = (sum(gains) / len(gains), sum(verify_lengths) / len(verify_lengths))
        self.version += 1
        key = (band, _size_bucket(rows))
        self.drafted[key] = self.drafted.get(key, 0) + (len(gains) if first_steps is None else first_steps)
        self.updates[key] = self.updates.get(key, 0) + 1
        # With a long memory, smoothing from the first step would keep that one step's outcome for a hundred more.
        weight = _new_step_weight(self.updates[key], self.smoothing)
        known = self.estimates.get(key, observed)
        self.estimates[key] = tuple(old + weight * (new - old) for old, new in zip(known, observed))
        if first_gains is not None:
            self.first_updates[key] = self.first_updates.get(key, 0) + 1
            first = sum(first_gains) / len(first_gains)
            known_first = self.first_estimates.get(key, first)
            self.first_estimates[key] = known_first + _new_step_weight(self.first_updates[key], self.smoothing) * (first - known_first)
        best = gains.index(max(gains))
        if key not in self.ceilings or gains[best] > self.ceilings[key][0]:
            self.ceilings[key] = (float(gains[best]), float(verify_lengths[best]))


def _host_values(values: Sequence[float] | torch.Tensor) -> list:
    """A 1-D tensor or a sequence of numbers as a list of Python numbers."""
    return values.tolist() if isinstance(values, torch.Tensor) else list(values)


@attrs.frozen
class GoodputFallback:
    """DSpark's per-row fallback (``RowFallback``): draft only for the rows that raise the predicted
    goodput (module docstring), re-probing skipped rows after ``probe_after`` steps, then after twice
    as long each time a probe does not bring them back, at most ``max_probe_interval`` steps.
    ``smoothing``: α, the weight of the newest observation in g_r and λ_r once the row has 1/α drafted steps of
    its own (before, every step weighs alike: a first outcome is one step, not the whole estimate).

    ``prior``: what earlier generations showed per batch size (module docstring), shared by every run.
    ``prior_weight``: κ, the pseudo-steps of the prior's gain in each row's estimate ĝ_r (0: the row's own g_r alone).

    ``generation_min_gain``, ``generation_probe_after``, ``max_generation_probe_interval``: a generation whose first
    choice probes no row and drafts for none, or for rows predicted to raise the goodput by less than
    ``generation_min_gain`` (a share of plain decoding's; not asked of a one-row generation), runs as plain
    decoding (``GoodputFallbackRun.drafts``),
    except that after ``generation_probe_after`` such generations in a row of one batch size and band, one drafts
    its first step for every row, and the wait doubles after each, up to ``max_generation_probe_interval``; a
    generation whose first choice drafts starts the count and the wait over.

    ``depth_margin``: a drafted row gets ⌈λ_r⌉ tokens (at least 1, at most γ), as many as the scheduler has
    been verifying for it, and ``depth_margin`` more on one of every ``probe_after`` of its drafted steps, so
    that it can verify more when the survival says so; the rest of a γ-token block would cost drafting
    time and rarely be verified. A row with no λ_r yet gets γ. None drafts γ for every drafted row.
    ``reach_cheaper_widths``: draft such a row deeper still where a deeper draft verified whole costs no more
    (``reach_depth``), so that the scheduler can reach a wider step the target runs faster; False keeps ⌈λ_r⌉.

    Subclass and override ``choose`` to change the rule while keeping the bookkeeping and the probes."""

    smoothing: float = attrs.field(default=0.1)
    probe_after: int = attrs.field(default=8, validator=int_at_least(1))
    max_probe_interval: int = attrs.field(default=64, validator=int_at_least(1))
    depth_margin: int | None = attrs.field(default=1, validator=int_at_least(0, optional=True))
    reach_cheaper_widths: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    prior: GainPrior = attrs.field(factory=GainPrior, eq=False, repr=False, validator=attrs.validators.instance_of(GainPrior))
    prior_weight: float = attrs.field(default=3.0)
    generation_probe_after: int = attrs.field(default=4, validator=int_at_least(1))
    max_generation_probe_interval: int = attrs.field(default=16, validator=int_at_least(1))
    generation_min_gain: float = attrs.field(default=0.05)

    def __attrs_post_init__(self):
        if isinstance(self.smoothing, bool) or not isinstance(self.smoothing, (int, float)) or not 0 < self.smoothing <= 1:
            raise ValueError(f"smoothing must be a number in (0, 1], got {self.smoothing!r}")
        if isinstance(self.prior_weight, bool) or not isinstance(self.prior_weight, (int, float)) or not 0 <= self.prior_weight < math.inf:
            raise ValueError(f"prior_weight must be a finite number >= 0, got {self.prior_weight!r}")
        if self.max_probe_interval < self.probe_after:
            raise ValueError(f"max_probe_interval must be >= probe_after={self.probe_after}, got {self.max_probe_interval!r}")
        if isinstance(self.generation_min_gain, bool) or not isinstance(self.generation_min_gain, (int, float)) or not 0 <= self.generation_min_gain < math.inf:
            raise ValueError(f"generation_min_gain must be a finite number >= 0, got {self.generation_min_gain!r}")
        if self.max_generation_probe_interval < self.generation_probe_after:
            raise ValueError(
                f"max_generation_probe_interval must be >= generation_probe_after={self.generation_probe_after}, "
                f"got {self.max_generation_probe_interval!r}"
            )

    def start(self, generation: GenerationStart, cost_model: CostModel) -> "GoodputFallbackRun":
        """A fresh run for ``generation``, which may draft for no row at all (``GoodputFallbackRun.drafts``)."""
        return GoodputFallbackRun(self, generation, cost_model)

    def choose(
        self, gains: torch.Tensor, widths: torch.Tensor, base: float, rows: int,
        step_time: Callable[[int, int], float], draft_time: Callable[[int], float],
    ) -> torch.Tensor:
        """Which observed rows to draft for, BoolTensor[n], from their w_r·g_r, priced widths v_r, Σ w, the
        forward's R, T and D (module docstring): ``best_drafted_rows``."""
        return best_drafted_rows(gains, widths, base, rows, step_time, draft_time)


class GoodputFallbackRun:
    """One generation's ``GoodputFallback`` state, on the host: per batch row g_r, λ_r, whether it was
    ever observed, steps skipped since it was last drafted and its current probe interval; and the
    least seconds a step that drafted for no row has spent outside the target forward. ``drafts``: whether
    the generation drafts at all (``FALLBACK_RUN_HOOKS``; module docstring), decided when the run starts.

    The per-row state is kept in Python lists indexed by batch row, and the helpers below take the step's rows as a
    list of batch indices: the choice runs before every step on a handful of rows, where each tensor op would cost
    more than its arithmetic (``draft_rows`` and ``observe`` keep the protocol's host tensors)."""

    def __init__(self, fallback: GoodputFallback, generation: GenerationStart, cost_model: CostModel):
        batch = generation.rows
        self.fallback, self.cost_model, self.band = fallback, cost_model, band_of(generation.sampling)
        self.max_draft_tokens = generation.max_draft_tokens
        self.priority = [1.0] * batch if generation.priority is None else generation.priority.detach().double().cpu().tolist()
        self.gain = [0.0] * batch
        self.verify = [0.0] * batch
        self.first_gain: list[float | None] = [None] * batch  # g¹_r: the gain of its first positions alone (None: unknown)
        self.read_gain: list[float | None] = [None] * batch  # the ĝ_r the rule chose it on for the coming step (None: not so chosen)
        # Per row: the smoothed ratio of its drafted steps' time to a one-token step's, T(R, 1 + ℓ_r) / T(R, 1), what
        # its verify lengths cost on average (None until its own first drafted step: the prior's λ prices it).
        self.step_ratio: list[float | None] = [None] * batch
        self.observed = [False] * batch  # has an estimate: its own outcome or the prior's
        self.own_steps = [0] * batch  # drafted steps of its own in this generation (> 0: measured)
        # Per row: its own drafted steps as evidence, each aged by (1 − α) for every step skipped since (``aged_evidence``).
        self.evidence = [0.0] * batch
        self.skipped = [0] * batch
        self.interval = [fallback.prior.probe_interval(self.band, batch) or fallback.probe_after] * batch
        self.idle_seconds: float | None = None
        # Feature columns the drafter has not read: the prompt's until the first pass, then one per skipped step.
        self.unread_prompt_columns = generation.prompt_length or 0
        self.skipped_steps = 0  # steps in a row, up to the last observed, that drafted for no row
        self.steps_left = generation.max_length - (generation.prompt_length or 0)  # at most: a step emits >= 1 token
        # What the last choice that drafted for no row read, besides estimates a skipped row cannot change:
        # while it holds, that choice stands (the cost model's small corrections wait until it changes).
        self._idle_key: tuple | None = None
        # A probed generation drafts its first step for every row, whether or not a probe could pay.
        self._probed_generation = False
        self.drafts = self._first_choice_drafts(batch)

    def _first_choice_drafts(self, batch: int) -> bool:
        """Whether this generation drafts (``FALLBACK_RUN_HOOKS``): when its first step's choice probes a row or drafts
        for rows predicted to raise Θ by ``generation_min_gain`` at least (any predicted gain, at one row), or when
        it is the prior's turn to probe a batch of this size and band (``GainPrior.idle_generation``); module
        docstring."""
        rows = list(range(batch))
        chosen, probes, _, priced, shallow = self._choice(rows, starting=True)
        min_gain = self.fallback.generation_min_gain if batch > 1 else 0.0  # module docstring: what the margin prices
        if any(probes) or (any(chosen) and self.predicted_gain(rows, chosen, priced, shallow) >= min_gain):
            self.fallback.prior.drafting_generation(self.band, batch)
            return True
        self._probed_generation = self.fallback.prior.idle_generation(
            self.band, batch, self.fallback.generation_probe_after, self.fallback.max_generation_probe_interval
        )
        if not self._probed_generation:  # plain decoding: at most steps_left steps, none of which drafts
            self.fallback.prior.age(self.band, self.steps_left)
        return self._probed_generation

    def predicted_gain(self, rows: list[int], chosen: list[bool], depths: list[int], shallow: bool = False) -> float:
        """Θ(S) / Θ(∅) − 1: what drafting the ``chosen`` of ``rows`` (``depths`` deep) is predicted to add to the
        goodput, the rule's Θ with the estimates the choice reads (module docstring; ``shallow``: the one-token offer's,
        g¹ at widths of at most 1); 0 for no row, +inf where drafting costs nothing avoidable."""
        if not any(chosen):
            return 0.0
        if self._drafting_is_free(len(rows)):
            return math.inf
        _, theta = drafting_goodput(*self._goodput_problem(rows, chosen, depths, shallow))
        return float(theta[-1] / theta[0]) - 1.0

    def _drafting_is_free(self, rows: int) -> bool:
        """Whether drafting a whole block for ``rows`` rows costs nothing that skipping would save."""
        return self.avoidable_draft_time(rows, max(self.max_draft_tokens, 1)) <= 0

    def _goodput_problem(self, rows: list[int], candidates: list[bool], depths: list[int], shallow: bool = False) -> tuple:
        """The arguments of ``drafting_goodput`` and ``choose`` for drafting the ``candidates`` of ``rows``: their
        ρ·φ·w_r·ĝ_r and priced widths v_r (``priced_widths``), Σ w over ``rows``, R, T, and D at the candidates' deepest depth.
        ``shallow``: the one-token offer's, ρ¹·w_r·ĝ¹_r at widths min(v_r, 1) (module docstring)."""
        drafted = [row for row, candidate in zip(rows, candidates) if candidate]
        ratio = self.fallback.prior.realised_ratio(self.band, first=shallow)
        if shallow:
            shrunk = self.shrunk_first_gain(drafted, self.fallback.prior.first_gain(self.band, len(rows)))
            priced_widths = [min(width, 1) for width in self.priced_widths(drafted, len(rows))]
        else:
            ratio *= self.fallback.prior.selection_ratio(self.band, len(rows))
            shrunk = self.shrunk_gain(drafted, self.fallback.prior.get(self.band, len(rows)))
            priced_widths = self.priced_widths(drafted, len(rows))
        gains = torch.tensor([self.priority[row] * gain * ratio for row, gain in zip(drafted, shrunk)], dtype=torch.float64)
        widths = torch.tensor(priced_widths, dtype=torch.long)
        deepest = max(max(depth for depth, candidate in zip(depths, candidates) if candidate), 1)
        draft_time = functools.partial(self.resume_draft_time, batch=len(rows), depth=deepest)
        return gains, widths, sum(self.priority[row] for row in rows), len(rows), self.cost_model.step_time, draft_time

    def priced_widths(self, drafted: list[int], rows: int) -> list[int]:
        """The width w in 0..γ each of ``drafted`` is priced at in a forward of ``rows`` rows: the one whose step
        time T(rows, 1 + w) / T(rows, 1) lies nearest the row's mean ratio over its own drafted steps (the narrower on
        a tie), round(λ_r) before its first. The mean of the times, not the time at the mean ℓ: a row that verifies
        four tokens on one step in eight and none on the others (prompt lookup between matches) widens one step in
        eight, where T at round(λ_r) = 1 would price every step one token wider (module docstring). The mean ratio is
        pulled towards the prior's, that of round(λ̄), as ĝ_r is towards ḡ (``shrunk``): the gain a step priced
        wider brings is pulled towards what rows verifying λ̄ tokens gain, so its width must be too."""
        one_token = self.cost_model.step_time(rows, 1)
        if one_token <= 0:
            return [round(self.verify[row]) for row in drafted]
        ratios = [self.cost_model.step_time(rows, 1 + width) / one_token for width in range(self.max_draft_tokens + 1)]
        prior = self.fallback.prior.get(self.band, rows)
        prior_ratio = None if prior is None else ratios[min(round(prior[1]), self.max_draft_tokens)]
        widths = []
        for row in drafted:
            if self.step_ratio[row] is None:
                widths.append(round(self.verify[row]))
                continue
            ratio = self.shrunk(row, self.step_ratio[row], prior_ratio)
            widths.append(min(range(len(ratios)), key=lambda width: (abs(ratios[width] - ratio), width)))
        return widths

    def avoidable_draft_time(self, rows: int, depth: int | None = None) -> float:
        """D(k): what drafting ``rows`` rows ``depth`` tokens deep (None: the whole block) adds to a step that drafts
        for none (module docstring)."""
        return max(self.cost_model.draft_time(rows, depth) - (self.idle_seconds or 0.0), 0.0)

    @property
    def catch_up_seconds(self) -> float | None:
        """Seconds per row and unread feature column that a pass pays to read them (``GainPrior.catch_up``)."""
        return self.fallback.prior.catch_up

    def resume_draft_time(self, count: int, batch: int | None = None, depth: int | None = None) -> float:
        """D(k) for this step, k = ``count`` of ``batch`` rows (default k), ``depth`` deep: ``avoidable_draft_time`` plus
        the catch-up of the skipped steps' columns and of the unread prompt's spread over the steps left (module
        docstring)."""
        columns = self.skipped_steps + self.unread_prompt_columns / max(self.steps_left, 1)
        return self._with_catch_up(count, batch, columns, depth)

    def probe_draft_time(self, count: int, batch: int | None = None, depth: int | None = None) -> float:
        """D(k) a probe is judged by: ``avoidable_draft_time``, plus every unread column while the prompt is unread."""
        columns = self.unread_prompt_columns + self.skipped_steps if self.unread_prompt_columns else 0
        return self._with_catch_up(count, batch, columns, depth)

    def _with_catch_up(self, count: int, batch: int | None, columns: float, depth: int | None) -> float:
        """``avoidable_draft_time(count, depth)`` plus reading ``columns`` unread columns of ``batch`` rows (default ``count``)."""
        return self.avoidable_draft_time(count, depth) + (self.catch_up_seconds or 0.0) * (count if batch is None else batch) * columns

    def probe_interval_cap(self, rows: int, depth: int | None = None, probe_seconds: float | None = None) -> int:
        """The longest wait between probes: the steps over which probing ``rows`` rows ``depth`` deep costs
        ``_PROBE_BUDGET`` of one-token steps (c / (budget·T(rows, 1)), rounded up), within probe_after..max_probe_interval.
        c = ``probe_seconds``, what a probe is predicted to lose (``probe_loss``), or without it D(rows)."""
        budget = _PROBE_BUDGET * self.cost_model.step_time(rows, 1)
        cost = self.avoidable_draft_time(rows, depth) if probe_seconds is None else probe_seconds
        # Rounded up past a float's error: a loss computed as a difference of goodputs lands a hair above its ratio.
        steps = math.ceil(cost / budget - 1e-9) if budget > 0 else self.fallback.max_probe_interval
        return min(max(steps, self.fallback.probe_after), self.fallback.max_probe_interval)

    def probe_loss(self, rows: list[int], chosen: list[bool], depths: list[int]) -> float | None:
        """c: the seconds a step that also drafts every observed row of ``rows`` outside ``chosen`` (priced ``depths``
        deep) is predicted to lose against one that drafts ``chosen`` alone: (Σ w + G')·(1/Θ(S') − 1/Θ(S)) ≥ 0, S the
        chosen rows, S' with the others, G' the gain S' is estimated at (module docstring); None when no row outside S was
        observed. Near break-even a probe costs little whatever its D, so rows the choice keeps out by a margin within the
        machine's noise are measured again soon, and so are the cost model's cells their drafted steps observe."""
        probed = [is_chosen or self.observed[row] for row, is_chosen in zip(rows, chosen)]
        if probed == chosen:
            return None
        tokens, with_probes = self._set_goodput(rows, probed, depths)
        _, without = self._set_goodput(rows, chosen, depths)
        if with_probes <= 0 or without <= 0:
            return None
        return max(tokens * (1 / with_probes - 1 / without), 0.0)

    def _set_goodput(self, rows: list[int], members: list[bool], depths: list[int]) -> tuple[float, float]:
        """(Σ w + G, Θ) of drafting the ``members`` of ``rows`` (``depths`` deep): the tokens one step is estimated to
        emit, weighted, and Θ (module docstring)."""
        if not any(members):
            base = sum(self.priority[row] for row in rows)
            return base, base / self.cost_model.step_time(len(rows), 1)
        problem = self._goodput_problem(rows, members, depths)
        _, theta = drafting_goodput(*problem)
        return problem[2] + float(problem[0].sum()), float(theta[-1])

    def _probe_cap(self, rows: list[int], chosen: list[bool], depths: list[int], priced: list[int]) -> int:
        """``probe_interval_cap`` of probing ``rows`` as deep as the deepest of ``depths``, at ``probe_loss`` beside the
        ``chosen`` rows (priced at ``priced``)."""
        return self.probe_interval_cap(len(rows), max(max(depths), 1), self.probe_loss(rows, chosen, priced))

    def draft_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """LongTensor[R] of draft depths, 0 for rows not drafted: the rows in the best predicted set (every row
        where drafting costs nothing avoidable), the rows never observed (when earlier generations say
        nothing about this batch size), and the rows due a probe get their ``depth``."""
        rows = rows.tolist()
        self.read_gain = [None] * len(self.read_gain)  # what the last choice read is spent
        if self._choice_key(rows) == self._idle_key:
            return torch.zeros(len(rows), dtype=torch.long)
        chosen, probes, depths, priced, shallow = self._choice(rows)
        self._remember_read_gains(rows, chosen, shallow)
        cap = None
        for row, is_chosen, is_probe in zip(rows, chosen, probes):
            if is_chosen:  # a row back in starts over
                self.interval[row] = self.fallback.probe_after
            elif is_probe and self.own_steps[row] > 0:
                # A re-probe of a row its estimate keeps out waits twice as long for the next (a first probe only
                # measures the row: the prior's wait stands).
                cap = self._probe_cap(rows, chosen, depths, priced) if cap is None else cap
                self.interval[row] = min(2 * self.interval[row], cap)
        self.fallback.prior.remember_probe_interval(self.band, len(rows), min(self.interval[row] for row in rows))
        drafting = [is_chosen or is_probe for is_chosen, is_probe in zip(chosen, probes)]
        self._idle_key = None if any(drafting) else self._choice_key(rows)
        return torch.tensor([depth if drafts else 0 for depth, drafts in zip(depths, drafting)], dtype=torch.long)

    def _remember_read_gains(self, rows: list[int], chosen: list[bool], shallow: bool) -> None:
        """Keep the ĝ_r the rule chose each of the ``chosen`` of ``rows`` on, for ``observe`` to compare with what their
        step gains (φ, module docstring): none for the one-token offer's choice."""
        if shallow or not any(chosen):
            return
        drafted = [row for row, is_chosen in zip(rows, chosen) if is_chosen]
        for row, gain in zip(drafted, self.shrunk_gain(drafted, self.fallback.prior.get(self.band, len(rows)))):
            self.read_gain[row] = gain

    def _choice(self, rows: list[int], starting: bool = False) -> tuple[list[bool], list[bool], list[int], list[int], bool]:
        """(chosen, probes, depths, priced, shallow) for ``rows``: the rows in the best predicted set (priced at
        ``priced``), the rows to probe (never observed, or due and a probe could pay, or due at all in a probed
        generation's first step), and every row's depths, drafted and priced (``depths``); ``shallow``: whether the set is
        the one-token offer's (``_shallow_choice``), drafted and priced one token deep.
        Rows new to the run take the prior's estimate first, the only change it makes. ``starting``: the generation's
        first choice, which judges its probes by the ceiling alone (module docstring)."""
        prior = self.fallback.prior.get(self.band, len(rows))
        if prior is not None:
            first_gain = self.fallback.prior.first_gain(self.band, len(rows))
            for row in rows:
                if not self.observed[row]:
                    self.gain[row], self.verify[row], self.observed[row] = prior[0], prior[1], True
                    self.first_gain[row] = first_gain
        observed = [self.observed[row] for row in rows]
        chosen = [False] * len(rows)
        depths, priced = self.depths(rows)
        deepest = max(max(depths), 1)  # a cost model prices depths >= 1
        if self._drafting_is_free(len(rows)):
            # Skipping would only stop the row from being measured, so every row is drafted for and the scheduler
            # alone decides what to verify.
            chosen = [True] * len(rows)
        elif any(observed):
            chosen = self._rule_choice(rows, observed, priced)
        shallow = False
        if not any(chosen) and any(observed):
            shallow_chosen, shallow_depths = self._shallow_choice(rows)
            if any(shallow_chosen):
                chosen, depths, priced, shallow = shallow_chosen, shallow_depths, shallow_depths, True
                deepest = max(max(depths), 1)
        due = [not is_chosen and is_due for is_chosen, is_due in zip(chosen, self._due(rows))]
        if any(due) and not self._probed_generation:
            cap = None if starting else self._probe_cap(rows, chosen, depths, priced)
            if not self._a_probe_could_pay(rows, cap, deepest):
                due = [False] * len(rows)
        return chosen, [not is_observed or is_due for is_observed, is_due in zip(observed, due)], depths, priced, shallow

    def _shallow_choice(self, rows: list[int]) -> tuple[list[bool], list[int]]:
        """The one-token offer, made when the choice at the rows' own depths drafts for none: (chosen, depths) of the best
        set by ``choose`` among the rows with a g¹, on ρ¹·w_r·ĝ¹_r at widths min(v_r, 1) and D one token deep (module
        docstring). Every row's depth is 1, or what ``depths`` makes of 1 (a whole block where it costs next to nothing,
        a cheaper width), as the choice's own."""
        candidates = [self.observed[row] and self.first_gain[row] is not None for row in rows]
        if not any(candidates):
            return [False] * len(rows), [0] * len(rows)
        gamma = self.max_draft_tokens
        depths = [gamma] * len(rows) if self.fallback.depth_margin is None else self._settled_depths(len(rows), [min(1, gamma)] * len(rows))[0]
        return self._rule_choice(rows, candidates, depths, shallow=True), depths

    def _rule_choice(self, rows: list[int], candidates: list[bool], depths: list[int], shallow: bool = False) -> list[bool]:
        """Per row of ``rows``: whether ``choose`` drafts it, asked about the ``candidates`` (``_goodput_problem``)."""
        picked = self.fallback.choose(*self._goodput_problem(rows, candidates, depths, shallow))
        if not isinstance(picked, torch.Tensor) or tuple(picked.shape) != (sum(candidates),):
            raise TypeError(f"{type(self.fallback).__name__}.choose must return a BoolTensor[{sum(candidates)}], got {picked!r}")
        picked = iter(picked.tolist())
        return [is_candidate and bool(next(picked)) for is_candidate in candidates]

    def shrunk_first_gain(self, rows: list[int], prior: float | None) -> list[float]:
        """ĝ¹_r of ``rows`` (each with a g¹): g¹_r pulled towards the prior's g¹ as ĝ_r is towards ḡ (``shrunk``)."""
        return [self.shrunk(row, self.first_gain[row], prior) for row in rows]

    def shrunk_gain(self, rows: list[int], prior: tuple[float, float] | None) -> list[float]:
        """ĝ_r of ``rows``: g_r pulled towards the prior's g (``shrunk``; module docstring)."""
        return [self.shrunk(row, self.gain[row], None if prior is None else prior[0]) for row in rows]

    def shrunk(self, row: int, own: float, prior: float | None) -> float:
        """(m_r·``own`` + κ·``prior``) / (m_r + κ): a value of row ``row`` pulled towards the prior's by ``prior_weight``
        pseudo-steps against its own drafted steps, aged (``aged_evidence``) and counted up to the smoothing's horizon
        (2 − α)/α; ``own`` itself without a prior or with κ = 0."""
        weight = self.fallback.prior_weight
        if prior is None or weight == 0:
            return own
        steps = min(self.aged_evidence(row), (2 - self.fallback.smoothing) / self.fallback.smoothing)
        return (steps * own + weight * prior) / (steps + weight)

    def aged_evidence(self, row: int) -> float:
        """m_r: row ``row``'s own drafted steps, each weighing (1 − α)^k, k the steps skipped since it (module docstring): a
        skipped step observes nothing, so what the row showed ages as the smoothing ages an observation. With no step
        skipped, the count of its drafted steps."""
        return self.evidence[row] * (1 - self.fallback.smoothing) ** self.skipped[row]

    def _explores(self, row: int) -> bool:
        """Whether row ``row``'s next drafted step is one that the margin deepens (one of every ``probe_after``)."""
        return self.observed[row] and self.own_steps[row] % self.fallback.probe_after == 0

    def depths(self, rows: list[int]) -> tuple[list[int], list[int]]:
        """(drafted, priced): how many tokens to draft for each of ``rows`` if drafted (``depth_margin``), and the depths
        the choice prices them at, the same without the margin's exploring token. The margin explores for the row's
        later steps; priced, its deeper pass tipped rows near break-even out on exactly their exploring steps, and a
        skipped row stays on such a step until its probe (at one row and temperature 1, rows drafted for seven steps
        in eight skipped 8–16 steps at each eighth: a probe, not kept). Either list is γ for every row where a whole
        block costs at most ``_PROBE_BUDGET`` of a one-token step more than its shallowest depth (savings that small
        are not worth cutting a long match short); else deepened to where a wider step is no dearer
        (``reach_cheaper_widths``, ``reach_depth``)."""
        margin, gamma = self.fallback.depth_margin, self.max_draft_tokens
        whole_block = [gamma] * len(rows)
        if margin is None:
            return whole_block, whole_block
        # ⌈λ_r⌉ up to a tolerance of α (at most ½): one deeper verification raises λ_r by the newest step's weight, at
        # least α, and fades by (1 − α) a step, so without it one ℓ = 2 at α = 0.1 drafted two deep for the ~200 steps
        # its excess takes to fall below a rounding error (a generation of 49 steps drafted two or three deep on 41 of
        # them and verified two tokens on 2, at 0.45 ms or more a deeper pass: a probe, not kept). Two deeper steps
        # close together still clear it.
        tolerance = min(self.fallback.smoothing, 0.5) + 1e-9
        lengths = [math.ceil(self.verify[row] - tolerance) for row in rows]
        priced = [min(max(length, 1), gamma) if self.observed[row] else gamma for row, length in zip(rows, lengths)]
        # The margin explores: on one drafted step in probe_after, so that λ_r can grow where deeper tokens pay.
        drafted = [min(max(length + margin, 1), gamma) if self._explores(row) else depth for row, length, depth in zip(rows, lengths, priced)]
        settled = self._settled_depths(len(rows), *((drafted,) if priced == drafted else (drafted, priced)))
        return settled[0], settled[-1]

    def _settled_depths(self, rows: int, *depth_lists: list[int]) -> list[list[int]]:
        """Each of ``depth_lists`` for a forward over ``rows`` rows, as drafted: γ for every row where a whole block costs
        at most ``_PROBE_BUDGET`` of a one-token step more than the list's shallowest depth, else each deepened to where a
        wider step is no dearer (``reach_cheaper_widths``, ``reach_depth``; ``depths``). The step costs are read once."""
        gamma = self.max_draft_tokens
        step_costs = None
        settled = []
        for depths in depth_lists:
            extra = self.cost_model.draft_time(rows, max(gamma, 1)) - self.cost_model.draft_time(rows, max(min(depths), 1))
            if extra <= _PROBE_BUDGET * self.cost_model.step_time(rows, 1):
                settled.append([gamma] * len(depths))
            elif not self.fallback.reach_cheaper_widths:
                settled.append(depths)
            else:
                if step_costs is None:
                    step_costs = [self.cost_model.draft_time(rows, depth) + self.cost_model.step_time(rows, 1 + depth) for depth in range(1, gamma + 1)]
                settled.append([reach_depth(depth, step_costs) for depth in depths])
        return settled

    def _due(self, rows: list[int]) -> list[bool]:
        """Per row of ``rows``: due a probe, never measured in this generation or skipped for its wait."""
        return [self.own_steps[row] == 0 or self.skipped[row] >= self.interval[row] for row in rows]

    def _choice_key(self, rows: list[int]) -> tuple:
        """The batch, the rows due a probe, the idle time and the prior's version: with the skipped rows'
        estimates, everything a choice that drafts for no row reads that can change between steps."""
        return tuple(rows), tuple(self._due(rows)), self.idle_seconds, self.fallback.prior.version

    def _a_probe_could_pay(self, rows: list[int], probe_interval_cap: int | None, depth: int) -> bool:
        """Whether drafting one row ``depth`` deep that gains as much as the best row ever did here would pay, at a
        probe's ``probe_draft_time`` (True while
        fewer than ``_CEILING_EVIDENCE`` rows drafted here, each counted once a generation, and where probing every ``probe_after``
        steps stays within ``_PROBE_BUDGET``, which ``probe_interval_cap`` (this step's) says: such probes are too
        cheap to give up; None, for a generation's first choice, judges by the ceiling alone)."""
        ceiling = self.fallback.prior.ceiling(self.band, len(rows))
        if ceiling is None or self.fallback.prior.evidence(self.band, len(rows)) < _CEILING_EVIDENCE:
            return True
        if probe_interval_cap is not None and probe_interval_cap <= self.fallback.probe_after:
            return True
        gain = torch.tensor([ceiling[0] * max(self.priority[row] for row in rows)], dtype=torch.float64)
        return bool(self.fallback.choose(
            gain, torch.tensor([round(ceiling[1])]), sum(self.priority[row] for row in rows), len(rows), self.cost_model.step_time,
            functools.partial(self.probe_draft_time, batch=len(rows), depth=depth),
        )[0])

    def observe(self, record: StepRecord) -> None:
        """Smooth g_r and λ_r of the rows drafted for (their first outcome replaces the prior's estimate); count the
        skipped; on a step that drafted for no row, keep the least ``draft_seconds`` as the idle time; on the first
        pass after unread columns (the prompt, skipped steps), learn the catch-up per row and column from what the
        pass took over the cost model's ``draft_time``."""
        rows = record.rows.tolist()
        drafted = record.asked.tolist()
        self.steps_left -= 1
        if not any(drafted):
            self.idle_seconds = record.draft_seconds if self.idle_seconds is None else min(self.idle_seconds, record.draft_seconds)
            self.skipped_steps += 1
            self.fallback.prior.age(self.band)
            for row in rows:
                self.skipped[row] += 1
            return
        count = sum(drafted)
        unread = self.unread_prompt_columns + self.skipped_steps
        if unread > 0:
            extra = max(record.draft_seconds - self.cost_model.draft_time(count, max(int(record.drafted.max()), 1)), 0.0)
            self.fallback.prior.remember_catch_up(extra / (unread * len(rows)))
        self.unread_prompt_columns = self.skipped_steps = 0
        self._probed_generation = False  # its first probe is done: later ones are judged as usual
        verify_lengths, accepted = record.verify_lengths.tolist(), record.accepted.tolist()
        survival = _host_survival(record)
        gains = _verified_gains(survival, verify_lengths, accepted, None)
        first_gains = _verified_gains(survival, verify_lengths, accepted, 1)
        one_token = self.cost_model.step_time(len(rows), 1)
        outcomes = []  # (gain, verify length, accepted, first positions' gain) of each drafted row
        chosen_gained, chosen_read = 0.0, 0.0  # what the rows the rule chose gained, and the ĝ_r it read for them
        first_steps = 0
        for row, drafts, gain, verify_length, accepted_count, first_gain in zip(rows, drafted, gains, verify_lengths, accepted, first_gains):
            if not drafts:
                self.skipped[row] += 1
                continue
            if self.read_gain[row] is not None:
                chosen_gained, chosen_read = chosen_gained + gain, chosen_read + self.read_gain[row]
            first_steps += int(self.own_steps[row] == 0)
            self.own_steps[row] += 1
            # The newest step weighs 1/m_r (at least α): after a long skip, the row's aged estimate gives way to it.
            self.evidence[row] = self.aged_evidence(row) + 1.0
            weight = _new_step_weight(self.evidence[row], self.fallback.smoothing)
            self.gain[row] += weight * (gain - self.gain[row])
            self.verify[row] += weight * (verify_length - self.verify[row])
            known_first = first_gain if self.first_gain[row] is None else self.first_gain[row]
            self.first_gain[row] = known_first + weight * (first_gain - known_first)
            if one_token > 0:
                ratio = self.cost_model.step_time(len(rows), 1 + verify_length) / one_token
                known = ratio if self.step_ratio[row] is None else self.step_ratio[row]
                self.step_ratio[row] = known + weight * (ratio - known)
            self.observed[row], self.skipped[row] = True, 0
            outcomes.append((gain, verify_length, accepted_count, first_gain))
        gains, verify_lengths, accepted, first_gains = zip(*outcomes)
        self.fallback.prior.update(self.band, len(rows), gains, verify_lengths, accepted, first_steps=first_steps, first_gains=first_gains)
        # Every drafting step discounts φ's sums, as it does ρ's: a φ that keeps rows out of the choice still ages.
        self.fallback.prior.update_selection(self.band, len(rows), chosen_gained, chosen_read)
