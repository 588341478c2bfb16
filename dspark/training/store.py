"""The target's view of every training sequence, computed once and kept on disk.

One target forward per regenerated sequence gives the hidden states of the drafter's target layers
and the target's top-K next-token distributions (the LM head runs only where a block can sit). They
are kept as safetensors shards, which a rerun reuses.
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

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


def _target_sequence(target, record: dict, layers: tuple[int, ...], top_k: int, max_sequence_tokens: int) -> TargetSequence:
    tokens = torch.tensor(record["prompt_ids"] + record["response_ids"])[:max_sequence_tokens]
    prompt_length = min(len(record["prompt_ids"]), tokens.numel())
    device = target.get_input_embeddings().weight.device
    positions = torch.arange(prompt_length - 1, tokens.numel(), device=device)
    features, probs = target_features(target, tokens[None].to(device), layers, positions)
    top_probs, top_ids = probs[0].topk(min(top_k, probs.shape[-1]), dim=-1)
    return TargetSequence(tokens, prompt_length, features[0].half().cpu(), top_ids.int().cpu(), top_probs.cpu())


def build_target_store(
    target,
    records: list[dict],
    layers: tuple[int, ...],
    top_k: int = 32,
    max_sequence_tokens: int = 768,
    directory: str | Path | None = None,
    shard_size: int = 64,
    progress=None,
) -> list[TargetSequence]:
    """One ``TargetSequence`` per record: a single target forward each, instead of one per training step.

    With ``directory``, shards of ``shard_size`` sequences are written as safetensors and reused by a
    rerun (a shard is recomputed when its record ids, layers or K differ). ``progress``: tqdm-like bar.
    """
    if top_k < 1:
        raise ValueError(f"top_k must be at least 1, got {top_k!r}")
    directory = None if directory is None else Path(directory)
    store = []
    for start in range(0, len(records), shard_size):
        shard = records[start : start + shard_size]
        identity = json.dumps({"ids": [(r["id"], r["mode"]) for r in shard], "layers": list(layers), "top_k": top_k, "max_tokens": max_sequence_tokens})
        path = None if directory is None else directory / f"shard-{start // shard_size:05d}.safetensors"
        if path is not None and path.is_file() and _shard_identity(path) == identity:
            store.extend(_read_shard(path, len(shard)))
        else:
            sequences = [_target_sequence(target, record, layers, top_k, max_sequence_tokens) for record in shard]
            if path is not None:
                _write_shard(path, sequences, identity)
            store.extend(sequences)
        if progress is not None:
            progress.update(len(shard))
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
