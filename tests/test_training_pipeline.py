"""The end-to-end distillation pipeline in dspark/training/pipeline.py, on a tiny target and a tiny data folder."""

import subprocess
import sys
import warnings

import attrs
import pytest
import torch

from dspark.drafters import SemiARConfig, SemiARDrafter
from dspark.training import DataConfig, TrainConfig, checkpoint_dir, distill_drafter, read_sequences, regenerate_answers, training_pools
from tests.conftest import build_model, tiny_data_dir, word_tokenizer


def _config(target) -> SemiARConfig:
    return SemiARConfig.for_target(target, target_layers=(1, 2), max_draft_tokens=3, intermediate_size=32, rank=4, draft_vocab_size=40)


QUICK = TrainConfig(steps=4, learning_rate=1e-3, warmup_steps=1, sequences_per_step=2, anchors_per_sequence=2, checkpoint_every=2)


def test_distill_drafter_regenerates_stores_trains_and_resumes(tmp_path):
    """Stage 'data' regenerates and stores then returns None; 'all' trains a drafter; a rerun regenerates nothing and resumes at the end."""
    target, tokenizer = build_model("llama"), word_tokenizer()
    data = DataConfig(prompts=8, max_new_tokens=6, modes=("greedy", "reference"), validation_share=0.2)
    logs = []
    assert distill_drafter(target, tokenizer, _config(target), tmp_path / "work", data, QUICK, tiny_data_dir(tmp_path), stage="data", progress=False, log=logs.append) is None
    records = read_sequences(tmp_path / "work" / "data.jsonl")
    assert {record["mode"] for record in records} == {"greedy", "reference"} and len(records) > 8
    assert (tmp_path / "work" / "targets-1-2").is_dir()
    drafter = distill_drafter(target, tokenizer, _config(target), tmp_path / "work", data, QUICK, tiny_data_dir(tmp_path / "again"), progress=False, log=logs.append)
    assert isinstance(drafter, SemiARDrafter) and drafter.draft_vocab.numel() == 40
    assert len(read_sequences(tmp_path / "work" / "data.jsonl")) == len(records), "the rerun must skip answered prompts"
    rerun_logs = []
    again = distill_drafter(target, tokenizer, _config(target), tmp_path / "work", data, QUICK, stage="train", progress=False, log=rerun_logs.append)
    assert any(line.startswith("resumed from step 4") for line in rerun_logs)
    assert all(torch.equal(a, b) for a, b in zip(drafter.state_dict().values(), again.state_dict().values()))


def test_a_run_resumes_only_a_checkpoint_of_its_own_settings(tmp_path):
    """Changing the step count keeps the checkpoint folder; changing loss weights, learning rate, seed or the drafter's shape gives a new one."""
    target = build_model("llama")
    config, folder = _config(target), checkpoint_dir(tmp_path, _config(target), QUICK)
    assert folder.parent == tmp_path and folder.name.startswith("checkpoint-")
    assert checkpoint_dir(tmp_path, config, attrs.evolve(QUICK, steps=40, validate_every=7)) == folder
    changed = [attrs.evolve(QUICK, loss_weights=(1.0, 0.9, 1.0)), attrs.evolve(QUICK, learning_rate=2e-3), attrs.evolve(QUICK, seed=1)]
    assert len({folder, *(checkpoint_dir(tmp_path, config, train_config) for train_config in changed)}) == 4
    assert checkpoint_dir(tmp_path, attrs.evolve(config, rank=8), QUICK) != folder


def test_a_bfloat16_copy_answers_and_the_target_is_left_as_it_was(tmp_path):
    """generate_dtype answers with a converted copy (recorded per answer); the target keeps its dtype and weights."""
    target, tokenizer = build_model("llama"), word_tokenizer()
    weights = {name: tensor.clone() for name, tensor in target.state_dict().items()}
    data = DataConfig(prompts=4, max_new_tokens=6, modes=("greedy",), generate_dtype="bfloat16")
    regenerate_answers(target, tokenizer, tmp_path / "work", data, tiny_data_dir(tmp_path), progress=False)
    records = read_sequences(tmp_path / "work" / "data.jsonl")
    assert records and {record["dtype"] for record in records} == {"bfloat16"}
    assert all(torch.equal(weights[name], tensor) for name, tensor in target.state_dict().items())
    record = records[0]
    answerer = build_model("llama").to(torch.bfloat16)
    expected = answerer.generate(torch.tensor([record["prompt_ids"]]), max_new_tokens=6, do_sample=False)[0, len(record["prompt_ids"]) :].tolist()
    assert record["response_ids"] == expected[: len(record["response_ids"])]


def test_stage_train_without_data_and_unknown_stages_are_refused(tmp_path):
    """Training before any regeneration names the missing file; an unknown stage names the allowed ones."""
    target = build_model("llama")
    with pytest.raises(ValueError, match="no regenerated answers"):
        distill_drafter(target, word_tokenizer(), _config(target), tmp_path, stage="train", progress=False)
    with pytest.raises(ValueError, match="stage must be one of"):
        distill_drafter(target, word_tokenizer(), _config(target), tmp_path, stage="everything", progress=False)


def test_training_pools_hold_out_own_answers_and_weight_them():
    """Held-out own answers go to validation, held-out dataset answers nowhere; own answers are drawn own_weight times."""
    records = [{"id": f"alpaca_5k.jsonl:{index}", "mode": mode} for index in range(200) for mode in ("greedy", "reference")]
    store = list(range(len(records)))
    pools = training_pools(records, store, DataConfig(validation_share=0.1, own_weight=3))
    held = 400 - pools.own_answers - pools.dataset_answers
    assert pools.own_answers == pools.dataset_answers and 2 * len(pools.validation) == held > 0
    assert len(pools.training) == 3 * pools.own_answers + pools.dataset_answers
    assert all(records[index]["mode"] == "greedy" for index in pools.validation)
    with pytest.raises(ValueError, match="align"):
        training_pools(records, store[:-1], DataConfig())


@pytest.mark.parametrize("field, value", [("modes", ("beam",)), ("modes", ()), ("generate_dtype", "int8"), ("validation_share", 1.0), ("own_weight", 0), ("prompts", 0)])
def test_data_config_refuses_bad_values(field, value):
    """DataConfig names the field and the offending value."""
    with pytest.raises(ValueError, match=field):
        DataConfig(**{field: value})


def test_old_distill_module_forwards_with_a_deprecation_warning():
    """dspark.drafters.distill.X still works, warns, and is the same object as its new home."""
    from dspark import training
    from dspark.drafters import default_target_layers, distill

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert distill.train is training.train and distill.default_target_layers is default_target_layers
    assert [w.category for w in caught] == [DeprecationWarning, DeprecationWarning]
    with pytest.raises(AttributeError):
        distill.no_such_name


def test_training_is_not_imported_by_dspark_and_needs_no_extras():
    """import dspark leaves dspark.training unimported; dspark.training imports with the demo and dev extras unavailable."""
    script = (
        "import sys\n"
        "for extra in ('gguf', 'matplotlib', 'sentencepiece', 'scipy', 'hypothesis', 'pytest', 'sphinx'): sys.modules[extra] = None\n"
        "import dspark\n"
        "assert 'dspark.training' not in sys.modules\n"
        "from dspark.training import distill_drafter, TrainConfig\n"
        "assert dspark.training.TrainConfig is TrainConfig\n"
    )
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr
