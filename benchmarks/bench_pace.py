"""How the machine's pace drifts between spells, and what that does to the online cost model's comparison.

The embedded target runs one forward of R rows (default 4, after a random cache of ``--context`` tokens, on the
fast path ``dspark.wrap`` uses) with one new token, then one with two, in pairs, for ``--seconds``. A pair's two
forwards run at the same moment, so their ratio is what verifying a second token costs; the one-token times
alone show the spells (their autocorrelation, their spread).

The series is then replayed into two ``OnlineCorrectedCostModel``s over a profile that holds the series' own
medians (so the profile is right and only the corrections can go wrong): one with the pace π (the default),
one with ``pace_smoothing=None``. Each sees every two-token forward and one in ``--thin`` one-token forwards, as
in generations that draft on most steps, where a skipped step is rare. After each observation (past a warm-up)
the replay records the corrected price of the second token, step_time(R, 2) / step_time(R, 1), against the
paired ratio; a ratio at 1 makes the second token look free. Written: the series, the summaries, both
replays' ratios, and a plot.

    python benchmarks/bench_pace.py --output benchmarks/results/bench_pace.json
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm
from transformers.utils import logging as transformers_logging

from dspark import pretrained
from dspark.benchmarking import write_json
from dspark.cost_models import CostTable, OnlineCorrectedCostModel, ProfiledCostModel
from dspark.cost_models import profiling
from dspark.fast_path import FastPath

ROOT = Path(__file__).resolve().parents[1]
#: Observations each replayed model sees before its ratios are recorded.
WARM_UP = 20


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--thin", type=int, default=10, help="the replays see one in this many one-token forwards")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "bench_pace.json")
    args = parser.parse_args(argv)
    if args.rows < 1 or args.context < 1 or args.seconds <= 0 or args.thin < 1:
        parser.error(f"--rows, --context and --thin must be >= 1 and --seconds > 0, got {args.rows}, {args.context}, {args.thin}, {args.seconds}")
    return args


def time_pairs(model, rows: int, context: int, seconds: float) -> list[tuple[float, float]]:
    """(one-token seconds, two-token seconds) of consecutive forwards over one random cache, for ``seconds``."""
    path = FastPath.shared(model)
    device = next(model.parameters()).device
    cache = profiling._random_cache(profiling._cache_layout(model, device), rows, context, device, profiling._generator(rows, 0, context))
    inputs = {tokens: profiling._step_inputs(model, rows, tokens, context, cache, profiling._generator(rows, tokens, context)) for tokens in (1, 2)}
    profiling._time_forward(model, inputs[1], path)  # warm-up: the fast path measures new shapes once
    pairs = []
    started = time.perf_counter()
    with tqdm(total=round(seconds), desc="timing pairs", unit="s") as bar:
        while (elapsed := time.perf_counter() - started) < seconds:
            pairs.append((profiling._time_forward(model, inputs[1], path), profiling._time_forward(model, inputs[2], path)))
            bar.n = min(round(elapsed), bar.total)
            bar.refresh()
    return pairs


def autocorrelation(values: list[float], lag: int) -> float:
    """The sample autocorrelation of ``values`` at ``lag``."""
    mean = statistics.fmean(values)
    deviations = [value - mean for value in values]
    return sum(a * b for a, b in zip(deviations, deviations[lag:])) / sum(d * d for d in deviations)


def replay(pairs: list[tuple[float, float]], rows: int, thin: int, **options) -> list[float]:
    """step_time(rows, 2) / step_time(rows, 1) after each observation past ``WARM_UP``, of a model that sees every
    two-token forward and one in ``thin`` one-token forwards, over a profile of the series' medians (``options``:
    the ``OnlineCorrectedCostModel``'s)."""
    profile = CostTable(rows=(rows,), tokens=(1, 2), step_seconds=((statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)),))
    model = OnlineCorrectedCostModel(ProfiledCostModel(profile), **options)
    ratios, observed = [], 0
    for index, (one, two) in enumerate(pairs):
        for tokens, seconds in ((1, one), (2, two)):
            if tokens == 1 and index % thin:
                continue
            model.observe_step(rows, tokens, seconds)
            observed += 1
            if observed > WARM_UP:
                ratios.append(model.step_time(rows, 2) / model.step_time(rows, 1))
    return ratios


def _summary(ratios: list[float], paired: float) -> dict:
    deciles = statistics.quantiles(ratios, n=10)
    return {"median": statistics.median(ratios), "p10": deciles[0], "p90": deciles[-1],
            "share_second_token_free": sum(ratio <= 1.02 for ratio in ratios) / len(ratios),
            "median_abs_error_vs_paired": statistics.median(abs(ratio - paired) for ratio in ratios)}


def _plot(path: Path, pairs: list[tuple[float, float]], replays: dict, paired: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=False)
    top.plot([1e3 * one for one, _ in pairs], lw=0.8, label="one new token")
    top.plot([1e3 * two for _, two in pairs], lw=0.8, label="two new tokens")
    top.set(xlabel="pair", ylabel="ms per forward", title="The same two forwards, timed in turn")
    top.legend()
    for name, ratios in replays.items():
        bottom.plot(ratios, lw=0.8, label=name)
    bottom.axhline(paired, color="black", ls="--", lw=0.8, label="paired ratio (median)")
    bottom.set(xlabel="observation (past the warm-up)", ylabel="step_time(R, 2) / step_time(R, 1)", title="The online model's price of a second token")
    bottom.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: list[str] | None = None) -> dict:
    args = _parse_args(argv)
    transformers_logging.disable_progress_bar()
    torch.manual_seed(0)
    target = pretrained.load().target
    pairs = time_pairs(target, args.rows, args.context, args.seconds)
    ones = [one for one, _ in pairs]
    paired = statistics.median(two / one for one, two in pairs)
    replays = {"with pace": replay(pairs, args.rows, args.thin), "without pace": replay(pairs, args.rows, args.thin, pace_smoothing=None)}
    report = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "settings": {**vars(args), "output": str(args.output)},
        "pairs": len(pairs),
        "one_token_ms": {"median": 1e3 * statistics.median(ones), "p10": 1e3 * statistics.quantiles(ones, n=10)[0],
                         "p90": 1e3 * statistics.quantiles(ones, n=10)[-1],
                         "autocorrelation_lag1": autocorrelation(ones, 1), "autocorrelation_lag10": autocorrelation(ones, 10)},
        "two_token_ms_median": 1e3 * statistics.median(two for _, two in pairs),
        "paired_ratio_median": paired,
        "replays": {name: _summary(ratios, paired) for name, ratios in replays.items()},
        "series_ms": [[1e3 * one, 1e3 * two] for one, two in pairs],
    }
    write_json(args.output, report)
    _plot(args.output.with_suffix(".png"), pairs, replays, paired)
    for name, summary in report["replays"].items():
        print(f"{name}: price of a second token, median {summary['median']:.3f} (paired {paired:.3f}), "
              f"free in {100 * summary['share_second_token_free']:.0f}% of observations")
    print(f"wrote {args.output}")
    return report


if __name__ == "__main__":
    main()
