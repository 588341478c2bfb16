"""Input checks for ``generate``: every refusal names the argument, the value and what is allowed."""

from __future__ import annotations

import inspect

import torch

from dspark.protocols import Drafter

__all__ = ["check_prompt", "check_max_new_tokens", "check_drafter", "check_forward_signature", "context_length", "eos_ids"]


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
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise TypeError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    return max_new_tokens


def check_drafter(drafter, vocab_size: int) -> None:
    """Refuse objects that are not Drafters and drafters whose vocabulary is not the target's."""
    if not isinstance(drafter, Drafter):
        raise TypeError(
            f"drafter must implement dspark.Drafter (propose(context, max_tokens), observe(outcome), vocab_size), "
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
