"""dspark/benchmarking.py, the helpers the benchmark scripts share, and the scripts' own start-up."""

import collections
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dspark.benchmarking import across_categories, first_difference, generated_tokens, run_strategy, write_json
from dspark.drafters import PromptLookupDrafter
from dspark.strategies import autoregressive
from tests.conftest import left_padded_batch

SCRIPTS = sorted((Path(__file__).resolve().parents[1] / "benchmarks").glob("*.py"))


def test_first_difference():
    """The first differing index, the shorter end when one is a prefix of the other, None when equal."""
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 5, 3], [1, 2, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2
    assert first_difference([], [4]) == 0


def test_across_categories_takes_each_categorys_prompts_in_turn():
    """The first prompt of every category (in order of first appearance), then every second one, and so on."""
    Prompt = collections.namedtuple("Prompt", "category name")
    prompts = [Prompt("a", 1), Prompt("a", 2), Prompt("a", 3), Prompt("b", 4), Prompt("c", 5), Prompt("c", 6)]
    assert [prompt.name for prompt in across_categories(prompts)] == [1, 4, 5, 2, 6, 3]
    assert across_categories([]) == []


def test_generated_tokens_stop_after_the_first_eos():
    """Each row's new tokens end at (and include) its first EOS; rows without one are kept whole."""
    sequences = torch.tensor([[9, 9, 5, 2, 0, 0], [9, 9, 5, 6, 7, 8]])
    assert generated_tokens(sequences, prompt_length=2, eos_token_id=2) == [[5, 2], [5, 6, 7, 8]]


def test_write_json_is_atomic(tmp_path):
    """write_json creates parent folders and leaves the report and no temporary file behind."""
    path = tmp_path / "deep" / "report.json"
    write_json(path, {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in path.parent.iterdir()] == ["report.json"]


def test_run_strategy_reports_speed_and_tau(llama):
    """run_strategy generates every prompt and reports tokens/s, τ = 1 for plain decoding and the verify share."""
    input_ids, attention_mask = left_padded_batch([6])
    report = run_strategy(llama, autoregressive(PromptLookupDrafter()), [{"input_ids": input_ids, "attention_mask": attention_mask}], 8)
    assert report["tokens_per_s"] > 0 and report["tau"] == pytest.approx(1.0) and report["verify_share"] == 0


@pytest.mark.parametrize("script", SCRIPTS, ids=[script.name for script in SCRIPTS])
def test_benchmark_scripts_start(script, tmp_path):
    """Every benchmark script imports what it needs and parses --help from any folder (no sys.path edits)."""
    completed = subprocess.run([sys.executable, str(script), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert "usage:" in completed.stdout
