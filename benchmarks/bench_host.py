"""Host time per step of the DSpark preset's deciding parts on SmolLM2: what a step spends outside the target's
forward and the drafter's pass on the row fallback's choice and bookkeeping, the estimator's survival, the
scheduler and the cost model's observations, against the step itself.

Two measurements in one run:

* **Generation.** The DSpark preset (shipped drafter, its calibrated estimator, the cost model ``wrap`` profiles
  on this machine) generates ``--max-new-tokens`` tokens for each of the first ``--prompts`` Spec-Bench prompts, in
  static batches of each ``--rows``, greedy, after an untimed warm-up. Every call of each part is timed: the mean
  per call, the mean per step (a part that does not run on a step, such as the scheduler where nothing was drafted,
  adds nothing to it) and its share of the mean decoding step (the step records' own times, which include it).
* **Replay.** The row fallback alone (``GoodputFallbackRun.draft_rows`` then ``observe``) on the same cost model, at
  ``--replay-rows`` rows, over seeded synthetic outcomes (each generation a drafter quality drawn uniformly, each
  verified token accepted with that chance): a figure that repeats from run to run, whatever the generations drafted,
  with a digest of every answer it gave, so that two versions of the fallback can be shown to decide alike.

    python benchmarks/bench_host.py --output benchmarks/results/bench_host.json
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import hashlib
import random
import subprocess
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm
from transformers.utils import logging as transformers_logging

import dspark
from dspark import pretrained, strategies
from dspark.benchmarking import across_categories, write_json
from dspark.pretrained import encode_chat
from dspark.protocols import COST_MODEL_HOOKS, hook
from dspark.stats import StepRecord
from dspark.training.data import eval_prompts
from dspark.types import GenerationStart, SamplingConfig
from dspark.verify import HardwareAwareScheduler, calibrated_estimator
from dspark.verify.fallback import GoodputFallback, GoodputFallbackRun

RESULTS = Path(__file__).resolve().parent / "results"


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1,2", help="batch sizes of the generations, comma-separated")
    parser.add_argument("--prompts", type=int, default=8, help="Spec-Bench prompts generated at each batch size")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--replay-rows", default="1,2,4,8,16,32", help="batch sizes of the fallback's replay")
    parser.add_argument("--replay-generations", type=int, default=60)
    parser.add_argument("--data-dir", default=None, help="the prompt-data folder holding eval/ (default: dspark.training.default_data_dir())")
    parser.add_argument("--output", type=Path, default=RESULTS / "bench_host.json")
    args = parser.parse_args(argv)
    args.rows, args.replay_rows = ([int(value) for value in text.split(",")] for text in (args.rows, args.replay_rows))
    if min(args.rows + args.replay_rows) < 1 or args.prompts < 1 or args.replay_generations < 1:
        parser.error(f"--rows, --replay-rows, --prompts and --replay-generations must be >= 1, got {vars(args)}")
    return args


@contextlib.contextmanager
def _timed_methods(parts: dict[str, tuple[type, str]], seconds: dict[str, list[float]]):
    """Within the block, every call of each ``parts`` label's (class, method) appends its wall seconds to ``seconds``."""
    originals = {label: getattr(owner, name) for label, (owner, name) in parts.items()}

    def timing(label, method):
        @functools.wraps(method)
        def timed(*arguments, **keywords):
            started = time.perf_counter()
            try:
                return method(*arguments, **keywords)
            finally:
                seconds[label].append(time.perf_counter() - started)
        return timed

    for label, (owner, name) in parts.items():
        setattr(owner, name, timing(label, originals[label]))
    try:
        yield
    finally:
        for label, (owner, name) in parts.items():
            setattr(owner, name, originals[label])


def _generation(bundle, strategy, batches: list, max_new_tokens: int, bar) -> dict:
    """Each part's calls, mean ms per call and per step, and share of the mean decoding step over ``batches``."""
    model = dspark.SpeculativeModel(bundle.target, strategy)
    for batch in batches:
        model.generate(**batch, max_new_tokens=4)  # one-off set-up of each shape, the cost table's included
    parts = {
        "fallback choice (draft_rows)": (GoodputFallbackRun, "draft_rows"),
        "fallback observe": (GoodputFallbackRun, "observe"),
        "estimator survival": (type(strategy.confidence), "survival"),
        "scheduler lengths": (HardwareAwareScheduler, "lengths"),
        "cost model observe_step": (type(strategy.cost_model), "observe_step"),
        "cost model observe_draft": (type(strategy.cost_model), "observe_draft"),
        "drafter propose (not host work)": (type(strategy.drafter), "propose"),
    }
    seconds, steps, decoding, drafted = collections.defaultdict(list), 0, 0.0, 0
    with _timed_methods(parts, seconds):
        for batch in batches:
            result = model.generate(**batch, max_new_tokens=max_new_tokens)
            steps += len(result.stats.records)
            decoding += sum(record.draft_seconds + record.verify_seconds for record in result.stats.records)
            drafted += sum(bool(record.drafted.gt(0).any()) for record in result.stats.records)
            bar.update(1)
    step_ms = 1000 * decoding / steps
    report = {"steps": steps, "drafted_steps": drafted, "step_ms": step_ms, "parts": {}}
    for label in parts:
        total_ms = 1000 * sum(seconds[label])
        report["parts"][label] = {
            "calls": len(seconds[label]), "ms_per_call": total_ms / max(len(seconds[label]), 1), "ms_per_step": total_ms / steps,
            "share_of_step": total_ms / steps / step_ms,
        }
    host = [entry["ms_per_step"] for label, entry in report["parts"].items() if "not host" not in label]
    report["host_ms_per_step"], report["host_share_of_step"] = sum(host), sum(host) / step_ms
    return report


