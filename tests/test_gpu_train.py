"""The one-shot GPU recipe in benchmarks/gpu_train.py: its budget arithmetic and a run on a tiny target."""

import gzip
import json

import pytest

from dspark.drafters import SemiARDrafter
from dspark.training.data import training_prompts
from dspark.training.regeneration import read_sequences
from tests.conftest import build_model, load_script, tiny_data_dir, word_tokenizer


@pytest.fixture(scope="module")
def gpu_train():
    """The script, imported as a module."""
    return load_script("gpu_train")


def test_budget_plan_splits_the_time_left_after_the_reserve(gpu_train):
    """Deadlines follow one another: regeneration's share, then the store's, then training up to the reserve."""
    plan = gpu_train.plan_budget(540, regenerate_share=0.5, store_share=0.1, reserve_seconds=40)
    assert (plan.regenerate_until, plan.store_until, plan.train_until, plan.budget) == (250, 300, 500, 540)
    with pytest.raises(ValueError, match="reserve_seconds"):
        gpu_train.plan_budget(30, reserve_seconds=30)
    with pytest.raises(ValueError, match="store_share"):
        gpu_train.plan_budget(540, store_share=0)
    with pytest.raises(ValueError, match="leave time to train"):
        gpu_train.plan_budget(540, regenerate_share=0.6, store_share=0.4)


def test_planned_steps_fit_the_time_left_within_the_cap(gpu_train):
    """Steps are planned for a margin of the time left, capped by max_steps, never below the steps done."""
    assert gpu_train.planned_steps(30, 0.1, 100.0) == 30 + 900
    assert gpu_train.planned_steps(30, 0.1, 100.0, max_steps=500) == 500
    assert gpu_train.planned_steps(30, 0.1, -5.0) == 30
    assert gpu_train.planned_steps(30, 0.1, 100.0, max_steps=10) == 30
    with pytest.raises(ValueError, match="seconds_per_step"):
        gpu_train.planned_steps(30, 0.0, 100.0)


def test_step_seconds_leave_out_the_first_steps(gpu_train):
    """The second half of the steps times a step; with too few ends, all of them do."""
    assert gpu_train.step_seconds(0.0, [5.0, 6.0, 7.0, 8.0]) == pytest.approx(1.0)
    assert gpu_train.step_seconds(1.0, [3.0]) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="step_ends"):
        gpu_train.step_seconds(0.0, [])


def test_answer_passes_give_one_greedy_answer_then_seeded_samples(gpu_train):
    """Each pass has its mode and seed; at least one answer per prompt is asked for."""
    assert gpu_train.answer_passes(3) == [("greedy", 0), ("sample", 1), ("sample", 2)]
    with pytest.raises(ValueError, match="answers_per_prompt"):
        gpu_train.answer_passes(0)


def _tiny_run_arguments(tmp_path) -> list[str]:
    return [
        "--device", "cpu", "--data-dir", str(tiny_data_dir(tmp_path)), "--work-dir", str(tmp_path / "work"), "--output", str(tmp_path / "out"),
        "--prompts", "8", "--answers-per-prompt", "2", "--max-new-tokens", "6", "--generate-batch-size", "4", "--store-batch-size", "3",
        "--draft-vocab-size", "40", "--intermediate-size", "32", "--max-draft-tokens", "3", "--warmup-steps", "2", "--probe-steps", "2",
        "--max-steps", "4", "--sequences-per-step", "2", "--anchors-per-sequence", "2", "--validation-share", "0.3",
        "--budget-seconds", "300", "--reserve-seconds", "10",
    ]


def test_a_tiny_run_regenerates_stores_trains_and_writes_a_loadable_drafter(gpu_train, tmp_path):
    """Every stage runs on a tiny target: two answers per prompt, four steps, a float16 drafter, the report and the answers."""
    target = build_model("llama")
    report = gpu_train.main(_tiny_run_arguments(tmp_path), model=(target, word_tokenizer()))
    assert report["data"]["by_mode"] == {"greedy": 8, "sample": 8} and report["data"]["stored"]["stored_sequences"] == 16
    assert report["training"]["planned_steps"] == 4 and [entry["step"] for entry in report["training"]["history"]] == [1, 2, 3, 4]
    assert list(report["ended_at_seconds"]) == ["load", "regenerate", "store", "train", "validate", "write"]
    assert json.loads((tmp_path / "out" / "gpu_train.json").read_text())["ended_at_seconds"] == report["ended_at_seconds"]
    drafter = SemiARDrafter.from_pretrained(tmp_path / "out" / "drafter", target)
    assert drafter.config.anchor_input == "feature" and drafter.draft_vocab.numel() == 40
    parts = sorted((tmp_path / "out").glob("answers.jsonl.gz.*"))
    assert [part.name for part in parts] == report["answer_parts"] == ["answers.jsonl.gz.00"]
    joined = tmp_path / "answers.jsonl"
    joined.write_bytes(gzip.decompress(parts[0].read_bytes()))
    assert len(read_sequences(joined)) == 16


def test_regeneration_starts_nothing_past_its_deadline(gpu_train, tmp_path):
    """A clock already past the deadline answers no prompt, and main says that the budget was too small."""
    arguments = _tiny_run_arguments(tmp_path)
    args = gpu_train._parse_args(arguments)
    target, tokenizer = build_model("llama"), word_tokenizer()
    prompts = training_prompts(args.data_dir, "train", limit=4)
    assert gpu_train.regenerate_within(target, tokenizer, prompts, tmp_path, args, deadline=10.0, clock=lambda: 11.0) == []
    with pytest.raises(ValueError, match="no answers were regenerated"):
        gpu_train.main(arguments + ["--budget-seconds", "10.5", "--regenerate-share", "0.001"], model=(target, tokenizer))
