"""What reading the prompt costs in one target forward against chunks of ``PREFILL_CHUNK_TOKENS`` tokens.

For each concurrency c, the batch ``bench_load.py`` runs first (c Spec-Bench first turns, padded to the
longest) is generated for one token with dspark's loop, so the time is the prefill and one step, through the
public ``generate`` with ``prefill_chunk_tokens`` set to the whole prompt (one forward) or left at its default.
Two strategies: plain decoding (the target returns no hidden states) and MTP-1 with the shipped drafter (the
target returns hidden states at the prefill, as for every drafter that reads target features). Reported per c,
strategy and chunking: the median of ``--rounds`` rounds run in alternating order, the chunked/one-forward time
ratio, the prefill's rows × columns, and whether both produced the same token.

    python benchmarks/bench_prefill.py --concurrency 1,4,16 --output benchmarks/results/bench_prefill.json
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
from dspark.benchmarking import across_categories, write_json
from dspark.loop import PREFILL_CHUNK_TOKENS
from dspark.pretrained import encode_chat
from dspark.training.data import eval_prompts

ROOT = Path(__file__).resolve().parents[1]


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "bench_prefill.json")
    args = parser.parse_args(argv)
    args.concurrency = [int(value) for value in args.concurrency.split(",")]
    if min(args.concurrency) < 1 or args.rounds < 1:
        parser.error(f"--concurrency must be ints >= 1 and --rounds >= 1, got {args.concurrency} and {args.rounds}")
    return args


def timed_generate(model: dspark.SpeculativeModel, batch: dict, prefill_chunk_tokens: int) -> tuple[float, torch.Tensor]:
    """(seconds, sequences) of a one-token generation of ``batch``."""
    started = time.perf_counter()
    result = model.generate(**batch, max_new_tokens=1, do_sample=False, prefill_chunk_tokens=prefill_chunk_tokens)
    return time.perf_counter() - started, result.sequences


def main(argv: list[str] | None = None) -> dict:
    args = _parse_args(argv)
    transformers_logging.disable_progress_bar()
    bundle = pretrained.load()
    messages = [prompt.message for prompt in across_categories(eval_prompts(args.data_dir, spec_per_category=max(1, -(-max(args.concurrency) // 13))))]
    models = {
        "plain": dspark.SpeculativeModel(bundle.target, strategies.autoregressive(bundle.drafter)),
        "mtp1_features": dspark.SpeculativeModel(bundle.target, strategies.mtp1(bundle.drafter)),
    }
    report = {"command": shlex.join([sys.executable, *sys.argv]), "settings": {**vars(args), "output": str(args.output)},
              "prefill_chunk_tokens": PREFILL_CHUNK_TOKENS, "results": {}}
    with tqdm(total=len(args.concurrency) * len(models) * 2 * args.rounds, desc="prefills", unit="run") as bar:
        for c in args.concurrency:
            batch = encode_chat(bundle.tokenizer, messages[:c])
            rows, columns = batch["input_ids"].shape
            one_forward = rows * columns
            for name, model in models.items():
                model.generate(**encode_chat(bundle.tokenizer, messages[:1]), max_new_tokens=1)  # warm the weights
                seconds = {"one_forward": [], "chunked": []}
                outputs = {}
                for round_index in range(args.rounds):
                    order = ("one_forward", "chunked") if round_index % 2 == 0 else ("chunked", "one_forward")
                    for chunking in order:
                        elapsed, outputs[chunking] = timed_generate(model, batch, one_forward if chunking == "one_forward" else PREFILL_CHUNK_TOKENS)
                        seconds[chunking].append(elapsed)
                        bar.update()
                entry = {chunking: statistics.median(times) for chunking, times in seconds.items()}
                entry.update(rounds=seconds, rows=rows, columns=columns, real_tokens=int(batch["attention_mask"].sum()),
                             chunk_columns=max(1, PREFILL_CHUNK_TOKENS // rows),
                             chunked_vs_one_forward=entry["chunked"] / entry["one_forward"],
                             same_tokens=bool(torch.equal(outputs["chunked"], outputs["one_forward"])))
                report["results"].setdefault(str(c), {})[name] = entry
                tqdm.write(f"c={c} {name}: one forward {entry['one_forward']:.2f} s, chunked {entry['chunked']:.2f} s "
                           f"({entry['chunked_vs_one_forward']:.2f}x), same tokens {entry['same_tokens']}")
                write_json(args.output, {**report, "complete": False})
    report["complete"] = True
    write_json(args.output, report)
    print(f"wrote {args.output}")
    return report


if __name__ == "__main__":
    main()
