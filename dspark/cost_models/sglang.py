"""Export and import cost tables in SGLang's DSpark steps-per-second (SPS) table format.

Notation: B is the number of tokens one target forward processes in total (the paper's §3.2.2
batch size; SGLang's ``batch_tokens``, ``bs + K``: one anchor per request plus the verify budget
K), SPS(B) = 1 / t(B) its steps per second. dspark's verify forward is rectangular, R rows of T
tokens, so B = R·T here.

The schema, from SGLang's public code (read for this module; repository sgl-project/sglang):

* ``python/sglang/srt/speculative/dspark_components/dspark_sps.py`` (commit 45b76f55) defines
  ``SpsCostTable``, a msgspec struct decoded from the file that ``--speculative-dspark-sps-table-path``
  names (``load_sps_table_from_path``): ``{"sample_batch_tokens": [int, ...], "sample_steps_per_sec":
  [float, ...], "max_batch_tokens": int}``. Its checks: at least one probe, ``sample_batch_tokens``
  strictly increasing, both lists of one length, ``max_batch_tokens`` ≥ the largest probe (advisory:
  the production ceiling). ``lookup(B)`` floors B to the largest probe ≤ B (``bisect_right − 1``),
  clamped to the first and last probe, and never interpolates (to keep the curve's hardware cliffs).
  The same loader decodes a file containing ``"bias_seconds"`` as ``SpsAdditiveCostTable``
  ``{"bias_seconds", "bs_probes", "alpha_seconds", "m_probes", "theta_seconds"}`` with step time
  bias + α(requests) + θ(requests + budget), each term linear between its probes and clamped.
* ``python/sglang/benchmark/dspark_sps_profiler.py`` writes the first form from a non-speculative
  server: a decode step at batch size bs forwards bs tokens, so B = bs and SPS = 1000 / ITL_ms,
  the median per B over repeats; its self-check expects SPS not to rise with B.
* ``python/sglang/srt/speculative/dspark_components/dspark_sps_table.py`` (commit 692c5f7d) holds the
  same struct and the online profiler, which samples the scheduler's coordinate B = bs + K.

What the mapping loses (B = R·T both ways):

* export: every (R, T) of the table (at the chosen ``rows``) becomes a probe at B = R·T; where
  several splits give one B (8×1, 4×2, 2×4) the slowest is kept (lower SPS is the safe direction
  for SGLang's scheduler), then SPS is made non-increasing in B. How the time depended on R and T
  separately is gone, and so are the drafting times and the table's key (SGLang's file has neither).
* import: t(R, T) = 1 / SPS(R·T) with SGLang's floor lookup, on the grid asked for; cliffs
  between grid points are smoothed by ``ProfiledCostModel``'s bilinear interpolation.

So a table whose times depend on R·T alone and grow with it survives the round trip exactly at its
grid points; any other comes back no faster anywhere than its monotone envelope.
"""

from __future__ import annotations

import bisect
import json
import math
import numbers
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from dspark.checks import check_int
from dspark.cost_models.profiled import CostTable, _check_grid, monotone_envelope

__all__ = ["from_sglang_sps", "load_sglang_sps", "save_sglang_sps", "to_sglang_sps"]

_DEFAULT_ROWS = (1, 2, 4, 8, 16, 32)
_DEFAULT_TOKENS = (1, 2, 3, 4, 5, 6, 8)


def to_sglang_sps(table: CostTable, rows: int | Iterable[int] | None = None, max_batch_tokens: int | None = None) -> dict:
    """SGLang's ``SpsCostTable`` JSON (a dict) from ``table``'s monotone envelope at the ``rows``
    given (one count or several, each one of ``table.rows``; default all of them) and all its
    tokens: probes at B = rows·tokens, the slowest split per B, SPS non-increasing in B.
    ``max_batch_tokens`` defaults to the largest probe."""
    if not isinstance(table, CostTable):
        raise TypeError(f"table must be a dspark.cost_models.CostTable, got {type(table).__name__}")
    if rows is None:
        chosen = table.rows
    elif isinstance(rows, int):
        chosen = (check_int("rows", rows, 1),)
    else:
        chosen = _check_grid("rows", rows)
    missing = [count for count in chosen if count not in table.rows]
    if missing:
        raise ValueError(f"rows must be among the table's rows {list(table.rows)}, got {missing}")
    envelope = monotone_envelope(table.step_seconds)
    slowest: dict[int, float] = {}
    for count in chosen:
        for token_count, seconds in zip(table.tokens, envelope[table.rows.index(count)]):
            batch_tokens = count * token_count
            slowest[batch_tokens] = max(seconds, slowest.get(batch_tokens, 0.0))
    batch_tokens = sorted(slowest)
    seconds, running = [], 0.0
    for value in (slowest[b] for b in batch_tokens):
        running = max(running, value)  # SPS never rises with B: a bigger forward is never quicker
        seconds.append(running)
    if seconds[0] <= 0:
        raise ValueError(f"table must hold step times > 0 to express as steps per second, got {seconds[0]!r} at B = {batch_tokens[0]}")
    ceiling = batch_tokens[-1] if max_batch_tokens is None else check_int("max_batch_tokens", max_batch_tokens, batch_tokens[-1])
    return {
        "sample_batch_tokens": batch_tokens,
        "sample_steps_per_sec": [1.0 / value for value in seconds],
        "max_batch_tokens": ceiling,
    }


