"""Measure what one target forward costs: seconds per step over (rows, new tokens per row, context).

This is the table a profiled cost model interpolates and what ``benchmarks/bench_cost_curve.py``
plots. A step is timed the way dspark's loop runs it: ``rows`` rows that each already hold
``context`` tokens in the cache the loop uses (``dspark.kv.empty_cache``: growing layers with spare
slots) append ``tokens`` new tokens with an explicit 2-D
``attention_mask`` and ``position_ids``, and logits are kept for the new positions only. The
context's keys and values are random (a step's cost does not depend on their values), so a grid
point costs no prefill; the cache is cropped back after every timed forward.

``cost_curve`` times the grid in passes: an untimed warm-up pass over every point, then ``repeats``
passes that each time every point once, and each point reports its median over the passes. A
disturbance that lasts a while (another process, a frequency change) then lands in one pass of many
points rather than in every repeat of a few consecutive ones, which would give the table a false
step (a flat stretch a scheduler reads as free tokens); the median drops it.

Within a pass, the points of one (context, rows) share a cache, made fresh for the pass. The first
forward on a fresh cache is slower than the next ones (on a 2-core CPU, a few percent for SmolLM2),
so it is untimed, and each pass starts the token counts at a different one (pass p at the p-th, wrapping round):
whatever a position in the order still costs lands on another point in every pass, and the median
drops it. A first point inflated this way flattens the table's first column, which the scheduler
reads as a cheap first draft token.

A shared machine's pace also changes from one second to the next (another tenant's work on a cloud CPU; see
``benchmarks/bench_pace.py``), so one rows value's points can be timed in a slow spell and another's in a fast one,
and with three passes the median keeps a spell wherever two of them fell in one. On a two-core cloud CPU tables came
out with their one- and two-row steps dearer than their four-row steps, which the monotone envelope then carried up
to every four-row step. So the points of one (context, rows) are timed between two forwards of one reference shape
(one row, one new token, on a cache of its own): each time is taken over the mean of the two, timed in the same
spell, the median of those ratios over the passes is scaled by the median of every reference, and a spell cancels.
This assumes a spell slows every shape alike, as lost processor time does; a slowdown that hits large shapes more
(memory bandwidth shared with another tenant) still reaches the table, though less.

``draft_curve`` times a drafter's ``propose`` over rows × depth the same way: a warm-up pass, then passes of one
proposal per point, each rows value a fresh generation whose first proposal (reading the whole context) is untimed and
whose depths start one later each pass. Every timed proposal follows a reference forward, as in the loop a proposal
follows the target's forward (which has just pushed the drafter's weights out of the processor's caches), and is
taken over the mean of the reference forwards either side of it, so a spell cancels as it does for steps. Before, each
point's proposals were timed in a row, hot, in one spell.
"""

from __future__ import annotations

import contextlib
import itertools
import statistics
import time
from collections.abc import Iterable

import attrs
import torch
from tqdm.auto import tqdm
from transformers import DynamicCache
from transformers.cache_utils import Cache

from dspark.checks import check_int, int_at_least
from dspark.fast_path import FastPath
from dspark.kv import empty_cache
from dspark.protocols import DRAFTER_HOOKS, hook
from dspark.types import DraftContext, GenerationStart, SamplingConfig, StepOutcome

__all__ = ["REVISION", "StepTiming", "DraftTiming", "measure_step_time", "cost_curve", "draft_curve", "one_row_draft_seconds"]

#: How ``cost_curve`` times its grid, and the revision of dspark's own code paths it times; part of a profiled
#: table's cache key, so a change in either measures the table again. 7: drafting timed in passes, each proposal after
#: a reference forward and over the references beside it; 6: each rows value's points timed over reference
#: forwards beside them; 5: drafting timed at every depth 1..γ;
#: 4: steps timed on a cache of growing layers
#: (``dspark.kv.empty_cache``, as the loop's), the semi-AR drafter's context grows in place and its attention joins
#: no keys; 3: a fresh
#: cache's first forward untimed, the token order rotated per pass; 2: in passes over the whole grid; 1: every
#: repeat of a point in a row.
REVISION = 7


