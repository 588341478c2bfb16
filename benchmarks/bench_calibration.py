"""How well calibrated are the survival estimates, on prompts held out from fitting (paper §3.2.1, Figure 6)?

For each drafter and its estimators, on first turns of Spec-Bench (``--per-category`` per category,
eval/ prompts, which no calibration ever fits on), greedy and at temperature 1, every drafted
position verified (``FixedLength(γ)``):

* per draft position k, the ECE of prefix survival a_k (blocks where its outcome is known), the ECE
  of conditional survival c_k on reached positions (per position, and pooled over them), Brier score,
  ROC-AUC and sample counts;
* each of these raw, calibrated by Sequential Temperature Scaling and by isotonic maps, both fitted
  on the blocks ``dspark calibrate`` fitted on (the calibration split), and with what ships;
* reliability diagrams (PNG) of a_k, raw against shipped, with the sample count per bin;
* whether the issue's targets hold: a_k ECE ≤ 0.02 at every position with at least ``MIN_COUNT``
  blocks, pooled c_k ECE ≤ 0.03, pooled ROC-AUC ≥ 0.75.

Estimators: everything the drafter's ``calibration.json`` calibrated — for the shipped drafter the
logistic model of its signals (the default), its learned head (``DrafterConfidence``) and its draft
probability (``DraftProbability``); for prompt lookup (``--lookup-calibration``, the ``--output`` of
``dspark calibrate --drafter prompt-lookup``) the logistic model of its signals. Needs the logs of
those ``dspark calibrate`` runs in the dspark cache; its own logs are cached there too, so a rerun
only reports.

    dspark calibrate --prompts 96 --method isotonic
    dspark calibrate --drafter prompt-lookup --prompts 96 --method isotonic --output benchmarks/results/calibration_prompt_lookup
    python benchmarks/bench_calibration.py --per-category 5 --lookup-calibration benchmarks/results/calibration_prompt_lookup
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import torch
from tqdm import tqdm
from transformers.utils import logging as transformers_logging

from dspark import pretrained
from dspark.benchmarking import write_json
from dspark.drafters import PromptLookupDrafter
from dspark.training.calibrate import CollectConfig, calibration_report, collect_logs, plot_reliability, raw_estimators, run_logs
from dspark.training.data import eval_prompts
from dspark.types import Draft
from dspark.verify.calibration import Calibration, CalibrationFile, CalibrationLog, file_fingerprint
from dspark.verify.estimators import LogisticConfidence

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
TARGETS = {"prefix_ece": 0.02, "conditional_ece": 0.03, "roc_auc": 0.75}
METHODS = ("temperature", "isotonic")
MIN_COUNT = 100  # positions scored alone need this many blocks; deeper ones count in the pooled c_k


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-category", type=int, default=8, help="Spec-Bench first turns per category")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--bands", default="greedy,high")
    parser.add_argument("--lookup-calibration", default=None, help="the --output folder of `dspark calibrate --drafter prompt-lookup` (skip prompt lookup without it)")
    parser.add_argument("--data-dir", default=None, help="the prompt-data folder holding eval/ (default: dspark.training.default_data_dir())")
    parser.add_argument("--output", type=Path, default=RESULTS / "bench_calibration.json")
    return parser.parse_args(argv)


def _summary(positions: dict) -> dict:
    """The worst position of each metric (positions with at least ``MIN_COUNT`` samples), the pooled c_k
    metrics, and whether the issue's targets hold."""
    prefix = [p for p in positions["prefix"] if p["count"] >= MIN_COUNT]
    pooled = positions["conditional_pooled"]
    summary = {
        "max_prefix_ece": max(p["ece"] for p in prefix),
        "conditional_ece": pooled["ece"],
        "conditional_roc_auc": pooled["roc_auc"],
        "conditional_brier": pooled["brier"],
    }
    summary["targets_met"] = {
        "prefix_ece": summary["max_prefix_ece"] <= TARGETS["prefix_ece"],
        "conditional_ece": summary["conditional_ece"] <= TARGETS["conditional_ece"],
        "roc_auc": summary["conditional_roc_auc"] >= TARGETS["roc_auc"],
    }
    return summary


def _rescored(estimator, signals, log: CalibrationLog) -> CalibrationLog:
    """``log`` with survival recomputed by a fitted ``estimator`` from the logged signals."""
    draft = Draft(tokens=torch.zeros(signals.shape[:2], dtype=torch.long), lengths=log.drafted, signals=signals)
    return CalibrationLog(estimator.survival(draft), log.verified, log.accepted, log.drafted)


