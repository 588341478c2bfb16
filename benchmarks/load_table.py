"""Print a ``benchmarks/bench_load.py`` report as the RST tables the docs show: for each drafter, a row per
concurrency c with every policy's speed over plain decoding (``greedy / temperature 1``), DSpark's over the best
static policy and over the vLLM rule, its ratio in each timed round, τ and ℓ (``dspark.benchmarking.load_table``);
with ``--noise``, what the A/A control says of the machine instead: its spread, and the paired generations a 3% or 2%
interval would need (``dspark.benchmarking.noise_table``).

    python benchmarks/load_table.py benchmarks/results/bench_load_pace_held_c1_4.json
    python benchmarks/load_table.py benchmarks/results/bench_load_pace_held_c1_4.json --decode
    python benchmarks/load_table.py REPORT --paired
    python benchmarks/load_table.py REPORT --noise
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dspark.benchmarking import load_table, noise_table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report", type=Path, help="a bench_load.py JSON report")
    kind = parser.add_mutually_exclusive_group()
    kind.add_argument("--decode", action="store_true", help="ratios of decoding alone (the steps' own times), not wall time")
    kind.add_argument("--paired", action="store_true", help="medians of the ratios on each batch (reports that keep them), not ratios of sums")
    kind.add_argument("--noise", action="store_true", help="the A/A control's spread and the pairs a 3%% or 2%% interval needs (reports with plain_again)")
    args = parser.parse_args(argv)
    report = json.loads(args.report.read_text())
    if args.noise:
        for drafter in report["results"]:
            print(f"{drafter}, {' / '.join(report['results'][drafter])}, the A/A control:\n")
            print(noise_table(report, drafter))
        return
    prefix, title = ("decode_", "decoding alone") if args.decode else ("paired_", "wall time, medians of per-batch ratios") if args.paired else ("", "wall time")
    for drafter in report["results"]:
        print(f"{drafter}, {' / '.join(report['results'][drafter])}, {title}:\n")
        print(load_table(report, drafter, prefix))


if __name__ == "__main__":
    main()
