"""Calibrating survival estimates from a drafter's own runs (paper §3.2.1); what ``dspark calibrate`` runs.

1. ``collect_logs``: the target and the drafter generate for held-out calibration prompts with every
   drafted position verified (``FixedLength(γ)``), once per sampling band. Every block's raw c_k from
   each estimator, the drafter's signals, ℓ and n are appended batch by batch to a JSONL file, so a
   rerun resumes where it stopped.
2. ``fit_calibrations``: per estimator and band, Sequential Temperature Scaling or isotonic maps
   (``Calibration.fit``), gathered in a ``CalibrationSet`` that is saved beside the drafter.
3. ``calibration_report``: per position, the ECE of prefix survival a_k and of conditional survival
   c_k on reached positions, Brier score and ROC-AUC, raw and calibrated, with sample counts; and
   ``plot_reliability`` draws the reliability diagrams (the paper's Figure 6).

Verifying every position is what makes the logs unbiased: a policy that stops early hides the
outcomes of exactly the positions it thought weak.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs
import torch
from tqdm.auto import tqdm

import dspark
from dspark.checks import int_at_least
from dspark.pretrained import encode_chat
from dspark.protocols import ESTIMATOR_HOOKS, ConfidenceEstimator, Drafter, hook
from dspark.types import Draft, GenerationStart, StepOutcome
from dspark.training.data import training_prompts
from dspark.verify.calibration import (
    BANDS,
    Calibration,
    CalibrationFile,
    CalibrationLog,
    CalibrationSet,
    brier_score,
    conditional_outcomes,
    expected_calibration_error,
    prefix_outcomes,
    reliability_bins,
    roc_auc,
)
from dspark.verify.confidence import DraftProbability, DrafterConfidence
from dspark.verify.estimators import LogisticConfidence
from dspark.verify.policies import FixedLength

__all__ = [
    "BAND_SAMPLING",
    "CalibrationOutcome",
    "CollectConfig",
    "RunLogs",
    "calibrate_drafter",
    "calibration_report",
    "collect_logs",
    "fit_calibrations",
    "plot_reliability",
    "raw_estimators",
    "run_logs",
]

#: The sampling each band is measured at: its typical setting (bands: see ``dspark.verify.calibration.band_of``).
BAND_SAMPLING: dict[str, dict] = {
    "greedy": {"do_sample": False},
    "low": {"do_sample": True, "temperature": 0.7},
    "high": {"do_sample": True, "temperature": 1.0},
}


def _bands(instance, attribute, value) -> None:
    if not value or any(band not in BANDS for band in value):
        raise ValueError(f"bands must be a non-empty tuple of {BANDS}, got {value!r}")


@attrs.frozen
class CollectConfig:
    """How many calibration prompts, how long each answer, how many prompts per batch, which bands."""

    prompts: int = attrs.field(default=96, validator=int_at_least(1))
    max_new_tokens: int = attrs.field(default=128, validator=int_at_least(1))
    batch_size: int = attrs.field(default=8, validator=int_at_least(1))
    bands: tuple[str, ...] = attrs.field(default=("greedy", "low", "high"), converter=tuple, validator=_bands)
    seed: int = 0


@attrs.frozen(eq=False)
class RunLogs:
    """Per band: each estimator's ``CalibrationLog`` (same blocks, different survival) and the drafter's
    signals FloatTensor[N, γ, F] (None when it gives none)."""

    logs: Mapping[str, Mapping[str, CalibrationLog]]
    signals: Mapping[str, torch.Tensor | None]


class _Recorder:
    """A ConfidenceEstimator for the collection run: scores each draft with every estimator and keeps
    the scores and the draft's signals; the loop gets the first estimator's (FixedLength ignores it).
    The lifecycle hooks reach every estimator that declares them."""

    def __init__(self, estimators: Mapping[str, ConfidenceEstimator]):
        self.estimators = dict(estimators)
        self.steps: list[tuple[dict[str, torch.Tensor], torch.Tensor | None]] = []

    def start(self, start: GenerationStart) -> None:
        self._forward("start", start)

    def observe(self, outcome: StepOutcome) -> None:
        self._forward("observe", outcome)

    def _forward(self, name: str, value) -> None:
        for estimator in self.estimators.values():
            method = hook(estimator, name, ESTIMATOR_HOOKS)
            if method is not None:
                method(value)

    def survival(self, draft: Draft) -> torch.Tensor:
        scores = {name: estimator.survival(draft).float() for name, estimator in self.estimators.items()}
        self.steps.append(({name: score.cpu() for name, score in scores.items()}, None if draft.signals is None else draft.signals.float().cpu()))
        return next(iter(scores.values()))


def _batch_blocks(records, recorder: _Recorder) -> dict:
    """One JSON-safe dict of the batch's blocks: counts, each estimator's survival, signals."""
    scored = [record for record in records if record.survival is not None]
    if len(scored) != len(recorder.steps):
        raise ValueError(f"expected one recorded score per scored step, got {len(recorder.steps)} for {len(scored)} steps")
    width = max((record.survival.shape[1] for record in scored), default=0)
    pad = lambda tensor: torch.nn.functional.pad(tensor, (0, width - tensor.shape[1]), value=0.5)  # noqa: E731
    blocks = {
        "verified": torch.cat([r.verify_lengths for r in scored]).tolist() if scored else [],
        "accepted": torch.cat([r.accepted for r in scored]).tolist() if scored else [],
        "drafted": torch.cat([r.drafted for r in scored]).tolist() if scored else [],
        "survival": {name: torch.cat([pad(step[0][name]) for step in recorder.steps]).tolist() if scored else [] for name in recorder.estimators},
    }
    if recorder.steps and recorder.steps[0][1] is not None:
        signals = [torch.nn.functional.pad(step[1], (0, 0, 0, width - step[1].shape[1])) for step in recorder.steps]
        blocks["signals"] = torch.cat(signals).tolist()
    return blocks


def _batch_key(messages: list[str], band: str, config: CollectConfig) -> str:
    """What a logged batch was generated from, so a log file from other prompts or settings is refused."""
    identity = json.dumps([messages, band, config.max_new_tokens, config.seed])
    return hashlib.sha256(identity.encode()).hexdigest()[:16]


def collect_logs(
    target,
    tokenizer,
    drafter: Drafter,
    estimators: Mapping[str, ConfidenceEstimator],
    messages: list[str],
    log_path: str | Path,
    config: CollectConfig = CollectConfig(),
    max_draft_tokens: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> dict[tuple[str, int], dict]:
    """Generate every message in ``config.bands`` with every drafted position verified and log the
    blocks, one JSON line per (band, batch) appended to ``log_path``; batches already there are read
    back, not rerun. Returns the entries by (band, batch index); ``run_logs`` turns them into logs.

    ``estimators``: name → raw estimator to score each draft with. ``progress(n)`` is called after each
    batch of ``n`` prompts.
    """
    if not estimators:
        raise ValueError("estimators must name at least one ConfidenceEstimator, got none")
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    done = {}
    if log_path.is_file():
        for line in log_path.read_text().splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:  # a torn last line from an interruption
                continue
            done[(entry["band"], entry["batch"])] = entry
    gamma = max_draft_tokens
    for band in config.bands:
        for batch, start in enumerate(range(0, len(messages), config.batch_size)):
            batch_messages = messages[start : start + config.batch_size]
            key = _batch_key(batch_messages, band, config)
            if (band, batch) in done:
                if done[(band, batch)]["key"] != key:
                    raise ValueError(f"log_path {str(log_path)!r} holds batch {batch} of band {band!r} from other prompts or settings; use another file")
            else:
                gamma = gamma or dspark.wrap(target, drafter, fast_path=False).strategy.max_draft_tokens
                recorder = _Recorder(estimators)
                model = dspark.wrap(target, drafter, policy=FixedLength(gamma), confidence=recorder, max_draft_tokens=gamma)
                prompt = encode_chat(tokenizer, batch_messages)
                generator = torch.Generator(device=target.device).manual_seed(config.seed + batch)
                result = model.generate(**prompt, max_new_tokens=config.max_new_tokens, generator=generator, **BAND_SAMPLING[band])
                done[(band, batch)] = {"band": band, "batch": batch, "key": key, "blocks": _batch_blocks(result.stats.records, recorder)}
                with log_path.open("a") as handle:
                    handle.write(json.dumps(done[(band, batch)]) + "\n")
            if progress is not None:
                progress(len(batch_messages))
    return {key: entry for key, entry in done.items() if key[0] in config.bands}


def run_logs(entries: Mapping[tuple[str, int], dict], names: list[str], batches: range | None = None) -> RunLogs:
    """Each band's ``CalibrationLog`` per estimator name (and the signals) from ``collect_logs``
    entries, optionally only those of ``batches``."""
    logs, signals = {}, {}
    for band in sorted({band for band, _ in entries}, key=BANDS.index):
        blocks = [
            entry["blocks"] for (entry_band, batch), entry in sorted(entries.items())
            if entry_band == band and entry["blocks"]["verified"] and (batches is None or batch in batches)
        ]
        if not blocks:
            raise ValueError(f"band {band!r} logged no drafted block; generate longer answers or more prompts")
        width = max(len(block["survival"][names[0]][0]) for block in blocks)
        pad = lambda rows: torch.nn.functional.pad(torch.tensor(rows, dtype=torch.float32), (0, width - len(rows[0])), value=0.5)  # noqa: E731
        counts = {key: torch.tensor([n for block in blocks for n in block[key]], dtype=torch.long) for key in ("verified", "accepted", "drafted")}
        logs[band] = {name: CalibrationLog(torch.cat([pad(block["survival"][name]) for block in blocks]), **counts) for name in names}
        has_signals = all("signals" in block for block in blocks)
        signals[band] = (
            torch.cat([torch.nn.functional.pad(torch.tensor(block["signals"]), (0, 0, 0, width - len(block["signals"][0]))) for block in blocks])
            if has_signals else None
        )
    return RunLogs(logs, signals)


def fit_calibrations(logs: Mapping[str, CalibrationLog], method: str = "temperature") -> dict[str, Calibration]:
    """One ``Calibration`` per band from that band's log (``Calibration.fit``)."""
    return {band: Calibration.fit(log, method) for band, log in logs.items()}


