"""A profiled cost model that measures the shape each generation runs at, the first time one needs it.

Notation: a generation of R rows whose padded prompt holds P tokens and which may add N more runs
its steps over contexts from P to P + N, on average about C = P + N/2 (``mean_context``). A target
forward's time t(R, T) depends on that context as well as on R and T: attention reads every cached
slot, and the drafter's attention reads its own context cache. A single table measured at a short
context over few rows gets both wrong for a large batch of long prompts: beyond its rows it
extrapolates the last segment's slope, and at a longer context the one-token step costs more, a
wider one more again, and a drafting pass much more, so a scheduler reading it drafts where
nothing pays.

:class:`AutoProfiledCostModel` keeps one :class:`~dspark.cost_models.ProfiledCostModel` per shape
(rows grid, context band). It profiles the base shape when it is made, and at every generation's
``start`` switches to the table of that generation's shape, measuring it first (a progress bar, then
cached on disk like any profiled table) when neither memory nor the disk holds it:

* rows grid: the base rows (``BASE_ROWS`` by default) and the powers of two above their largest
  up to the first ≥ R (``rows_grid``), so R rows interpolate rather than extrapolate;
* context band: C rounded to the nearest half octave of the base context, 256·2^(k/2) = 256, 362,
  512, 724, 1024, … tokens, never below the base (``context_band``). Neighbouring bands differ by a
  factor √2, so a table's context is within a factor 2^(1/4) (19%) of the generation's.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable

import torch

from dspark.checks import check_int
from dspark.cost_models.profiled import DEFAULT_TOKENS, CostTable, ProfiledCostModel, _check_grid
from dspark.fast_path import FastPath
from dspark.types import GenerationStart

__all__ = ["BASE_ROWS", "AutoProfiledCostModel", "context_band", "mean_context", "rows_grid"]

#: The batch sizes profiled at once; a larger batch adds doublings of the largest up to its size.
BASE_ROWS = (1, 2, 4, 8)


def context_band(context: int, base: int = 256) -> int:
    """The context a table is profiled at for generations of mean context ``context``: the nearest, by
    ratio, of ``base``·2^(k/2) for k = 0, 1, 2, … (256, 362, 512, 724, 1024, … for base 256); ``base``
    itself at or below it."""
    check_int("context", context, 0)
    check_int("base", base, 1)
    if context <= base:
        return base
    return round(base * 2 ** (round(2 * math.log2(context / base)) / 2))


def rows_grid(rows: int, base: Iterable[int] = BASE_ROWS) -> tuple[int, ...]:
    """``base`` (strictly increasing ints ≥ 1), then its largest entry doubled until the grid reaches ``rows``."""
    check_int("rows", rows, 0)
    grid = list(_check_grid("base", base))
    while grid[-1] < rows:
        grid.append(grid[-1] * 2)
    return tuple(grid)


def mean_context(generation: GenerationStart) -> int:
    """C = P + N/2: the mean context of the generation's steps, from its padded prompt length P and the
    N = ``max_length`` − P tokens it may add (P = ``max_length`` where the prompt length is unknown)."""
    prompt = generation.max_length if generation.prompt_length is None else generation.prompt_length
    return prompt + (generation.max_length - prompt) // 2


class AutoProfiledCostModel:
    """``step_time`` and ``draft_time`` from the :class:`ProfiledCostModel` of the running generation's
    shape (module docstring), each shape profiled on first need and cached.

    ``tokens``, ``repeats``, ``fast_path``, ``max_draft_tokens``, ``cache_dir`` and ``progress`` are
    ``ProfiledCostModel.profile``'s, for every shape; ``base_rows`` and ``base_context`` are the shape
    profiled at once, which answers until the first ``start`` and for every generation that fits it.
    Five passes (``repeats``) by default: with three, on a noisy two-core CPU, one-row two-token points timed high in
    two passes priced a second verified token far above the first (in traces, not in a committed benchmark), and a
    generation's drafts went unverified, so no step observed that price to correct it.
    Subclass and override ``shape`` to choose tables differently (for example one context for all).
    """

    def __init__(
        self,
        target: torch.nn.Module,
        drafter=None,
        *,
        tokens: Iterable[int] = DEFAULT_TOKENS,
        base_rows: Iterable[int] = BASE_ROWS,
        base_context: int = 256,
        repeats: int = 5,
        fast_path: bool | FastPath | None = True,
        max_draft_tokens: int | None = None,
        cache_dir: str | os.PathLike | None = None,
        progress: bool = True,
    ):
        if not isinstance(target, torch.nn.Module):
            raise TypeError(f"target must be a torch.nn.Module, got {type(target).__name__}")
        self.target, self.drafter = target, drafter
        self.tokens = _check_grid("tokens", tokens)
        self.base_rows = _check_grid("base_rows", base_rows)
        self.base_context = check_int("base_context", base_context, 1)
        self.profile_options = {
            "tokens": self.tokens, "repeats": check_int("repeats", repeats, 1), "fast_path": fast_path,
            "max_draft_tokens": max_draft_tokens, "cache_dir": cache_dir, "progress": progress,
        }
        self._models: dict[tuple[tuple[int, ...], int], ProfiledCostModel] = {}
        self.current_shape = self.base_shape = (self.base_rows, self.base_context)
        self.profiled(self.base_shape)

    def __repr__(self) -> str:
        rows, context = self.current_shape
        return f"AutoProfiledCostModel({type(self.target).__name__}, rows={list(rows)}, context={context}, {len(self._models)} table(s))"

    def shape(self, generation: GenerationStart) -> tuple[tuple[int, ...], int]:
        """(rows grid, profiled context) for ``generation``: ``rows_grid`` of its rows over the base rows and
        the ``context_band`` of its ``mean_context`` over the base context."""
        return rows_grid(generation.rows, self.base_rows), context_band(mean_context(generation), self.base_context)

    def start(self, generation: GenerationStart) -> bool:
        """Answer from the table of ``generation``'s shape, profiling it first if needed; True when that
        is another table than before (``table_key`` names which)."""
        if not isinstance(generation, GenerationStart):
            raise TypeError(f"generation must be a dspark.types.GenerationStart, got {type(generation).__name__}")
        shape = self.shape(generation)
        self.profiled(shape)
        changed, self.current_shape = shape != self.current_shape, shape
        return changed

    @property
    def table_key(self) -> tuple[tuple[int, ...], int]:
        """The cost-model hook that names the table answering now: its shape, ``current_shape``. An
        ``OnlineCorrectedCostModel`` around this model keeps its corrections per shape, so a generation back
        on a shape it has seen resumes them."""
        return self.current_shape

    @property
    def current(self) -> ProfiledCostModel:
        """The profiled model answering now, that of ``current_shape``."""
        return self._models[self.current_shape]

    @property
    def table(self) -> CostTable:
        """The measured table answering now."""
        return self.current.table

    def step_time(self, rows: int, tokens: int) -> float:
        """Seconds of one target forward over ``rows`` rows of ``tokens`` new tokens, at the current shape's context."""
        return self.current.step_time(rows, tokens)

    def draft_time(self, rows: int, depth: int | None = None) -> float:
        """Seconds of one drafting pass for ``rows`` rows, ``depth`` tokens deep (None: the whole block), at the
        current shape's context."""
        return self.current.draft_time(rows, depth)

    def profiled(self, shape: tuple[tuple[int, ...], int]) -> ProfiledCostModel:
        """The profiled model of ``shape`` (rows grid, context), measured first if neither memory nor the disk
        cache holds it (to profile the shapes a service expects ahead of its first requests)."""
        if shape not in self._models:
            rows, context = shape
            self._models[shape] = ProfiledCostModel.profile(self.target, self.drafter, rows=rows, context=context, **self.profile_options)
        return self._models[shape]
