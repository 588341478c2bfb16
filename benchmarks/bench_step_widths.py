"""What a verify step of each width costs in dspark's loop, against what the profiled table says it costs.

For each concurrency c, static batches of c different Spec-Bench first turns (``--rows``, as in ``bench_load.py``)
generate ``--max-new-tokens`` greedy tokens per row with the shipped drafter and a fixed verify width w = 1 + ℓ:
plain decoding for w = 1, ``FixedLength(w − 1)`` above, every width on each batch in turn, in an order drawn anew
(seeded) at every batch and round, after an untimed warm-up. From the step records (the first of each generation,
which pays for the prefill's cache, left out) it keeps the steps over all c rows at width w and reports their
``verify_seconds`` (the target's forward, the acceptance rule and the cache's bookkeeping; median and mean) and
``draft_seconds`` (median), each width's median over width 1's, and, for comparison, the profiled table's entry
for (c, w) as measured and under its monotone envelope (``dspark.profiled_cost_model``'s base table, profiled on
first use). A step's time varies with the machine's pace, so the order is shuffled and every width runs on the same
batches; the ratios are what a scheduler compares.

Writes JSON and a PNG (``*_widths.png``: the loop's median step time against w per c, beside the table's).

    python benchmarks/bench_step_widths.py --concurrency 1,2 --output benchmarks/results/bench_step_widths.json
"""

from __future__ import annotations

import argparse
import random
import shlex
import statistics
import sys
from pathlib import Path

import torch
from tqdm import tqdm
from transformers.utils import logging as transformers_logging

import dspark
from dspark import pretrained, strategies
from dspark.benchmarking import across_categories, write_json
from dspark.cost_models import monotone_envelope
from dspark.pretrained import encode_chat
from dspark.training.data import eval_prompts

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,2")
    parser.add_argument("--widths", default=None, help="verify widths w = 1 + ℓ to run (default: 1 to γ + 1)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rows", type=int, default=8, help="rows per setting at least: ceil(rows / c) batches of c different prompts")
    parser.add_argument("--repeats", type=int, default=2, help="timed rounds; every width runs on every batch in each")
    parser.add_argument("--data-dir", default=None, help="the prompt-data folder holding eval/ (default: dspark.training.default_data_dir())")
    parser.add_argument("--output", type=Path, default=RESULTS / "bench_step_widths.json")
    args = parser.parse_args(argv)
    args.concurrency = [int(value) for value in args.concurrency.split(",")]
    if min(args.concurrency) < 1 or args.rows < 1 or args.repeats < 1 or args.max_new_tokens < 2:
        parser.error(f"--concurrency, --rows and --repeats must be >= 1 and --max-new-tokens >= 2, got {args.concurrency}, {args.rows}, {args.repeats}, {args.max_new_tokens}")
    return args


def _table_entries(cost_model, rows: int, width: int) -> dict:
    """The base table's (rows, width) entry as measured and under its monotone envelope; None where not on its grid."""
    table = cost_model.base.table
    if rows not in table.rows or width not in table.tokens:
        return {"table_seconds": None, "table_envelope_seconds": None}
    i, j = table.rows.index(rows), table.tokens.index(width)
    return {"table_seconds": table.step_seconds[i][j], "table_envelope_seconds": monotone_envelope(table.step_seconds)[i][j]}


def _plot(report: dict, output: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = report["results"]
    figure, axes = plt.subplots(1, len(settings), figsize=(5 * len(settings), 4.2), squeeze=False)
    for axis, (c, by_width) in zip(axes[0], settings.items()):
        widths = [int(width) for width in by_width]
        axis.plot(widths, [1e3 * by_width[str(w)]["verify_median_seconds"] for w in widths], marker="o", label="loop: median verify step")
        for key, label in (("table_seconds", "profiled table"), ("table_envelope_seconds", "table's monotone envelope")):
            points = [(w, by_width[str(w)][key]) for w in widths if by_width[str(w)][key] is not None]
            if points:
                axis.plot([w for w, _ in points], [1e3 * s for _, s in points], marker=".", linestyle="--", label=label)
        axis.set(title=f"c = {c}", xlabel="verify width w = 1 + ℓ (tokens per row)", ylabel="ms per step")
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(output.with_name(f"{output.stem}_widths.png"), dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> dict:
    args = _parse_args(argv)
    args.output = args.output.resolve()
    transformers_logging.disable_progress_bar()
    bundle = pretrained.load()
    target, drafter = bundle.target, bundle.drafter
    gamma = drafter.max_draft_tokens
    widths = list(range(1, gamma + 2)) if args.widths is None else [int(value) for value in args.widths.split(",")]
    if min(widths) < 1 or max(widths) > gamma + 1:
        raise SystemExit(f"--widths must lie in 1..{gamma + 1} (γ + 1), got {widths}")
    cost_model = dspark.profiled_cost_model(target, drafter, gamma)
    models = {
        width: dspark.SpeculativeModel(target, strategies.autoregressive(drafter) if width == 1 else strategies.fixed_length(drafter, width - 1))
        for width in widths
    }
    batches_at = {c: -(-args.rows // c) for c in args.concurrency}
    needed = max(c * batches_at[c] for c in args.concurrency)
    messages = [prompt.message for prompt in across_categories(eval_prompts(args.data_dir, spec_per_category=max(1, -(-needed // 13))))]
    report = {"command": shlex.join([sys.executable, *sys.argv]), "settings": {**vars(args), "output": str(args.output), "widths": widths},
              "machine": dspark.fast_path.processor_name(), "torch_threads": torch.get_num_threads(), "results": {}}
    runs = sum(batches_at[c] * len(widths) * (args.repeats + 1) for c in args.concurrency)
    with tqdm(total=runs, desc="generations", unit="run", mininterval=30) as bar:
        for c in args.concurrency:
            batches = [encode_chat(bundle.tokenizer, messages[start : start + c]) for start in range(0, c * batches_at[c], c)]
            verify, draft = {width: [] for width in widths}, {width: [] for width in widths}
            for round_index in range(args.repeats + 1):  # round 0 warms up
                for batch_index, batch in enumerate(batches):
                    for width in random.Random(round_index * len(batches) + batch_index).sample(widths, len(widths)):
                        result = models[width].generate(**batch, max_new_tokens=args.max_new_tokens if round_index else 4)
                        bar.update(1)
                        for record in result.stats.records[1:] if round_index else ():
                            step_width = 1 + int(record.verify_lengths.max())
                            if record.rows.numel() == c and step_width in verify:
                                verify[step_width].append(record.verify_seconds)
                                draft[step_width].append(record.draft_seconds)
            one = statistics.median(verify[1]) if verify[1] else None
            entries = {}
            for width in widths:
                times = verify[width]
                median = statistics.median(times) if times else None
                entries[str(width)] = {
                    "steps": len(times),
                    "verify_median_seconds": median,
                    "verify_mean_seconds": statistics.fmean(times) if times else None,
                    "draft_median_seconds": statistics.median(draft[width]) if times else None,
                    "vs_width_1": None if median is None or not one else median / one,
                    **_table_entries(cost_model, c, width),
                }
            report["results"][str(c)] = entries
            tqdm.write(f"c={c}: " + ", ".join(f"w{w} {1e3 * e['verify_median_seconds']:.1f} ms" for w, e in entries.items() if e["steps"]))
            write_json(args.output, report)
    _plot(report, args.output)
    print(f"wrote {args.output}")
    return report


if __name__ == "__main__":
    main()