@attrs.frozen
class StepTiming:
    """Seconds of a target forward of ``rows`` × ``tokens`` new tokens after ``context``, from ``repeats`` timed
    forwards: their median (``measure_step_time``), or the median of their times over reference forwards beside
    them, scaled by the references' median (``cost_curve``)."""

    rows: int = attrs.field(validator=int_at_least(1))
    tokens: int = attrs.field(validator=int_at_least(1))
    context: int = attrs.field(validator=int_at_least(0))
    path: str = attrs.field(validator=attrs.validators.in_(("default", "fast")))
    seconds: float = attrs.field(validator=attrs.validators.instance_of(float))
    repeats: int = attrs.field(validator=int_at_least(1))


@attrs.frozen
class DraftTiming:
    """Seconds of one drafting pass (``propose``) for ``rows`` rows, ``depth`` tokens deep: the median over ``repeats``
    passes of its time over the reference forwards beside it, scaled by the references' median (``draft_curve``)."""

    rows: int = attrs.field(validator=int_at_least(1))
    depth: int = attrs.field(validator=int_at_least(1))
    seconds: float = attrs.field(validator=attrs.validators.instance_of(float))
    repeats: int = attrs.field(validator=int_at_least(1))


def _cache_layout(model: torch.nn.Module, device: torch.device) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """Per layer, the shape of one token's keys ([1, heads, 1, head_dim]) and their dtype, from a one-token forward."""
    cache = DynamicCache()
    with torch.inference_mode():
        model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device), cache=cache, use_cache=True, logits_to_keep=1)
    return [(tuple(keys.shape), keys.dtype) for keys, _, _ in cache]


def _random_cache(layout, rows: int, context: int, device: torch.device, generator: torch.Generator) -> Cache:
    cache = empty_cache()
    for index, ((_, heads, _, head_dim), dtype) in enumerate(layout if context > 0 else ()):
        shape = (rows, heads, context, head_dim)
        cache.update(*(torch.randn(shape, generator=generator).to(device, dtype) for _ in range(2)), index)
    return cache


def measure_step_time(
    model: torch.nn.Module, rows: int, tokens: int, context: int, fast_path: FastPath | None = None, repeats: int = 5
) -> StepTiming:
    """Median seconds of one forward of ``rows`` rows × ``tokens`` new tokens after ``context`` cached
    tokens, on ``fast_path`` when given (else plain forwards), after one untimed warm-up."""
    check_int("rows", rows, 1)
    check_int("tokens", tokens, 1)
    check_int("context", context, 0)
    check_int("repeats", repeats, 1)
    return _measure(model, _cache_layout(model, _device(model)), rows, tokens, context, fast_path, repeats)


def _device(model: torch.nn.Module) -> torch.device:
    return model.get_output_embeddings().weight.device


def _step_inputs(model, rows: int, tokens: int, context: int, cache: Cache, generator: torch.Generator) -> dict:
    """The forward arguments of one step of ``rows`` × ``tokens`` new tokens after ``context`` cached ones."""
    device = _device(model)
    vocab = model.get_output_embeddings().weight.shape[0]
    return {
        "input_ids": torch.randint(vocab, (rows, tokens), generator=generator).to(device),
        "attention_mask": torch.ones((rows, context + tokens), dtype=torch.long, device=device),
        "position_ids": torch.arange(context, context + tokens, device=device).expand(rows, tokens),
        "cache": cache,
        "use_cache": True,
        "logits_to_keep": tokens,
    }


def _timed(device: torch.device, fast_path: FastPath | None, call) -> float:
    """Seconds of ``call()`` under inference mode on ``fast_path`` (when given), the device's work included."""
    with torch.inference_mode():
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        with fast_path.active() if fast_path is not None else contextlib.nullcontext():
            call()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - started