def _position_metrics(predicted: torch.Tensor, outcome: torch.Tensor) -> dict:
    if outcome.numel() == 0:
        return {"count": 0}
    return {
        "count": int(outcome.numel()),
        "ece": expected_calibration_error(predicted, outcome),
        "brier": brier_score(predicted, outcome),
        "roc_auc": roc_auc(predicted, outcome),
        "mean_predicted": float(predicted.mean()),
        "observed_rate": float(outcome.float().mean()),
    }


def calibration_report(log: CalibrationLog, calibration: Calibration | None = None) -> dict:
    """Per draft position k, for the raw survival and (when given) the calibrated one: ECE, Brier,
    ROC-AUC, mean prediction, observed rate and count of prefix survival a_k (blocks where a_k's
    outcome is known) and of conditional survival c_k (positions reached and verified), and the
    latter pooled over all reached positions (``conditional_pooled``)."""
    versions = {"raw": log.survival}
    if calibration is not None:
        versions["calibrated"] = calibration.apply(log.survival)
    prefix_known, prefix_outcome = prefix_outcomes(log)
    reached, conditional_outcome = conditional_outcomes(log)
    report = {}
    for name, survival in versions.items():
        prefix = survival.double().cumprod(dim=1)
        report[name] = {
            "prefix": [_position_metrics(prefix[:, k][prefix_known[:, k]], prefix_outcome[:, k][prefix_known[:, k]]) for k in range(log.width)],
            "conditional": [_position_metrics(survival[:, k][reached[:, k]].double(), conditional_outcome[:, k][reached[:, k]]) for k in range(log.width)],
            # Every reached position together: deep positions are reached too rarely to score alone.
            "conditional_pooled": _position_metrics(survival[reached].double(), conditional_outcome[reached]),
        }
    return report


