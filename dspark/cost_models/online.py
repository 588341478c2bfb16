"""A cost model that learns, while generating, how far another one is off on this machine.

It keeps two sets of what follows, one learnt from greedy generations and one from sampled ones, and a
generation's ``start`` picks the one its sampling needs: a sampled step does more around the same forward. Where the
base answers from one of several tables (``AutoProfiledCostModel``: one per generation shape, named by its ``table_key``
hook), it keeps both sets per table, and the pace π (below) across them: batches of prompts of different lengths take
turns on two or three tables, and sets forgotten at each switch made every stretch start again from the profile alone
(in a trace, not in a committed benchmark: at four rows, temperature 1, on training prompts, the table switched at 4
of 10 generations; one generation back on the short-prompt table, on a fresh set, verified drafts on 44 of its 63
steps, where the one before it on that table, on the set it had learnt, verified none). A base whose ``start`` says
its answers changed without naming another table (no hook, or the same key) makes the model forget everything.

Notation: t₀(R, T) and d₀(R, k) are the wrapped (base) model's step and drafting times for R rows of
T new tokens, and of k drafted tokens (the drafting surface has depth k where the step surface has T;
what follows says T for both); a cell is a pair (bucket(R), bucket(T)) with ``bucket(n)`` = n up to 16, else the
next power of two (``dspark.fast_path.row_bucket``), so the cells, and the memory, stay bounded
whatever the batch. Each observation of a step that took s seconds where the base predicted
p = t₀(R, T) > 0 gives its cell the ratio clip(s/p). While a cell's ratios, with one more value counted twice,
number at most ⌈1/α⌉ (α = ``smoothing``; 16 values at most, for memory), its correction k is their median with that
value counted twice: the k it would answer with unobserved (below), read afresh at every answer. From then on each
ratio smooths k (where α ≥ 1/2, from the first: no median forms),
k ← k + α·(clip(s/p) − k), starting from the median's last answer. The global correction g starts at 1
and is smoothed from the first ratio on. Why a median first: smoothing alone keeps a cell seen a few
times near where it started (3 observations move it 27% of the way at α = 0.1), and one start is the
profile, measured on another day: at 16 rows on a CPU the drafted cells, seen only in a 4-token
warm-up, kept prices well below what their steps took while plain generations taught the one-token cell
the machine's pace, so a generation's first choice saw a gain in drafting that was not there. Why the
unobserved k, read afresh: a cell seen a few times moves with the cell it follows (the one-token cell, above,
as it learns the machine's pace). Why counted twice: a lone first ratio then leaves k where it was, two that
agree move it halfway and three all the way, so one early observation far off (a pass after skipped steps
reads their columns; a step in a slow moment) does not price a cell alone. A cell priced too high is one a
scheduler avoids, so it is seen again only rarely: with prompt lookup at one row, one slow first step of the
four-token cell, taken halfway, priced verifying a third token 13–14% above two (in a trace), the scheduler
verified fewer of the tokens lookup proposed, and the cell came back only after about a round.
``clip`` bounds a ratio to [k/2, 2k] of the current k: once smoothing, one outlier (a pause of the
process, a drafter's pass that also reads the whole prompt) moves a correction by at most a factor
1 + α, where unbounded it could multiply it many times over and make drafting look too dear to ever try
again, while a lasting change is still followed, by up to 1 + α per step. The corrected
time of a point in a cell is h = t₀(R, T)·k (at the usual pace, below); a cell never observed takes the k of the widest
observed cell of its row bucket with fewer tokens: the profile's shape along tokens is kept where nothing
says otherwise (a per-row fixed overhead makes narrow cells' k larger, and giving wider cells g would
flatten the curve, making extra tokens look free). With no such cell, a drafting cell takes g, and a step
cell the least of 1 (the profile, which measured this very cell), g and the k of the narrowest observed
cell of its row bucket with more tokens, if any, from that cell's own ratios (while it has few, their
median without its prior, which would be this cell's k). Such a step cell is typically the one-token step of a
batch size whose every step has verified drafts (or, in the cumulative maximum below, of a smaller batch
not seen yet), and only a choice not to draft would observe it. The wider steps' k carries work that a
one-token step without drafts does not do (scoring, scheduling and accepting the drafts around a wider
forward), so a k taken from them prices the one-token step too high and drafting too cheap, an error no
step would ever correct; a k too low makes skipping look cheap, and the skipped steps then measure the
cell. A drafting cell errs the other way for the same reason: only drafting observes it. Where the base predicts 0 (a cost
model that knows no drafting time), a cell instead learns the observed seconds themselves, the same way:
an unobserved one takes the seconds the widest observed cell of its row bucket with fewer tokens has
learnt, else the narrowest with more (a shallow pass is not charged the average of deeper ones), each
from its own observations, else the global seconds (learnt the same way without a prior), and that is the
prior of its first observations.

A larger batch must never look cheaper, or a scheduler would verify more than it should, so the
answer is the cumulative maximum of h over every R' ≤ R: at T's own token bucket for a step, over all
(R', T') ≤ (R, T) for a drafting pass (a deeper pass runs the drafter's head more often, never less). Steps are
not forced up along tokens because a wider forward can truly cost less: on a 2-core EPYC (family 25) the packed
products of two rows streamed their weights slower than those of four or six, so a step of two rows and one token
took longer in the loop than one of two rows and two or three tokens (52.5 against 49.4 and 47.9 ms,
``benchmarks/results/bench_step_widths.json``). A maximum over tokens priced every wider step at least that dear
narrow one; deep steps then looked nearly free beside the cheaper two and three tokens they were compared with, and
the scheduler verified four and five tokens at two rows, whose steps took 58.5 and 56.5 ms.
Each observed step cell answers what its steps took; one priced too low is chosen, so observed, and corrected.
Within a cell the correction is one number and t₀ is monotone, so that maximum is attained at one corner per cell —
the smaller of the cell's top and the query along each axis it runs over — and it takes one base evaluation per cell
below the query (a drafting answer up to 16 deep reads the one a token shallower and the cells at its own depth
only, ``_CorrectedSurface._answer``). A cell never observed enters that maximum at no more than what any observed
cell at or above it in rows (and, for drafting, in depth; for a step, of its token bucket) answers, at that cell's
least point at or above the corner: a forward over no more rows takes no longer than one measured on this machine,
while the profile's entry for a cell no step observes may have been timed in a burst of another process's work, and
through the maximum it would price every larger batch, an error no step could correct (at four rows, a profile's
noisy one- and two-row one-token entries priced every skipped step above what the four-row steps took, so skipping
looked dear and drafting paid on paper). Answers are cached until an observation that can change them: one of a
settled cell they read, or any at all where they read a cell not settled or not observed (a settled cell's k is its
own smoothed ratio, which nothing else moves).

A shared machine's pace changes from one second to the next (another tenant's work on a cloud CPU): the same forward
runs fast for a while, then slow (``benchmarks/results/bench_pace.json``: consecutive four-row forwards' times
correlate, 0.51 at lag 1). A cell observed rarely, such as a batch's one-token step in generations that draft on most
steps, keeps whatever spell it was seen in, and the comparison that decides whether drafting pays, a wider step
against the one-token step, then compares two spells: in traces at four rows, a one-token cell seen in slow spells was
priced as dear as the two-token cell seen in fast ones, and drafting showed a gain it did not have. So every answer,
of steps and of drafting passes, is h·π, where π, the machine's pace (``_Pace``, one per model), is learnt from the
steps observed in settled cells (past their median): π ← π + β·(clip(s/h₀) − π), h₀ = t₀(R, T)·k₀ the cell's answer at
the usual pace when it settled (k₀, its anchor: its k after its first smoothed observation, the one after its median
or, where α ≥ 1/2, its first; or its seconds where the base predicts 0), β = ``pace_smoothing`` (a few steps); and
every cell learns s/π, π that of the steps before this one, what the step or pass would have taken at the usual pace.
Why the anchor and not the cell's k now: that k learns s/π in turn, so π and the k of the cell seen most could trade a
factor with nothing to hold their split, and skewed step times (a shared CPU's spikes; E[1/x] > 1/E[x]) traded it one
way, π up and that k down a little every step, while a cell seen rarely kept its k, so its price rose against the
other's without bound (in a trace at one row, not in a committed benchmark: over 24 generations π rose to 1.4–1.9 and
the two-token cell's k fell from 0.59 to 0.49 while the one-token cell's stayed near 0.53, so a one-token step was
priced above a two-token one, and skipping a draft looked dearer than verifying one token; under log-normal noise,
3000 steps priced it 3× — ``test_skewed_steps_of_a_cell_seen_often_do_not_drift_the_price_of_one_seen_rarely``). A
spell moves π, not the cells, and so does a lasting change: the cells keep the machine's shape, π its level. A lasting
change that passed into the cells would reach each at the rate it is observed, and a cell seen rarely would keep the
old level: in a trace at one row, minutes of a slow machine where generations drafted often, then minutes of a fast
one, taught the one-token cell, seen on every step, the fast level and left the two-token cell at the slow one, so a
second token was priced 1.4× the first where the steps took about 1.1×, and the fallback stopped drafting where MTP-1
gained. π multiplies every answer alike, so it cancels from every comparison made at one moment: an outlier (a pause
of the process) moves π by a factor 1 + β at most, and what a scheduler compares not at all. A cell's first
observations do not move π: their error is the cell's own. ``pace_smoothing=None`` keeps π at 1.

An anchor starts where the cell's median left it, and that median read each step over the π of the steps before it, a
π that the steps of a cell still forming its median do not move: a cell whose median formed in a stretch of its own
steps while the machine's pace drifted starts anchored off by that drift. Steps taken in stretches then keep the error
for good: within a cell's stretch π reads the steps against that cell's anchor and the cell's k learns the anchor
back, and only the steps where one cell follows another compare the two. So a step of a settled cell that follows one
of another settled cell in the same generation first corrects both anchors (``_contrast``): two consecutive steps run
at nearly one pace, so their readings r = s/h₀ agree where the anchors are right, and log h₀ of the later cell moves
by α/2·log clip(r_later/r_earlier), that of the earlier by as much the other way. The sum of the logs of the anchors
stays where it was, so their common level, which π carries, does not wander (the drift above), and in logs skewed
steps push it neither way. Steps of two generations are not compared: other work ran between them. Without this, in a
trace at two rows, greedy (not in a committed benchmark), DSpark drafted in stretches and on one table priced a second
token at a median 1.08× the first where its two-token steps took 1.22× its one-token ones, and
``test_cells_seen_in_stretches_correct_an_anchor_that_settled_in_a_slow_spell`` priced a one-token step 11–17% above
an equal two-token one.

dspark's loop feeds it after every step, through the optional cost-model hooks
``observe_step(rows, tokens, seconds)`` with the step's rows, its verify width (1 + max ℓ) and
``StepRecord.verify_seconds``, and ``observe_draft(rows, seconds, depth)`` with
``StepRecord.draft_seconds`` and the depth of the pass. Both are host wall-clock times that include what the loop does
around the forward and the drafter (the acceptance rule; estimating and scheduling), so the
corrected model learns the whole cost a step's choice incurs, not the bare forward.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Callable

from dspark.checks import check_fraction, check_int, check_seconds
from dspark.fast_path import row_bucket
from dspark.protocols import COST_MODEL_HOOKS, CostModel, check_draft_time, check_hooks, hook
from dspark.types import GenerationStart

__all__ = ["OnlineCorrectedCostModel"]

# Answers and base evaluations kept between observations; the caches are emptied when they reach this.
_CACHE_LIMIT = 4096


def _buckets_up_to(count: int) -> list[int]:
    """Every bucket ≤ bucket(count), in order: 1..16, then 32, 64, ..."""
    top = row_bucket(count)
    buckets = list(range(1, min(top, 16) + 1))
    bucket = 32
    while bucket <= top:
        buckets.append(bucket)
        bucket *= 2
    return buckets


def _lowest(bucket: int) -> int:
    """The least count in ``bucket`` (``row_bucket``): the bucket itself up to 16, else one more than half of it."""
    return bucket if bucket <= 16 else bucket // 2 + 1


#: An observation counts as at most this factor above, or below, the correction it updates.
_OUTLIER_BOUND = 2.0


def _clip(value: float, around: float) -> float:
    """``value`` bounded to [``around`` / ``_OUTLIER_BOUND``, ``around`` · ``_OUTLIER_BOUND``]."""
    return min(max(value, around / _OUTLIER_BOUND), around * _OUTLIER_BOUND)


#: The most values a cell's median is taken over (``_Learnt``): ⌈1/α⌉ where α ≥ 1/16, so memory stays bounded.
_MEDIAN_VALUES = 16

#: How many values a cell's prior counts as in its median (module docstring).
_PRIOR_COUNT = 2


class _Learnt:
    """One learnt quantity: a cell's ratio observed/predicted, or its seconds, or the global ones. While an
    observation, its predecessors and the prior (if any, counted ``_PRIOR_COUNT`` times) number at most ⌈1/α⌉ (and
    ``_MEDIAN_VALUES``), it joins ``early`` and the answer is the median of ``early`` and of the prior passed in when
    asked, counted as many times (module docstring); from then on, exponential smoothing from the median's last answer.
    ``anchor`` is the answer after the first smoothed observation, kept for π (module docstring)."""

    __slots__ = ("anchor", "early", "smoothed")

    def __init__(self, smoothed: float | None = None):
        self.early: list[float] = []
        self.smoothed = smoothed
        self.anchor: float | None = None  # the answer after the first smoothed observation, which π is learnt against

    def value(self, prior: float | None) -> float | None:
        """What it answers with, given ``prior`` (None: no prior; None back where nothing was observed either)."""
        if self.smoothed is not None:
            return self.smoothed
        values = self.early if prior is None else [prior] * _PRIOR_COUNT + self.early
        return statistics.median(values) if values else None

    def learn(self, value: float, smoothing: float, prior: float | None) -> None:
        """Learn one observation, bounded to a factor ``_OUTLIER_BOUND`` of the current answer."""
        current = self.value(prior)
        if current is not None and current > 0:
            value = _clip(value, current)
        prior_values = 0 if prior is None else _PRIOR_COUNT
        if self.smoothed is None and len(self.early) + prior_values + 1 <= min(math.ceil(1 / smoothing), _MEDIAN_VALUES):
            self.early.append(value)
            return
        if self.smoothed is None:  # an observation or a prior came before, so current is a number
            self.smoothed, self.early = current, []
        self.smoothed += smoothing * (value - self.smoothed)
        if self.anchor is None:
            self.anchor = self.smoothed


def _settled(learnt: _Learnt | None) -> bool:
    """Whether ``learnt`` was observed and is past its median (smoothing): it reads no prior any more."""
    return learnt is not None and learnt.smoothed is not None


class _Cell:
    """What one cell has learnt, where it was observed: its ratio, and seconds where the base predicts 0."""

    __slots__ = ("ratio", "seconds")

    def __init__(self):
        self.ratio: _Learnt | None = None
        self.seconds: _Learnt | None = None


def _neighbours(observed: list[int], bucket: int) -> tuple[int | None, int | None]:
    """In the sorted token buckets ``observed``, the widest below ``bucket`` and the narrowest above it (None where none)."""
    below = bisect.bisect_left(observed, bucket)
    above = bisect.bisect_right(observed, bucket)
    return (observed[below - 1] if below else None), (observed[above] if above < len(observed) else None)


class _Pace:
    """π, the machine's pace now against the pace the cells learnt at (module docstring): each step observed in a
    settled cell pulls it by β = ``smoothing`` towards what the step took over the cell's anchored answer h₀ (the
    answer, without π, when the cell settled, since corrected by contrasts; clipped like any ratio). A step of another
    settled cell right after one of the same generation first corrects both cells' anchors by the contrast of the two
    readings (``_contrast``). Always 1 while disabled (``smoothing`` None)."""

    __slots__ = ("last", "smoothing", "value")

    def __init__(self, smoothing: float | None):
        self.smoothing = smoothing
        self.value = 1.0
        # The previous step's settled cell and its reading s/h₀, while the step just before this one was such a step
        # of this generation; None after a step of a cell not settled, and at a generation's start (``forget_last``).
        self.last: tuple[_Learnt, float] | None = None

    def forget_last(self) -> None:
        """Forget the previous step: the next one follows a gap (a new generation; a cell not settled)."""
        self.last = None

    def learn(self, learnt: _Learnt, anchored: float, seconds: float, anchor_smoothing: float) -> None:
        """Learn that a step of the settled cell ``learnt``, anchored at h₀ = ``anchored`` > 0 at its point, took
        ``seconds``: its anchor and the previous step's are corrected by ``_contrast`` at weight ``anchor_smoothing`` α
        (the cells'), then π learns the reading s/h₀. A step that took no time compares with no other."""
        if self.smoothing is None:
            return
        reading = seconds / anchored
        if reading > 0 and self.last is not None and self.last[0] is not learnt:
            reading /= _contrast(learnt, self.last[0], reading, self.last[1], anchor_smoothing)
        self.last = (learnt, reading) if reading > 0 else None
        self.value += self.smoothing * (_clip(reading, self.value) - self.value)


def _contrast(later: _Learnt, earlier: _Learnt, later_reading: float, earlier_reading: float, smoothing: float) -> float:
    """Correct the anchors of two settled cells whose steps ran one after the other, and return the factor ``later``'s
    anchor was multiplied by.

    Two consecutive steps run at nearly one pace, so their readings r = s/h₀ differ only where the anchors disagree
    with what the cells cost against each other (and by the step-to-step noise). With c = clip(r_later/r_earlier) the
    log contrast (both readings > 0), log h₀(later) += α/2·log c and log h₀(earlier) −= α/2·log c: each anchor takes
    half of the correction, together closing a share α of the log gap, so the sum of the logs of the anchors never
    changes and their common level, which π carries, cannot wander; in logs, skewed step times do not bias it one way."""
    factor = math.exp(smoothing / 2 * math.log(_clip(later_reading / earlier_reading, 1.0)))
    later.anchor *= factor
    earlier.anchor /= factor
    return factor


class _CorrectedSurface:
    """h = base·k·π per cell, answered as its cumulative maximum (module docstring). ``pace`` is shared by every
    surface of one model; only a surface that ``learns_pace`` (the steps') teaches it."""

    def __init__(
        self, base: Callable[[int, int], float], smoothing: float, profile_caps_unobserved: bool, pace: _Pace, learns_pace: bool,
        monotone_in_tokens: bool,
    ):
        self.base = base
        self.smoothing = smoothing
        self.pace, self.learns_pace = pace, learns_pace
        # A step surface: an unobserved cell with no narrower observed cell takes at most the profile (module docstring).
        self.profile_caps_unobserved = profile_caps_unobserved
        # The answer's cumulative maximum runs over rows, and over tokens only where this is set (drafting depths; module
        # docstring): a wider step can truly cost less.
        self.monotone_in_tokens = monotone_in_tokens
        self.cells: dict[tuple[int, int], _Cell] = {}
        self.overall = _Cell()  # g, smoothed from 1, and the global seconds, learnt without a prior
        self.overall.ratio, self.overall.seconds = _Learnt(smoothed=1.0), _Learnt()
        self._ratio_tokens: dict[int, list[int]] = {}  # per row bucket, the token buckets with a learnt ratio, sorted
        self._seconds_tokens: dict[int, list[int]] = {}  # likewise, with learnt seconds
        # Answers until an observation that can change them. A settled cell's k is its own smoothed ratio alone, so an
        # answer read only from settled cells changes only when one of them is observed; every other answer, each
        # unsettled cell's k and every bound may read g, a neighbour or the cells' list, so any observation drops them.
        self._answers: dict[tuple[int, int], tuple[float, tuple[tuple[int, int], ...] | None]] = {}  # ``_answer``'s
        self._readers: dict[tuple[int, int], set[tuple[int, int]]] = {}  # settled cell → the answers read from it
        self._unsettled_answers: set[tuple[int, int]] = set()  # answers read from a cell not settled, or unobserved
        self._corrections: dict[tuple[int, int], float] = {}  # unsettled and unobserved cells' k
        self._bounds: dict[tuple[tuple[int, int], int, int], float] = {}  # _bound's answers
        self._base_values: dict[tuple[int, int], float] = {}

    def _base(self, rows: int, tokens: int) -> float:
        value = self._base_values.get((rows, tokens))
        if value is None:
            if len(self._base_values) >= _CACHE_LIMIT:
                self._base_values.clear()
            value = self._base_values[(rows, tokens)] = float(self.base(rows, tokens))
        return value

    def observe(self, rows: int, tokens: int, seconds: float) -> None:
        key = (row_bucket(rows), row_bucket(tokens))
        cell = self.cells.get(key)
        if cell is None:
            cell = self.cells[key] = _Cell()
        predicted = self._base(rows, tokens)
        learnt = cell.ratio if predicted > 0 else cell.seconds
        # The cell learns this step over the π of the steps before it: divided by a π this very step moved against the
        # cell's own anchor, a cell seen rarely would keep part of its anchor's error for good (9% at β = 0.5 for an
        # anchor 20% off), where the π before it lets its k converge.
        pace_before = self.pace.value
        anchored = 0.0
        if self.learns_pace and _settled(learnt):  # while a cell's median forms, its error is its own
            anchored = predicted * learnt.anchor if predicted > 0 else learnt.anchor
        if anchored > 0:  # a seconds cell anchored at 0 s (steps that took no time) teaches no π
            self.pace.learn(learnt, anchored, seconds, self.smoothing)
        elif self.learns_pace:  # nothing the next step could be compared with
            self.pace.forget_last()
        seconds /= pace_before  # what the step would have taken at the usual pace
        # Each prior is read before the cell is listed as observed: a narrower step cell's k reads a wider one's
        # own ratios, which a cell about to learn its first does not have yet.
        if predicted > 0:
            prior = None if _settled(cell.ratio) else self._unobserved_correction(key)
            if cell.ratio is None:
                cell.ratio = _Learnt()
                bisect.insort(self._ratio_tokens.setdefault(key[0], []), key[1])
            cell.ratio.learn(seconds / predicted, self.smoothing, prior=prior)
            self.overall.ratio.learn(seconds / predicted, self.smoothing, prior=None)
        else:
            prior = None if _settled(cell.seconds) else self._unobserved_seconds(key)
            if cell.seconds is None:
                cell.seconds = _Learnt()
                bisect.insort(self._seconds_tokens.setdefault(key[0], []), key[1])
            cell.seconds.learn(seconds, self.smoothing, prior=prior)
            self.overall.seconds.learn(seconds, self.smoothing, prior=None)
        self._drop_answers_reading(key)

    def _drop_answers_reading(self, key: tuple[int, int]) -> None:
        """Forget what observing cell ``key`` may have changed: the answers read from it or from any cell not settled,
        every k but a settled cell's (read afresh from the cell) and every bound."""
        for point in self._unsettled_answers | self._readers.pop(key, set()):
            self._answers.pop(point, None)
        self._unsettled_answers = set()
        self._corrections.clear()
        self._bounds.clear()

    def _settled_at(self, key: tuple[int, int], rows: int, tokens: int) -> bool:
        """Whether cell ``key`` answers at the point (rows, tokens) from its own smoothed value alone: observed, and past
        its median in the quantity it learns there (its ratio, or its seconds where the base predicts 0)."""
        cell = self.cells.get(key)
        return cell is not None and _settled(cell.ratio if self._base(rows, tokens) > 0 else cell.seconds)

    def _usual(self, key: tuple[int, int], rows: int, tokens: int) -> float:
        """h at the point (rows, tokens) of cell ``key`` at the machine's usual pace (π = 1)."""
        base = self._base(rows, tokens)
        if base > 0:
            return base * self.correction(key)
        cell = self.cells.get(key)
        if cell is not None and _settled(cell.seconds):
            return cell.seconds.smoothed
        seconds = self._unobserved_seconds(key) if cell is None or cell.seconds is None else cell.seconds.value(self._unobserved_seconds(key))
        return 0.0 if seconds is None else seconds

    def _unobserved_seconds(self, key: tuple[int, int]) -> float | None:
        """The seconds cell ``key`` answers with unobserved: the widest observed cell's of its row bucket with fewer
        tokens, else the narrowest's with more, each from its own observations (their prior would be this cell's),
        else the global seconds; None where no seconds were observed."""
        narrower, wider = _neighbours(self._seconds_tokens.get(key[0], []), key[1])
        if narrower is None and wider is None:
            return self.overall.seconds.value(None)
        return self.cells[(key[0], wider if narrower is None else narrower)].seconds.value(None)

    def correction(self, key: tuple[int, int]) -> float:
        """The k of cell ``key``: its smoothed ratio; while it has few observations, their median with the k it
        would answer with unobserved (``_unobserved_correction``); unobserved, that k (module docstring)."""
        cell = self.cells.get(key)
        if cell is not None and _settled(cell.ratio):
            return cell.ratio.smoothed
        correction = self._corrections.get(key)
        if correction is None:
            if cell is None or cell.ratio is None:
                correction = self._unobserved_correction(key)
            else:
                correction = cell.ratio.value(self._unobserved_correction(key))
            self._corrections[key] = correction
        return correction

    def _unobserved_correction(self, key: tuple[int, int]) -> float:
        """The k cell ``key`` answers with unobserved: that of the widest observed cell of its row bucket with fewer
        tokens, else g, or on a step surface the least of 1, g and the k the narrowest observed cell with more
        tokens has from its own ratios."""
        narrower, wider = _neighbours(self._ratio_tokens.get(key[0], []), key[1])
        if narrower is not None:
            return self.correction((key[0], narrower))
        overall = self.overall.ratio.smoothed
        if not self.profile_caps_unobserved:
            return overall
        at_most_profile = min(1.0, overall)
        # Without the wider cell's prior: while it has few observations, that prior is this cell's k, which would
        # make each cell's k depend on the other's.
        return at_most_profile if wider is None else min(at_most_profile, self.cells[(key[0], wider)].ratio.value(None))

    def _bound(self, key: tuple[int, int], rows: int, tokens: int) -> float:
        """What the unobserved cell ``key`` may answer at the point (rows, tokens) at most: the least h of the observed
        cells at or above it in rows, and in tokens where the surface is monotone in them (else of its token bucket),
        each at its least point at or above this one (module docstring)."""
        bound = self._bounds.get((key, rows, tokens))
        if bound is None:
            above = [
                cell for cell in self.cells
                if cell[0] >= key[0] and (cell[1] >= key[1] if self.monotone_in_tokens else cell[1] == key[1])
            ]
            bound = min((self._usual(cell, max(rows, _lowest(cell[0])), max(tokens, _lowest(cell[1]))) for cell in above), default=math.inf)
            self._bounds[(key, rows, tokens)] = bound
        return bound

    def __call__(self, rows: int, tokens: int) -> float:
        known = self._answers.get((rows, tokens))  # looked up here: a fallback at a few rows asks hundreds a step
        return (known if known is not None else self._answer(rows, tokens))[0] * self.pace.value

    def _answer(self, rows: int, tokens: int) -> tuple[float, tuple[tuple[int, int], ...] | None]:
        """The cumulative maximum at (rows, tokens) at the usual pace, cached, and the settled cells it read (None where
        it read a cell not settled, or unobserved). Where the surface is monotone in tokens and ``tokens`` ≤ 16, every
        token bucket is one count, so the maximum over the buckets below ``tokens`` is the answer one token down: it is
        taken from there (cached, or computed the same way), and a pass asked at depths 1..γ in turn, as the fallback
        asks, evaluates each cell's corner once rather than once per depth at or above it."""
        point = (rows, tokens)
        known = self._answers.get(point)
        if known is not None:
            return known
        # One corner per cell at or below the query's: the cell's top, or the query where the cell holds it.
        row_corners = [(bucket, min(bucket, rows)) for bucket in _buckets_up_to(rows)]
        if self.monotone_in_tokens and 1 < tokens <= 16:
            answer, reads = self._answer(rows, tokens - 1)
            token_corners = [(tokens, tokens)]
        else:
            answer, reads = 0.0, ()
            token_buckets = _buckets_up_to(tokens) if self.monotone_in_tokens else [row_bucket(tokens)]
            token_corners = [(bucket, min(bucket, tokens)) for bucket in token_buckets]
        observed, unobserved = [], []
        for row_cell, row_count in row_corners:
            for token_cell, token_count in token_corners:
                key = (row_cell, token_cell)
                (observed if key in self.cells else unobserved).append((key, row_count, token_count))
        answer = max([answer, *(self._usual(*corner) for corner in observed)])
        for corner in unobserved:
            value = self._usual(*corner)
            if value > answer:  # only then can its bound matter, and looking it up costs a pass over the cells
                answer = max(answer, min(value, self._bound(*corner)))
        if reads is not None and not unobserved and all(self._settled_at(*corner) for corner in observed):
            reads = reads + tuple(key for key, _, _ in observed)
        else:
            reads = None
        self._remember(point, answer, reads)
        return answer, reads

    def _remember(self, point: tuple[int, int], answer: float, reads: tuple[tuple[int, int], ...] | None) -> None:
        """Cache ``answer`` for ``point``, at the usual pace (π changes with every step, even of another surface),
        listed under the settled cells it ``reads``, else (None) among the answers any observation drops."""
        if len(self._answers) >= _CACHE_LIMIT:
            self._answers.clear()
            self._readers.clear()
            self._unsettled_answers.clear()
        self._answers[point] = (answer, reads)
        if reads is None:
            self._unsettled_answers.add(point)
        else:
            for key in reads:
                self._readers.setdefault(key, set()).add(point)


class OnlineCorrectedCostModel:
    """``base`` (any ``CostModel``) times a correction learnt from observed step and drafting times.

    ``smoothing`` α in (0, 1] is the weight of each new observation in a cell's correction;
    ``pace_smoothing`` β in (0, 1], that in the machine's pace π (its spells and its lasting changes), or None to assume a steady machine (π = 1;
    module docstring). ``step_time`` stays non-decreasing in rows and ``draft_time`` in rows and depth whatever is
    observed, given a base that is (every cost model in dspark is); along tokens each observed step cell answers what
    its steps took, so a wider step measured cheaper is priced cheaper. The base's answers are cached per table of
    the base (its ``table_key`` hook), and forgotten when its ``start`` hook (forwarded by ``start``) says they changed
    without naming another table.
    """

    def __init__(self, base: CostModel, smoothing: float = 0.1, pace_smoothing: float | None = 0.5):
        if not isinstance(base, CostModel):
            raise TypeError(f"base must be a CostModel (step_time(rows, tokens) and draft_time(rows, depth)), got {type(base).__name__}")
        check_draft_time(base, "base")
        self.base = base
        self.smoothing = check_fraction("smoothing", smoothing)
        self.pace_smoothing = None if pace_smoothing is None else check_fraction("pace_smoothing", pace_smoothing)
        self._forget()

    def _forget(self) -> None:
        """Start learning afresh: no cell observed, the base's answers not yet read (for any table, greedy and sampled
        steps), and π at 1 (it is the pace against what the cells learnt)."""
        self._surfaces: dict[tuple[object, bool], tuple[_CorrectedSurface, _CorrectedSurface]] = {}
        self._pace = _Pace(self.pace_smoothing)
        self._table = self._base_table()
        self._learn_for(sampled=False)

    def _base_table(self) -> object:
        """The base's ``table_key`` now (None without the hook), refused by name where it cannot key the corrections."""
        check_hooks(self.base, {"table_key": COST_MODEL_HOOKS["table_key"]}, "base")
        return hook(self.base, "table_key", COST_MODEL_HOOKS)

    def _learn_for(self, sampled: bool) -> None:
        """Answer from, and learn into, the corrections of the base's table now (``_table``) for greedy or for sampled
        generations: a sampled step also warps the target's and the drafter's distributions over the vocabulary for
        every verified or drafted position, so greedy steps' corrections would price its wider forwards and deeper
        passes too low."""
        key = (self._table, sampled)
        if key not in self._surfaces:
            self._surfaces[key] = (
                _CorrectedSurface(self.base.step_time, self.smoothing, profile_caps_unobserved=True, pace=self._pace, learns_pace=True,
                                  monotone_in_tokens=False),
                _CorrectedSurface(self.base.draft_time, self.smoothing, profile_caps_unobserved=False, pace=self._pace, learns_pace=False,
                                  monotone_in_tokens=True),
            )
        self._steps, self._drafts = self._surfaces[key]

    def __repr__(self) -> str:
        return f"OnlineCorrectedCostModel({self.base!r}, smoothing={self.smoothing}, pace_smoothing={self.pace_smoothing})"

    def start(self, generation: GenerationStart) -> bool:
        """Forward a generation's start to the base's optional ``start`` hook, then use the corrections of the
        table the base answers from now, for greedy or for sampled generations by the generation's sampling
        (``_learn_for``). A base with the ``table_key`` hook names its table, and each table keeps its own
        corrections: a generation back on a table seen before resumes them (module docstring). A base that says its
        answers changed (True) without naming another table (no ``table_key``, or the same one) makes the model forget
        what it learnt, which corrected the old answers. Returns the base's answer (False for a base without
        ``start``)."""
        if not isinstance(generation, GenerationStart):
            raise TypeError(f"generation must be a GenerationStart, got {generation!r}")
        start = hook(self.base, "start", COST_MODEL_HOOKS)
        changed = bool(start(generation)) if start is not None else False
        table = self._base_table()
        if changed and table == self._table:
            self._forget()
        self._pace.forget_last()  # other work ran since the last generation's steps: no contrast across the gap
        self._table = table
        self._learn_for(sampled=bool(generation.sampling.do_sample))
        return changed

    def observe_step(self, rows: int, tokens: int, seconds: float) -> None:
        """Learn that a target forward over ``rows`` rows of ``tokens`` new tokens took ``seconds``."""
        check_int("rows", rows, 1)
        check_int("tokens", tokens, 1)
        self._steps.observe(rows, tokens, check_seconds("seconds", seconds))

    def observe_draft(self, rows: int, seconds: float, depth: int) -> None:
        """Learn that a drafting pass for ``rows`` rows, ``depth`` tokens deep, took ``seconds``."""
        check_int("rows", rows, 1)
        check_int("depth", depth, 1)
        self._drafts.observe(rows, depth, check_seconds("seconds", seconds))

    def step_time(self, rows: int, tokens: int) -> float:
        """The base's step time, corrected, and never less than that of fewer rows of as many tokens."""
        check_int("rows", rows, 1)
        check_int("tokens", tokens, 1)
        return self._steps(rows, tokens)

    def draft_time(self, rows: int, depth: int | None = None) -> float:
        """The base's drafting time, corrected, and never less than that of fewer rows or a shallower pass.
        ``depth`` None: the base's whole block, corrected by the global drafting correction (or, where the base
        knows no drafting time, the global seconds learnt from every pass)."""
        check_int("rows", rows, 1)
        if depth is None:
            base = float(self.base.draft_time(rows, None))
            usual = base * self._drafts.overall.ratio.smoothed if base > 0 else (self._drafts.overall.seconds.value(None) or 0.0)
            return usual * self._pace.value
        check_int("depth", depth, 1)
        return self._drafts(rows, depth)

    def step_correction(self, rows: int, tokens: int) -> float:
        """The correction k applied to the cell holding (``rows``, ``tokens``), the pace π left out: its smoothed ratio;
        while it has few observations, their median with the k it would answer with unobserved; unobserved, that of the widest
        observed cell of its row bucket with fewer tokens, else the least of 1, the global one g and the own k of
        the narrowest with more (module docstring)."""
        check_int("rows", rows, 1)
        check_int("tokens", tokens, 1)
        return self._steps.correction((row_bucket(rows), row_bucket(tokens)))

    def report(self) -> dict:
        """What has been learnt for the table and the kind of generation last started (greedy or sampled): the
        global step and drafting corrections (at the usual pace), the pace π now, and how many cells were observed;
        and how many of the base's tables it has answered from since it last forgot (``tables``)."""
        return {
            "tables": len({table for table, _ in self._surfaces}),
            "step_correction": self._steps.overall.ratio.smoothed,
            "draft_correction": self._drafts.overall.ratio.smoothed,
            "pace": self._pace.value,
            "draft_seconds": self._drafts.overall.seconds.value(None),
            "step_cells": len(self._steps.cells),
            "draft_cells": len(self._drafts.cells),
        }
