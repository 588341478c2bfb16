"""What the target's one-token step costs in a ragged cache of HF's concatenating layers against growing ones.

``transformers``' ``DynamicLayer.update`` concatenates the new keys and values onto the whole cached layer, so
every forward copies the entire cache; ``dspark.kv.GrowingLayer`` writes them into spare slots instead. For each
concurrency c, the batch ``bench_load.py`` runs first (c Spec-Bench first turns, padded to the longest) is
prefilled into a ``RaggedCache`` of each layer class, then decoded greedily one token per row per forward, as
dspark's loop runs plain decoding (2-D mask, explicit positions, logits of the last position, on the fast path
``wrap`` uses). Reported per c and layer class: the median step over ``--steps`` steps, best of ``--rounds``
rounds run in alternating order, the growing/concatenating ratio, and whether both produced the same tokens
(they must: the cached values are the same).

    python benchmarks/bench_cache_layers.py --concurrency 1,4,16,32 --output benchmarks/results/bench_cache_layers.json
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
from transformers.cache_utils import DynamicLayer
from transformers.utils import logging as transformers_logging

from dspark import pretrained
from dspark.benchmarking import across_categories, write_json
from dspark.fast_path import FastPath
from dspark.kv import GrowingLayer, RaggedCache
from dspark.pretrained import encode_chat
from dspark.training.data import eval_prompts

ROOT = Path(__file__).resolve().parents[1]
LAYER_CLASSES = {"concatenating": DynamicLayer, "growing": GrowingLayer}


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,4,16,32")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "bench_cache_layers.json")
    args = parser.parse_args(argv)
    args.concurrency = [int(value) for value in args.concurrency.split(",")]
    if min(args.concurrency) < 1 or args.steps < 2 or args.rounds < 1:
        parser.error(f"--concurrency must be ints >= 1, --steps >= 2 and --rounds >= 1, got {args.concurrency}, {args.steps}, {args.rounds}")
    return args


def decode(target, fast_path: FastPath, batch: dict, layer_class: type, steps: int) -> tuple[list[float], torch.Tensor]:
    """(seconds of each one-token step, the greedy tokens [R, steps]) after prefilling ``batch`` into a ragged cache."""
    mask = batch["attention_mask"]
    cache = RaggedCache(mask.shape[0], mask.device, hole_budget=1, layer_class=layer_class)
    seconds, tokens = [], []
    with torch.inference_mode(), fast_path.active():
        logits = target(batch["input_ids"], **cache.forward_inputs(mask), logits_to_keep=1).logits[:, -1]
        cache.commit(mask)
        for _ in range(steps):
            tokens.append(logits.argmax(dim=-1))
            one = torch.ones((mask.shape[0], 1), dtype=torch.long, device=mask.device)
            started = time.perf_counter()
            logits = target(tokens[-1][:, None], **cache.forward_inputs(one), logits_to_keep=1).logits[:, -1]
            cache.commit(one)
            seconds.append(time.perf_counter() - started)
    return seconds, torch.stack(tokens, dim=1)


def main(argv: list[str] | None = None) -> dict:
    args = _parse_args(argv)
    transformers_logging.disable_progress_bar()
    bundle = pretrained.load()
    target = bundle.target
    fast_path = FastPath.shared(target)
    prompts = across_categories(eval_prompts(args.data_dir, spec_per_category=max(1, -(-max(args.concurrency) // 13))))
    report = {"command": shlex.join([sys.executable, *sys.argv]), "settings": {**vars(args), "output": str(args.output)}, "results": {}}
    for c in tqdm(args.concurrency, desc="batches", unit="batch"):
        batch = encode_chat(bundle.tokenizer, [prompt.message for prompt in prompts[:c]])
        decode(target, fast_path, batch, GrowingLayer, 2)  # the batch shape's one-off set-up
        medians, outputs = {name: [] for name in LAYER_CLASSES}, {}
        for round_index in range(args.rounds):
            names = list(LAYER_CLASSES) if round_index % 2 == 0 else list(reversed(LAYER_CLASSES))
            for name in names:
                seconds, tokens = decode(target, fast_path, batch, LAYER_CLASSES[name], args.steps)
                medians[name].append(statistics.median(seconds))
                outputs[name] = tokens
        step = {name: min(values) for name, values in medians.items()}
        report["results"][str(c)] = {
            "prompt_length": batch["input_ids"].shape[1],
            "step_seconds": step,
            "growing_over_concatenating": step["growing"] / step["concatenating"],
            "same_tokens": bool(torch.equal(outputs["growing"], outputs["concatenating"])),
        }
        tqdm.write(f"c={c} (prompt {batch['input_ids'].shape[1]}): concatenating {1e3 * step['concatenating']:.1f} ms, "
                   f"growing {1e3 * step['growing']:.1f} ms ({step['growing'] / step['concatenating']:.2f}x), "
                   f"same tokens {report['results'][str(c)]['same_tokens']}")
        write_json(args.output, report)
    return report


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
