"""The semi-autoregressive DSpark drafter in dspark/drafters/semi_ar.py (untrained, on tiny targets)."""

import json

import pytest
import torch

import dspark
from dspark.drafters import SemiARConfig, SemiARDrafter, TargetSignature, default_target_layers
from dspark.drafters.semi_ar import context_and_block_attention
from dspark.training.store import target_features
from dspark.types import DraftContext, SamplingConfig
from dspark.verify import DrafterConfidence, FixedLength, Threshold
from tests.conftest import build_model, left_padded_batch, start_generation, tiny_semi_ar_drafter


def _drafter(target, seed: int = 0, **overrides) -> SemiARDrafter:
    config = SemiARConfig(target=TargetSignature.of(target), target_layers=(1, 2), max_draft_tokens=4, num_heads=4, intermediate_size=64, rank=8, **overrides)
    torch.manual_seed(seed)
    drafter = SemiARDrafter(config, target)
    with torch.no_grad():  # a non-zero transition so the sequential head matters in these tests
        drafter.transition_out.normal_(0, 0.5)
        drafter.mask_embedding.normal_(0, 0.5)
        if drafter.anchor_fusion is not None:  # away from its start at the plain sum
            drafter.anchor_fusion.weight.normal_(0, 0.2)
    return drafter.eval()


@pytest.mark.parametrize(
    "sequential, backbone, anchor_input",
    [("markov", "parallel", "embedding"), ("rnn", "parallel", "embedding"), (None, "parallel", "embedding"), (None, "autoregressive", "embedding"),
     ("markov", "autoregressive", "embedding"), ("markov", "parallel", "feature"), (None, "parallel", "feature")],
)
@pytest.mark.parametrize("architecture", ["llama", "qwen2", "gpt2"])
def test_greedy_equals_hf_generate(architecture, sequential, backbone, anchor_input):
    """Any semi-AR drafter (here untrained), with either anchor input, and the autoregressive-head ablation reproduce HF greedy output."""
    target = build_model(architecture)
    input_ids, attention_mask = left_padded_batch([7, 12, 3])
    expected = target.generate(input_ids, attention_mask=attention_mask, max_new_tokens=20, do_sample=False)
    drafter = _drafter(target, sequential=sequential, backbone=backbone, anchor_input=anchor_input)
    for policy in (None, Threshold(0.5)):
        result = dspark.wrap(target, drafter, policy=policy, confidence=None if policy is None else DrafterConfidence()).generate(
            input_ids, attention_mask=attention_mask, max_new_tokens=20
        )
        assert torch.equal(result.sequences, expected)


def test_draft_carries_probabilities_and_confidence(llama):
    """Drafts carry q over the full vocabulary (zero outside the draft vocabulary) and c_k in (0, 1)."""
    target = llama
    config = SemiARConfig(target=TargetSignature.of(target), target_layers=(2,), max_draft_tokens=3, rank=4, intermediate_size=32, draft_vocab_size=50)
    drafter = SemiARDrafter(config, target, draft_vocab=torch.arange(10, 60))
    input_ids, attention_mask = left_padded_batch([5, 9])
    result = dspark.wrap(target, drafter, policy=FixedLength(3)).generate(input_ids, attention_mask=attention_mask, max_new_tokens=8)
    assert torch.equal(result.sequences, target.generate(input_ids, attention_mask=attention_mask, max_new_tokens=8, do_sample=False))
    context = dspark.DraftContext(
        tokens=input_ids, begin=torch.tensor([4, 0]), end=torch.tensor([9, 9]), rows=torch.arange(2), step=0,
        sampling=dspark.SamplingConfig(),
    )
    draft = start_generation(drafter, rows=2).propose(context, 3)
    assert bool(((draft.tokens >= 10) & (draft.tokens < 60)).all())
    assert torch.allclose(draft.probs.sum(dim=-1), torch.ones(2, 3))
    assert float(draft.probs[:, :, :10].sum()) == 0.0
    assert bool(((draft.confidence > 0) & (draft.confidence < 1)).all())


