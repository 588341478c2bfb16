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

__all__ = ["REVISION", "StepTiming", "measure_step_time", "cost_curve"]

#: How ``cost_curve`` times its grid, and the revision of dspark's own code paths it times; part of a profiled
#: table's cache key, so a change in either measures the table again. 6: each rows value's points timed over reference
#: forwards beside them; 5: drafting timed at every depth 1..γ;
#: 4: steps timed on a cache of growing layers
#: (``dspark.kv.empty_cache``, as the loop's), the semi-AR drafter's context grows in place and its attention joins
#: no keys; 3: a fresh
#: cache's first forward untimed, the token order rotated per pass; 2: in passes over the whole grid; 1: every
#: repeat of a point in a row.
REVISION = 6


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


def _time_forward(model, inputs: dict, fast_path: FastPath | None) -> float:
    """Seconds of one forward (device work included), after which the cache is cropped back to its context."""
    device = _device(model)
    with torch.inference_mode():
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        with fast_path.active() if fast_path is not None else contextlib.nullcontext():
            model(**inputs)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - started
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
    reference_cache = _random_cache(layout, 1, contexts[0], device, _generator(1, 0, contexts[0]))
    reference = _step_inputs(model, 1, 1, contexts[0], reference_cache, _generator(1, 1, contexts[0]))
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
