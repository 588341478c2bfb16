"""A cost model read from a table of measured step times, interpolated, monotone in rows.

Notation: a target forward runs R rows of T new tokens each (dspark's verify forward is a
rectangular [R, T] batch, padded); t(R, T) is its measured time in seconds and d(R, k) the time of one
drafting pass for R rows, k tokens deep. A :class:`CostTable` holds t on a grid ``rows`` × ``tokens`` (and d
on ``draft_rows`` × ``draft_depths``); :class:`ProfiledCostModel` answers ``step_time(R, T)`` and
``draft_time(R, k)`` for any R, T, k ≥ 1 from it. The depth matters: a drafter's head and its choice run once
per drafted position, so a row fallback that drafts one token deep must not be charged a γ-deep pass.

Between grid points the surface is bilinear, after the table is replaced by its monotone envelope
(the cumulative maximum along rows, and for drafting then along depth: the smallest table ≥ the measured one that
never decreases along those axes). Measured noise can make a bigger batch look cheaper than a
smaller one; a scheduler that believed it would verify more tokens than it should, so the envelope
never lets it. Step times are not raised along tokens, because a wider forward can truly cost less: on a 2-core
EPYC the packed products of two rows stream their weights slower than those of four or six, and in the loop a
step of two rows took 52.5 ms with one token each, 49.4 with two and 47.9 with three
(``benchmarks/results/bench_step_widths.json``), which the profiled table had measured too (55.2, 50.8 and
46.4 ms); raised along tokens it priced all three at 55.2 ms, and four and five tokens, which took 58.5 and
56.5 ms, at 58.4 beside them, so deep steps looked nearly free. A cell measured too cheap is one the scheduler
picks, so the online correction (``OnlineCorrectedCostModel``) observes it and corrects it. Below the grid the
surface is constant (a smaller batch than any measured costs what
the smallest measured one does: fixed per-forward overhead dominates there); above the grid it
continues linearly with the last segment's slopes, never below 0 (compute-bound forwards grow linearly in rows
and tokens, and a clamp would make big batches look free), with those slopes made non-decreasing
along the other axis so the extrapolation stays monotone in rows too.

``ProfiledCostModel.profile`` measures a table on the running machine with
``dspark.cost_models.profiling.cost_curve`` (target forwards over random KV caches) and
``profiling.draft_curve`` (the drafter's ``propose`` on a synthetic context at every depth 1..γ), and caches the table as JSON keyed by what the timings
depend on (model, parameter count, device, dtype, threads, torch version, grid and settings).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import attrs
import torch

from dspark.checks import check_format, check_int, check_non_negative, check_seconds
from dspark.cost_models.profiling import REVISION as PROFILING_REVISION
from dspark.cost_models.profiling import cost_curve, draft_curve
from dspark.fast_path import REVISION as FAST_PATH_REVISION
from dspark.fast_path import FastPath, on_cpu, processor_name
from dspark.protocols import DRAFTER_HOOKS, drafter_modules, hook

__all__ = [
    "DEFAULT_TOKENS",
    "default_table_dir",
    "FORMAT_VERSION",
    "CostTable",
    "ProfiledCostModel",
    "interpolate_monotone",
    "monotone_envelope",
    "profile_key",
]

logger = logging.getLogger(__name__)

#: The version of ``CostTable.to_dict``'s layout; ``from_dict`` refuses others.
FORMAT_VERSION = 2  # 2: drafting times per depth (``draft_depths``)

#: New tokens per row a profile times by default: the verify widths of γ up to 7.
DEFAULT_TOKENS = (1, 2, 3, 4, 5, 6, 8)


# -- validation -------------------------------------------------------------------------------


def _check_grid(name: str, values) -> tuple[int, ...]:
    """``values`` as a tuple of strictly increasing ints >= 1, at least one."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"{name} must be a non-empty sequence of strictly increasing ints >= 1, got {values!r}")
    grid = tuple(values)
    for value in grid:
        check_int(f"every entry of {name}", value, 1)
    if not grid or any(later <= earlier for earlier, later in zip(grid, grid[1:])):
        raise ValueError(f"{name} must be a non-empty sequence of strictly increasing ints >= 1, got {list(grid)!r}")
    return grid


