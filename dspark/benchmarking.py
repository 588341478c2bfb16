"""Helpers the benchmark scripts share: output trimming and comparison, atomic JSON reports, and
timing a strategy over prompts (prompts are encoded with ``dspark.pretrained.encode_chat``).

They live in the package (not next to the scripts) so that every script imports them the same
way, with no ``sys.path`` edits.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import random
import statistics
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

import dspark
from dspark.checks import check_fraction, check_int

__all__ = [
    "STATIC_POLICIES", "across_categories", "best_static", "first_difference", "generated_tokens", "load_table", "log_ratio_spread",
    "noise_table", "pairs_needed", "paired_ratio", "paired_ratio_interval", "paired_vs_best_static", "run_strategy", "sweep", "write_json",
]

#: How ``load_table`` heads the policies ``benchmarks/bench_load.py`` names (``dspark_static``: in reports made before the
#: preset weighed rows by when they finish); any other keeps its own name.
_POLICY_TITLES = {
    "plain_again": "plain again", "mtp1": "MTP-1", "fixed_gamma": "fixed γ", "threshold": "threshold", "vllm_rule": "vLLM rule", "dspark": "DSpark",
    "dspark_candidates": "DSpark (candidates)", "dspark_static": "DSpark (static)", "dspark_theta": "DSpark (Θ)", "dspark_look_ahead": "DSpark (look-ahead)",
    "dspark_shallow": "DSpark (⌈λ⌉ deep)",
}


def across_categories(prompts: list) -> list:
    """``prompts`` (each with a ``category``) reordered round-robin over their categories, so that every batch,
    and the first rows of a small one, mix categories rather than take one category's prompts."""
    categories = list(dict.fromkeys(prompt.category for prompt in prompts))
    rank = {}
    ordered = []
    for prompt in prompts:
        rank[prompt.category] = rank.get(prompt.category, -1) + 1
        ordered.append((rank[prompt.category], categories.index(prompt.category), prompt))
    return [prompt for *_, prompt in sorted(ordered, key=lambda item: item[:2])]


def generated_tokens(sequences: torch.Tensor, prompt_length: int, eos_token_id: int) -> list[list[int]]:
    """Each row's new tokens up to and including its first EOS (HF stops there, dspark pads after it)."""
    rows = []
    for row in sequences[:, prompt_length:].tolist():
        rows.append(row[: row.index(eos_token_id) + 1] if eos_token_id in row else row)
    return rows


def write_json(path: Path, report: dict) -> None:
    """Write through a temporary file so an interrupted run never leaves half a report."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(partial, path)


def first_difference(tokens: list[int], reference: list[int]) -> int | None:
    """Index of the first differing token (or of the shorter sequence's end), None when equal."""
    if tokens == reference:
        return None
    return next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b), min(len(tokens), len(reference)))


def run_strategy(model, strategy, prompts, max_new_tokens) -> dict:
    """Generate every prompt; return tokens/s, τ, the share of steps that verified a draft, and the
    median plain (ℓ = 0) and verifying step times in ms."""
    speculative = dspark.SpeculativeModel(model, strategy)
    tokens = seconds = 0.0
    plain, verifying, row_steps = [], [], 0
    for prompt in prompts:
        started = time.perf_counter()
        result = speculative.generate(**prompt, max_new_tokens=max_new_tokens)
        seconds += time.perf_counter() - started
        tokens += result.stats.new_tokens
        row_steps += result.stats.steps
        for record in result.stats.records:
            (verifying if int(record.verify_lengths.max()) > 0 else plain).append(record.verify_seconds)
    return {
        "tokens_per_s": tokens / seconds,
        "tau": tokens / row_steps,
        "verify_share": len(verifying) / max(row_steps, 1),
        "plain_step_ms": 1000 * statistics.median(plain) if plain else None,
        "verify_step_ms": 1000 * statistics.median(verifying) if verifying else None,
    }


def sweep(model, settings: list[tuple[str, object]], prompts, max_new_tokens) -> dict:
    """``run_strategy`` every (name, strategy) after one warm-up call; the first setting is the baseline that
    every ``vs_autoregressive`` ratio divides by."""
    dspark.SpeculativeModel(model, settings[-1][1]).generate(**prompts[0], max_new_tokens=4)
    results = {}
    for name, strategy in tqdm(settings, desc="settings"):
        results[name] = run_strategy(model, strategy, prompts, max_new_tokens)
        results[name]["vs_autoregressive"] = results[name]["tokens_per_s"] / results[settings[0][0]]["tokens_per_s"]
        tqdm.write(f"{name:28s} {results[name]['tokens_per_s']:6.2f} tok/s  x{results[name]['vs_autoregressive']:.2f}  tau {results[name]['tau']:.2f}")
    return results