def _time_forward(model, inputs: dict, fast_path: FastPath | None) -> float:
    """Seconds of one forward (device work included), after which the cache is cropped back to its context."""
    seconds = _timed(_device(model), fast_path, lambda: model(**inputs))
    inputs["cache"].crop(-inputs["input_ids"].shape[1])
    return seconds


def _generator(rows: int, tokens: int, context: int) -> torch.Generator:
    return torch.Generator().manual_seed(rows * 1_000_003 + tokens * 1009 + context)


def _measure(model, layout, rows: int, tokens: int, context: int, fast_path: FastPath | None, repeats: int) -> StepTiming:
    generator = _generator(rows, tokens, context)
    inputs = _step_inputs(model, rows, tokens, context, _random_cache(layout, rows, context, _device(model), generator), generator)
    # Attempt 0 warms up (and lets the fast path measure new shapes).
    seconds = [_time_forward(model, inputs, fast_path) for _ in range(repeats + 1)][1:]
    path = "default" if fast_path is None else "fast"
    return StepTiming(rows=rows, tokens=tokens, context=context, path=path, seconds=statistics.median(seconds), repeats=repeats)


def _reference_inputs(model, layout, context: int) -> dict:
    """The reference forward's arguments: one row, one new token after ``context`` cached tokens, on a cache of its own."""
    cache = _random_cache(layout, 1, context, _device(model), _generator(1, 0, context))
    return _step_inputs(model, 1, 1, context, cache, _generator(1, 1, context))


def _rotated(values: list[int], start: int) -> list[int]:
    """``values`` starting at index ``start`` (mod their number) and wrapping round."""
    start %= len(values)
    return values[start:] + values[:start]


def cost_curve(
    model: torch.nn.Module,
    rows: Iterable[int] = (1, 2, 4, 8, 16, 32),
    tokens: Iterable[int] = (1, 2, 4, 8, 16),
    contexts: Iterable[int] = (300, 1000),
    fast_path: FastPath | None = None,
    repeats: int = 5,
    progress: bool = True,
) -> list[StepTiming]:
    """One ``StepTiming`` per point of the grid rows × tokens × contexts (contexts outermost), timed in
    passes (module docstring): a warm-up pass, then ``repeats`` passes of one forward per point, the
    median per point of its time over the reference forwards around it, times their median. One random
    cache per (context, rows) serves every token count of a pass, after an untimed forward on it, in an
    order that starts one token count later each pass; a timed one-row, one-token reference forward comes
    before that untimed forward and after the last point."""
    rows = [check_int("rows", row_count, 1) for row_count in rows]
    tokens = [check_int("tokens", token_count, 1) for token_count in tokens]
    contexts = [check_int("context", context, 0) for context in contexts]
    check_int("repeats", repeats, 1)
    device = _device(model)
    layout = _cache_layout(model, device)
    # Each point's time over the reference forwards timed around its group, then scaled by their median (module docstring).
    relative: dict[tuple[int, int, int], list[float]] = {(c, r, k): [] for c in contexts for r in rows for k in tokens}
    references: list[float] = []
    reference = _reference_inputs(model, layout, contexts[0])
    label = f"step times ({'fast' if fast_path is not None else 'default'} path)"
    with tqdm(total=len(relative) * (repeats + 1), desc=label, unit="forward", disable=not progress) as bar:
        for attempt in range(repeats + 1):  # pass 0 warms up (and lets the fast path measure new shapes)
            for context, row_count in itertools.product(contexts, rows):
                before = _time_forward(model, reference, fast_path)
                cache = _random_cache(layout, row_count, context, device, _generator(row_count, 0, context))
                _time_forward(model, _step_inputs(model, row_count, tokens[0], context, cache, _generator(row_count, 0, context)), fast_path)
                group = []
                for token_count in _rotated(tokens, attempt):
                    inputs = _step_inputs(model, row_count, token_count, context, cache, _generator(row_count, token_count, context))
                    group.append((token_count, _time_forward(model, inputs, fast_path)))
                    bar.update(1)
                reference_seconds = (before + _time_forward(model, reference, fast_path)) / 2
                if attempt > 0:
                    references.append(reference_seconds)
                    for token_count, elapsed in group:
                        relative[(context, row_count, token_count)].append(elapsed / reference_seconds)
    path, scale = ("default" if fast_path is None else "fast"), statistics.median(references)
    return [
        StepTiming(rows=r, tokens=k, context=c, path=path, seconds=statistics.median(ratios) * scale, repeats=repeats)
        for (c, r, k), ratios in relative.items()
    ]


