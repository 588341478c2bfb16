"""Greedy throughput of SmolLM2 on Spec-Bench: Hugging Face generate and prompt lookup against dspark.

Batch 1, interleaved per prompt so drift in machine load hits every method alike:
  hf_generate                  plain ``model.generate``
  hf_prompt_lookup             ``model.generate(prompt_lookup_num_tokens=10)``
  dspark_autoregressive        dspark's loop with nothing drafted (FixedLength(0))
  dspark_prompt_lookup         dspark with ``PromptLookupDrafter`` at its default γ
  dspark_prompt_lookup_g{γ}    the same for every γ of ``--gammas`` (other than the default)
Then a batch section: ``--batch`` prompts left-padded, dspark prompt lookup against HF batched
``generate`` (HF refuses assisted generation at batch > 1).

Every dspark output is checked token for token against ``hf_generate``. The verify cost ratio is
the median target-forward time of steps verifying k draft tokens over that of a one-token step.

    python benchmarks/bench_batch1.py --quick            # 1 prompt per category, 32 tokens
    python benchmarks/bench_batch1.py --gammas 2,4,6,10
"""

from __future__ import annotations

import argparse
import collections
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers
from tqdm import tqdm
from transformers.utils import logging as transformers_logging

import dspark
from dspark import pretrained
from dspark.benchmarking import first_difference, generated_tokens, write_json
from dspark.drafters import PromptLookupDrafter
from dspark.pretrained import encode_chat
from dspark.training.data import spec_bench_questions

__all__ = ["main"]

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
BASELINE = "hf_generate"
HF_LOOKUP_TOKENS = 10


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=None, help="the prompt-data folder holding eval/ (default: dspark.training.default_data_dir())")
    parser.add_argument("--output", type=Path, default=None, help="default: benchmarks/results/bench_batch1[_quick].json")
    parser.add_argument("--per-category", type=int, default=2, help="prompts per Spec-Bench category (first turn)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--gammas", default="", help="comma-separated γ sweep for dspark prompt lookup, e.g. 2,4,6,10")
    parser.add_argument("--batch", type=int, default=8, help="rows of the batch section (0 skips it)")
    parser.add_argument("--quick", action="store_true", help="smoke test: 1 prompt per category, 32 new tokens")
    args = parser.parse_args(argv)
    if args.quick:
        args.per_category, args.max_new_tokens = 1, 32
    if args.output is None:
        # A smoke test must not overwrite the full run's report.
        args.output = RESULTS / ("bench_batch1_quick.json" if args.quick else "bench_batch1.json")
    try:
        args.gammas = sorted({int(value) for value in args.gammas.split(",") if value.strip()})
    except ValueError:
        parser.error(f"--gammas must be comma-separated ints >= 1, got {args.gammas!r}")
    if any(gamma < 1 for gamma in args.gammas):
        parser.error(f"--gammas must be comma-separated ints >= 1, got {args.gammas}")
    if args.per_category < 1 or args.max_new_tokens < 1 or args.batch < 0:
        parser.error("--per-category and --max-new-tokens must be >= 1, --batch >= 0")
    return args


def _encode(tokenizer, questions: list[dict]) -> dict:
    """Chat-templated first turns, left-padded into one batch."""
    return encode_chat(tokenizer, [question["turns"][0] for question in questions])


def _methods(target, gammas: list[int]) -> dict:
    """name -> function(prompt, max_new_tokens) returning (sequences, dspark stats or None)."""

    def hf(**options):
        return lambda prompt, max_new_tokens: (target.generate(**prompt, max_new_tokens=max_new_tokens, do_sample=False, **options), None)

    def speculative(model):
        def run(prompt, max_new_tokens):
            result = model.generate(**prompt, max_new_tokens=max_new_tokens)
            return result.sequences, result.stats

        return run

    default_gamma = PromptLookupDrafter().max_draft_tokens
    methods = {
        BASELINE: hf(),
        "hf_prompt_lookup": hf(prompt_lookup_num_tokens=HF_LOOKUP_TOKENS),
        "dspark_autoregressive": speculative(dspark.SpeculativeModel(target, dspark.strategies.autoregressive(PromptLookupDrafter()))),
        "dspark_prompt_lookup": speculative(dspark.wrap(target, PromptLookupDrafter())),
    }
    for gamma in gammas:
        if gamma != default_gamma:
            methods[f"dspark_prompt_lookup_g{gamma}"] = speculative(dspark.wrap(target, PromptLookupDrafter(), max_draft_tokens=gamma))
    return methods


