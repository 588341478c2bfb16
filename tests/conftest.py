"""Tiny randomly initialised causal LMs of many architectures, built from configs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import transformers

VOCAB = 128
COMMON = dict(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, pad_token_id=0, initializer_range=0.3)
LLAMA_LIKE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)

# name -> (config class, model class, config keyword arguments)
ARCHITECTURES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", LLAMA_LIKE),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", LLAMA_LIKE),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {**LLAMA_LIKE, "head_dim": 8}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {**LLAMA_LIKE, "sliding_window": None}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {**LLAMA_LIKE, "head_dim": 8}),
    "phi": ("PhiConfig", "PhiForCausalLM", {**LLAMA_LIKE, "num_key_value_heads": 4}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {**LLAMA_LIKE, "pad_token_id": 0}),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", LLAMA_LIKE),
    "olmo": ("OlmoConfig", "OlmoForCausalLM", LLAMA_LIKE),
    "granite": ("GraniteConfig", "GraniteForCausalLM", LLAMA_LIKE),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_embd=32, n_layer=2, n_head=4, n_positions=2048)),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=2048)),
    "opt": ("OPTConfig", "OPTForCausalLM", dict(hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4, word_embed_proj_dim=32, max_position_embeddings=2048)),
    "falcon": ("FalconConfig", "FalconForCausalLM", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=2048)),
    "bloom": ("BloomConfig", "BloomForCausalLM", dict(hidden_size=32, n_layer=2, n_head=4)),
}


def load_script(name: str):
    """``benchmarks/<name>.py`` imported as a module, for testing a script's functions."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_model(name: str, seed: int = 0, vocab_size: int = VOCAB, **overrides) -> torch.nn.Module:
    """A deterministic tiny model of architecture ``name`` in eval mode, float32."""
    config_name, model_name, kwargs = ARCHITECTURES[name]
    config = getattr(transformers, config_name)(**{**COMMON, **kwargs, "vocab_size": vocab_size, **overrides})
    torch.manual_seed(seed)
    return getattr(transformers, model_name)(config).eval()


def left_padded_batch(lengths: list[int], vocab_size: int = VOCAB, seed: int = 0, pad_token_id: int = 0):
    """Random prompts of the given lengths, left-padded into (input_ids, attention_mask)."""
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    input_ids = torch.full((len(lengths), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for row, length in enumerate(lengths):
        # Ids from 3 up: no prompt token is BOS/EOS/pad, and repeats give prompt lookup something to find.
        tokens = torch.randint(3, min(vocab_size, 24), (length,), generator=generator)
        input_ids[row, width - length :] = tokens
        attention_mask[row, width - length :] = 1
    return input_ids, attention_mask


@pytest.fixture(scope="session", autouse=True)
def _fast_path_cache(tmp_path_factory):
    """Fast-path measurements and profiled cost tables of this run stay in scratch folders (subprocesses
    inherit them), never the user's cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DSPARK_FAST_PATH_CACHE", str(tmp_path_factory.mktemp("fast_path")))
        patch.setenv("DSPARK_COST_TABLE_CACHE", str(tmp_path_factory.mktemp("cost_tables")))
        yield


@pytest.fixture(scope="session")
def llama():
    """A tiny Llama shared by tests that do not care about architecture."""
    return build_model("llama")


def start_generation(drafter, rows: int, max_length: int = 64, max_draft_tokens: int = 8, sampling=None):
    """Call a stateful drafter's start hook as dspark's loop does before it proposes directly in a test."""
    from dspark.types import GenerationStart, SamplingConfig

    drafter.start(GenerationStart(rows=rows, device=torch.device("cpu"), max_draft_tokens=max_draft_tokens,
                                  max_length=max_length, sampling=sampling or SamplingConfig()))
    return drafter


# The project's prompt data, beside the checkout (tests that need it skip without it).
DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data"
TRAIN_DIR = DATA_DIR / "train"


def tiny_semi_ar_drafter(target, sequential="markov", max_draft_tokens=4, backbone="parallel", anchor_input="embedding"):
    """A small untrained SemiARDrafter for ``target`` (target layers 1 and 2), seeded."""
    from dspark.drafters import SemiARConfig, SemiARDrafter, TargetSignature

    config = SemiARConfig(
        target=TargetSignature.of(target), target_layers=(1, 2), max_draft_tokens=max_draft_tokens, num_heads=4, intermediate_size=64, rank=8,
        sequential=sequential, backbone=backbone, anchor_input=anchor_input,
    )
    torch.manual_seed(0)
    return SemiARDrafter(config, target)


def regenerated_records(target, count=12, prompt_length=6, new_tokens=40):
    """Records shaped like dspark.training.regenerate's: random prompts and the target's greedy answers."""
    generator = torch.Generator().manual_seed(1)
    records = []
    for index in range(count):
        prompt = torch.randint(3, 40, (1, prompt_length), generator=generator)
        output = target.generate(prompt, max_new_tokens=new_tokens, do_sample=False, eos_token_id=None)
        records.append({"id": str(index), "mode": "greedy", "prompt_ids": prompt[0].tolist(), "response_ids": output[0, prompt_length:].tolist()})
    return records


def word_tokenizer():
    """A word-level tokenizer over the tiny vocabulary (token i is "w<i>") with a minimal chat template."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(WordLevel({f"w{index}": index for index in range(VOCAB)}, unk_token="w0"))
    backend.pre_tokenizer = WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="w0", pad_token="w0")
    tokenizer.chat_template = (
        "{% for message in messages %}{% if message['role'] == 'assistant' %}w4 {% endif %}{{ message['content'] }} w3 {% endfor %}"
        "{% if add_generation_prompt %}w4 {% endif %}"
    )
    return tokenizer


def tiny_data_dir(tmp_path, per_source=6):
    """A data folder shaped like shared/data: train/ with the four sources, made of tiny-vocabulary words."""
    import json

    train = tmp_path / "data" / "train"
    train.mkdir(parents=True)
    words = lambda index, count: " ".join(f"w{5 + (index * 7 + j) % 30}" for j in range(count))  # noqa: E731
    rows = {
        "sharegpt_prompts.jsonl": [{"prompt": words(i, 4)} for i in range(per_source)],
        "alpaca_5k.jsonl": [{"instruction": words(i, 3), "input": "", "output": words(i + 1, 8)} for i in range(per_source)],
        "code_alpaca_2k.jsonl": [{"instruction": words(i + 2, 3), "input": words(i, 2), "output": words(i + 3, 8)} for i in range(per_source)],
        "gsm8k_train.jsonl": [{"question": words(i + 4, 5), "answer": words(i, 6) + " <<1+1=2>>"} for i in range(per_source)],
    }
    for name, records in rows.items():
        (train / name).write_text("".join(json.dumps(record) + "\n" for record in records))
    return tmp_path / "data"


class FixedSurvival:
    """An estimator giving every draft position the same survival (for point-mass drafts, which carry no q)."""

    def __init__(self, value: float = 0.6):
        self.value = value

    def survival(self, draft):
        return torch.full(draft.tokens.shape, self.value, device=draft.tokens.device)