#: What ``load_table`` writes where a report holds no figure (a run cut before that setting; an older report).
_MISSING = "–"


def _paired_ratios(mine: list[list[float]], theirs: list[list[float]]) -> list[list[float]]:
    """x_{i,b} / y_{i,b} for every round i and batch b of ``mine`` and ``theirs`` (``paired_ratio``)."""
    if len(mine) != len(theirs) or not mine or any(len(row) != len(other) or not row for row, other in zip(mine, theirs)):
        raise ValueError(f"mine and theirs must hold as many rounds, each of as many batches (at least one), got {mine!r} and {theirs!r}")
    return [[x / y for x, y in zip(row, other)] for row, other in zip(mine, theirs)]


def paired_ratio(mine: list[list[float]], theirs: list[list[float]]) -> tuple[float, list[float]]:
    """How much faster one policy ran than another on the same batches: with x_{i,b} and y_{i,b} their tokens/s on
    batch b of timed round i (``mine``, ``theirs``: a list per round of a value per batch, each batch run by both in
    that round), (median over every i and b of x_{i,b} / y_{i,b}, [median over b of x_{i,b} / y_{i,b} for each round
    i]). A median of paired ratios, where a ratio of sums lets one generation slowed by a burst of another tenant's
    work weigh on its whole round."""
    ratios = _paired_ratios(mine, theirs)
    return statistics.median(ratio for row in ratios for ratio in row), [statistics.median(row) for row in ratios]


