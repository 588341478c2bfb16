"""How well calibrated are the survival estimates, on prompts held out from fitting (paper §3.2.1, Figure 6)?

For each drafter and its estimators, on first turns of Spec-Bench (``--per-category`` per category,
eval/ prompts, which no calibration ever fits on), greedy and at temperature 1, every drafted
position verified (``FixedLength(γ)``):

* per draft position k, the ECE of prefix survival a_k (blocks where its outcome is known), the ECE
  of conditional survival c_k on reached positions, Brier score, ROC-AUC and sample counts, raw and
  calibrated with the calibration ``dspark calibrate`` fitted on the calibration split;
* reliability diagrams (PNG) of a_k, raw against calibrated, with the sample count per bin;
* whether the issue's targets hold: a_k ECE ≤ 0.02 at every position, c_k ECE ≤ 0.03, ROC-AUC ≥ 0.75.

Estimators: the shipped drafter's learned head (``DrafterConfidence``) and its draft probability
(``DraftProbability``), each with the calibration in the drafter's ``calibration.json``; prompt
lookup with the logistic model on its signals fitted by ``dspark calibrate --drafter prompt-lookup
--output DIR`` (``--lookup-calibration DIR``). Logs are cached under the dspark cache, so a rerun
only reports.

    python benchmarks/bench_calibration.py --lookup-calibration benchmarks/results/calibration_prompt_lookup
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from tqdm import tqdm
from transformers.utils import logging as transformers_logging

from dspark import pretrained
from dspark.benchmarking import write_json
from dspark.drafters import PromptLookupDrafter
from dspark.training.calibrate import CollectConfig, calibration_report, collect_logs, plot_reliability, raw_estimators, run_logs
from dspark.training.data import eval_prompts
from dspark.verify.calibration import CalibrationFile, CalibrationLog, file_fingerprint
from dspark.verify.estimators import LogisticConfidence

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
TARGETS = {"prefix_ece": 0.02, "conditional_ece": 0.03, "roc_auc": 0.75}


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


def _summary(report: dict) -> dict:
    """The worst position of each metric, raw and calibrated, and whether the targets hold."""
    summary = {}
    for version, kinds in report.items():
        prefix = [p for p in kinds["prefix"] if p["count"]]
        conditional = [p for p in kinds["conditional"] if p["count"]]
        summary[version] = {
            "max_prefix_ece": max(p["ece"] for p in prefix),
            "max_conditional_ece": max(p["ece"] for p in conditional),
            "min_roc_auc": min(p["roc_auc"] for p in conditional if p["roc_auc"] == p["roc_auc"]),
        }
    calibrated = summary.get("calibrated", summary["raw"])
    summary["targets_met"] = {
        "prefix_ece": calibrated["max_prefix_ece"] <= TARGETS["prefix_ece"],
        "conditional_ece": calibrated["max_conditional_ece"] <= TARGETS["conditional_ece"],
        "roc_auc": calibrated["min_roc_auc"] >= TARGETS["roc_auc"],
    }
    return summary


def _evaluate(bundle_drafter, name_of_drafter, estimators, calibration_file, messages, args, work_dir, bar) -> dict:
    config = CollectConfig(prompts=len(messages), max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, bands=tuple(args.bands.split(",")))
    entries = collect_logs(
        bundle_drafter[0].target, bundle_drafter[0].tokenizer, bundle_drafter[1], estimators, messages,
        work_dir / f"logs-eval-spec{args.per_category}-t{args.max_new_tokens}-b{args.batch_size}.jsonl", config, progress=bar.update,
    )
    run = run_logs(entries, list(estimators))
    results = {}
    for name in estimators:
        logs = {band: run.logs[band][name] for band in run.logs}
        if name == "LogisticConfidence":  # rescore the logged signals with the fitted model
            fitted = LogisticConfidence.from_dict(calibration_file.estimators[name])
            logs = {band: _rescored(fitted, run.signals[band], log) for band, log in logs.items()}
        calibrations = calibration_file.sets[name] if calibration_file is not None and name in calibration_file.sets else None
        per_band = {}
        for band, log in logs.items():
            calibration = None if calibrations is None else calibrations.for_band(band)
            report = calibration_report(log, calibration)
            per_band[band] = {"blocks": log.blocks, "summary": _summary(report), "positions": report}
        plot = plot_reliability(logs, {band: None if calibrations is None else calibrations.for_band(band) for band in logs},
                                args.output.with_name(f"bench_calibration_{name_of_drafter}_{name}.png"), f"{name_of_drafter} {name}")
        results[name] = {"bands": per_band, "plot": str(plot.relative_to(ROOT) if plot.is_relative_to(ROOT) else plot)}
        for band, entry in per_band.items():
            raw, calibrated = entry["summary"]["raw"], entry["summary"].get("calibrated", {})
            tqdm.write(
                f"{name_of_drafter:14s} {name:18s} {band:6s} a_k ECE max {raw['max_prefix_ece']:.3f} -> {calibrated.get('max_prefix_ece', float('nan')):.3f}, "
                f"c_k ECE max {raw['max_conditional_ece']:.3f} -> {calibrated.get('max_conditional_ece', float('nan')):.3f}, AUC min {raw['min_roc_auc']:.3f}"
            )
    return results


def _rescored(estimator, signals, log: CalibrationLog) -> CalibrationLog:
    import torch

    from dspark.types import Draft

    draft = Draft(tokens=torch.zeros(signals.shape[:2], dtype=torch.long), lengths=log.drafted, signals=signals)
    return CalibrationLog(estimator.survival(draft), log.verified, log.accepted, log.drafted)


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
              "targets": TARGETS, "drafters": {}}
    with tqdm(total=len(messages) * len(args.bands.split(",")) * len(runs), desc="evaluation runs", unit="prompt", mininterval=30) as bar:
        for name, drafter, calibration_file, work_dir in runs:
            report["drafters"][name] = _evaluate((bundle, drafter), name, raw_estimators(drafter), calibration_file, messages, args, work_dir, bar)
    write_json(args.output, report)
    print(f"wrote {args.output}")
    return report


if __name__ == "__main__":
    main()