def _timed(method, prompt, max_new_tokens):
    started = time.perf_counter()
    sequences, stats = method(prompt, max_new_tokens)
    return sequences, stats, time.perf_counter() - started


def _run_batch1(bundle, questions, methods, max_new_tokens):
    """Every method on every question; returns per-prompt results, mismatches and all dspark step records."""
    eos = bundle.target.generation_config.eos_token_id
    per_prompt, mismatches, records = [], [], []
    progress = tqdm(questions, desc="batch 1", unit="prompt")
    for question in progress:
        prompt = _encode(bundle.tokenizer, [question])
        prompt_length = prompt["input_ids"].shape[1]
        outputs, results = {}, {}
        for name, method in methods.items():
            sequences, stats, seconds = _timed(method, prompt, max_new_tokens)
            outputs[name] = generated_tokens(sequences, prompt_length, eos)[0]
            results[name] = {
                "new_tokens": len(outputs[name]),
                "seconds": seconds,
                "tokens_per_s": len(outputs[name]) / seconds,
                "tau": None if stats is None else stats.tau,
                "steps": None if stats is None else stats.steps,
                "draft_seconds": None if stats is None else stats.draft_seconds,
                "verify_seconds": None if stats is None else stats.verify_seconds,
            }
            if stats is not None:
                records.extend(stats.records)
        for name, tokens in outputs.items():
            difference = first_difference(tokens, outputs[BASELINE])
            results[name]["matches_hf"] = difference is None
            if difference is not None:
                mismatches.append({"question_id": question["question_id"], "method": name, "first_difference": difference})
        per_prompt.append(
            {"question_id": question["question_id"], "category": question["category"], "prompt_tokens": prompt_length, "methods": results}
        )
        progress.set_postfix({name.replace("dspark_", "d_"): f"{result['tokens_per_s']:.1f}" for name, result in results.items()})
    return per_prompt, mismatches, records