def test_save_load_round_trip(tmp_path, llama):
    """save_pretrained/from_pretrained restore identical drafts; the shared target weights are not saved."""
    drafter = _drafter(llama, sequential="rnn")
    drafter.save_pretrained(tmp_path)
    loaded = SemiARDrafter.from_pretrained(tmp_path, target=llama)
    assert set(loaded.state_dict()) == set(drafter.state_dict())
    shared_shape = llama.get_input_embeddings().weight.shape
    assert all(tensor.shape != shared_shape for tensor in loaded.state_dict().values())
    assert all(torch.equal(tensor, loaded.state_dict()[name]) for name, tensor in drafter.state_dict().items())
    tokens = torch.randint(3, 60, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        hidden = llama(tokens[:, :-1], output_hidden_states=True).hidden_states
    context = dspark.DraftContext(
        tokens=tokens, begin=torch.tensor([0]), end=torch.tensor([12]), rows=torch.tensor([0]), step=0, sampling=dspark.SamplingConfig(),
        features=torch.cat([hidden[1], hidden[2]], dim=-1), feature_mask=torch.ones((1, 11), dtype=torch.long),
    )
    first, second = start_generation(drafter, rows=1).propose(context, 4), start_generation(loaded, rows=1).propose(context, 4)
    assert torch.equal(first.tokens, second.tokens)
    assert torch.equal(first.probs, second.probs) and torch.equal(first.confidence, second.confidence)


def test_loading_another_draft_vocabulary_rederives_the_reduced_head(llama):
    """load_state_dict from a drafter with another draft vocabulary (a checkpoint) then drafts exactly like that drafter."""
    config = SemiARConfig(target=TargetSignature.of(llama), target_layers=(2,), max_draft_tokens=3, rank=4, intermediate_size=32, draft_vocab_size=50)
    torch.manual_seed(0)
    source = SemiARDrafter(config, llama, draft_vocab=torch.arange(10, 60)).eval()
    loaded = SemiARDrafter(config, llama, draft_vocab=torch.arange(50, 100)).eval()
    loaded.load_state_dict(source.state_dict())
    assert torch.equal(loaded.draft_head, llama.get_output_embeddings().weight.detach()[10:60])
    input_ids, attention_mask = left_padded_batch([5, 9])
    context = dspark.DraftContext(
        tokens=input_ids, begin=torch.tensor([4, 0]), end=torch.tensor([9, 9]), rows=torch.arange(2), step=0, sampling=dspark.SamplingConfig(),
    )
    first, second = start_generation(source, rows=2).propose(context, 3), start_generation(loaded, rows=2).propose(context, 3)
    assert torch.equal(first.tokens, second.tokens) and torch.equal(first.probs, second.probs)


def test_loading_for_another_target_is_refused(tmp_path, llama):
    """A drafter trained for one target refuses a target of another architecture or size."""
    _drafter(llama).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="target must match"):
        SemiARDrafter.from_pretrained(tmp_path, target=build_model("qwen2"))


@pytest.mark.parametrize(
    "overrides, message",
    [({"sequential": "lstm"}, "sequential"), ({"backbone": "tree"}, "backbone"), ({"target_layers": ()}, "target_layers"), ({"num_heads": 5}, "num_heads"), ({"draft_vocab_size": 0}, "draft_vocab_size"), ({"max_draft_tokens": 0}, "max_draft_tokens"), ({"verify_threshold": 1.5}, "verify_threshold"),
     ({"anchor_input": "hidden"}, "anchor_input"), ({"anchor_input": "feature", "backbone": "autoregressive"}, "anchor_input")],
)
def test_bad_configs_are_refused(llama, overrides, message):
    """Invalid configuration values raise ValueError naming the field."""
    arguments = {"target": TargetSignature.of(llama), "target_layers": (1,), **overrides}
    with pytest.raises(ValueError, match=message):
        SemiARConfig(**arguments)


def test_wrap_uses_the_drafters_measured_default_policy(llama):
    """wrap with no policy verifies every drafted token, or thresholds the confidence head when the config says so."""
    plain = dspark.wrap(llama, _drafter(llama)).strategy
    assert plain.policy == FixedLength(4) and plain.confidence is None and plain.max_draft_tokens == 4
    thresholded = dspark.wrap(llama, _drafter(llama, verify_threshold=0.3)).strategy
    assert thresholded.policy == Threshold(0.3) and isinstance(thresholded.confidence, DrafterConfidence) and thresholded.max_draft_tokens == 4
    assert dspark.wrap(llama, _drafter(llama, verify_threshold=0.3), policy=FixedLength(2)).strategy.confidence is None


def test_target_layers_beyond_the_target_are_refused(llama):
    """target_layers must index the target's hidden states."""
    config = SemiARConfig(target=TargetSignature.of(llama), target_layers=(1, 7), num_heads=4)
    with pytest.raises(ValueError, match="target_layers"):
        SemiARDrafter(config, llama)


