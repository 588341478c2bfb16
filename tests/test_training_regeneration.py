"""The target regenerating its own answers, in dspark/training/regeneration.py."""

import pytest
import torch

from dspark.training.data import PromptRecord
from dspark.training.regeneration import frequent_tokens, read_sequences, regenerate
from tests.conftest import build_model, word_tokenizer


def test_regenerate_writes_the_targets_answers_and_resumes(tmp_path):
    """regenerate stores the target's own greedy and sampled answers and skips prompts already done."""
    target = build_model("llama")
    prompts = [PromptRecord(id=f"p{i}", text=" ".join(f"w{5 + (i * 3 + j) % 20}" for j in range(4 + i))) for i in range(3)]
    output = regenerate(target, word_tokenizer(), prompts, tmp_path / "data.jsonl", max_new_tokens=6, batch_size=2)
    records = read_sequences(output)
    assert sorted((r["id"], r["mode"]) for r in records) == sorted((p.id, m) for p in prompts for m in ("greedy", "sample"))
    greedy = next(r for r in records if r["id"] == "p1" and r["mode"] == "greedy")
    expected = target.generate(torch.tensor([greedy["prompt_ids"]]), max_new_tokens=6, do_sample=False)[0, len(greedy["prompt_ids"]) :].tolist()
    assert greedy["response_ids"] == expected[: len(greedy["response_ids"])]
    assert greedy["dtype"] == "float32"
    regenerate(target, word_tokenizer(), prompts, output, max_new_tokens=6, batch_size=2)
    assert len(read_sequences(output)) == len(records)


def test_reference_mode_writes_the_dataset_answer_as_the_assistant_turn(tmp_path):
    """Mode 'reference' stores the dataset's answer after the generation prompt, cut at EOS; prompts without one are skipped."""
    target = build_model("llama")
    # The tiny target's EOS is w2: the answer is kept up to it.
    prompts = [PromptRecord(id="a", text="w5 w6", reference="w7 w8 w2 w9"), PromptRecord(id="b", text="w10")]
    tokenizer = word_tokenizer()
    records = read_sequences(regenerate(target, tokenizer, prompts, tmp_path / "data.jsonl", modes=("reference",)))
    assert records == [{"id": "a", "mode": "reference", "prompt_ids": [5, 6, 3, 4], "response_ids": [7, 8, 2]}]
    with pytest.raises(ValueError, match="modes"):
        regenerate(target, tokenizer, prompts, tmp_path / "other.jsonl", modes=("beam",))


def test_frequent_tokens_are_the_most_common_response_tokens():
    """The draft vocabulary holds the most frequent response tokens, sorted by id."""
    records = [{"prompt_ids": [9, 9, 9], "response_ids": [5, 5, 5, 7, 7, 2]}, {"prompt_ids": [], "response_ids": [7, 1]}]
    assert frequent_tokens(records, 2, 10).tolist() == [5, 7]
    with pytest.raises(ValueError, match="size"):
        frequent_tokens(records, 0, 10)


def test_frequent_tokens_rank_ties_by_the_second_records():
    """Tokens the first records leave tied (here 1 and 2 once each, and the unseen) are ranked by the second records."""
    records = [{"response_ids": [5, 5, 1, 2]}]
    then = [{"response_ids": [2, 2, 8, 8, 8, 1, 5]}]
    assert frequent_tokens(records, 2, 10, then=then).tolist() == [2, 5]
    assert frequent_tokens(records, 4, 10, then=then).tolist() == [1, 2, 5, 8]
