"""The embedded SmolLM2-135M-Instruct target (dspark/pretrained.py) and the CLI (dspark/cli.py)."""

import pytest
import torch
from safetensors import safe_open

import dspark
from dspark import pretrained
from dspark.drafters import PromptLookupDrafter, SemiARConfig, SemiARDrafter, TargetSignature

pytestmark = pytest.mark.integration

PROMPTS = [
    "List three prime numbers.",
    "Write a Python function that returns the square of a number, and explain it in one sentence.",
    "Repeat after me: the cat sat on the mat, the cat sat on the mat.",
]


@pytest.fixture(scope="module")
def bundle():
    return pretrained.load("smollm2-135m-instruct")


def _chat_batch(tokenizer, prompts):
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False) for p in prompts]
    tokenizer.padding_side = "left"
    encoded = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    return encoded["input_ids"], encoded["attention_mask"]


def test_bundle_parts(bundle):
    """The bundle carries a Llama target, its tokenizer and the DSpark drafter shipped for it."""
    assert bundle.target.config.vocab_size == 49152
    assert isinstance(bundle.drafter, SemiARDrafter)
    assert bundle.drafter.config.sequential == "markov" and bundle.drafter.config.max_draft_tokens == 7
    assert bundle.tokenizer.eos_token == "<|im_end|>"


def test_shipped_drafter_files():
    """The shipped drafter is a small fp16 safetensors file with its config and a model card naming the data licenses."""
    directory = pretrained.shipped_drafter("smollm2-135m-instruct")
    assert directory is not None
    assert (directory / "model.safetensors").stat().st_size <= 30 * 2**20
    card = (directory / "README.md").read_text()
    assert "CC BY-NC 4.0" in card and "dspark train" in card
    with safe_open(str(directory / "model.safetensors"), framework="pt") as weights:
        assert {weights.get_slice(name).get_dtype() for name in weights.keys()} <= {"F16", "I64"}


def test_prompt_lookup_on_request():
    """load(drafter="prompt-lookup") bundles the training-free n-gram drafter instead."""
    loaded = pretrained.load("smollm2-135m-instruct", drafter=pretrained.PROMPT_LOOKUP)
    assert isinstance(loaded.drafter, PromptLookupDrafter)


def test_greedy_equals_hf_generate_on_smollm2(bundle):
    """With the shipped drafter and its default policy, a mixed-length batch of chat prompts gives exactly HF's greedy output."""
    input_ids, attention_mask = _chat_batch(bundle.tokenizer, PROMPTS)
    expected = bundle.target.generate(input_ids, attention_mask=attention_mask, max_new_tokens=40, do_sample=False)
    result = dspark.wrap(bundle.target, bundle.drafter).generate(input_ids, attention_mask=attention_mask, max_new_tokens=40)
    assert torch.equal(result.sequences, expected)
    assert result.stats.tau > 1.0


def test_bundle_with_a_trained_drafter_directory(bundle, tmp_path):
    """load(drafter=DIR) bundles that SemiARDrafter, and its greedy output equals HF's."""
    torch.manual_seed(0)
    config = SemiARConfig(target=TargetSignature.of(bundle.target), target_layers=(1, 15, 29), num_heads=9, draft_vocab_size=512)
    SemiARDrafter(config, bundle.target, draft_vocab=torch.arange(512)).save_pretrained(tmp_path)
    loaded = pretrained.load("smollm2-135m-instruct", drafter=tmp_path)
    assert isinstance(loaded.drafter, SemiARDrafter) and loaded.drafter.config == config
    input_ids, attention_mask = _chat_batch(loaded.tokenizer, PROMPTS[:2])
    expected = loaded.target.generate(input_ids, attention_mask=attention_mask, max_new_tokens=12, do_sample=False)
    result = dspark.wrap(loaded.target, loaded.drafter).generate(input_ids, attention_mask=attention_mask, max_new_tokens=12)
    assert torch.equal(result.sequences, expected)


def test_drafter_argument_is_checked(tmp_path):
    """A drafter that is not a path, or a directory without a saved drafter, is refused by name."""
    with pytest.raises(TypeError, match="drafter"):
        pretrained.load("smollm2-135m-instruct", drafter=3)
    with pytest.raises(ValueError, match="config.json"):
        pretrained.load("smollm2-135m-instruct", drafter=tmp_path)


def test_unknown_model_name_is_refused():
    """Unknown names raise ValueError listing the known ones."""
    with pytest.raises(ValueError, match="smollm2-135m-instruct"):
        pretrained.load("gpt-17")



def test_load_checkpoint_reads_the_cached_folder(bundle):
    """load_checkpoint on the folder load_target caches gives the same weights and tokenizer, in the dtype asked for."""
    target, tokenizer = pretrained.load_checkpoint(pretrained.default_cache_dir() / "smollm2-135m-instruct", dtype=torch.bfloat16)
    assert not target.training and target.dtype == torch.bfloat16
    expected = bundle.target.get_input_embeddings().weight.to(torch.bfloat16)
    assert torch.equal(target.get_input_embeddings().weight, expected)
    assert tokenizer("List three prime numbers.")["input_ids"] == bundle.tokenizer("List three prime numbers.")["input_ids"]


def test_load_checkpoint_refuses_what_it_cannot_read(tmp_path):
    """A folder with neither config.json nor exactly one .gguf file, a non-path and a non-float dtype are refused by name."""
    with pytest.raises(ValueError, match=r"exactly one \.gguf file.*\[\]"):
        pretrained.load_checkpoint(tmp_path)
    (tmp_path / "a.gguf").write_bytes(b"")
    (tmp_path / "b.gguf").write_bytes(b"")
    with pytest.raises(ValueError, match="'a.gguf', 'b.gguf'"):
        pretrained.load_checkpoint(tmp_path)
    with pytest.raises(TypeError, match="path"):
        pretrained.load_checkpoint(3)
    with pytest.raises(TypeError, match="dtype"):
        pretrained.load_checkpoint(tmp_path, dtype=torch.int64)
