"""The dspark command line (dspark/cli.py) on the embedded SmolLM2."""

import collections
import json
import re

import pytest

from dspark import cli
from dspark.drafters import SemiARDrafter
from dspark.pretrained import load_target
from tests.conftest import DATA_DIR

pytestmark = pytest.mark.integration


def test_generate_streams_and_compares(capsys):
    """`dspark generate --compare` streams an answer and reports speed, τ and identical outputs."""
    cli.main(["generate", "Say hello.", "--max-new-tokens", "12", "--compare"])
    output = capsys.readouterr().out
    assert "tokens/s" in output and "τ" in output and "speedup" in output
    assert "greedy outputs identical: True" in output


def test_fast_path_shows_the_chosen_formulations(capsys):
    """`dspark fast-path` prints one chosen formulation per weight shape and row count, and the copies' memory."""
    cli.main(["fast-path"])
    output = capsys.readouterr().out
    assert "49152 x 576" in output and "weight copies:" in output
    assert re.search(r"49152 x 576\s+1\s+float32\s+(linear|transposed|pretransposed|packed)", output)


def test_generate_without_the_fast_path(capsys):
    """`dspark generate --no-fast-path --compare` still gives HF's greedy output."""
    cli.main(["generate", "Say hello.", "--max-new-tokens", "8", "--compare", "--no-fast-path", "--drafter", "prompt-lookup"])
    assert "greedy outputs identical: True" in capsys.readouterr().out


@pytest.mark.skipif(not DATA_DIR.is_dir(), reason="shared/data is not beside the repository")
def test_train_regenerates_data_and_saves_a_loadable_drafter(tmp_path, capsys):
    """`dspark train --stage data` regenerates answers, adds dataset answers and builds the target store; `--stage train` trains on them
    without regenerating (own answers weighted up) and saves an fp16 drafter that `dspark generate --drafter` uses losslessly."""
    common = ["train", "--work-dir", str(tmp_path / "work"), "--data-dir", str(DATA_DIR), "--prompts", "4", "--max-new-tokens", "24", "--modes", "greedy"]
    with pytest.raises(SystemExit):
        cli.main([*common, "--stage", "train", "--output", str(tmp_path / "drafter")])
    assert "no regenerated answers" in capsys.readouterr().err
    cli.main([*common, "--stage", "data", "--modes", "greedy,reference"])
    assert list((tmp_path / "work").glob("targets-*/shard-*.safetensors")) and not (tmp_path / "drafter").exists()
    cli.main([*common, "--stage", "train", "--prompts", "8", "--output", str(tmp_path / "drafter"), "--steps", "2",
              "--draft-vocab-size", "512", "--intermediate-size", "64", "--max-draft-tokens", "3", "--weight-decay", "0.01", "--own-weight", "3"])
    assert re.search(r"training pool: \d+ draws per pass, \d+ own answers × 3, \d+ dataset answers", capsys.readouterr().out)
    records = [json.loads(line) for line in (tmp_path / "work" / "data.jsonl").read_text().splitlines()]
    # One prompt per source; ShareGPT has no dataset answer, so three references.
    assert collections.Counter(record["mode"] for record in records) == {"greedy": 4, "reference": 3}
    assert all(record["response_ids"] for record in records)
    config = json.loads((tmp_path / "drafter" / "config.json").read_text())
    assert config["draft_vocab_size"] == 512 and config["max_draft_tokens"] == 3
    drafter = SemiARDrafter.from_pretrained(tmp_path / "drafter", target=load_target()[0])
    assert drafter.draft_vocab.numel() == 512
    capsys.readouterr()
    cli.main(["generate", "Say hello.", "--max-new-tokens", "8", "--compare", "--drafter", str(tmp_path / "drafter")])
    assert "greedy outputs identical: True" in capsys.readouterr().out


def test_train_refuses_a_non_positive_own_weight(capsys):
    """--own-weight must be a positive integer; the error names the setting."""
    with pytest.raises(SystemExit):
        cli.main(["train", "--output", "unused", "--own-weight", "0"])
    assert "own_weight must be an int >= 1, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("weights", ["1,2", "a,b,c", "0.1,-1,1"])
def test_train_refuses_bad_loss_weights(weights, capsys):
    """--loss-weights must be three non-negative numbers; the error names the value."""
    with pytest.raises(SystemExit):
        cli.main(["train", "--output", "unused", "--loss-weights", weights])
    assert weights in capsys.readouterr().err
