"""Prompt sets in dspark/training/data.py: splits, hold-outs, the data folder."""

import pytest

from dspark.training.data import (
    default_data_dir,
    eval_prompts,
    held_out_for_validation,
    spec_bench_questions,
    split_of,
    training_prompts,
)
from tests.conftest import DATA_DIR, TRAIN_DIR


NEEDS_DATA = pytest.mark.skipif(not TRAIN_DIR.is_dir(), reason="shared/data is not beside the repository")


@NEEDS_DATA
def test_training_prompts_split_and_refuse_eval():
    """Training and calibration prompts are disjoint, every source is used, and eval/ is refused."""
    train_prompts = training_prompts(TRAIN_DIR, "train", limit=40)
    references = {prompt.id.split(":")[0]: prompt.reference for prompt in train_prompts}
    assert references["sharegpt_prompts.jsonl"] is None and references["alpaca_5k.jsonl"]
    assert "<<" not in references["gsm8k_train.jsonl"]
    calibration = training_prompts(TRAIN_DIR, "calibration", limit=40)
    assert len(train_prompts) == len(calibration) == 40
    assert not {p.id for p in train_prompts} & {p.id for p in calibration}
    assert {p.id.split(":")[0] for p in train_prompts} == {"sharegpt_prompts.jsonl", "alpaca_5k.jsonl", "code_alpaca_2k.jsonl", "gsm8k_train.jsonl"}
    with pytest.raises(ValueError, match="eval"):
        training_prompts(TRAIN_DIR.parent / "eval")


def test_split_is_stable_and_small():
    """About 5% of ids go to calibration, always the same ones."""
    ids = [f"source:{index}" for index in range(4000)]
    shares = [split_of(i) == "calibration" for i in ids]
    assert 0.03 < sum(shares) / len(ids) < 0.07
    assert shares == [split_of(i) == "calibration" for i in ids]


def test_validation_hold_out_is_stable_and_checked():
    """The held-out share is a stable function of the record id, about the requested size; a share outside [0, 1) is refused."""
    ids = [f"alpaca_5k.jsonl:{index}" for index in range(2000)]
    held = [held_out_for_validation(record_id, 0.1) for record_id in ids]
    assert held == [held_out_for_validation(record_id, 0.1) for record_id in ids] and 150 < sum(held) < 250
    assert not any(held_out_for_validation(record_id, 0.0) for record_id in ids)
    for share in (-0.1, 1.0, True):
        with pytest.raises(ValueError, match="share"):
            held_out_for_validation("x", share)


@NEEDS_DATA
def test_the_data_folder_or_its_train_folder_give_the_same_prompts():
    """training_prompts accepts the data folder or its train/ folder, and finds it by itself from the checkout."""
    assert training_prompts(DATA_DIR, limit=8) == training_prompts(TRAIN_DIR, limit=8) == training_prompts(limit=8)


def test_default_data_dir_reads_the_variable_and_says_where_it_looked(tmp_path, monkeypatch):
    """$DSPARK_DATA_DIR wins; without it and without shared/data above the working directory the error names both remedies."""
    monkeypatch.setenv("DSPARK_DATA_DIR", str(tmp_path))
    assert default_data_dir() == tmp_path
    monkeypatch.delenv("DSPARK_DATA_DIR")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"DSPARK_DATA_DIR.*--data-dir"):
        default_data_dir()
    (tmp_path / "shared" / "data" / "train").mkdir(parents=True)
    assert default_data_dir() == tmp_path / "shared" / "data"


def test_a_folder_without_train_is_refused(tmp_path):
    """A data_dir with neither train/ nor the source files is refused with its path in the message."""
    with pytest.raises(ValueError, match="has no train/"):
        training_prompts(tmp_path)


@NEEDS_DATA
def test_eval_prompts_take_the_first_of_each_category():
    """Spec-Bench gives per_category questions of each of its 13 categories in file order; HumanEval and GSM8K follow."""
    questions = spec_bench_questions(DATA_DIR, per_category=2)
    assert len(questions) == 2 * len({q["category"] for q in questions}) == 26
    prompts = eval_prompts(DATA_DIR, spec_per_category=1, humaneval=2, gsm8k=3)
    assert [p.set for p in prompts] == ["spec_bench"] * 13 + ["humaneval"] * 2 + ["gsm8k"] * 3
    assert prompts[0].message == questions[0]["turns"][0]
    with pytest.raises(ValueError, match="per_category"):
        spec_bench_questions(DATA_DIR, per_category=0)