def plot_reliability(logs: Mapping[str, CalibrationLog], calibrations: Mapping[str, Calibration | None], path: str | Path, title: str) -> Path:
    """Reliability diagrams of prefix survival a_k over all positions, one panel per band: raw and
    calibrated against the observed rate, with the sample count per bin shaded behind."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(logs), figsize=(4.5 * len(logs), 4.2), squeeze=False)
    for axis, (band, log) in zip(axes[0], logs.items()):
        known, outcome = prefix_outcomes(log)
        curves = {"raw": log.survival}
        if calibrations.get(band) is not None:
            curves["calibrated"] = calibrations[band].apply(log.survival)
        counts = axis.twinx()
        for name, survival in curves.items():
            predicted = survival.double().cumprod(dim=1)[known]
            bins = reliability_bins(predicted, outcome[known])
            filled = bins.count > 0
            centers = (bins.edges[:-1] + bins.edges[1:]) / 2
            axis.plot(bins.mean_predicted[filled], bins.observed_rate[filled], marker="o", label=f"{name} (ECE {expected_calibration_error(predicted, outcome[known]):.3f})")
            if name == "raw":
                counts.bar(centers, bins.count, width=bins.edges[1] - bins.edges[0], alpha=0.15, color="grey")
        counts.set_ylabel("samples per bin")
        axis.plot([0, 1], [0, 1], color="black", linestyle="--", linewidth=0.8)
        axis.set(title=f"{title}: {band}", xlabel="predicted prefix survival a_k", ylabel="observed acceptance", xlim=(0, 1), ylim=(0, 1))
        axis.legend(loc="upper left")
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def raw_estimators(drafter: Drafter) -> dict[str, ConfidenceEstimator]:
    """The raw estimators worth calibrating for ``drafter``, the default (the one ``wrap`` will use)
    first: a logistic model of the drafter's ``Draft.signals`` fitted from the logs, for a
    SemiARDrafter or prompt lookup (for a SemiARDrafter also its head and its draft probability on
    their own, for comparison); any other drafter's draft probability."""
    from dspark.drafters import PromptLookupDrafter, SemiARDrafter
    from dspark.drafters.prompt_lookup import LOOKUP_SIGNALS
    from dspark.drafters.semi_ar import SEMI_AR_SIGNALS

    # Zero coefficients score 0.5 everywhere: the collection run only needs the signals it logs.
    if isinstance(drafter, SemiARDrafter):
        return {
            "LogisticConfidence": LogisticConfidence(((0.0,) * (1 + len(SEMI_AR_SIGNALS)),)),
            "DrafterConfidence": DrafterConfidence(),
            "DraftProbability": DraftProbability(),
        }
    if isinstance(drafter, PromptLookupDrafter):
        return {"LogisticConfidence": LogisticConfidence(((0.0,) * (1 + len(LOOKUP_SIGNALS)),))}
    return {"DraftProbability": DraftProbability()}


