"""Input checks for ``generate``: every refusal names the argument, the value and what is allowed."""

from __future__ import annotations

import inspect
import math

import torch

from dspark.checks import check_int
from dspark.protocols import Drafter

__all__ = [
    "check_prompt",
    "check_max_new_tokens",
    "check_drafter",
    "check_forward_signature",
    "check_generation_config",
    "check_generator",
    "check_row_values",
    "context_length",
    "eos_ids",
]

# Generation-config fields that change which token HF generate picks, with the values that do not.
_NEUTRAL_GENERATION_SETTINGS = {
    "repetition_penalty": (None, 1.0),
    "encoder_repetition_penalty": (None, 1.0),
    "no_repeat_ngram_size": (None, 0),
    "min_new_tokens": (None, 0),
    "min_length": (None, 0),
    "suppress_tokens": (None, []),
    "begin_suppress_tokens": (None, []),
    "bad_words_ids": (None, []),
    "sequence_bias": (None, {}),
    "forced_bos_token_id": (None,),
    "forced_eos_token_id": (None,),
    "exponential_decay_length_penalty": (None,),
    "guidance_scale": (None, 1.0),
    "watermarking_config": (None,),
}


def check_prompt(input_ids, attention_mask, vocab_size: int):
    """Return (input_ids, attention_mask) after checking dtype, shape, ids and left padding."""
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids must be a torch.LongTensor of shape [batch, length], got {type(input_ids).__name__}")
    if input_ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
        raise TypeError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
    if input_ids.dim() == 1:
        input_ids = input_ids[None, :]
    if input_ids.dim() != 2 or input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must be a non-empty [batch, length] tensor, got shape {tuple(input_ids.shape)}")
    input_ids = input_ids.long()
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or high >= vocab_size:
        raise ValueError(f"input_ids must be token ids in [0, {vocab_size}), got values in [{low}, {high}]")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if not isinstance(attention_mask, torch.Tensor):
        raise TypeError(f"attention_mask must be a tensor of 0/1 or None, got {type(attention_mask).__name__}")
    if attention_mask.dim() == 1:
        attention_mask = attention_mask[None, :]
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask must have the shape of input_ids {tuple(input_ids.shape)}, got {tuple(attention_mask.shape)}"
        )
    if attention_mask.dtype.is_floating_point or attention_mask.dtype.is_complex:
        raise TypeError(f"attention_mask must be an integer or bool tensor of 0/1, got dtype {attention_mask.dtype}")
    attention_mask = attention_mask.long().to(input_ids.device)
    if not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
        raise ValueError("attention_mask must contain only 0 and 1")
    # Left padding only: each row is zeros then ones, the last column all ones.
    if not bool((attention_mask[:, 1:] >= attention_mask[:, :-1]).all()) or not bool(attention_mask[:, -1].all()):
        raise ValueError(
            "attention_mask must describe left-padded prompts (each row 0…0 1…1, the last column all 1); "
            "tokenize with padding_side='left'"
        )
    return input_ids, attention_mask


def check_max_new_tokens(max_new_tokens) -> int:
    """Return ``max_new_tokens`` after checking it is an int >= 0."""
    return check_int("max_new_tokens", max_new_tokens, 0)


def check_drafter(drafter, vocab_size: int) -> None:
    """Refuse objects that are not Drafters and drafters whose vocabulary is not the target's."""
    if not isinstance(drafter, Drafter):
        raise TypeError(
            f"drafter must implement dspark.Drafter (propose(context, max_draft_tokens), observe(outcome), vocab_size), "
            f"got {type(drafter).__name__}"
        )
    if drafter.vocab_size is not None and drafter.vocab_size != vocab_size:
        raise ValueError(
            f"drafter vocabulary size {drafter.vocab_size} differs from the target's {vocab_size}; "
            f"the drafter must share the target's tokenizer and vocabulary"
        )


def check_forward_signature(model) -> frozenset:
    """Return the forward arguments the loop may pass; refuse models without a cache or attention mask."""
    parameters = inspect.signature(model.forward).parameters
    missing = [name for name in ("attention_mask", "cache") if name not in parameters]
    if missing:
        raise ValueError(
            f"{type(model).__name__}.forward lacks the arguments {missing}; dspark needs a causal LM that takes "
            f"attention_mask and a key/value cache"
        )
    return frozenset(name for name in ("position_ids", "logits_to_keep") if name in parameters)


def check_generation_config(generation_config) -> None:
    """Refuse generation-config settings that make HF generate pick other tokens than plain decoding.

    dspark reproduces plain greedy decoding and sampling from the warped target distribution; a
    repetition penalty, banned n-grams, forced tokens and the like would make its output differ from
    ``model.generate`` silently, so they are refused by name rather than ignored.
    """
    for name, neutral in _NEUTRAL_GENERATION_SETTINGS.items():
        value = getattr(generation_config, name, None)
        if value not in neutral:
            raise ValueError(
                f"the model's generation_config.{name}={value!r} changes the decoded tokens and dspark does not apply it; "
                f"allowed: {' or '.join(repr(v) for v in neutral)} (set it on a copy of the generation config)"
            )


def check_generator(generator, device: torch.device) -> None:
    """Refuse a generator that is not a torch.Generator on the device of input_ids."""
    if generator is None:
        return
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    if generator.device.type != device.type:
        raise ValueError(f"generator must live on the device of input_ids ({device}), got a generator on {generator.device}")


def context_length(config) -> int | None:
    """The longest sequence the model accepts, if its config says."""
    text_config = config.get_text_config(decoder=True)
    for name in ("max_position_embeddings", "n_positions", "seq_length"):
        value = getattr(text_config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def eos_ids(eos_token_id, vocab_size: int) -> list[int]:
    """Normalize None / int / list of ints to a list of ids in the vocabulary."""
    if eos_token_id is None:
        return []
    values = [eos_token_id] if isinstance(eos_token_id, int) else eos_token_id
    if not isinstance(values, (list, tuple)) or any(isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < vocab_size for v in values):
        raise ValueError(f"eos_token_id must be None, an int or a list of ints in [0, {vocab_size}), got {eos_token_id!r}")
    return list(values)


def check_row_values(name: str, values, rows: int, device: torch.device, integer: bool) -> torch.Tensor | None:
    """One value per batch row as a tensor on ``device`` (LongTensor of ints >= 0 when ``integer``, else
    FloatTensor of finite numbers > 0), or None for None; refuses anything else, naming ``name``."""
    if values is None:
        return None
    allowed = "ints >= 0" if integer else "finite numbers > 0"
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().tolist() if values.dim() == 1 else values
    if not isinstance(values, (list, tuple)) or len(values) != rows:
        raise ValueError(f"{name} must be a sequence (or 1-D tensor) of {rows} {allowed}, one per row of input_ids, got {values!r}")
    for value in values:
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if integer and not (number and float(value).is_integer() and value >= 0):
            raise ValueError(f"{name} must hold {allowed}, got {values!r}")
        if not integer and not (number and math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must hold {allowed}, got {values!r}")
    return torch.tensor([int(value) for value in values] if integer else [float(value) for value in values], device=device)
