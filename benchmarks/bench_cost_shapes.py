"""What the preset's cost model prices a load-benchmark batch at: one base table against a table per shape.

For each concurrency c, the batch ``bench_load.py`` runs first (c Spec-Bench first turns, padded to the
longest) is priced by the cost model ``dspark.profiled_cost_model`` makes: by its base table (1-8 rows at a
256-token context, extrapolated beyond) and by the table of the batch's own shape
(``AutoProfiledCostModel.start``: its rows grid and context band). Both are set beside the one-token step
the loop actually takes on that batch with plain decoding (the median ``verify_seconds`` of its step
records over ``--max-new-tokens`` tokens, which includes the acceptance rule). Reported per c: t(c, 1),
the second token's relative cost t(c, 2) / t(c, 1), the widest forward's t(c, γ + 1) / t(c, 1) and one
drafting pass d(c) / t(c, 1). Tables already profiled are read from the cache; a shape not yet profiled
is measured first (a progress bar).

    python benchmarks/bench_cost_shapes.py --concurrency 1,4,16,32 --output benchmarks/results/bench_cost_shapes.json
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
from pathlib import Path

import torch
from tqdm import tqdm
from transformers.utils import logging as transformers_logging

import dspark
from dspark import pretrained
from dspark.benchmarking import across_categories, write_json
from dspark.pretrained import encode_chat
from dspark.training.data import eval_prompts
from dspark.types import GenerationStart, SamplingConfig
from dspark.verify import FixedLength

ROOT = Path(__file__).resolve().parents[1]


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,4,16,32")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="as bench_load.py: the context band reads the prompt plus half of these")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "bench_cost_shapes.json")
    args = parser.parse_args(argv)
    args.concurrency = [int(value) for value in args.concurrency.split(",")]
    if min(args.concurrency) < 1 or args.max_new_tokens < 2:
        parser.error(f"--concurrency must be ints >= 1 and --max-new-tokens >= 2, got {args.concurrency} and {args.max_new_tokens}")
    return args


def _prices(cost_model, rows: int, gamma: int) -> dict:
    one = cost_model.step_time(rows, 1)
    return {
        "step_seconds_1": one,
        "step_ratio_2": cost_model.step_time(rows, 2) / one,
        "step_ratio_widest": cost_model.step_time(rows, gamma + 1) / one,
        "draft_ratio": cost_model.draft_time(rows) / one,
    }


def main(argv: list[str] | None = None) -> dict:
    args = _parse_args(argv)
    transformers_logging.disable_progress_bar()
    bundle = pretrained.load()
    target, drafter = bundle.target, bundle.drafter
    gamma = drafter.max_draft_tokens
    prompts = across_categories(eval_prompts(args.data_dir, spec_per_category=max(1, -(-max(args.concurrency) // 13))))
    auto = dspark.profiled_cost_model(target, drafter, gamma).base
    plain = dspark.wrap(target, drafter, policy=FixedLength(0))
    report = {"command": shlex.join([sys.executable, *sys.argv]), "settings": {**vars(args), "output": str(args.output)}, "results": {}}
    for c in tqdm(args.concurrency, desc="shapes", unit="batch"):
        batch = encode_chat(bundle.tokenizer, [prompt.message for prompt in prompts[:c]])
        prompt_length = batch["input_ids"].shape[1]
        generation = GenerationStart(rows=c, device=batch["input_ids"].device, max_draft_tokens=gamma,
                                     max_length=prompt_length + args.max_new_tokens, sampling=SamplingConfig(), prompt_length=prompt_length)
        base = _prices(auto.profiled(auto.base_shape), c, gamma)
        rows, context = auto.shape(generation)
        shaped = _prices(auto.profiled((rows, context)), c, gamma)
        plain.generate(**batch, max_new_tokens=4)  # the batch shape's one-off set-up
        records = plain.generate(**batch, max_new_tokens=args.max_new_tokens, eos_token_id=[]).stats.records
        measured = statistics.median(record.verify_seconds for record in records[1:])
        report["results"][str(c)] = {
            "prompt_length": prompt_length, "table_rows": list(rows), "table_context": context,
            "base_table": base, "shape_table": shaped, "measured_step_seconds_1": measured,
            "base_vs_measured": base["step_seconds_1"] / measured, "shape_vs_measured": shaped["step_seconds_1"] / measured,
        }
        tqdm.write(f"c={c} (prompt {prompt_length}, table {list(rows)} @ {context}): t(c,1) base {1e3 * base['step_seconds_1']:.0f} ms, "
                   f"shape {1e3 * shaped['step_seconds_1']:.0f} ms, measured {1e3 * measured:.0f} ms; t(c,2)/t(c,1) base "
                   f"{base['step_ratio_2']:.2f}, shape {shaped['step_ratio_2']:.2f}; d(c)/t(c,1) base {base['draft_ratio']:.2f}, "
                   f"shape {shaped['draft_ratio']:.2f}")
        write_json(args.output, report)
    return report


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
