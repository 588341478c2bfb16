"""Distillation pipeline in dspark/drafters/distill.py on tiny targets."""

import io
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from tqdm import tqdm
from transformers import PreTrainedTokenizerFast

from dspark.drafters import SemiARConfig, SemiARDrafter, TargetSignature
from dspark.drafters.distill import (
    PromptRecord,
    TrainConfig,
    build_target_store,
    default_target_layers,
    distillation_loss,
    frequent_tokens,
    held_out_for_validation,
    position_weights,
    read_sequences,
    regenerate,
    sample_anchors,
    split_of,
    target_features,
    train,
    training_prompts,
    validate,
)
from dspark.types import DraftContext, SamplingConfig
from tests.conftest import VOCAB, build_model, start_generation

TRAIN_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "train"


def _drafter(target, sequential="markov", block_size=4, backbone="parallel") -> SemiARDrafter:
    config = SemiARConfig(
        target=TargetSignature.of(target), target_layers=(1, 2), block_size=block_size, num_heads=4, intermediate_size=64, rank=8,
        sequential=sequential, backbone=backbone,
    )
    torch.manual_seed(0)
    return SemiARDrafter(config, target)


def _records(target, count=12, prompt_length=6, new_tokens=40):
    generator = torch.Generator().manual_seed(1)
    records = []
    for index in range(count):
        prompt = torch.randint(3, 40, (1, prompt_length), generator=generator)
        output = target.generate(prompt, max_new_tokens=new_tokens, do_sample=False, eos_token_id=None)
        records.append({"id": str(index), "mode": "greedy", "prompt_ids": prompt[0].tolist(), "response_ids": output[0, prompt_length:].tolist()})
    return records


@pytest.mark.skipif(not TRAIN_DIR.is_dir(), reason="shared/data/train is not beside the repository")
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


def test_loss_vanishes_when_draft_equals_target():
    """With p_d = p_t on the full vocabulary, TV is 0, acceptance is 1 and CE is −log p_t(x*)."""
    logits = torch.randn(3, 4, 10)
    probs = logits.softmax(dim=-1)
    tokens = torch.randint(0, 10, (3, 4))
    ids = torch.arange(10).expand(3, 4, 10)
    loss, terms = distillation_loss(logits, torch.full((3, 4), 0.999), ids, probs, tokens, torch.arange(10))
    assert terms["tv"] == pytest.approx(0.0, abs=1e-5)
    assert terms["acceptance"] == pytest.approx(1.0, abs=1e-5)
    expected_ce = (-(probs.gather(-1, tokens[..., None]).squeeze(-1).log()) * position_weights(4)).sum(-1).mean()
    assert terms["ce"] == pytest.approx(float(expected_ce), rel=1e-4)


def test_loss_counts_mass_outside_the_draft_vocabulary():
    """Target mass outside the draft vocabulary is total variation the drafter cannot remove."""
    target_probs = torch.tensor([[[0.5, 0.3, 0.2]]])
    draft_logits = torch.log(torch.tensor([[[0.625, 0.375]]]))  # p_t restricted to {0, 1}, renormalised
    _, terms = distillation_loss(draft_logits, torch.tensor([[0.5]]), torch.tensor([[[0, 1, 2]]]), target_probs, torch.tensor([[2]]), torch.tensor([0, 1]))
    assert terms["tv"] == pytest.approx(0.4, abs=1e-5)  # |.625−.5| + |.375−.3| + .2
    assert terms["ce"] == 0.0  # x* = 2 is outside the draft vocabulary


def test_sample_anchors_leave_room_for_a_block():
    """Anchors start at the last prompt token and leave γ tokens after them."""
    anchors = sample_anchors(prompt_length=5, length=20, block_size=4, count=50, generator=torch.Generator().manual_seed(0))
    assert anchors.min() >= 4 and anchors.max() <= 15 and anchors.numel() == 12
    assert sample_anchors(prompt_length=5, length=8, block_size=4, count=3, generator=torch.Generator()) is None


@pytest.mark.parametrize("sequential, backbone", [("markov", "parallel"), ("rnn", "parallel"), (None, "parallel"), (None, "autoregressive"), ("rnn", "autoregressive")])
def test_training_outputs_equal_inference_drafts(llama, sequential, backbone):
    """Teacher-forced training outputs at an anchor equal what propose computes there (same function)."""
    drafter = _drafter(llama, sequential, backbone=backbone).eval()
    with torch.no_grad():
        drafter.transition_out.normal_(0, 0.5)
    tokens = torch.randint(3, 60, (1, 30), generator=torch.Generator().manual_seed(2))
    anchor = 17
    features, _ = target_features(llama, tokens, drafter.target_layers, torch.tensor([0]))
    context = DraftContext(
        tokens=tokens, begin=torch.tensor([0]), end=torch.tensor([anchor + 1]), rows=torch.tensor([0]), step=0,
        sampling=SamplingConfig(), features=features[:, :anchor], feature_mask=torch.ones((1, anchor), dtype=torch.long),
    )
    draft = start_generation(drafter, rows=1).propose(context, 4)
    forced = tokens.clone()
    forced[0, anchor + 1 : anchor + 4] = draft.tokens[0, :3]
    with torch.no_grad():
        logits, confidence = drafter.training_outputs(features, forced, torch.tensor([[anchor]]))
    assert torch.equal(logits[0, 0].argmax(dim=-1), draft.tokens[0])
    assert torch.allclose(logits[0, 0].softmax(dim=-1), draft.probs[0], atol=1e-5)
    assert torch.allclose(confidence[0, 0], draft.confidence[0], atol=1e-5)