def _replay(cost_model, rows: int, gamma: int, generations: int) -> dict:
    """The fallback's draft_rows and observe on seeded synthetic outcomes at ``rows`` rows (module docstring)."""
    fallback, rng, answers = GoodputFallback(), random.Random(0), []
    cost_start = hook(cost_model, "start", COST_MODEL_HOOKS)
    choose_seconds = observe_seconds = 0.0
    steps = drafted_steps = 0
    for _ in range(generations):
        generation = GenerationStart(rows=rows, device=torch.device("cpu"), max_draft_tokens=gamma, max_length=300,
                                     sampling=SamplingConfig(), prompt_length=100)
        if cost_start is not None:
            cost_start(generation)  # as the loop does: the cost model may switch to a table of this generation's shape
        run = fallback.start(generation, cost_model)
        if not run.drafts:
            answers.append(None)
            continue
        quality, batch_rows = rng.random() * 0.8, torch.arange(rows)
        for step in range(64):
            started = time.perf_counter()
            depths = run.draft_rows(batch_rows)
            choose_seconds += time.perf_counter() - started
            answers.append(depths.tolist())
            drafted = depths > 0
            verify_lengths = depths.clamp_max(2)
            accepted = torch.tensor([sum(rng.random() < quality for _ in range(length)) for length in verify_lengths.tolist()])
            survival = torch.rand(rows, gamma, generator=torch.Generator().manual_seed(step)) * drafted[:, None]
            record = StepRecord(rows=batch_rows, verify_lengths=verify_lengths, accepted=accepted, emitted=accepted + 1, drafted=depths,
                                survival=survival, draft_seconds=0.003 if bool(drafted.any()) else 0.0005, verify_seconds=0.025,
                                cache_slots=0, drafted_for=drafted)
            started = time.perf_counter()
            run.observe(record)
            observe_seconds += time.perf_counter() - started
            steps, drafted_steps = steps + 1, drafted_steps + int(bool(drafted.any()))
    return {
        "steps": steps, "drafted_steps": drafted_steps, "draft_rows_ms": 1000 * choose_seconds / max(steps, 1),
        "observe_ms": 1000 * observe_seconds / max(steps, 1), "answers_md5": hashlib.md5(repr(answers).encode()).hexdigest(),
    }


def _plot(report: dict, output: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    settings = list(report["generation"])
    labels = [label for label in report["generation"][settings[0]]["parts"] if "not host" not in label]
    for offset, rows in enumerate(settings):
        values = [report["generation"][rows]["parts"][label]["ms_per_step"] for label in labels]
        axes[0].barh([index + 0.4 * offset for index in range(len(labels))], values, height=0.4, label=f"{rows} row(s)")
    axes[0].set(yticks=range(len(labels)), yticklabels=labels, xlabel="ms per step", title="DSpark preset: host work per step")
    axes[0].legend(fontsize=8)
    replay = report["replay"]
    sizes = [int(rows) for rows in replay]
    axes[1].plot(sizes, [replay[str(rows)]["draft_rows_ms"] for rows in sizes], marker="o", label="draft_rows")
    axes[1].plot(sizes, [replay[str(rows)]["observe_ms"] for rows in sizes], marker="o", label="observe")
    axes[1].set(xscale="log", xticks=sizes, xlabel="rows", ylabel="ms per step", title="Row fallback alone (replay)")
    axes[1].set_xticklabels([str(rows) for rows in sizes])
    axes[1].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(output.with_suffix(".png"), dpi=110)
    plt.close(figure)


def _code() -> str:
    """The git commit of the imported dspark's checkout, with '+changes' when it differs from it."""
    folder = Path(dspark.__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(folder), "status", "--porcelain", "--", "."], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        return f"unknown ({error})"
    return commit + ("+changes" if dirty.strip() else "")


def main(argv: list[str] | None = None) -> dict:
    args = _parse_args(argv)
    transformers_logging.disable_progress_bar()
    bundle = pretrained.load()
    drafter, gamma = bundle.drafter, bundle.drafter.max_draft_tokens
    cost_model = dspark.profiled_cost_model(bundle.target, drafter, gamma)
    messages = [prompt.message for prompt in across_categories(eval_prompts(args.data_dir, spec_per_category=max(1, -(-args.prompts // 13))))]
    report = {"command": " ".join([sys.executable, *sys.argv]), "code": _code(), "machine": dspark.fast_path._machine_fingerprint(),
              "settings": {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()},
              "generation": {}, "replay": {}}
    batches_at = {rows: [encode_chat(bundle.tokenizer, messages[start : start + rows]) for start in range(0, args.prompts, rows)] for rows in args.rows}
    with tqdm(total=sum(len(batches) for batches in batches_at.values()) + len(args.replay_rows), desc="host time", unit="run") as bar:
        for rows, batches in batches_at.items():
            strategy = strategies.dspark(drafter, gamma, dspark.profiled_cost_model(bundle.target, drafter, gamma), calibrated_estimator(drafter.calibration))
            report["generation"][str(rows)] = entry = _generation(bundle, strategy, batches, args.max_new_tokens, bar)
            tqdm.write(f"{rows} row(s): step {entry['step_ms']:.2f} ms, host {entry['host_ms_per_step']:.3f} ms ({100 * entry['host_share_of_step']:.1f}%)")
        for rows in args.replay_rows:
            report["replay"][str(rows)] = entry = _replay(cost_model, rows, gamma, args.replay_generations)
            tqdm.write(f"replay {rows} row(s): draft_rows {entry['draft_rows_ms']:.3f} ms, observe {entry['observe_ms']:.3f} ms a step")
            bar.update(1)
    write_json(args.output, report)
    _plot(report, args.output)
    print(f"wrote {args.output}")
    return report


if __name__ == "__main__":
    main()
