"""The target's view of every training sequence, computed once and kept on disk.

One target forward per regenerated sequence (or per right-padded batch of them) gives the hidden
states of the drafter's target layers and the target's top-K next-token distributions (the LM head
runs only where a block can sit). They are kept as safetensors shards, which a rerun reuses.
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from dspark.checks import check_int

__all__ = ["TargetSequence", "build_target_store", "target_features"]


@torch.no_grad()
def target_features(target, tokens: torch.Tensor, layers: tuple[int, ...], positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's hidden states of ``layers`` at every position of ``tokens`` [1, L], concatenated,
    and its next-token distributions at ``positions`` only (the LM head runs nowhere else)."""
    outputs = target(input_ids=tokens, output_hidden_states=True, logits_to_keep=positions)
    features = torch.cat([outputs.hidden_states[layer] for layer in layers], dim=-1)
    return features.float().to(tokens.device), outputs.logits.float().softmax(dim=-1).to(tokens.device)


@attrs.frozen(eq=False)
class TargetSequence:
    """What training needs from the target for one regenerated sequence, computed once.

    ``tokens`` [L]; ``features`` [L, m·d] the hidden states of the drafter's target layers (fp16);
    ``top_ids`` / ``top_probs`` [L − P + 1, K]: the target's K most likely next tokens after each
    position from the last prompt token (P − 1) on, where every anchor block lives.
    """

    tokens: torch.Tensor
    prompt_length: int
    features: torch.Tensor
    top_ids: torch.Tensor
    top_probs: torch.Tensor


def _token_rows(records: list[dict], max_sequence_tokens: int) -> tuple[list[torch.Tensor], list[int]]:
    """Each record's prompt and answer tokens cut to ``max_sequence_tokens``, and its prompt length within them."""
    empty = [record["id"] for record in records if not record["prompt_ids"]]
    if empty:
        raise ValueError(f"records must each have a prompt (the first anchor is its last token), got empty prompt_ids in {empty!r}")
    rows = [torch.tensor(record["prompt_ids"] + record["response_ids"])[:max_sequence_tokens] for record in records]
    return rows, [min(len(record["prompt_ids"]), tokens.numel()) for record, tokens in zip(records, rows)]


@torch.no_grad()
def _target_batch(target, records: list[dict], layers: tuple[int, ...], top_k: int, max_sequence_tokens: int) -> list[TargetSequence]:
    """The ``TargetSequence`` of each of ``records`` from one forward over them, right-padded.

    Right padding keeps every real token at its own position, and causal attention keeps the padding
    out of what real positions see. The LM head runs on the last ``longest − shortest prompt + 1``
    positions (``logits_to_keep``), which cover every row's span from its last prompt token on.
    """
    token_rows, prompt_lengths = _token_rows(records, max_sequence_tokens)
    width = max(tokens.numel() for tokens in token_rows)
    input_ids = torch.zeros((len(records), width), dtype=torch.long)  # the pad id is masked, so any id does
    attention_mask = torch.zeros_like(input_ids)
    for row, tokens in enumerate(token_rows):
        input_ids[row, : tokens.numel()] = tokens
        attention_mask[row, : tokens.numel()] = 1
    device = target.get_input_embeddings().weight.device
    first = min(prompt_lengths) - 1  # logits row 0 is the next-token distribution after this position
    outputs = target(
        input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), output_hidden_states=True, use_cache=False,
        logits_to_keep=width - first,
    )
    features = torch.cat([outputs.hidden_states[layer] for layer in layers], dim=-1)
    sequences = []
    for row, (tokens, prompt_length) in enumerate(zip(token_rows, prompt_lengths)):
        logits = outputs.logits[row, prompt_length - 1 - first : tokens.numel() - first]
        top_probs, top_ids = logits.float().softmax(dim=-1).topk(min(top_k, logits.shape[-1]), dim=-1)
        sequences.append(TargetSequence(tokens, prompt_length, features[row, : tokens.numel()].half().cpu(), top_ids.int().cpu(), top_probs.cpu()))
    return sequences