@pytest.mark.parametrize("anchor_input", ["embedding", "feature"])
def test_rows_finishing_at_eos_leave_the_drafter_cache(llama, anchor_input):
    """With rows ending at different steps, the semi-AR drafter (and its remembered anchor context) follows the shrinking batch and stays lossless."""
    input_ids, attention_mask = left_padded_batch([7, 12, 3, 9], seed=3)
    free_run = llama.generate(input_ids, attention_mask=attention_mask, max_new_tokens=30, do_sample=False, eos_token_id=None)
    eos = int(free_run[0, input_ids.shape[1] + 6])
    expected = llama.generate(input_ids, attention_mask=attention_mask, max_new_tokens=30, do_sample=False, eos_token_id=eos, pad_token_id=0)
    drafter = _drafter(llama, anchor_input=anchor_input)
    result = dspark.wrap(llama, drafter).generate(input_ids, attention_mask=attention_mask, max_new_tokens=30, eos_token_id=eos, pad_token_id=0)
    assert torch.equal(result.sequences, expected)
    assert len({record.rows.numel() for record in result.stats.records}) > 1


@pytest.mark.parametrize("sequential", ["markov", "rnn", None])
def test_greedy_proposal_equals_teacher_forced_training_outputs(llama, sequential):
    """propose's q and confidence equal training_outputs teacher-forced on the drafted tokens: the fast
    inference path (one rotation per pass, W1 rows from the vocabulary table, batched confidence) is the model trained."""
    drafter = _drafter(llama, sequential=sequential)
    prompt = left_padded_batch([9])[0]
    with torch.inference_mode():
        hidden = llama(input_ids=prompt, output_hidden_states=True).hidden_states
        features = torch.cat([hidden[layer] for layer in drafter.target_layers], dim=-1)
        context = dspark.DraftContext(
            tokens=prompt, begin=torch.tensor([0]), end=torch.tensor([9]), rows=torch.arange(1), step=0,
            sampling=dspark.SamplingConfig(), features=features[:, :-1], feature_mask=torch.ones(1, 8, dtype=torch.long),
        )
        draft = start_generation(drafter, rows=1).propose(context, 4)
        tokens = torch.cat([prompt, draft.tokens, torch.zeros(1, 1, dtype=torch.long)], dim=1)
        padded = torch.cat([features, features.new_zeros(1, tokens.shape[1] - 9, features.shape[-1])], dim=1)
        logits, confidence = drafter.training_outputs(padded, tokens, torch.tensor([[8]]))
    assert torch.equal(draft.tokens[0], logits[0, 0].argmax(dim=-1))
    assert torch.allclose(draft.probs[0], logits[0, 0].softmax(dim=-1), atol=1e-5)
    assert torch.allclose(draft.confidence[0], confidence[0, 0], atol=1e-5)


def test_vocabulary_features_follow_weight_changes(llama):
    """The W1 table of the draft vocabulary is derived again after an in-place change to the weights it comes from."""
    drafter = _drafter(llama)
    before = drafter.draft_vocab_features().clone()
    with torch.no_grad():
        drafter.transition_in.weight.mul_(2.0)
    after = drafter.draft_vocab_features()
    with torch.inference_mode():
        expected = drafter.previous_token_features(drafter.draft_vocab)
    assert torch.allclose(after, expected) and not torch.allclose(after, before)


@pytest.mark.parametrize(
    "sequential, backbone, anchor_input",
    [("markov", "parallel", "embedding"), ("rnn", "parallel", "embedding"), (None, "parallel", "embedding"), (None, "autoregressive", "embedding"),
     ("rnn", "autoregressive", "embedding"), ("markov", "parallel", "feature")],
)
def test_training_outputs_equal_inference_drafts(llama, sequential, backbone, anchor_input):
    """Teacher-forced training outputs at an anchor equal what propose computes there (same function), the
    anchor's previous-position feature included."""
    drafter = tiny_semi_ar_drafter(llama, sequential, backbone=backbone, anchor_input=anchor_input).eval()
    with torch.no_grad():
        drafter.transition_out.normal_(0, 0.5)
        if drafter.anchor_fusion is not None:
            drafter.anchor_fusion.weight.normal_(0, 0.2)
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


def test_default_target_layers_are_spread_over_the_model():
    """Three hidden-state indices from the first layer to the last but one."""
    assert default_target_layers(30) == (1, 15, 29)
    assert default_target_layers(2) == (1,)


