"""Public API of dspark/speculative.py: wrap/generate options, bad input, streaming, accelerate dispatch."""

import copy

import pytest
import torch
from accelerate import dispatch_model
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import PreTrainedTokenizerFast, TextIteratorStreamer

import dspark
from dspark.drafters import DraftModelDrafter, PromptLookupDrafter
from dspark.verify import DraftProbability, FixedLength, Threshold
from tests.conftest import VOCAB, build_model, left_padded_batch


def _state(model) -> dict:
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}


def test_public_api_names():
    """The names DESIGN.md promises are exported."""
    for name in ("wrap", "generate", "SpeculativeModel", "GenerationResult", "Strategy", "Drafter", "ConfidenceEstimator", "CostModel", "VerifyPolicy"):
        assert name in dspark.__all__ and hasattr(dspark, name)
    assert hasattr(dspark.drafters, "PromptLookupDrafter") and hasattr(dspark.drafters, "DraftModelDrafter")


def test_wrap_defaults_verify_every_drafted_token(llama):
    """wrap(model, drafter) verifies the drafter's default block; FixedLength(k) sets γ = k."""
    assert dspark.wrap(llama, PromptLookupDrafter(max_draft_tokens=6)).strategy.max_draft_tokens == 6
    assert dspark.wrap(llama, PromptLookupDrafter(), policy=FixedLength(2)).strategy.max_draft_tokens == 2
    strategy = dspark.wrap(llama, PromptLookupDrafter(), policy=FixedLength(2)).strategy
    assert strategy.policy == FixedLength(2) and strategy.confidence is None


@pytest.mark.parametrize("value, error", [(-1, ValueError), (2.0, TypeError), (True, TypeError)])
def test_wrap_refuses_bad_block_width(llama, value, error):
    """max_draft_tokens must be an int >= 0, and the message names it."""
    with pytest.raises(error, match="max_draft_tokens"):
        dspark.wrap(llama, PromptLookupDrafter(), max_draft_tokens=value)


def test_one_dimensional_prompt_is_a_batch_of_one(llama):
    """A 1-D input_ids is treated as one row, like HF generate."""
    prompt = torch.tensor([5, 6, 7, 5, 6])
    expected = llama.generate(prompt[None], max_new_tokens=8, do_sample=False)
    assert torch.equal(dspark.generate(llama, prompt, drafter=PromptLookupDrafter(), max_new_tokens=8).sequences, expected)


BAD_INPUTS = [
    ({"input_ids": [[1, 2, 3]]}, TypeError, "input_ids"),
    ({"input_ids": torch.tensor([[1.0, 2.0]])}, TypeError, "input_ids"),
    ({"input_ids": torch.zeros((1, 0), dtype=torch.long)}, ValueError, "input_ids"),
    ({"input_ids": torch.zeros((0, 3), dtype=torch.long)}, ValueError, "input_ids"),
    ({"input_ids": torch.tensor([[1, VOCAB]])}, ValueError, "input_ids"),
    ({"input_ids": torch.tensor([[1, -1]])}, ValueError, "input_ids"),
    ({"attention_mask": torch.ones((1, 4), dtype=torch.long)}, ValueError, "attention_mask"),
    ({"attention_mask": torch.tensor([[1, 1, 0]])}, ValueError, "attention_mask"),
    ({"attention_mask": torch.tensor([[1, 0, 1]])}, ValueError, "attention_mask"),
    ({"attention_mask": torch.tensor([[1.0, 1.0, 1.0]])}, TypeError, "attention_mask"),
    ({"attention_mask": torch.tensor([[2, 1, 1]])}, ValueError, "attention_mask"),
    ({"max_new_tokens": -1}, ValueError, "max_new_tokens"),
    ({"max_new_tokens": 2.5}, TypeError, "max_new_tokens"),
    ({"max_new_tokens": 5000}, ValueError, "max_new_tokens"),
    ({"do_sample": True, "temperature": 0.0}, ValueError, "temperature"),
    ({"do_sample": True, "temperature": -0.5}, ValueError, "temperature"),
    ({"do_sample": True, "top_p": 0.0}, ValueError, "top_p"),
    ({"do_sample": True, "top_p": 1.2}, ValueError, "top_p"),
    ({"do_sample": True, "top_k": -3}, ValueError, "top_k"),
    ({"eos_token_id": "eos"}, ValueError, "eos_token_id"),
    ({"eos_token_id": [VOCAB + 1]}, ValueError, "eos_token_id"),
    ({"generator": 42}, TypeError, "generator"),
    ({"input_ids": torch.tensor([[1, 2, 3], [4, 5, 6]]), "streamer": object()}, ValueError, "streamer"),
    ({"input_ids": torch.ones((1, 2100), dtype=torch.long)}, ValueError, "context"),
    ({"prefill_chunk_tokens": 0}, ValueError, "prefill_chunk_tokens"),
    ({"prefill_chunk_tokens": 64.0}, TypeError, "prefill_chunk_tokens"),
]