def _check_row(name: str, values, length: int) -> tuple[float, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a sequence of {length} seconds, got {values!r}")
    if len(values) != length:
        raise ValueError(f"{name} must hold {length} seconds, got {len(values)}: {list(values)!r}")
    return tuple(check_seconds(f"{name}[{index}]", value) for index, value in enumerate(values))


def _check_table(rows: tuple[int, ...], columns: tuple[int, ...], seconds, name: str = "step_seconds") -> tuple[tuple[float, ...], ...]:
    if isinstance(seconds, (str, bytes)) or not isinstance(seconds, Sequence):
        raise TypeError(f"{name} must be a sequence of {len(rows)} sequences of {len(columns)} seconds, got {seconds!r}")
    if len(seconds) != len(rows):
        raise ValueError(f"{name} must have one entry per rows value ({len(rows)}), got {len(seconds)}")
    return tuple(_check_row(f"{name}[{index}]", row, len(columns)) for index, row in enumerate(seconds))


def _check_key(instance, attribute, value) -> None:
    if not isinstance(value, dict) or not all(isinstance(name, str) for name in value):
        raise TypeError(f"key must be a dict with str keys, got {value!r}")
    try:
        json.dumps(value)
    except (TypeError, ValueError) as error:
        raise TypeError(f"key must hold only JSON values (str, int, float, bool, None, lists, dicts), got {value!r}") from error


# -- the table --------------------------------------------------------------------------------


@attrs.frozen
class CostTable:
    """Measured seconds per target forward on a grid, and optionally per drafting pass.

    ``step_seconds[i][j]`` is t(``rows[i]``, ``tokens[j]``); ``draft_seconds[i][k]`` is
    d(``draft_rows[i]``, ``draft_depths[k]``) (all three None when no drafter was timed). ``key`` says what
    the timings depend on (see ``profile_key``); it is copied, and JSON-serialisable.
    """

    rows: tuple[int, ...] = attrs.field(converter=lambda value: _check_grid("rows", value))
    tokens: tuple[int, ...] = attrs.field(converter=lambda value: _check_grid("tokens", value))
    step_seconds: tuple[tuple[float, ...], ...]
    draft_rows: tuple[int, ...] | None = attrs.field(default=None, converter=lambda value: None if value is None else _check_grid("draft_rows", value))
    draft_depths: tuple[int, ...] | None = attrs.field(default=None, converter=lambda value: None if value is None else _check_grid("draft_depths", value))
    draft_seconds: tuple[tuple[float, ...], ...] | None = None
    key: dict = attrs.field(factory=dict, converter=lambda value: dict(value) if isinstance(value, Mapping) else value, validator=_check_key, hash=False)

    def __attrs_post_init__(self):
        # Fields validated against each other, then stored as tuples of floats.
        object.__setattr__(self, "step_seconds", _check_table(self.rows, self.tokens, self.step_seconds))
        drafting = (self.draft_rows, self.draft_depths, self.draft_seconds)
        if len({value is None for value in drafting}) > 1:
            raise ValueError(
                f"draft_rows, draft_depths and draft_seconds must all be given or all be None, got draft_rows={self.draft_rows!r}, "
                f"draft_depths={self.draft_depths!r}, draft_seconds={self.draft_seconds!r}"
            )
        if self.draft_rows is not None:
            object.__setattr__(self, "draft_seconds", _check_table(self.draft_rows, self.draft_depths, self.draft_seconds, "draft_seconds"))

    def to_dict(self) -> dict:
        """A JSON-ready dict with ``format_version``; ``from_dict`` reads it back."""
        return {
            "format_version": FORMAT_VERSION,
            "rows": list(self.rows),
            "tokens": list(self.tokens),
            "step_seconds": [list(row) for row in self.step_seconds],
            "draft_rows": None if self.draft_rows is None else list(self.draft_rows),
            "draft_depths": None if self.draft_depths is None else list(self.draft_depths),
            "draft_seconds": None if self.draft_seconds is None else [list(row) for row in self.draft_seconds],
            "key": dict(self.key),
        }

    @classmethod
    def from_dict(cls, data: Mapping) -> "CostTable":
        """The table ``to_dict`` wrote; refuses another ``format_version`` or a missing field by name."""
        check_format(data, "CostTable", FORMAT_VERSION)
        missing = [name for name in ("rows", "tokens", "step_seconds") if name not in data]
        if missing:
            raise ValueError(f"data is missing the field(s) {missing} of a CostTable")
        return cls(
            rows=data["rows"], tokens=data["tokens"], step_seconds=data["step_seconds"],
            draft_rows=data.get("draft_rows"), draft_depths=data.get("draft_depths"), draft_seconds=data.get("draft_seconds"),
            key=data.get("key") or {},
        )

    def save(self, path: str | os.PathLike) -> None:
        """Write ``to_dict`` as JSON to ``path`` (atomically: a reader never sees half a file)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        scratch.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        os.replace(scratch, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "CostTable":
        """The table ``save`` wrote to ``path``."""
        return cls.from_dict(json.loads(Path(path).read_text()))


# -- the monotone surface ---------------------------------------------------------------------


def monotone_envelope(seconds: Sequence[Sequence[float]], along_tokens: bool = True) -> list[list[float]]:
    """The smallest table ≥ ``seconds`` that never decreases along rows (the first axis) and, with ``along_tokens``,
    along tokens too: entry (i, j) is the largest measurement at (i', j') with i' ≤ i and j' ≤ j (a cumulative max
    along rows, then tokens; the second pass keeps the first's order because a max of ordered columns stays
    ordered), or, without ``along_tokens``, at (i', j) with i' ≤ i."""
    if not isinstance(along_tokens, bool):
        raise TypeError(f"along_tokens must be a bool, got {along_tokens!r}")
    envelope = [list(map(float, row)) for row in seconds]
    for i in range(1, len(envelope)):
        envelope[i] = [max(value, below) for value, below in zip(envelope[i], envelope[i - 1])]
    for row in envelope if along_tokens else ():
        for j in range(1, len(row)):
            row[j] = max(row[j], row[j - 1])
    return envelope


def _cumulative_max(values: list[float]) -> tuple[float, ...]:
    result, running = [], -math.inf
    for value in values:
        running = max(running, value)
        result.append(running)
    return tuple(result)


def _locate(grid: tuple[float, ...], value: float) -> tuple[int, float]:
    """(i, u) with ``value`` = (1 − u)·grid[i] + u·grid[i + 1], u in [0, 1]; ``value`` must lie on the grid's span."""
    if len(grid) == 1:
        return 0, 0.0
    i = min(bisect.bisect_right(grid, value) - 1, len(grid) - 2)
    return i, (value - grid[i]) / (grid[i + 1] - grid[i])


def _linear(grid: tuple[float, ...], values: tuple[float, ...], value: float) -> float:
    i, u = _locate(grid, value)
    return values[i] if u == 0.0 else (1.0 - u) * values[i] + u * values[i + 1]


@attrs.frozen
class _Surface:
    """f(x, y) over a monotone grid ``z`` on ``x`` × ``y``: bilinear inside, constant below, linear
    above with slopes ``slope_x`` (per y, made non-decreasing in y), ``slope_y`` (per x, likewise)
    and the cross term ``twist`` ≥ 0 where both coordinates are beyond the grid."""

    x: tuple[float, ...]
    y: tuple[float, ...]
    z: tuple[tuple[float, ...], ...]
    slope_x: tuple[float, ...]
    slope_y: tuple[float, ...]
    twist: float

    @classmethod
    def build(cls, x: Sequence[float], y: Sequence[float], seconds: Sequence[Sequence[float]], along_y: bool = True) -> "_Surface":
        """The surface over ``seconds``' monotone envelope, along x only unless ``along_y`` (``monotone_envelope``)."""
        z = monotone_envelope(seconds, along_tokens=along_y)
        x, y = tuple(map(float, x)), tuple(map(float, y))
        n, m = len(x), len(y)
        # Beyond the grid each axis continues with its last segment's slope (never below 0: a table not monotone
        # along y may end falling, and wider forwards must not come out ever cheaper); making the slope along
        # one axis non-decreasing along the other keeps f monotone there (f = base + slope·distance,
        # both terms non-decreasing).
        slope_x = [(z[n - 1][j] - z[n - 2][j]) / (x[n - 1] - x[n - 2]) if n > 1 else 0.0 for j in range(m)]
        slope_y = [max(0.0, (z[i][m - 1] - z[i][m - 2]) / (y[m - 1] - y[m - 2])) if m > 1 else 0.0 for i in range(n)]
        twist = 0.0
        if n > 1 and m > 1:
            # The last cell's cross term: it makes t = a·R·T (compute-bound) extrapolate exactly.
            cross = z[n - 1][m - 1] - z[n - 2][m - 1] - z[n - 1][m - 2] + z[n - 2][m - 2]
            twist = max(0.0, cross / ((x[n - 1] - x[n - 2]) * (y[m - 1] - y[m - 2])))
        return cls(x, y, tuple(map(tuple, z)), _cumulative_max(slope_x), _cumulative_max(slope_y), twist)

    def __call__(self, x: float, y: float) -> float:
        x_in = min(max(x, self.x[0]), self.x[-1])
        y_in = min(max(y, self.y[0]), self.y[-1])
        i, u = _locate(self.x, x_in)
        j, v = _locate(self.y, y_in)
        z = self.z
        i1, j1 = min(i + 1, len(self.x) - 1), min(j + 1, len(self.y) - 1)
        # a + w·(b − a), not (1 − w)·a + w·b: exact where neighbours are equal, so rounding never makes
        # a point between two equal cells cheaper than both (monotonicity is the contract).
        low, high = z[i][j] + v * (z[i][j1] - z[i][j]), z[i1][j] + v * (z[i1][j1] - z[i1][j])
        inside = low + u * (high - low)
        beyond_x, beyond_y = max(0.0, x - self.x[-1]), max(0.0, y - self.y[-1])
        if beyond_x == 0.0 and beyond_y == 0.0:
            return inside
        return (
            inside
            + _linear(self.y, self.slope_x, y_in) * beyond_x
            + _linear(self.x, self.slope_y, x_in) * beyond_y
            + self.twist * beyond_x * beyond_y
        )


def interpolate_monotone(
    rows_grid: Sequence[int], tokens_grid: Sequence[int], seconds: Sequence[Sequence[float]], rows: float, tokens: float,
    along_tokens: bool = True,
) -> float:
    """t(``rows``, ``tokens``) from ``seconds`` [len(rows_grid)][len(tokens_grid)] on that grid:
    bilinear over the table's monotone envelope (``monotone_envelope(seconds, along_tokens)``), constant below the
    grid, linear above (see the module docstring). Non-decreasing in ``rows``, and in ``tokens`` with
    ``along_tokens`` (``ProfiledCostModel`` passes False for step times); exact at grid points of a table that is
    already its envelope."""
    rows_grid, tokens_grid = _check_grid("rows_grid", rows_grid), _check_grid("tokens_grid", tokens_grid)
    seconds = _check_table(rows_grid, tokens_grid, seconds)
    surface = _Surface.build(rows_grid, tokens_grid, seconds, along_y=along_tokens)  # monotone_envelope checks along_tokens
    return surface(check_non_negative("rows", rows), check_non_negative("tokens", tokens))


# -- measuring --------------------------------------------------------------------------------


def _device_name(device: torch.device) -> str:
    """The device type and, where known, the processor or accelerator model (timings differ between them)."""
    if device.type == "cuda":
        return f"cuda {torch.cuda.get_device_name(device)}"
    if device.type == "cpu":
        return f"cpu {processor_name()}".strip()
    return device.type


def _parameter_count(part) -> int | None:
    """Parameters of the modules ``part`` runs (``drafter_modules``: a composite drafter's tables then
    differ with its parts); None when it runs none."""
    modules = drafter_modules(part)
    if not modules:
        return None
    seen = {id(parameter): parameter.numel() for module in modules for parameter in module.parameters()}
    return sum(seen.values())


def _draft_width(drafter, tokens: tuple[int, ...], max_draft_tokens: int | None) -> int:
    if max_draft_tokens is not None:
        return check_int("max_draft_tokens", max_draft_tokens, 1)
    return hook(drafter, "max_draft_tokens", DRAFTER_HOOKS) or max(1, max(tokens) - 1)


def default_table_dir() -> Path:
    """Where profiled tables are cached: ``$DSPARK_COST_TABLE_CACHE`` if set, else the
    ``cost_tables`` folder of ``dspark.pretrained.default_cache_dir()``."""
    if os.environ.get("DSPARK_COST_TABLE_CACHE"):
        return Path(os.environ["DSPARK_COST_TABLE_CACHE"])
    from dspark.pretrained import default_cache_dir

    return default_cache_dir() / "cost_tables"


def profile_key(
    target: torch.nn.Module,
    drafter=None,
    context: int = 256,
    repeats: int = 5,
    fast_path: bool = True,
    max_draft_tokens: int | None = None,
    one_row_copies: bool | None = None,
    drafter_one_row_copies: bool | None = None,
    transposed_rows: tuple[int, ...] | None = None,
) -> dict:
    """What a profiled table's timings depend on: the target (class, name, parameter count), device,
    dtype, torch threads and version, the measuring settings (``profiling.REVISION``, and the fast path's
    ``REVISION`` when it is on, with whether its one-row products read weight copies,
    ``FastPath.one_row_copies``: measured per machine, it can come out otherwise when measured again, and the same
    for the drafter's modules, ``drafter_one_row_copies``; and the product row counts at which its products run
    transposed, ``FastPath.transposed_rows``, measured alike), and the drafter (class, parameters, γ).
    Weights' values are left out: a forward's time does not depend on them."""
    weight = target.get_output_embeddings().weight
    name = target.config.name_or_path or "" if hasattr(target, "config") else ""
    return {
        "model": f"{type(target).__name__} {name}".strip(),
        "parameters": sum(parameter.numel() for parameter in target.parameters()),
        "device": _device_name(weight.device),
        "dtype": str(weight.dtype).removeprefix("torch."),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "context": context,
        "repeats": repeats,
        "profiling_revision": PROFILING_REVISION,
        "fast_path": fast_path,
        "fast_path_revision": FAST_PATH_REVISION if fast_path else None,
        "one_row_copies": one_row_copies if fast_path else None,
        "drafter_one_row_copies": drafter_one_row_copies if fast_path and drafter is not None else None,
        "transposed_rows": list(transposed_rows) if fast_path and transposed_rows is not None else None,
        "drafter": None if drafter is None else f"{type(drafter).__name__} {_parameter_count(drafter)}",
        "max_draft_tokens": max_draft_tokens,
    }


def _cache_file(directory: Path, key: dict, rows: tuple[int, ...], tokens: tuple[int, ...]) -> Path:
    # The grid is part of the name: the same machine and model profiled on another grid is another table.
    digest = hashlib.sha1(json.dumps({"key": key, "rows": rows, "tokens": tokens}, sort_keys=True).encode()).hexdigest()[:16]
    return directory / f"{digest}.json"


def _resolve_fast_path(target: torch.nn.Module, drafter, fast_path) -> FastPath | None:
    """The fast path ``dspark.wrap`` would run these forwards on (same rule: None means on for CPU targets)."""
    from dspark.speculative import _resolve_fast_path as resolve  # the loop's own rule, so timings match it

    return resolve(target, drafter, fast_path)


# -- the cost model ---------------------------------------------------------------------------


@attrs.frozen
class ProfiledCostModel:
    """``step_time`` and ``draft_time`` from a :class:`CostTable`, interpolated (module docstring): ``step_time``
    non-decreasing in rows, as measured along tokens; ``draft_time`` non-decreasing in rows and depth, 0 when the table
    has no drafting times, its depth defaulting to the deepest profiled (the whole block)."""

    table: CostTable = attrs.field(validator=attrs.validators.instance_of(CostTable))
    _steps: _Surface = attrs.field(init=False, repr=False, eq=False)
    _drafts: _Surface | None = attrs.field(init=False, repr=False, eq=False)

    @_steps.default
    def _build_steps(self) -> _Surface:
        # Monotone in rows only: a wider forward can truly cost less (module docstring).
        return _Surface.build(self.table.rows, self.table.tokens, self.table.step_seconds, along_y=False)

    @_drafts.default
    def _build_drafts(self) -> _Surface | None:
        if self.table.draft_rows is None:
            return None
        return _Surface.build(self.table.draft_rows, self.table.draft_depths, self.table.draft_seconds)

    def step_time(self, rows: int, tokens: int) -> float:
        """Seconds of one target forward over ``rows`` rows of ``tokens`` new tokens each."""
        check_int("rows", rows, 1)
        check_int("tokens", tokens, 1)
        return self._steps(rows, tokens)

    def draft_time(self, rows: int, depth: int | None = None) -> float:
        """Seconds of one drafting pass for ``rows`` rows, ``depth`` tokens deep (None: the deepest profiled);
        0 without drafting times in the table."""
        check_int("rows", rows, 1)
        if depth is not None:
            check_int("depth", depth, 1)
        if self._drafts is None:
            return 0.0
        return self._drafts(rows, self.table.draft_depths[-1] if depth is None else depth)

    def save(self, path: str | os.PathLike) -> None:
        """Write the table as JSON to ``path``."""
        self.table.save(path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "ProfiledCostModel":
        """The model of the table saved at ``path``."""
        return cls(CostTable.load(path))

    @classmethod
    def profile(
        cls,
        target: torch.nn.Module,
        drafter=None,
        rows: Iterable[int] = (1, 2, 4, 8, 16, 32),
        tokens: Iterable[int] = DEFAULT_TOKENS,
        context: int = 256,
        repeats: int = 5,
        fast_path: bool | FastPath | None = True,
        cache_dir: str | os.PathLike | None = None,
        progress: bool = True,
        max_draft_tokens: int | None = None,
    ) -> "ProfiledCostModel":
        """Measure a table on this machine, or load the one measured before with the same key.

        Target forwards are timed with ``cost_curve`` over ``rows`` × ``tokens`` after ``context``
        cached tokens (median of ``repeats``), on the fast path ``dspark.wrap`` would use for
        ``fast_path`` (True: ``FastPath.shared(target)``; None: that on CPU targets only; False:
        plain forwards; or a given ``FastPath``). With a ``drafter``, its ``propose`` is timed with ``draft_curve``
        per ``rows`` value and depth 1..γ, γ = ``max_draft_tokens`` (default: the drafter's own
        ``max_draft_tokens``, else max(tokens) − 1). The table is cached as ``<hash>.json`` in ``cache_dir`` (default
        ``dspark.pretrained.default_cache_dir() / "cost_tables"``), named by a hash of
        ``profile_key`` and the grid; a later call with the same key and grid loads it and measures
        no forward (on the fast path it builds that path first, since the key holds its one-row choice;
        ``profile_key`` called alone leaves ``one_row_copies``, ``drafter_one_row_copies`` and ``transposed_rows`` None unless given). The default folder is
        ``default_table_dir()``.
        """
        rows, tokens = _check_grid("rows", rows), _check_grid("tokens", tokens)
        check_int("context", context, 1)
        check_int("repeats", repeats, 1)
        if fast_path is not None and not isinstance(fast_path, (bool, FastPath)):
            raise TypeError(f"fast_path must be None, a bool or a dspark.fast_path.FastPath, got {type(fast_path).__name__}")
        width = None if drafter is None else _draft_width(drafter, tokens, max_draft_tokens)
        fast = on_cpu(target) if fast_path is None else fast_path is not False
        path_to_time = _resolve_fast_path(target, drafter, fast_path) if fast else None
        one_row_copies = None if path_to_time is None else path_to_time.one_row_copies(target)
        drafter_copies = None if path_to_time is None else any(path_to_time.one_row_copies(module) for module in drafter_modules(drafter))
        transposed_rows = None if path_to_time is None else path_to_time.transposed_rows(target)
        key = profile_key(target, drafter, context=context, repeats=repeats, fast_path=fast, max_draft_tokens=width,
                          one_row_copies=one_row_copies, drafter_one_row_copies=drafter_copies, transposed_rows=transposed_rows)
        directory = default_table_dir() if cache_dir is None else Path(cache_dir)
        path = _cache_file(directory, key, rows, tokens)
        cached = _read_cached(path, key, rows, tokens)
        if cached is not None:
            return cls(cached)

        timings = cost_curve(target, rows=rows, tokens=tokens, contexts=(context,), fast_path=path_to_time, repeats=repeats, progress=progress)
        seconds = {(timing.rows, timing.tokens): timing.seconds for timing in timings}
        draft_depths = draft_seconds = None
        if drafter is not None:
            draft_depths = tuple(range(1, width + 1))
            drafts = draft_curve(target, drafter, rows=rows, depths=draft_depths, context=context, max_draft_tokens=width,
                                 fast_path=path_to_time, repeats=repeats, progress=progress)
            timed = {(timing.rows, timing.depth): timing.seconds for timing in drafts}
            draft_seconds = [[timed[(row_count, depth)] for depth in draft_depths] for row_count in rows]
        table = CostTable(
            rows=rows, tokens=tokens, step_seconds=[[seconds[(row_count, token_count)] for token_count in tokens] for row_count in rows],
            draft_rows=None if drafter is None else rows, draft_depths=draft_depths, draft_seconds=draft_seconds, key=key,
        )
        table.save(path)
        return cls(table)


def _read_cached(path: Path, key: dict, rows: tuple[int, ...], tokens: tuple[int, ...]) -> CostTable | None:
    """The table at ``path`` if it is there, readable and measured with ``key`` on this grid; else None."""
    if not path.is_file():
        return None
    try:
        table = CostTable.load(path)
    except (OSError, ValueError, TypeError) as error:  # a damaged file is measured again, not trusted
        logger.warning("ignoring the unreadable cost table %s: %s", path, error)
        return None
    if table.key != key or table.rows != rows or table.tokens != tokens:
        return None
    return table