def _probes(data: Mapping, name: str) -> list[int]:
    values = data[name]
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise ValueError(f"{name} must be a non-empty list of ints, got {values!r}")
    for value in values:
        check_int(f"every entry of {name}", value, 1)
    if any(later <= earlier for earlier, later in zip(values, values[1:])):
        raise ValueError(f"{name} must be strictly increasing, got {list(values)!r}")
    return list(values)


def _number(name: str, value, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise ValueError(f"{name} must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}")
    return float(value)


def _numbers(data: Mapping, name: str, length: int, positive: bool) -> list[float]:
    values = data[name]
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) != length:
        raise ValueError(f"{name} must be a list of {length} numbers (one per probe), got {values!r}")
    return [_number(f"every entry of {name}", value, positive) for value in values]


def _require(data: Mapping, names: tuple[str, ...], form: str) -> None:
    missing = [name for name in names if name not in data]
    if missing:
        raise ValueError(f"data is missing the field(s) {missing} of SGLang's {form}")


def _floor_lookup(probes: list[int], values: list[float], batch_tokens: int) -> float:
    """SGLang's ``SpsCostTable.lookup``: the value of the largest probe ≤ B, clamped to the ends."""
    index = max(0, min(bisect.bisect_right(probes, batch_tokens) - 1, len(probes) - 1))
    return values[index]


def _clamped_linear(probes: list[int], values: list[float], x: float) -> float:
    """SGLang's ``_interp_clamped``: linear between probes, the end value beyond them."""
    if x <= probes[0]:
        return values[0]
    if x >= probes[-1]:
        return values[-1]
    upper = bisect.bisect_right(probes, x)
    lower = upper - 1
    fraction = (x - probes[lower]) / (probes[upper] - probes[lower])
    return values[lower] + fraction * (values[upper] - values[lower])


def from_sglang_sps(
    data: Mapping, rows: Iterable[int] = _DEFAULT_ROWS, tokens: Iterable[int] = _DEFAULT_TOKENS, key: Mapping | None = None
) -> CostTable:
    """A ``CostTable`` on ``rows`` × ``tokens`` from SGLang's SPS table JSON (a dict, checked as SGLang
    checks it): t(R, T) = 1 / SPS(R·T) with SGLang's floor lookup; or, for the additive form (with
    ``bias_seconds``), t(R, T) = bias + α(R) + θ(R·T). ``key`` defaults to the source and its
    ``max_batch_tokens``. No drafting times: SGLang's file has none."""
    if not isinstance(data, Mapping):
        raise TypeError(f"data must be a mapping (SGLang's SPS table JSON, decoded), got {type(data).__name__}")
    rows, tokens = _check_grid("rows", rows), _check_grid("tokens", tokens)
    if "bias_seconds" in data:  # the same test SGLang's loader makes
        _require(data, ("bias_seconds", "bs_probes", "alpha_seconds", "m_probes", "theta_seconds"), "SpsAdditiveCostTable")
        bias = _number("bias_seconds", data["bias_seconds"], positive=True)
        requests = _probes(data, "bs_probes")
        alpha = _numbers(data, "alpha_seconds", len(requests), positive=False)
        batch = _probes(data, "m_probes")
        theta = _numbers(data, "theta_seconds", len(batch), positive=False)
        seconds = [[bias + _clamped_linear(requests, alpha, count) + _clamped_linear(batch, theta, count * width) for width in tokens] for count in rows]
        default_key = {"source": "sglang SpsAdditiveCostTable"}
    else:
        _require(data, ("sample_batch_tokens", "sample_steps_per_sec", "max_batch_tokens"), "SpsCostTable")
        probes = _probes(data, "sample_batch_tokens")
        rates = _numbers(data, "sample_steps_per_sec", len(probes), positive=True)
        ceiling = check_int("max_batch_tokens", data["max_batch_tokens"], probes[-1])
        seconds = [[1.0 / _floor_lookup(probes, rates, count * width) for width in tokens] for count in rows]
        default_key = {"source": "sglang SpsCostTable", "max_batch_tokens": ceiling}
    return CostTable(rows=rows, tokens=tokens, step_seconds=seconds, key=default_key if key is None else key)


def save_sglang_sps(table: CostTable, path: str | os.PathLike, rows: int | Iterable[int] | None = None, max_batch_tokens: int | None = None) -> None:
    """Write ``to_sglang_sps(table, rows, max_batch_tokens)`` as the JSON file SGLang's
    ``--speculative-dspark-sps-table-path`` reads."""
    Path(path).write_text(json.dumps(to_sglang_sps(table, rows=rows, max_batch_tokens=max_batch_tokens)) + "\n")


def load_sglang_sps(path: str | os.PathLike, rows: Iterable[int] = _DEFAULT_ROWS, tokens: Iterable[int] = _DEFAULT_TOKENS) -> CostTable:
    """``from_sglang_sps`` of the JSON file at ``path``."""
    return from_sglang_sps(json.loads(Path(path).read_text()), rows=rows, tokens=tokens)