@pytest.mark.parametrize("overrides, error, argument", BAD_INPUTS)
def test_bad_input_is_refused_and_leaves_the_model_usable(llama, overrides, error, argument):
    """Bad input raises ValueError/TypeError naming the argument; weights and config are untouched; the next call works."""
    weights, config = _state(llama), llama.config.to_dict()
    speculative = dspark.wrap(llama, DraftModelDrafter(build_model("llama", seed=1)))
    arguments = {"input_ids": torch.tensor([[1, 2, 3]]), "max_new_tokens": 4, **overrides}
    with pytest.raises(error, match=argument):
        speculative.generate(**arguments)
    assert llama.config.to_dict() == config
    assert all(torch.equal(tensor, weights[name]) for name, tensor in llama.state_dict().items())
    expected = llama.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=4, do_sample=False)
    assert torch.equal(speculative.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=4).sequences, expected)


@pytest.mark.parametrize("setting, value", [("repetition_penalty", 1.2), ("no_repeat_ngram_size", 3), ("suppress_tokens", [5])])
def test_generation_config_settings_that_change_tokens_are_refused(setting, value):
    """A generation config that HF would apply but dspark does not is refused by name."""
    target = build_model("llama")
    setattr(target.generation_config, setting, value)
    with pytest.raises(ValueError, match=setting):
        dspark.generate(target, torch.tensor([[3, 4, 5]]), drafter=PromptLookupDrafter(), max_new_tokens=4)


def test_drafter_that_is_not_a_drafter_is_refused(llama):
    """Anything without propose/observe/vocab_size is refused with a TypeError naming drafter."""
    with pytest.raises(TypeError, match="drafter"):
        dspark.wrap(llama, object())
    with pytest.raises(TypeError, match="drafter"):
        dspark.generate(llama, torch.tensor([[1, 2]]), drafter="ngram")


def test_drafter_vocabulary_mismatch_is_refused(llama):
    """A draft model with another vocabulary size is refused, naming both sizes."""
    with pytest.raises(ValueError, match=f"vocabulary size 64 differs from the target's {VOCAB}"):
        dspark.wrap(llama, DraftModelDrafter(build_model("llama", vocab_size=64)))


def test_threshold_without_confidence_is_refused(llama):
    """A policy that needs survival estimates without an estimator is refused at wrap time."""
    with pytest.raises(ValueError, match="confidence"):
        dspark.wrap(llama, PromptLookupDrafter(), policy=Threshold(0.5))


def test_cache_types_that_cannot_hold_holes_are_refused():
    """A sliding window narrower than the generation is refused up front, naming the window."""
    target = build_model("mistral", sliding_window=16)
    with pytest.raises(ValueError, match="sliding-window"):
        dspark.generate(target, torch.tensor([[3, 4, 5]]), drafter=PromptLookupDrafter(), max_new_tokens=40)
    result = dspark.generate(target, torch.tensor([[3, 4, 5]]), drafter=PromptLookupDrafter(), max_new_tokens=4, max_draft_tokens=2)
    assert torch.equal(result.sequences, target.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=4, do_sample=False))


def _word_tokenizer() -> PreTrainedTokenizerFast:
    vocabulary = {f"w{index}": index for index in range(VOCAB)}
    backend = Tokenizer(WordLevel(vocabulary, unk_token="w0"))
    backend.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="w0")


def test_streaming_with_a_transformers_streamer(llama):
    """TextIteratorStreamer receives exactly the generated text at batch 1."""
    tokenizer = _word_tokenizer()
    prompt = torch.tensor([[5, 6, 7, 5, 6, 7]])
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True)
    result = dspark.generate(llama, prompt, drafter=PromptLookupDrafter(), max_new_tokens=15, streamer=streamer, eos_token_id=[])
    streamed = "".join(streamer)
    assert streamed.split() == tokenizer.decode(result.sequences[0, prompt.shape[1] :]).split()


def test_accelerate_dispatched_target_works_unchanged(tmp_path):
    """A target dispatched by accelerate over CPU and disk offload gives the same greedy output."""
    target = build_model("llama")
    reference = copy.deepcopy(target)
    device_map = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk", "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
    dispatched = dispatch_model(target, device_map=device_map, offload_dir=str(tmp_path))
    input_ids, attention_mask = left_padded_batch([7, 12, 3])
    expected = reference.generate(input_ids, attention_mask=attention_mask, max_new_tokens=20, do_sample=False)
    for drafter in (PromptLookupDrafter(), DraftModelDrafter(reference)):
        result = dspark.generate(dispatched, input_ids, drafter=drafter, attention_mask=attention_mask, max_new_tokens=20)
        assert torch.equal(result.sequences, expected)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_targets_run(dtype):
    """bf16 and fp16 targets generate (acceptance math runs in float32) and self-drafting accepts everything."""
    target = build_model("llama").to(dtype)
    input_ids, attention_mask = left_padded_batch([5, 9])
    result = dspark.wrap(target, DraftModelDrafter(target), policy=Threshold(0.0), confidence=DraftProbability(), max_draft_tokens=3).generate(
        input_ids, attention_mask=attention_mask, max_new_tokens=12, eos_token_id=[]
    )
    expected = target.generate(input_ids, attention_mask=attention_mask, max_new_tokens=1, do_sample=False)
    assert result.sequences.shape == (2, input_ids.shape[1] + 12)
    assert torch.equal(result.sequences[:, : expected.shape[1]], expected)
    assert result.stats.tau == pytest.approx(4.0)
