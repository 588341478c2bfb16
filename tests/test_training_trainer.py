"""The drafter trainer in dspark/training/trainer.py on tiny targets."""

import io
import json

import pytest
import torch
from safetensors.torch import load_file
from tqdm import tqdm

from dspark.drafters import SemiARDrafter
from dspark.training.store import build_target_store
from dspark.training.trainer import TrainConfig, sample_anchors, train, validate
from tests.conftest import build_model, regenerated_records, tiny_semi_ar_drafter


def test_sample_anchors_leave_room_for_a_block():
    """Anchors start at the last prompt token and leave γ tokens after them."""
    anchors = sample_anchors(prompt_length=5, length=20, max_draft_tokens=4, count=50, generator=torch.Generator().manual_seed(0))
    assert anchors.min() >= 4 and anchors.max() <= 15 and anchors.numel() == 12
    assert sample_anchors(prompt_length=5, length=8, max_draft_tokens=4, count=3, generator=torch.Generator()) is None


@pytest.mark.parametrize("anchor_input, precision", [("embedding", "float32"), ("feature", "float32"), ("embedding", "bfloat16")])
def test_short_training_run_lowers_the_loss(tmp_path, anchor_input, precision):
    """Distilling a tiny drafter from a tiny target lowers the loss and raises predicted acceptance, for
    either anchor input and with the forward autocast to bfloat16."""
    target = build_model("llama")
    drafter = tiny_semi_ar_drafter(target, anchor_input=anchor_input)
    config = TrainConfig(steps=60, learning_rate=1e-2, warmup_steps=5, sequences_per_step=2, anchors_per_sequence=8, precision=precision)
    history = train(drafter, build_target_store(target, regenerated_records(target), drafter.target_layers), config, log=lambda line: None)
    assert all(parameter.dtype == torch.float32 for parameter in drafter.parameters())
    first = sum(entry["loss"] for entry in history[:5]) / 5
    last = sum(entry["loss"] for entry in history[-5:]) / 5
    assert last < 0.9 * first
    assert history[-1]["acceptance"] > history[0]["acceptance"] + 0.1


def test_validation_scores_fixed_held_out_blocks_during_training():
    """validate scores the same anchor blocks on every call; train reports it every validate_every steps and at the end."""
    target = build_model("llama")
    store = build_target_store(target, regenerated_records(target, count=6), (1, 2))
    config = TrainConfig(steps=5, learning_rate=1e-3, warmup_steps=1, sequences_per_step=1, anchors_per_sequence=4, validate_every=2)
    drafter = tiny_semi_ar_drafter(target)
    before = validate(drafter, store[4:], config)
    assert before == validate(drafter, store[4:], config) and 0.0 <= before["acceptance"] <= 1.0
    logs = []
    history = train(drafter, store[:4], config, log=logs.append, validation=store[4:])
    assert [entry["step"] for entry in history if "validation" in entry] == [2, 4, 5]
    assert history[-1]["validation"] == validate(drafter, store[4:], config) != before
    assert sum('"validation"' in line for line in logs) == 3


def test_training_resumes_from_its_checkpoint(tmp_path):
    """A rerun continues from the last checkpoint's step with the same weights."""
    target = build_model("llama")
    store = build_target_store(target, regenerated_records(target, count=4), (1, 2))
    config = TrainConfig(steps=4, learning_rate=1e-3, warmup_steps=1, sequences_per_step=1, anchors_per_sequence=4, checkpoint_every=2)
    train(tiny_semi_ar_drafter(target), store, config, checkpoint_dir=tmp_path / "run", log=lambda line: None)
    assert json.loads((tmp_path / "run" / "trainer_state.json").read_text()) == {"step": 4}
    saved = SemiARDrafter.from_pretrained(tmp_path / "run", target=target)
    logs, bar = [], tqdm(total=6, file=io.StringIO())
    history = train(tiny_semi_ar_drafter(target), store, TrainConfig(steps=6, learning_rate=1e-3, warmup_steps=1, sequences_per_step=1, anchors_per_sequence=4, checkpoint_every=2), checkpoint_dir=tmp_path / "run", progress=bar, log=logs.append)
    assert logs[0].startswith("resumed from step 4") and [entry["step"] for entry in history] == [5, 6]
    assert bar.n == 6, "the progress bar counts the resumed steps too"
    resumed = SemiARDrafter.from_pretrained(tmp_path / "run", target=target)
    changed = [name for name, tensor in saved.state_dict().items() if not torch.equal(tensor, resumed.state_dict()[name])]
    assert changed, "two more steps must have moved the weights that were loaded from step 4"
    moments = load_file(str(tmp_path / "run" / "optimizer.safetensors"))
    trainable = [name for name, parameter in resumed.named_parameters() if parameter.requires_grad]
    assert all(f"{name}.exp_avg" in moments for name in trainable)


def test_train_config_refuses_an_unknown_precision():
    """TrainConfig.precision names one of the autocast dtypes."""
    with pytest.raises(ValueError, match="precision"):
        TrainConfig(precision="int8")


def test_train_config_refuses_bad_loss_weights():
    """TrainConfig.loss_weights must be three non-negative numbers."""
    with pytest.raises(ValueError, match="loss_weights"):
        TrainConfig(loss_weights=(0.1, 0.9))
    with pytest.raises(ValueError, match="loss_weights"):
        TrainConfig(loss_weights=(0.1, -0.9, 1.0))