def _feature_layout(target, drafter) -> list[tuple[int, torch.dtype]] | None:
    """The (width, dtype) of each target layer the drafter reads (``target_layers``), from a one-token forward; None
    for a drafter that reads none."""
    layers = hook(drafter, "target_layers", DRAFTER_HOOKS)
    if not layers:
        return None
    with torch.inference_mode():
        outputs = target(input_ids=torch.zeros((1, 1), dtype=torch.long, device=_device(target)), output_hidden_states=True)
    return [(outputs.hidden_states[layer].shape[-1], outputs.hidden_states[layer].dtype) for layer in layers]


class _DraftingRun:
    """One generation of ``drafter`` over ``rows`` rows of random tokens in its steady state, as dspark's loop runs it:
    ``start``, a first (untimed) proposal that also takes in the ``context`` tokens (with random features of the
    ``_feature_layout`` ``features`` when the drafter reads target layers: a pass's time does not depend on their values,
    and a real target forward over rows × context tokens would cost far more than the timings), then per ``propose``
    one new committed token, and after it the ``observe`` of a step that kept nothing. Random tokens rarely repeat, so an
    n-gram drafter's lookups find little: its time here is the no-match cost."""

    def __init__(self, target, drafter, rows: int, context: int, max_draft_tokens: int, proposals: int,
                 features: list[tuple[int, torch.dtype]] | None):
        self.drafter, self.context, self.step = drafter, context, 0
        device = _device(target)
        vocab = target.get_output_embeddings().weight.shape[0]
        generator = torch.Generator().manual_seed(rows * 7919 + context)
        width = context + proposals
        self.tokens = torch.randint(vocab, (rows, width), generator=generator).to(device)
        self.begin = torch.zeros(rows, dtype=torch.long, device=device)
        self.row_ids = torch.arange(rows, device=device)
        self.nothing = torch.zeros(rows, dtype=torch.long, device=device)
        self.sampling = SamplingConfig()
        start = hook(drafter, "start", DRAFTER_HOOKS)
        if start is not None:
            start(GenerationStart(rows=rows, device=device, max_draft_tokens=max_draft_tokens, max_length=width, sampling=self.sampling, prompt_length=context))
        self.features = self.feature_mask = None
        if features and context > 1:
            self.features = torch.cat([torch.randn((rows, context - 1, size), generator=generator).to(device, dtype) for size, dtype in features], dim=-1)
            self.feature_mask = torch.ones((rows, context - 1), dtype=torch.long, device=device)

    def propose(self, depth: int, fast_path: FastPath | None) -> float:
        """Seconds of the next ``propose`` of ``depth`` tokens (device work included), then its step's ``observe``."""
        end = torch.full_like(self.begin, self.context + self.step)
        context = DraftContext(tokens=self.tokens, begin=self.begin, end=end, rows=self.row_ids, step=self.step, sampling=self.sampling,
                               features=self.features, feature_mask=self.feature_mask)
        seconds = _timed(self.tokens.device, fast_path, lambda: self.drafter.propose(context, depth))  # as the loop's forward_mode
        with torch.inference_mode():
            self.drafter.observe(StepOutcome(
                rows=self.row_ids, verify_lengths=self.nothing, accepted=self.nothing,
                next_tokens=self.tokens[:, self.context + self.step], finished=torch.zeros_like(self.begin, dtype=torch.bool),
            ))
        if self.features is not None:  # the verify forward of a step that kept nothing commits the anchor alone
            self.features, self.feature_mask = self.features[:, -1:], self.feature_mask[:, -1:]
        self.step += 1
        return seconds