def _logs_of(run, name: str, calibration_file) -> dict:
    logs = {band: run.logs[band][name] for band in run.logs}
    if name in calibration_file.estimators:  # a model fitted from the signals: rescore them with it
        fitted = LogisticConfidence.from_dict(calibration_file.estimators[name])
        logs = {band: _rescored(fitted, run.signals[band], log) for band, log in logs.items()}
    return logs


def _evaluate(bundle, label, drafter, calibration_file, calibration_logs, messages, args, work_dir, bar) -> dict:
    """Eval logs for ``drafter``; per estimator and band: raw, each method fitted on the calibration
    logs (``calibration_logs``, the prompts ``dspark calibrate`` fitted on), and what ships."""
    config = CollectConfig(prompts=len(messages), max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, bands=tuple(args.bands.split(",")))
    estimators = raw_estimators(drafter)
    entries = collect_logs(
        bundle.target, bundle.tokenizer, drafter, estimators, messages,
        work_dir / f"logs-eval-spec{args.per_category}-t{args.max_new_tokens}-b{args.batch_size}.jsonl", config, progress=bar.update,
    )
    run = run_logs(entries, list(estimators))
    results = {}
    for name in calibration_file.sets:
        logs, fit_logs = _logs_of(run, name, calibration_file), _logs_of(calibration_logs, name, calibration_file)
        per_band = {}
        for band, log in logs.items():
            versions = {"raw": calibration_report(log)["raw"]}
            for method in METHODS:
                versions[method] = calibration_report(log, Calibration.fit(fit_logs[band], method))["calibrated"]
            versions["shipped"] = calibration_report(log, calibration_file.sets[name].for_band(band))["calibrated"]
            per_band[band] = {"blocks": log.blocks, "summary": {version: _summary(report) for version, report in versions.items()}, "positions": versions}
            line = ", ".join(f"{version} a_k {entry['max_prefix_ece']:.3f} c_k {entry['conditional_ece']:.3f} AUC {entry['conditional_roc_auc']:.3f}"
                             for version, entry in per_band[band]["summary"].items())
            tqdm.write(f"{label} {name} {band}: {line}")
        shipped = {band: calibration_file.sets[name].for_band(band) for band in logs}
        plot = plot_reliability(logs, shipped, args.output.with_name(f"bench_calibration_{label}_{name}.png"), f"{label} {name}")
        results[name] = {"bands": per_band, "plot": str(plot.relative_to(ROOT) if plot.is_relative_to(ROOT) else plot)}
    return results


def _calibration_logs(work_dir: Path, calibration_file, names) -> object:
    """The blocks ``dspark calibrate`` fitted ``calibration_file`` on (its log's first batches)."""
    entries = {}
    for line in (work_dir / "logs.jsonl").read_text().splitlines():
        entry = json.loads(line)
        entries[(entry["band"], entry["batch"])] = entry
    batches = calibration_file.fitted_on["prompts"] // calibration_file.fitted_on["batch_size"]
    return run_logs(entries, names, range(batches))


def main(argv: list[str] | None = None) -> dict:
    args = _parse_args(argv)
    transformers_logging.disable_progress_bar()
    messages = [prompt.message for prompt in eval_prompts(args.data_dir, spec_per_category=args.per_category)]
    bundle = pretrained.load()
    directory = pretrained.shipped_drafter("smollm2-135m-instruct")
    fingerprint = file_fingerprint(directory / "model.safetensors")
    cache = pretrained.default_cache_dir() / "calibrate" / "smollm2-135m-instruct"
    runs = [("shipped", bundle.drafter, CalibrationFile.load(directory, fingerprint), cache / fingerprint)]
    if args.lookup_calibration:
        runs.append(("prompt_lookup", PromptLookupDrafter(), CalibrationFile.load(args.lookup_calibration), cache / pretrained.PROMPT_LOOKUP))
    report = {"command": shlex.join([sys.executable, *sys.argv]), "settings": {**vars(args), "output": str(args.output)}, "prompts": len(messages),
              "targets": TARGETS, "min_count": MIN_COUNT, "drafters": {}}
    with tqdm(total=len(messages) * len(args.bands.split(",")) * len(runs), desc="evaluation runs", unit="prompt", mininterval=30) as bar:
        for label, drafter, calibration_file, work_dir in runs:
            if calibration_file is None:
                raise SystemExit(f"no calibration.json for {label}: run dspark calibrate first")
            fit_logs = _calibration_logs(work_dir, calibration_file, list(raw_estimators(drafter)))
            report["drafters"][label] = {
                "calibration": calibration_file.fitted_on,
                "estimators": _evaluate(bundle, label, drafter, calibration_file, fit_logs, messages, args, work_dir, bar),
            }
    write_json(args.output, report)
    print(f"wrote {args.output}")
    return report


if __name__ == "__main__":
    main()
