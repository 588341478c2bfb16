"""Calibration runs in dspark/training/calibrate.py (collect, fit, save, report) and `dspark calibrate`, on tiny models."""

import json

import pytest
import torch

from dspark import cli
from dspark.drafters import PromptLookupDrafter
from dspark.training.calibrate import CollectConfig, calibrate_drafter, collect_logs, run_logs
from dspark.verify import CalibrationFile, DraftProbability, DrafterConfidence, LogisticConfidence
from tests.conftest import build_model, tiny_data_dir, tiny_semi_ar_drafter, word_tokenizer

CONFIG = CollectConfig(prompts=16, max_new_tokens=10, batch_size=4, bands=("greedy", "high"))


def test_collect_logs_verifies_every_drafted_position_and_resumes(tmp_path):
    """Blocks verify all they drafted (but where max_new_tokens cuts a row's last step); a rerun reads the file back instead of generating; other prompts are refused."""
    target = build_model("llama")
    drafter = tiny_semi_ar_drafter(target)
    estimators = {"DrafterConfidence": DrafterConfidence(), "DraftProbability": DraftProbability()}
    messages = ["w5 w6 w7", "w8 w9", "w10 w11 w12 w13", "w14"]
    config = CollectConfig(prompts=4, max_new_tokens=8, batch_size=2, bands=("greedy", "high"))
    entries = collect_logs(target, word_tokenizer(), drafter, estimators, messages, tmp_path / "logs.jsonl", config)
    run = run_logs(entries, list(estimators))
    for band in ("greedy", "high"):
        head, probability = run.logs[band]["DrafterConfidence"], run.logs[band]["DraftProbability"]
        assert bool((head.verified <= head.drafted).all()) and float((head.verified == head.drafted).float().mean()) > 0.75
        assert torch.equal(head.accepted, probability.accepted)
        assert not torch.equal(head.survival, probability.survival)
    lines = (tmp_path / "logs.jsonl").read_text().count("\n")
    assert lines == 4
    again = collect_logs(None, word_tokenizer(), drafter, estimators, messages, tmp_path / "logs.jsonl", config)  # no target needed
    assert again == entries
    with pytest.raises(ValueError, match="from other prompts or settings"):
        collect_logs(None, word_tokenizer(), drafter, estimators, messages[::-1], tmp_path / "logs.jsonl", config)


def test_calibrate_drafter_saves_a_checked_calibration_and_reports_held_out_prompts(tmp_path):
    """calibrate_drafter fits the logistic model of the signals and every band of each estimator, saves them with the fingerprint, and reports raw and calibrated on the held-out batch."""
    target = build_model("llama")
    outcome = calibrate_drafter(
        target, word_tokenizer(), tiny_semi_ar_drafter(target), tmp_path / "work", tmp_path / "drafter", CONFIG,
        data_dir=tiny_data_dir(tmp_path, per_source=120), fingerprint="f00d", progress=False,
    )
    saved = CalibrationFile.load(tmp_path / "drafter", fingerprint="f00d")
    assert saved == outcome.file and saved.default == "LogisticConfidence" and "LogisticConfidence" in saved.estimators
    assert set(saved.sets) == {"LogisticConfidence", "DrafterConfidence", "DraftProbability"} and set(saved.sets["DraftProbability"].bands) == {"greedy", "high"}
    assert saved.fitted_on["prompts"] == 12 and saved.fitted_on["report_prompts"] == 4
    report = json.loads(outcome.paths["report"].read_text())["report"]
    positions = report["DrafterConfidence"]["greedy"]["calibrated"]["prefix"]
    assert len(positions) == 4 and positions[0]["count"] > 0 and 0.0 <= positions[0]["ece"] <= 1.0
    assert outcome.paths["plot_DrafterConfidence"].stat().st_size > 0


def test_prompt_lookup_gets_a_logistic_model_of_its_signals(tmp_path):
    """For prompt lookup the logistic model is fitted from the logged signals and saved with the calibration."""
    target = build_model("llama", initializer_range=0.02)
    outcome = calibrate_drafter(
        target, word_tokenizer(), PromptLookupDrafter(min_ngram=1), tmp_path / "work", tmp_path / "out", CONFIG,
        data_dir=tiny_data_dir(tmp_path, per_source=120), progress=False,
    )
    fitted = LogisticConfidence.from_dict(outcome.file.estimators["LogisticConfidence"])
    assert fitted.features == 3 and any(any(weight != 0.0 for weight in vector) for vector in fitted.coefficients)


@pytest.mark.parametrize(
    "arguments, message",
    [(["--drafter", "prompt-lookup"], "--output is needed"), (["--bands", "greedy,warm"], "bands must be"), (["--prompts", "0"], "prompts must be")],
)
def test_calibrate_cli_refuses_bad_arguments(arguments, message, capsys):
    """`dspark calibrate` names what is wrong before loading anything."""
    with pytest.raises(SystemExit):
        cli.main(["calibrate", *arguments])
    assert message in capsys.readouterr().err
