"""How noisy this machine is for paired timings: the load benchmark's A/A control in minutes rather than hours.

Plain decoding (``dspark.strategies.autoregressive``, as ``bench_load.py`` runs it) of one batch of ``--concurrency``
Spec-Bench first turns on the default model, ``--generations`` times in a row, each generation timed by the wall
clock and by the process's CPU time, with the machine's steal time (``/proc/stat``, where the system has one):

* ``spread``: the standard deviation of the log ratio of consecutive generations' tokens/s (generation 2k against
  2k + 1, ``dspark.benchmarking.log_ratio_spread``): what the noise alone makes of one paired generation, as
  ``bench_load.py`` pairs policies on a batch; ``cpu_spread``, the same of CPU time;
* ``pairs_needed``: ``dspark.benchmarking.pairs_needed`` for a 95% interval of a paired median within ±1, 2, 3 and 5%
  (a floor: batches that differ add to it);
* where the noise comes from: ``cpu_per_wall`` (CPU seconds per wall second: time the process is kept off the CPU,
  by the hypervisor or other processes, runs up the wall clock only, so it moves this; work slowed by what the
  processor shares, caches and memory bandwidth, runs up both and leaves it) with its correlation to the wall time,
  and ``steal_share``, the hypervisor's share of the machine's time over the run.

Writes JSON and ``*_timeline.png`` (each generation's wall and CPU time, in order: a drift shows as a slow wave).

    python benchmarks/bench_noise.py --generations 32 --output benchmarks/results/bench_noise.json
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

import dspark
from dspark import pretrained, strategies
from dspark.benchmarking import across_categories, log_ratio_spread, pairs_needed, write_json
from dspark.pretrained import encode_chat
from dspark.training.data import eval_prompts

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
HALF_WIDTHS = (0.01, 0.02, 0.03, 0.05)


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=1, help="rows in the batch")
    parser.add_argument("--generations", type=int, default=32, help="generations timed, an even number >= 4 (consecutive pairs)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--data-dir", default=None, help="the prompt-data folder holding eval/ (default: dspark.training.default_data_dir())")
    parser.add_argument("--output", type=Path, default=RESULTS / "bench_noise.json")
    args = parser.parse_args(argv)
    if args.concurrency < 1 or args.max_new_tokens < 1:
        parser.error(f"--concurrency and --max-new-tokens must be >= 1, got {args.concurrency} and {args.max_new_tokens}")
    if args.generations < 4 or args.generations % 2:
        parser.error(f"--generations must be an even number >= 4, got {args.generations}")
    return args


def _cpu_ticks() -> tuple[int, int] | None:
    """(steal, all) clock ticks the machine has spent since boot, from the first line of /proc/stat; None where the
    system has no /proc/stat."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(value) for value in stat.readline().split()[1:]]
    except OSError:
        return None
    # user nice system idle iowait irq softirq steal guest guest_nice; guest time is counted in user already.
    return fields[7], sum(fields[:8])


def _timed(model, batch: dict, max_new_tokens: int) -> tuple[float, float, int]:
    """One greedy generation: (wall seconds, the process's CPU seconds, new tokens)."""
    cpu_started, started = time.process_time(), time.perf_counter()
    result = model.generate(**batch, max_new_tokens=max_new_tokens)
    return time.perf_counter() - started, time.process_time() - cpu_started, result.stats.new_tokens


def _plot(report: dict, output: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 3.8))
    walls, cpus = report["walls"], report["cpu_seconds"]
    axis.plot(range(len(walls)), walls, marker="o", label="wall")
    axis.plot(range(len(cpus)), [cpu / report["threads"] for cpu in cpus], marker=".", label=f"CPU time / {report['threads']} threads")
    axis.set(xlabel="generation, in order", ylabel="seconds", title=f"plain decoding, c = {report['settings']['concurrency']}: spread {report['spread']:.3f}")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(output.with_name(f"{output.stem}_timeline.png"), dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> dict:
    args = _parse_args(argv)
    transformers_logging.disable_progress_bar()
    bundle = pretrained.load()
    messages = [prompt.message for prompt in across_categories(eval_prompts(args.data_dir, spec_per_category=max(1, -(-args.concurrency // 13))))]
    batch = encode_chat(bundle.tokenizer, messages[: args.concurrency])
    model = dspark.SpeculativeModel(bundle.target, strategies.autoregressive(bundle.drafter))
    model.generate(**batch, max_new_tokens=4)  # the batch shape's one-off set-up, untimed
    ticks_started = _cpu_ticks()
    walls, cpus, tokens = [], [], []
    for _ in tqdm(range(args.generations), desc="generations", unit="gen"):
        wall, cpu, new_tokens = _timed(model, batch, args.max_new_tokens)
        walls.append(wall)
        cpus.append(cpu)
        tokens.append(new_tokens)
    ticks_ended = _cpu_ticks()
    rates = [count / wall for count, wall in zip(tokens, walls)]
    cpu_rates = [count / cpu for count, cpu in zip(tokens, cpus)]
    spread = log_ratio_spread([rates[0::2]], [rates[1::2]])
    cpu_per_wall = [cpu / wall for cpu, wall in zip(cpus, walls)]
    report = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "settings": {name: (str(value) if isinstance(value, Path) else value) for name, value in vars(args).items()},
        "machine": dspark.fast_path._machine_fingerprint(),
        "threads": torch.get_num_threads(),
        "walls": walls,
        "cpu_seconds": cpus,
        "new_tokens": tokens,
        "wall_cv": statistics.stdev(walls) / statistics.mean(walls),
        "spread": spread,
        "cpu_spread": log_ratio_spread([cpu_rates[0::2]], [cpu_rates[1::2]]),
        "pairs_needed": {f"{100 * half_width:g}%": pairs_needed(spread, half_width) for half_width in HALF_WIDTHS},
        "cpu_per_wall": statistics.mean(cpu_per_wall),
        "cpu_per_wall_wall_correlation": statistics.correlation(cpu_per_wall, walls) if len(set(cpu_per_wall)) > 1 else 0.0,
        "steal_share": None if ticks_started is None or ticks_ended is None else (
            (ticks_ended[0] - ticks_started[0]) / max(1, ticks_ended[1] - ticks_started[1])
        ),
    }
    write_json(args.output, report)
    _plot(report, args.output)
    print(
        f"wrote {args.output}: spread {spread:.3f} (CPU time {report['cpu_spread']:.3f}), wall cv {report['wall_cv']:.3f}, "
        f"CPU per wall {report['cpu_per_wall']:.2f} (correlation with wall {report['cpu_per_wall_wall_correlation']:+.2f}), "
        f"steal {report['steal_share']}; pairs for a 95% interval within " + ", ".join(f"±{k}: {v}" for k, v in report["pairs_needed"].items())
    )
    return report


if __name__ == "__main__":
    main()