def draft_curve(
    target: torch.nn.Module,
    drafter,
    rows: Iterable[int] = (1, 2, 4, 8, 16, 32),
    depths: Iterable[int] = (1, 2, 3, 4, 5, 6, 7),
    context: int = 256,
    max_draft_tokens: int | None = None,
    fast_path: FastPath | None = None,
    repeats: int = 5,
    progress: bool = True,
) -> list[DraftTiming]:
    """One ``DraftTiming`` per point of rows × depths (rows outermost) for ``drafter`` beside ``target``, timed in
    passes (module docstring): a warm-up pass, then ``repeats`` passes of one proposal per point. Per rows value and
    pass, a fresh generation of block width ``max_draft_tokens`` (default: the deepest depth) over ``context`` tokens,
    its first proposal untimed, then the depths from the pass's offset, each after a one-row, one-token reference
    forward of ``target`` (on ``fast_path`` when given), with one more reference after the last."""
    rows = [check_int("rows", row_count, 1) for row_count in rows]
    depths = [check_int("depths", depth, 1) for depth in depths]
    check_int("context", context, 1)
    check_int("repeats", repeats, 1)
    if not rows or not depths:
        raise ValueError(f"rows and depths must each hold at least one value, got rows={rows!r}, depths={depths!r}")
    width = max(depths) if max_draft_tokens is None else check_int("max_draft_tokens", max_draft_tokens, max(depths))
    reference = _reference_inputs(target, _cache_layout(target, _device(target)), context)
    features = _feature_layout(target, drafter)
    relative: dict[tuple[int, int], list[float]] = {(r, d): [] for r in rows for d in depths}
    references: list[float] = []
    with tqdm(total=len(relative) * (repeats + 1), desc="drafting times", unit="proposal", disable=not progress) as bar:
        for attempt in range(repeats + 1):  # pass 0 warms up
            for row_count in rows:
                run = _DraftingRun(target, drafter, row_count, context, width, len(depths) + 1, features)
                run.propose(depths[-1], fast_path)  # reads the whole context: not the steady state
                before = _time_forward(target, reference, fast_path)
                for depth in _rotated(depths, attempt):
                    seconds = run.propose(depth, fast_path)
                    after = _time_forward(target, reference, fast_path)
                    if attempt > 0:
                        references.append(before)
                        relative[(row_count, depth)].append(seconds / ((before + after) / 2))
                    before = after
                    bar.update(1)
    scale = statistics.median(references)
    return [DraftTiming(rows=r, depth=d, seconds=statistics.median(ratios) * scale, repeats=repeats) for (r, d), ratios in relative.items()]


def one_row_draft_seconds(
    target: torch.nn.Module, drafter, fast_path: FastPath | None, max_draft_tokens: int, context: int = 256, repeats: int = 5
) -> float:
    """Median seconds of a one-row drafting pass one token deep plus one a whole block (``max_draft_tokens``) deep, each
    after a one-row, one-token reference forward of ``target`` as in the loop, over ``repeats`` pairs of a fresh
    generation after its untimed first proposal: what ``dspark.wrap`` times to decide whether a drafter's one-row
    products read their weight copies (``FastPath.measure_one_row``)."""
    width = check_int("max_draft_tokens", max_draft_tokens, 1)
    check_int("context", context, 1)
    check_int("repeats", repeats, 1)
    reference = _reference_inputs(target, _cache_layout(target, _device(target)), context)
    run = _DraftingRun(target, drafter, 1, context, width, 2 * repeats + 1, _feature_layout(target, drafter))
    run.propose(width, fast_path)
    seconds = []
    for _ in range(repeats):
        _time_forward(target, reference, fast_path)
        shallow = run.propose(1, fast_path)
        _time_forward(target, reference, fast_path)
        seconds.append(shallow + run.propose(width, fast_path))
    return statistics.median(seconds)