def test_fp16_checkpoint_round_trip(tmp_path, llama):
    """save_pretrained(dtype=float16) halves the file and loads back into a float32 drafter."""
    drafter = tiny_semi_ar_drafter(llama)
    drafter.save_pretrained(tmp_path / "fp32")
    drafter.save_pretrained(tmp_path / "fp16", dtype=torch.float16)
    size = lambda name: (tmp_path / name / "model.safetensors").stat().st_size
    assert size("fp16") < 0.6 * size("fp32")
    loaded = SemiARDrafter.from_pretrained(tmp_path / "fp16", target=llama)
    assert loaded.transition_in.weight.dtype == torch.float32
    assert torch.allclose(loaded.transition_in.weight, drafter.transition_in.weight, atol=1e-3)


def test_config_files_naming_gamma_block_size_still_load(llama):
    """A config.json written before the rename (block_size) loads as max_draft_tokens; .block_size still reads it, with a warning."""
    config = tiny_semi_ar_drafter(llama, max_draft_tokens=5).config
    values = json.loads(config.to_json())
    values["block_size"] = values.pop("max_draft_tokens")
    assert SemiARConfig.from_json(json.dumps(values)) == config
    with pytest.warns(DeprecationWarning):
        assert config.block_size == 5


def test_a_saved_calibration_is_loaded_checked_and_used_by_wrap(tmp_path, llama):
    """from_pretrained reads calibration.json when its fingerprint names these weights; wrap then gives the DSpark preset (calibrated head,
    hardware-aware scheduler, a cost model profiled here); other weights are refused."""
    from dspark.cost_models import OnlineCorrectedCostModel
    from dspark.verify import CalibratedConfidence, Calibration, CalibrationFile, CalibrationSet, HardwareAwareScheduler
    from dspark.verify.calibration import file_fingerprint

    drafter = tiny_semi_ar_drafter(llama)
    drafter.save_pretrained(tmp_path)
    assert SemiARDrafter.from_pretrained(tmp_path, target=llama).calibration is None
    fitted = CalibrationSet("DrafterConfidence", {"greedy": Calibration("temperature", (2.0,))}, fingerprint=file_fingerprint(tmp_path / "model.safetensors"))
    CalibrationFile({"DrafterConfidence": fitted}, "DrafterConfidence").save(tmp_path)
    loaded = SemiARDrafter.from_pretrained(tmp_path, target=llama)
    strategy = dspark.wrap(llama, loaded).strategy
    assert isinstance(strategy.confidence, CalibratedConfidence) and strategy.confidence.calibrations == fitted
    assert strategy.policy == HardwareAwareScheduler(max_draft_tokens=4), "a calibrated drafter gets the DSpark preset"
    assert isinstance(strategy.cost_model, OnlineCorrectedCostModel) and strategy.cost_model.step_time(4, 5) >= strategy.cost_model.step_time(1, 1) > 0
    input_ids, attention_mask = left_padded_batch([5])
    result = dspark.wrap(llama, loaded).generate(input_ids, attention_mask=attention_mask, max_new_tokens=6)
    assert torch.equal(result.sequences, llama.generate(input_ids, attention_mask=attention_mask, max_new_tokens=6, do_sample=False))
    drafter.mask_embedding.data += 1.0
    drafter.save_pretrained(tmp_path)  # new weights, old calibration.json
    with pytest.raises(ValueError, match="was fitted for drafter weights"):
        SemiARDrafter.from_pretrained(tmp_path, target=llama)


def test_drafts_carry_non_anticipating_signals(llama):
    """Draft.signals holds logit(confidence) and logit(max q) per position: what the head and q knew before each token was drawn."""
    drafter = start_generation(_drafter(llama), rows=2)
    input_ids, _ = left_padded_batch([6, 6])
    context = DraftContext(tokens=input_ids, begin=torch.zeros(2, dtype=torch.long), end=torch.full((2,), 6), rows=torch.arange(2), step=0, sampling=SamplingConfig())
    draft = drafter.propose(context, 3)
    assert draft.signals.shape == (2, 3, 2)
    assert torch.allclose(draft.signals[..., 0], torch.logit(draft.confidence, eps=1e-6))
    assert torch.allclose(draft.signals[..., 1], torch.logit(draft.probs.amax(dim=-1), eps=1e-6))