def test_short_training_run_lowers_the_loss(tmp_path):
    """Distilling a tiny drafter from a tiny target lowers the loss and raises predicted acceptance."""
    target = build_model("llama")
    drafter = _drafter(target)
    history = train(drafter, build_target_store(target, _records(target), drafter.target_layers), TrainConfig(steps=60, learning_rate=1e-2, warmup_steps=5, sequences_per_step=2, anchors_per_sequence=8), log=lambda line: None)
    first = sum(entry["loss"] for entry in history[:5]) / 5
    last = sum(entry["loss"] for entry in history[-5:]) / 5
    assert last < 0.9 * first
    assert history[-1]["acceptance"] > history[0]["acceptance"] + 0.1


def test_validation_scores_fixed_held_out_blocks_during_training():
    """validate scores the same anchor blocks on every call; train reports it every validate_every steps and at the end."""
    target = build_model("llama")
    store = build_target_store(target, _records(target, count=6), (1, 2))
    config = TrainConfig(steps=5, learning_rate=1e-3, warmup_steps=1, sequences_per_step=1, anchors_per_sequence=4, validate_every=2)
    drafter = _drafter(target)
    before = validate(drafter, store[4:], config)
    assert before == validate(drafter, store[4:], config) and 0.0 <= before["acceptance"] <= 1.0
    logs = []
    history = train(drafter, store[:4], config, log=logs.append, validation=store[4:])
    assert [entry["step"] for entry in history if "validation" in entry] == [2, 4, 5]
    assert history[-1]["validation"] == validate(drafter, store[4:], config) != before
    assert sum('"validation"' in line for line in logs) == 3


def test_validation_hold_out_is_stable_and_checked():
    """The held-out share is a stable function of the record id, about the requested size; a share outside [0, 1) is refused."""
    ids = [f"alpaca_5k.jsonl:{index}" for index in range(2000)]
    held = [held_out_for_validation(record_id, 0.1) for record_id in ids]
    assert held == [held_out_for_validation(record_id, 0.1) for record_id in ids] and 150 < sum(held) < 250
    assert not any(held_out_for_validation(record_id, 0.0) for record_id in ids)
    for share in (-0.1, 1.0, True):
        with pytest.raises(ValueError, match="share"):
            held_out_for_validation("x", share)


def test_training_resumes_from_its_checkpoint(tmp_path):
    """A rerun continues from the last checkpoint's step with the same weights."""
    target = build_model("llama")
    store = build_target_store(target, _records(target, count=4), (1, 2))
    config = TrainConfig(steps=4, learning_rate=1e-3, warmup_steps=1, sequences_per_step=1, anchors_per_sequence=4, checkpoint_every=2)
    train(_drafter(target), store, config, checkpoint_dir=tmp_path / "run", log=lambda line: None)
    assert json.loads((tmp_path / "run" / "trainer_state.json").read_text()) == {"step": 4}
    saved = SemiARDrafter.from_pretrained(tmp_path / "run", target=target)
    logs, bar = [], tqdm(total=6, file=io.StringIO())
    history = train(_drafter(target), store, TrainConfig(steps=6, learning_rate=1e-3, warmup_steps=1, sequences_per_step=1, anchors_per_sequence=4, checkpoint_every=2), checkpoint_dir=tmp_path / "run", progress=bar, log=logs.append)
    assert logs[0].startswith("resumed from step 4") and [entry["step"] for entry in history] == [5, 6]
    assert bar.n == 6, "the progress bar counts the resumed steps too"
    resumed = SemiARDrafter.from_pretrained(tmp_path / "run", target=target)
    changed = [name for name, tensor in saved.state_dict().items() if not torch.equal(tensor, resumed.state_dict()[name])]
    assert changed, "two more steps must have moved the weights that were loaded from step 4"
    moments = load_file(str(tmp_path / "run" / "optimizer.safetensors"))
    trainable = [name for name, parameter in resumed.named_parameters() if parameter.requires_grad]
    assert all(f"{name}.exp_avg" in moments for name in trainable)