def _aggregate(entries: list[dict], names) -> dict:
    """Total tokens / total seconds per method, its ratio to HF generate, and τ = tokens / steps for dspark."""
    totals = {}
    for name in names:
        runs = [entry["methods"][name] for entry in entries]
        tokens, seconds = sum(run["new_tokens"] for run in runs), sum(run["seconds"] for run in runs)
        steps = None if runs[0]["steps"] is None else sum(run["steps"] for run in runs)
        totals[name] = {"new_tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds, "tau": None if steps is None else tokens / steps}
        if steps is not None:
            # Drafting (propose, survival, policy) against verifying (the target forward and acceptance), per step.
            draft, verify = (sum(run[key] for run in runs) for key in ("draft_seconds", "verify_seconds"))
            totals[name].update(draft_ms_per_step=1000 * draft / steps, verify_ms_per_step=1000 * verify / steps, draft_over_verify=draft / verify)
    for total in totals.values():
        total["ratio_vs_hf"] = total["tokens_per_s"] / totals[BASELINE]["tokens_per_s"]
    return totals


def _verify_cost(records) -> dict:
    """Median verify seconds per step, grouped by the step's largest verify length, and its ratio to ℓ = 0."""
    by_length = collections.defaultdict(list)
    for record in records:
        by_length[int(record.verify_lengths.max())].append(record.verify_seconds)
    if 0 not in by_length:
        return {}
    one_token = statistics.median(by_length[0])
    return {
        str(length): {"steps": len(times), "median_seconds": statistics.median(times), "ratio_vs_one_token": statistics.median(times) / one_token}
        for length, times in sorted(by_length.items())
    }


def _run_batch(bundle, questions, methods, batch, max_new_tokens):
    """``batch`` questions spread over the categories, left-padded: dspark prompt lookup against HF batched generate."""
    chosen = [questions[index * len(questions) // batch] for index in range(batch)]
    prompt = _encode(bundle.tokenizer, chosen)
    prompt_length = prompt["input_ids"].shape[1]
    eos = bundle.target.generation_config.eos_token_id
    methods = {name: methods[name] for name in (BASELINE, "dspark_prompt_lookup")}
    _warm_up(methods, prompt)
    results, outputs = {}, {}
    for name, method in tqdm(methods.items(), desc=f"batch {batch}", unit="method"):
        sequences, stats, seconds = _timed(method, prompt, max_new_tokens)
        outputs[name] = generated_tokens(sequences, prompt_length, eos)
        tokens = sum(len(row) for row in outputs[name])
        results[name] = {"new_tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}
        if stats is not None:
            results[name].update(tau=stats.tau, steps=stats.steps)
    for result in results.values():
        result["ratio_vs_hf"] = result["tokens_per_s"] / results[BASELINE]["tokens_per_s"]
    mismatched_rows = [row for row, (a, b) in enumerate(zip(outputs["dspark_prompt_lookup"], outputs[BASELINE])) if a != b]
    return {
        "question_ids": [question["question_id"] for question in chosen],
        "padded_prompt_tokens": prompt_length,
        "methods": results,
        "mismatched_rows": mismatched_rows,
    }


def _warm_up(methods, prompt):
    """One short untimed run of every method, so no timed run pays first-call setup."""
    for method in methods.values():
        method(prompt, 8)


def _print_table(report) -> None:
    names = list(report["overall"])
    width = max(len(name) for name in names) + 2
    print(f"\nbatch 1, {report['settings']['prompts']} prompts, {report['settings']['max_new_tokens']} new tokens")
    print(f"{'method':<{width}}{'tok/s':>8}{'vs hf':>8}{'tau':>7}{'draft/verify':>14}")
    for name, total in report["overall"].items():
        tau = "" if total["tau"] is None else f"{total['tau']:.2f}"
        cost = f"{total['draft_over_verify']:.3f}" if "draft_over_verify" in total else ""
        print(f"{name:<{width}}{total['tokens_per_s']:>8.2f}{total['ratio_vs_hf']:>7.2f}x{tau:>7}{cost:>14}")
    print("\nper category, tokens/s:")
    print(f"{'category':<16}" + "".join(f"{name.replace('dspark_', 'd_'):>22}" for name in names))
    for category, totals in report["categories"].items():
        print(f"{category:<16}" + "".join(f"{totals[name]['tokens_per_s']:>22.2f}" for name in names))
    print("\nverify cost (median target forward by max verify length ℓ, vs ℓ = 0):")
    for length, cost in report["verify_cost"].items():
        print(f"  ℓ={length:>2}: {cost['median_seconds'] * 1000:7.1f} ms  {cost['ratio_vs_one_token']:.2f}x  ({cost['steps']} steps)")
    print(f"\ngreedy mismatches vs hf_generate: {len(report['mismatches'])}")
    if report.get("batch"):
        section = report["batch"]
        print(f"\nbatch {len(section['question_ids'])} (left-padded to {section['padded_prompt_tokens']} tokens):")
        for name, result in section["methods"].items():
            print(f"  {name:<{width}}{result['tokens_per_s']:>8.2f} tok/s  {result['ratio_vs_hf']:.2f}x")
        print(f"  mismatched rows: {section['mismatched_rows']}")


def main(argv: list[str] | None = None) -> dict:
    args = _parse_args(argv)
    # Other processes on a small CPU skew every timing; the load average makes that visible in the report.
    load_before = os.getloadavg()
    transformers_logging.disable_progress_bar()
    bundle = pretrained.load()
    bundle.tokenizer.padding_side = "left"
    questions = spec_bench_questions(args.data_dir, args.per_category)
    methods = _methods(bundle.target, args.gammas)
    _warm_up(methods, _encode(bundle.tokenizer, questions[:1]))
    per_prompt, mismatches, records = _run_batch1(bundle, questions, methods, args.max_new_tokens)
    categories = collections.defaultdict(list)
    for entry in per_prompt:
        categories[entry["category"]].append(entry)
    report = {
        "command": shlex.join([sys.executable, *sys.argv]) if argv is None else shlex.join(["bench_batch1.py", *argv]),
        "settings": {
            "model": bundle.name,
            "prompts": len(per_prompt),
            "per_category": args.per_category,
            "max_new_tokens": args.max_new_tokens,
            "default_gamma": PromptLookupDrafter().max_draft_tokens,
            "gammas": args.gammas,
            "hf_prompt_lookup_num_tokens": HF_LOOKUP_TOKENS,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
        },
        "overall": _aggregate(per_prompt, methods),
        "categories": {category: _aggregate(entries, methods) for category, entries in categories.items()},
        "verify_cost": _verify_cost(records),
        "mismatches": mismatches,
        "prompts": per_prompt,
    }
    if args.batch:
        report["batch"] = _run_batch(bundle, questions, methods, args.batch, args.max_new_tokens)
    report["settings"]["load_average_1_5_15min"] = {"start": load_before, "end": os.getloadavg()}
    write_json(args.output, report)
    _print_table(report)
    print(f"\nwrote {args.output}")
    return report


if __name__ == "__main__":
    main()