@pytest.mark.parametrize(
    "sequential, backbone, anchor_input", [("markov", "parallel", "embedding"), ("rnn", "parallel", "embedding"), ("markov", "autoregressive", "embedding"), ("markov", "parallel", "feature")]
)
def test_drafting_a_subset_of_rows_equals_drafting_them_all(llama, sequential, backbone, anchor_input):
    """With context.draft_rows, the named rows get the draft they get when every row is drafted; the others get length 0."""
    input_ids, attention_mask = left_padded_batch([5, 9, 7])
    with torch.inference_mode():
        hidden = llama(input_ids[:, :-1], attention_mask=attention_mask[:, :-1], output_hidden_states=True).hidden_states
    features = torch.cat([hidden[1], hidden[2]], dim=-1)
    drafter = _drafter(llama, sequential=sequential, backbone=backbone, anchor_input=anchor_input)
    drafts = []
    for draft_rows in (None, torch.tensor([0, 2])):
        context = dspark.DraftContext(
            tokens=input_ids, begin=(attention_mask == 0).sum(dim=1), end=torch.full((3,), input_ids.shape[1]), rows=torch.arange(3), step=0,
            sampling=dspark.SamplingConfig(), features=features, feature_mask=attention_mask[:, :-1], draft_rows=draft_rows,
        )
        drafts.append(start_generation(drafter, rows=3).propose(context, 3))
    every, subset = drafts
    assert subset.lengths.tolist() == [3, 0, 3]
    for name in ("tokens", "probs", "confidence", "signals"):
        assert torch.allclose(getattr(subset, name)[[0, 2]], getattr(every, name)[[0, 2]], atol=1e-5), name


@pytest.mark.parametrize("sequential, backbone", [("markov", "parallel"), ("rnn", "parallel"), (None, "parallel"), ("markov", "autoregressive")])
@pytest.mark.parametrize("do_sample", [False, True])
def test_a_shallower_proposal_is_the_deeper_ones_prefix(llama, sequential, backbone, do_sample):
    """Drafting k < γ tokens gives exactly the first k tokens, q, confidence and signals of the γ-token draft."""
    input_ids, attention_mask = left_padded_batch([5, 9])
    with torch.inference_mode():
        hidden = llama(input_ids[:, :-1], attention_mask=attention_mask[:, :-1], output_hidden_states=True).hidden_states
    drafter, drafts = _drafter(llama, sequential=sequential, backbone=backbone), []
    for depth in (4, 2):
        context = dspark.DraftContext(
            tokens=input_ids, begin=(attention_mask == 0).sum(dim=1), end=torch.full((2,), input_ids.shape[1]), rows=torch.arange(2), step=0,
            sampling=dspark.SamplingConfig(do_sample=do_sample), features=torch.cat([hidden[1], hidden[2]], dim=-1),
            feature_mask=attention_mask[:, :-1], generator=torch.Generator().manual_seed(3),
        )
        drafts.append(start_generation(drafter, rows=2).propose(context, depth))
    deep, shallow = drafts
    assert shallow.lengths.tolist() == [2, 2]
    for name in ("tokens", "probs", "confidence", "signals"):
        assert torch.allclose(getattr(shallow, name), getattr(deep, name)[:, :2], atol=1e-5), name


@pytest.mark.parametrize("context_slots", [0, 1, 13])
def test_context_and_block_attention_equals_attention_over_joined_keys(context_slots):
    """Attention over context and block parts without joining them equals SDPA over the joined keys and values."""
    generator = torch.Generator().manual_seed(context_slots)
    rows, heads, queries, head_dim = 3, 2, 4, 8
    query = torch.randn((rows, heads, queries, head_dim), generator=generator)
    context = tuple(torch.randn((rows, heads, context_slots, head_dim), generator=generator) for _ in range(2))
    block = tuple(torch.randn((rows, heads, queries, head_dim), generator=generator) for _ in range(2))
    visible = torch.rand((rows, queries, context_slots + queries), generator=generator) < 0.6
    visible[:, :, context_slots:] |= torch.eye(queries, dtype=torch.bool)  # every query sees itself
    joined_keys, joined_values = (torch.cat([c, b], dim=2) for c, b in zip(context, block))
    expected = torch.nn.functional.scaled_dot_product_attention(query, joined_keys, joined_values, attn_mask=visible[:, None])
    assert torch.allclose(context_and_block_attention(query, context, block, visible), expected, atol=1e-5)
    half = context_and_block_attention(query.bfloat16(), tuple(t.bfloat16() for t in context), tuple(t.bfloat16() for t in block), visible)
    assert half.dtype == torch.bfloat16 and torch.allclose(half.float(), expected, atol=0.1)