def _word_tokenizer() -> PreTrainedTokenizerFast:
    backend = Tokenizer(WordLevel({f"w{index}": index for index in range(VOCAB)}, unk_token="w0"))
    backend.pre_tokenizer = WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="w0", pad_token="w0")
    tokenizer.chat_template = (
        "{% for message in messages %}{% if message['role'] == 'assistant' %}w4 {% endif %}{{ message['content'] }} w3 {% endfor %}"
        "{% if add_generation_prompt %}w4 {% endif %}"
    )
    return tokenizer


def test_regenerate_writes_the_targets_answers_and_resumes(tmp_path):
    """regenerate stores the target's own greedy and sampled answers and skips prompts already done."""
    target = build_model("llama")
    prompts = [PromptRecord(id=f"p{i}", text=" ".join(f"w{5 + (i * 3 + j) % 20}" for j in range(4 + i))) for i in range(3)]
    output = regenerate(target, _word_tokenizer(), prompts, tmp_path / "data.jsonl", max_new_tokens=6, batch_size=2)
    records = read_sequences(output)
    assert sorted((r["id"], r["mode"]) for r in records) == sorted((p.id, m) for p in prompts for m in ("greedy", "sample"))
    greedy = next(r for r in records if r["id"] == "p1" and r["mode"] == "greedy")
    expected = target.generate(torch.tensor([greedy["prompt_ids"]]), max_new_tokens=6, do_sample=False)[0, len(greedy["prompt_ids"]) :].tolist()
    assert greedy["response_ids"] == expected[: len(greedy["response_ids"])]
    regenerate(target, _word_tokenizer(), prompts, output, max_new_tokens=6, batch_size=2)
    assert len(read_sequences(output)) == len(records)


def test_reference_mode_writes_the_dataset_answer_as_the_assistant_turn(tmp_path):
    """Mode 'reference' stores the dataset's answer after the generation prompt, cut at EOS; prompts without one are skipped."""
    target = build_model("llama")
    # The tiny target's EOS is w2: the answer is kept up to it.
    prompts = [PromptRecord(id="a", text="w5 w6", reference="w7 w8 w2 w9"), PromptRecord(id="b", text="w10")]
    tokenizer = _word_tokenizer()
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


def test_default_target_layers_are_spread_over_the_model():
    """Three hidden-state indices from the first layer to the last but one."""
    assert default_target_layers(30) == (1, 15, 29)
    assert default_target_layers(2) == (1,)


def test_fp16_checkpoint_round_trip(tmp_path, llama):
    """save_pretrained(dtype=float16) halves the file and loads back into a float32 drafter."""
    drafter = _drafter(llama)
    drafter.save_pretrained(tmp_path / "fp32")
    drafter.save_pretrained(tmp_path / "fp16", dtype=torch.float16)
    size = lambda name: (tmp_path / name / "model.safetensors").stat().st_size
    assert size("fp16") < 0.6 * size("fp32")
    loaded = SemiARDrafter.from_pretrained(tmp_path / "fp16", target=llama)
    assert loaded.transition_in.weight.dtype == torch.float32
    assert torch.allclose(loaded.transition_in.weight, drafter.transition_in.weight, atol=1e-3)


def test_target_store_holds_the_targets_view_and_reuses_its_shards(tmp_path):
    """The store keeps the target's features and top-K next-token law per sequence; a rerun reads its shards."""
    target = build_model("llama")
    records = _records(target, count=5, new_tokens=12)
    store = build_target_store(target, records, (1, 2), top_k=4, directory=tmp_path / "store", shard_size=2)
    assert sorted(path.name for path in (tmp_path / "store").iterdir()) == [f"shard-0000{index}.safetensors" for index in range(3)]
    tokens = torch.tensor(records[3]["prompt_ids"] + records[3]["response_ids"])[None]
    features, probs = target_features(target, tokens, (1, 2), torch.arange(5, tokens.shape[1]))
    assert torch.equal(store[3].tokens, tokens[0]) and store[3].prompt_length == 6
    assert torch.allclose(store[3].features.float(), features[0], atol=1e-2)
    assert torch.allclose(store[3].top_probs, probs[0].topk(4).values) and torch.equal(store[3].top_ids.long(), probs[0].topk(4).indices)
    reread = build_target_store(None, records, (1, 2), top_k=4, directory=tmp_path / "store", shard_size=2)  # no target needed
    assert all(torch.equal(a.features, b.features) and torch.equal(a.top_ids, b.top_ids) for a, b in zip(store, reread))
    recomputed = build_target_store(target, records, (1, 2), top_k=3, directory=tmp_path / "store", shard_size=2)
    assert recomputed[0].top_ids.shape[-1] == 3


def test_train_config_refuses_bad_loss_weights():
    """TrainConfig.loss_weights must be three non-negative numbers."""
    with pytest.raises(ValueError, match="loss_weights"):
        TrainConfig(loss_weights=(0.1, 0.9))
    with pytest.raises(ValueError, match="loss_weights"):
        TrainConfig(loss_weights=(0.1, -0.9, 1.0))