def _shard_sequences(target, shard: list[dict], layers: tuple[int, ...], top_k: int, max_sequence_tokens: int, batch_size: int, progress) -> list[TargetSequence]:
    """The ``TargetSequence`` of every record of ``shard``, in its order, ``batch_size`` records per
    forward; records of similar length share a batch, so little of it is padding."""
    order = sorted(range(len(shard)), key=lambda index: len(shard[index]["prompt_ids"]) + len(shard[index]["response_ids"]))
    computed = {}
    for start in range(0, len(order), batch_size):
        indices = order[start : start + batch_size]
        computed |= zip(indices, _target_batch(target, [shard[index] for index in indices], layers, top_k, max_sequence_tokens))
        if progress is not None:
            progress.update(len(indices))
    return [computed[index] for index in range(len(shard))]


def build_target_store(
    target,
    records: list[dict],
    layers: tuple[int, ...],
    top_k: int = 32,
    max_sequence_tokens: int = 768,
    directory: str | Path | None = None,
    shard_size: int = 64,
    progress=None,
    batch_size: int = 1,
) -> list[TargetSequence]:
    """One ``TargetSequence`` per record, computed once instead of once per training step.

    ``batch_size`` records (of similar length, within a shard) share one right-padded target forward
    on the target's device; the results come back to the CPU. What the forward holds grows with it:
    the LM head's output is ``batch_size × (longest sequence − shortest prompt + 1) × vocabulary``
    values of the target's dtype, and the hidden states of every layer ``batch_size × longest ×
    hidden size × (layers + 1)``. Results equal those of ``batch_size=1`` up to the target's rounding.

    With ``directory``, shards of ``shard_size`` sequences are written as safetensors and reused by a
    rerun (a shard is recomputed when its record ids, layers or K differ; ``batch_size`` is no part of
    that, so a store built either way is reused). ``progress``: tqdm-like bar, one step per record.
    """
    if top_k < 1:
        raise ValueError(f"top_k must be at least 1, got {top_k!r}")
    check_int("batch_size", batch_size, 1)
    directory = None if directory is None else Path(directory)
    store = []
    for start in range(0, len(records), shard_size):
        shard = records[start : start + shard_size]
        identity = json.dumps({"ids": [(r["id"], r["mode"]) for r in shard], "layers": list(layers), "top_k": top_k, "max_tokens": max_sequence_tokens})
        path = None if directory is None else directory / f"shard-{start // shard_size:05d}.safetensors"
        if path is not None and path.is_file() and _shard_identity(path) == identity:
            store.extend(_read_shard(path, len(shard)))
            if progress is not None:
                progress.update(len(shard))
        else:
            sequences = _shard_sequences(target, shard, layers, top_k, max_sequence_tokens, batch_size, progress)
            if path is not None:
                _write_shard(path, sequences, identity)
            store.extend(sequences)
    return store


def _shard_identity(path: Path) -> str | None:
    with safe_open(str(path), framework="pt") as handle:
        return (handle.metadata() or {}).get("identity")


def _write_shard(path: Path, sequences: list[TargetSequence], identity: str) -> None:
    tensors = {}
    for index, sequence in enumerate(sequences):
        tensors |= {
            f"{index}.tokens": sequence.tokens,
            f"{index}.prompt_length": torch.tensor([sequence.prompt_length]),
            f"{index}.features": sequence.features.contiguous(),
            f"{index}.top_ids": sequence.top_ids.contiguous(),
            f"{index}.top_probs": sequence.top_probs.contiguous(),
        }
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(path.name + ".partial")
    save_file(tensors, str(staging), metadata={"identity": identity})
    staging.rename(path)


def _read_shard(path: Path, count: int) -> list[TargetSequence]:
    tensors = load_file(str(path))
    return [
        TargetSequence(
            tensors[f"{index}.tokens"], int(tensors[f"{index}.prompt_length"]), tensors[f"{index}.features"],
            tensors[f"{index}.top_ids"], tensors[f"{index}.top_probs"],
        )
        for index in range(count)
    ]