def paired_ratio_interval(
    mine: list[list[float]], theirs: list[list[float]], level: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """A percentile bootstrap interval at ``level`` for ``paired_ratio``'s median of x_{i,b} / y_{i,b}: each of
    ``resamples`` resamples draws the B batches with replacement, then for each drawn batch its I rounds with
    replacement, and takes the median of the I·B ratios drawn; the interval holds the middle ``level`` of those medians
    (its ends rounded outwards to resamples).

    Two stages, because a batch is one set of prompts, shared by all its rounds (how far ahead its drafter reaches,
    how long it runs), while its rounds differ by the machine's noise and, when sampling, by the draws: drawing every
    (round, batch) pair alike would count one batch timed in four rounds as four batches and make the interval too
    narrow wherever batches differ. Batches are drawn from a generator of their own, so that which batches a resample
    holds depends on ``seed`` alone: a batch whose rounds all read one ratio counts as that one ratio, however many
    rounds timed it. With one batch the interval spans what its rounds' medians can be (with two rounds, both
    ratios), which understates a noisy machine's spread: few rounds rarely show its slow spells. With one ratio, it is
    that ratio. Paired with a policy picked after the fact (the best static one), the
    interval holds given that pick."""
    ratios = _paired_ratios(mine, theirs)
    if len({len(row) for row in ratios}) != 1:
        raise ValueError(f"mine and theirs must hold as many batches in every round, got {mine!r} and {theirs!r}")
    check_fraction("level", level, include_one=False)
    check_int("resamples", resamples, 1)
    by_batch = [list(column) for column in zip(*ratios)]
    rounds = len(ratios)
    batch_draws, round_draws = random.Random(f"{seed}:batches"), random.Random(f"{seed}:rounds")
    medians = []
    for _ in range(resamples):
        drawn = []
        for batch in batch_draws.choices(by_batch, k=len(by_batch)):
            drawn += round_draws.choices(batch, k=rounds)
        medians.append(statistics.median(drawn))
    medians.sort()
    tail = (1 - level) / 2 * (resamples - 1)
    return medians[math.floor(tail)], medians[math.ceil(resamples - 1 - tail)]


def log_ratio_spread(mine: list[list[float]], theirs: list[list[float]]) -> float:
    """The standard deviation s of log(x_{i,b} / y_{i,b}) over every round i and batch b (the pairs of
    ``paired_ratio``; at least two). Of an A/A control, one policy timed twice, it is how far the machine's noise
    alone moves one paired generation's ratio: what ``pairs_needed`` reads."""
    logs = [math.log(ratio) for row in _paired_ratios(mine, theirs) for ratio in row]
    if len(logs) < 2:
        raise ValueError(f"mine and theirs must hold at least two pairs to spread, got {mine!r} and {theirs!r}")
    return statistics.stdev(logs)


def pairs_needed(spread: float, half_width: float, level: float = 0.95) -> int:
    """How many paired generations n a median of paired ratios needs for its ``level`` interval to lie within
    ×(1 ± ``half_width``), where one pair's log ratio has standard deviation ``spread`` (``log_ratio_spread`` of an
    A/A control).

    The median of n normal draws of standard deviation s has standard error √(π/2)·s/√n, so with z the normal
    quantile at (1 + level)/2, n = ⌈(z·√(π/2)·s / log(1 + h))²⌉ (log(1 + h), the nearer end in logs). A floor, not
    an estimate: it counts the machine's noise only, and batches whose true ratios differ widen the interval of
    ``paired_ratio_interval`` further, whatever the number of rounds."""
    if isinstance(spread, bool) or not isinstance(spread, numbers.Real):
        raise TypeError(f"spread must be a number >= 0, got {spread!r}")
    if not 0 <= spread < math.inf:
        raise ValueError(f"spread must be a number >= 0, got {spread!r}")
    check_fraction("half_width", half_width, include_one=False)
    check_fraction("level", level, include_one=False)
    z = statistics.NormalDist().inv_cdf((1 + level) / 2)
    return max(1, math.ceil((z * math.sqrt(math.pi / 2) * spread / math.log1p(half_width)) ** 2))


#: ``benchmarks/bench_load.py``'s policies whose verify lengths read nothing of the step: DSpark is measured against the best of them.
STATIC_POLICIES = ("plain", "mtp1", "fixed_gamma", "threshold")


def best_static(entries: dict) -> str:
    """The name of the static policy (``STATIC_POLICIES``) with the highest ``paired_vs_plain`` in one setting's
    ``entries`` of a ``benchmarks/bench_load.py`` report."""
    static = [name for name in STATIC_POLICIES if name in entries]
    if not static:
        raise ValueError(f"entries must hold a static policy, one of {STATIC_POLICIES}, got {sorted(entries)}")
    return max(static, key=lambda name: entries[name]["paired_vs_plain"])


def paired_vs_best_static(entries: dict, name: str = "dspark") -> float:
    """Policy ``name``'s tokens/s over the best static policy's (``best_static``), batch by batch: ``paired_ratio``
    of their ``round_batch_tokens_per_s``. Where a report's ``paired_vs_best_static`` divides two medians, each taken
    on its own median batch, this pairs every batch."""
    return paired_ratio(entries[name]["round_batch_tokens_per_s"], entries[best_static(entries)]["round_batch_tokens_per_s"])[0]


def _interval_text(interval: tuple[float, float]) -> str:
    """An interval as a table cell shows it: its ends to two places."""
    return f"{interval[0]:.2f}–{interval[1]:.2f}"


def load_table(report: dict, drafter: str, prefix: str = "") -> str:
    """One drafter's part of a ``benchmarks/bench_load.py`` report as an RST table, a row per concurrency c: each
    policy's speed over plain decoding, then DSpark's over the best static policy and over the vLLM rule, its ratio
    to plain decoding in each timed round (where the report keeps rounds: their spread is the machine's noise) and,
    where the report holds the A/A control ``plain_again``, that control's ratio in each round, then DSpark's τ, its
    mean verify length ℓ and, where the report keeps it, the share of its rows' steps the drafter was asked for. A
    cell holds one figure per mode, ``greedy / temperature 1``, and ``–`` where the report has none. ``prefix``
    ``"decode_"`` gives the ratios of decoding alone, ``"paired_"`` the medians of per-batch ratios (``paired_ratio``),
    with DSpark's over the best static policy both as the report's ratio of two medians and, where the report keeps
    every batch, paired batch by batch (``paired_vs_best_static``), and then the 95% bootstrap intervals of DSpark's
    paired ratios to plain decoding and to the best static policy (``paired_ratio_interval``): what the machine's
    noise and the batches' spread leave of each median."""
    if prefix not in ("", "decode_", "paired_"):
        raise ValueError(f"prefix must be '', 'decode_' or 'paired_', got {prefix!r}")
    by_mode, concurrencies = _drafter_settings(report, drafter)
    settings = [entries for by_c in by_mode.values() for entries in by_c.values()]
    measured = dict.fromkeys(name for entries in settings for name in entries if name != "plain")
    policies = [name for name in _POLICY_TITLES if name in measured] + [name for name in measured if name not in _POLICY_TITLES]

    columns = {_POLICY_TITLES.get(name, name): (lambda entries, name=name: f"{entries[name][prefix + 'vs_plain']:.2f}") for name in policies}
    if "dspark" in measured:
        columns["DSpark/best"] = lambda entries: f"{entries['dspark'][prefix + 'vs_best_static']:.2f}"
        if prefix == "paired_" and any("round_batch_tokens_per_s" in entries.get("dspark", {}) for entries in settings):
            columns["DSpark/best by batch"] = lambda entries: f"{paired_vs_best_static(entries):.2f}"
            columns["DSpark/plain, 95%"] = lambda entries: _interval_text(
                paired_ratio_interval(entries["dspark"]["round_batch_tokens_per_s"], entries["plain"]["round_batch_tokens_per_s"])
            )
            columns["DSpark/best, 95%"] = lambda entries: _interval_text(
                paired_ratio_interval(entries["dspark"]["round_batch_tokens_per_s"], entries[best_static(entries)]["round_batch_tokens_per_s"])
            )
        if "vllm_rule" in measured:
            columns["DSpark/vLLM"] = lambda entries: f"{entries['dspark'][prefix + 'vs_plain'] / entries['vllm_rule'][prefix + 'vs_plain']:.2f}"
        if any(prefix + "vs_plain_rounds" in entries.get("dspark", {}) for entries in settings):
            columns["DSpark by round"] = lambda entries: ", ".join(f"{ratio:.2f}" for ratio in entries["dspark"][prefix + "vs_plain_rounds"])
            if "plain_again" in measured:
                columns["A/A by round"] = lambda entries: ", ".join(f"{ratio:.2f}" for ratio in entries["plain_again"][prefix + "vs_plain_rounds"])
        columns["DSpark τ"] = lambda entries: f"{entries['dspark']['tau']:.2f}"
        columns["DSpark ℓ"] = lambda entries: f"{entries['dspark']['mean_verify_length']:.2f}"
        if any("drafted_share" in entries.get("dspark", {}) for entries in settings):
            columns["DSpark drafted"] = lambda entries: f"{entries['dspark']['drafted_share']:.2f}"
    return _rst_table(["c", *columns], [[c, *(_mode_cell(by_mode, c, read) for read in columns.values())] for c in concurrencies])


def noise_table(report: dict, drafter: str, half_widths: tuple[float, ...] = (0.03, 0.02)) -> str:
    """What the A/A control (``plain_again``) of one drafter's part of a ``benchmarks/bench_load.py`` report says
    about the machine, as an RST table, a row per concurrency c: the control's ``log_ratio_spread`` against plain
    decoding, the pairs each setting timed (rounds × batches) and, for each of ``half_widths``, the ``pairs_needed``
    for a 95% interval within ×(1 ± h). A cell holds one figure per mode, ``greedy / temperature 1``, and ``–`` where
    the report has none (no control, one pair, or no such setting)."""
    by_mode, concurrencies = _drafter_settings(report, drafter)
    for half_width in half_widths:
        check_fraction("half_widths", half_width, include_one=False)

    def spread(entries: dict) -> float:
        return log_ratio_spread(entries["plain_again"]["round_batch_tokens_per_s"], entries["plain"]["round_batch_tokens_per_s"])

    columns = {
        "A/A spread": lambda entries: f"{spread(entries):.3f}",
        "pairs timed": lambda entries: str(sum(len(row) for row in entries["plain"]["round_batch_tokens_per_s"])),
        **{
            f"pairs for ±{100 * half_width:g}%": (lambda entries, half_width=half_width: str(pairs_needed(spread(entries), half_width)))
            for half_width in half_widths
        },
    }

    absent = (KeyError, ValueError)  # a setting without the control, or one pair, which has no spread
    return _rst_table(["c", *columns], [[c, *(_mode_cell(by_mode, c, read, absent) for read in columns.values())] for c in concurrencies])


def _drafter_settings(report: dict, drafter: str) -> tuple[dict, list[str]]:
    """(mode → c → entries, every c in any mode, in order) of one drafter's part of a ``benchmarks/bench_load.py``
    report; a ValueError naming the drafter where the report has none."""
    by_mode = report["results"].get(drafter)
    if not by_mode:
        raise ValueError(f"drafter {drafter!r} is not in the report; it has {sorted(report['results'])}")
    return by_mode, list(dict.fromkeys(c for by_c in by_mode.values() for c in by_c))


def _mode_cell(by_mode: dict, c: str, read, absent: tuple = (KeyError,)) -> str:
    """One table cell: ``read`` of setting c's entries in each mode of ``by_mode``, joined ``greedy / temperature 1``,
    ``–`` for a mode where reading raises one of ``absent`` (a setting, policy or field this report does not hold)."""
    figures = []
    for entries in by_mode.values():
        try:
            figures.append(read(entries[c]))
        except absent:
            figures.append(_MISSING)
    return " / ".join(figures)


def _rst_table(header: list[str], body: list[list[str]]) -> str:
    """A simple RST table of ``header`` and the rows of ``body``, each column as wide as its widest cell."""
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
    rule = "  ".join("=" * width for width in widths)
    lines = [rule, "  ".join(text.ljust(width) for text, width in zip(header, widths)).rstrip(), rule]
    lines += ["  ".join(text.ljust(width) for text, width in zip(row, widths)).rstrip() for row in body]
    return "\n".join([*lines, rule]) + "\n"