@attrs.frozen(eq=False)
class CalibrationOutcome:
    """What ``calibrate_drafter`` produced: the saved ``CalibrationFile``, the held-out report (per
    estimator and band, ``calibration_report``) and the paths it wrote."""

    file: CalibrationFile
    report: dict
    paths: dict


def _fitted_logs(run: RunLogs, name: str, estimator) -> dict[str, CalibrationLog]:
    """Each band's log of ``name``, rescored by a fitted ``estimator`` from the logged signals when given."""
    if estimator is None:
        return {band: logs[name] for band, logs in run.logs.items()}
    rescored = {}
    for band, logs in run.logs.items():
        log = logs[name]
        signals = run.signals[band]
        blocks, width = signals.shape[:2]
        draft = Draft(tokens=torch.zeros((blocks, width), dtype=torch.long), lengths=log.drafted, signals=signals)
        rescored[band] = CalibrationLog(estimator.survival(draft), log.verified, log.accepted, log.drafted)
    return rescored


def calibrate_drafter(
    target,
    tokenizer,
    drafter: Drafter,
    work_dir: str | Path,
    output_dir: str | Path,
    config: CollectConfig = CollectConfig(),
    method: str = "isotonic",
    report_share: float = 0.25,
    data_dir: str | Path | None = None,
    fingerprint: str | None = None,
    progress: bool = True,
) -> CalibrationOutcome:
    """Collect logs on the calibration split, fit per band, save ``output_dir/calibration.json``, and
    report raw against calibrated on the held-out ``report_share`` of the prompts.

    The first prompts fit, the last ``report_share`` only score (both from ``training_prompts(...,
    'calibration')``, never eval/). Logs live in ``work_dir`` and a rerun resumes them.
    ``fingerprint``: the drafter weights' ``file_fingerprint``, written into the file and checked on load.
    ``method`` defaults to isotonic maps: on the shipped SmolLM2 drafter temperature scaling alone
    cannot remove the head's bias (it only stretches logits about 0.5), see docs/calibration.rst.
    """
    if not 0.0 < report_share < 1.0:
        raise ValueError(f"report_share must be in (0, 1), got {report_share!r}")
    work_dir = Path(work_dir)
    messages = [prompt.text for prompt in training_prompts(data_dir, "calibration", limit=config.prompts)]
    # Whole batches are held out, so fitting and reporting never share a generation.
    batches = math.ceil(len(messages) / config.batch_size)
    report_batches = max(1, round(report_share * batches))
    if report_batches >= batches:
        raise ValueError(f"config.prompts must give at least two batches of config.batch_size to fit and report on, got {len(messages)} prompts")
    estimators = raw_estimators(drafter)
    with tqdm(total=len(messages) * len(config.bands), desc="calibration runs", unit="prompt", disable=not progress) as bar:
        entries = collect_logs(target, tokenizer, drafter, estimators, messages, work_dir / "logs.jsonl", config, progress=bar.update)
    fit_run = run_logs(entries, list(estimators), range(batches - report_batches))
    report_run = run_logs(entries, list(estimators), range(batches - report_batches, batches))
    sets, fitted, report = {}, {}, {}
    for name in estimators:
        estimator = None
        if name == "LogisticConfidence":  # fitted from the signals first, on every band's blocks together
            bands = list(fit_run.logs)
            estimator = LogisticConfidence.fit(
                torch.cat([fit_run.signals[band] for band in bands]), CalibrationLog.concat(fit_run.logs[band][name] for band in bands)
            )
            fitted[name] = estimator.to_dict()
        fit_logs, report_logs = _fitted_logs(fit_run, name, estimator), _fitted_logs(report_run, name, estimator)
        calibrations = fit_calibrations(fit_logs, method)
        sets[name] = CalibrationSet(name, calibrations, fingerprint)
        report[name] = {band: calibration_report(report_logs[band], calibrations[band]) for band in report_logs}
    default = next(iter(estimators))
    fit_prompts = (batches - report_batches) * config.batch_size
    fitted_on = {
        "prompts": fit_prompts, "report_prompts": len(messages) - fit_prompts, "batch_size": config.batch_size,
        "max_new_tokens": config.max_new_tokens, "bands": list(config.bands), "method": method, "seed": config.seed,
    }
    calibration_file = CalibrationFile(sets, default, fitted, fitted_on)
    paths = {"calibration": calibration_file.save(output_dir)}
    paths["report"] = work_dir / "report.json"
    paths["report"].write_text(json.dumps({"fitted_on": fitted_on, "report": report}, indent=2) + "\n")
    for name in estimators:
        paths[f"plot_{name}"] = plot_reliability(
            _fitted_logs(report_run, name, None if name not in fitted else LogisticConfidence.from_dict(fitted[name])),
            sets[name].bands, work_dir / f"reliability-{name}.png", name,
        )
    return CalibrationOutcome(calibration_file, report, paths)
