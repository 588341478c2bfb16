"""Training a SemiARDrafter on a target store: anchor blocks, AdamW, resumable checkpoints.

Each step draws ``sequences_per_step`` stored sequences and ``anchors_per_sequence`` anchor blocks
from each, computes the distillation loss of the drafter's teacher-forced outputs and takes one
AdamW step (warm-up, then cosine decay). Checkpoints (drafter weights, optimiser moments, step) are
written atomically and resumed from; ``validate`` scores fixed held-out blocks.
"""

from __future__ import annotations

import collections
import json
import math
import random
import time
from pathlib import Path
from typing import Iterator

import attrs
import torch
from safetensors.torch import load_file, save_file

from dspark.drafters.semi_ar import SemiARDrafter
from dspark.training.losses import distillation_loss
from dspark.training.store import TargetSequence

__all__ = ["TrainConfig", "sample_anchors", "train", "validate"]


def sample_anchors(prompt_length: int, length: int, max_draft_tokens: int, count: int, generator: torch.Generator) -> torch.Tensor | None:
    """Up to ``count`` distinct anchor positions a ∈ [prompt_length − 1, length − 1 − γ] (None if none fit)."""
    low, high = prompt_length - 1, length - 1 - max_draft_tokens
    if high < low:
        return None
    candidates = torch.arange(low, high + 1)
    chosen = torch.randperm(candidates.numel(), generator=generator)[:count]
    return candidates[chosen].sort().values


PRECISIONS = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _loss_weights(instance, attribute, value) -> None:
    if len(value) != 3 or not all(isinstance(weight, (int, float)) and weight >= 0 for weight in value):
        raise ValueError(f"loss_weights must be three non-negative numbers (α_ce, α_tv, α_conf), got {value!r}")


@attrs.frozen
class TrainConfig:
    """Optimisation settings of ``train``."""

    steps: int = 1000
    learning_rate: float = 3e-4
    warmup_steps: int = 50
    sequences_per_step: int = 4
    anchors_per_sequence: int = 16
    weight_decay: float = 0.0
    gradient_clip: float = 1.0
    loss_weights: tuple[float, float, float] = attrs.field(default=(0.1, 0.9, 1.0), converter=tuple, validator=_loss_weights)  # α_ce, α_tv, α_conf
    checkpoint_every: int = 100
    validate_every: int = 200
    log_every_seconds: float = 60.0
    seed: int = 0
    # The drafter's forward under autocast in this dtype (weights, optimiser and loss stay float32):
    # bfloat16 runs its products 2-3.5x faster on CPUs with AVX512-BF16 or AMX and on GPUs.
    precision: str = attrs.field(default="float32", validator=attrs.validators.in_(tuple(PRECISIONS)))


def _sequences_forever(items: list, seed: int) -> Iterator:
    rng = random.Random(seed)
    while True:
        order = list(range(len(items)))
        rng.shuffle(order)
        yield from (items[index] for index in order)


def _learning_rate(config: TrainConfig, step: int) -> float:
    if step < config.warmup_steps:
        return config.learning_rate * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.learning_rate * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def _save_checkpoint(drafter: SemiARDrafter, optimizer: torch.optim.Optimizer, step: int, directory: Path) -> None:
    """Drafter weights via save_pretrained, optimizer moments as safetensors, the step as JSON."""
    staging = directory.with_name(directory.name + ".partial")
    drafter.save_pretrained(staging)
    names = [name for name, parameter in drafter.named_parameters() if parameter.requires_grad]
    state = {}
    for name, parameter in zip(names, (p for p in drafter.parameters() if p.requires_grad)):
        for key, value in optimizer.state.get(parameter, {}).items():
            if torch.is_tensor(value):
                state[f"{name}.{key}"] = value.detach().contiguous().cpu()
    save_file(state, str(staging / "optimizer.safetensors"))
    (staging / "trainer_state.json").write_text(json.dumps({"step": step}))
    if directory.exists():
        for file in directory.iterdir():
            file.unlink()
        directory.rmdir()
    staging.rename(directory)


def _load_checkpoint(drafter: SemiARDrafter, optimizer: torch.optim.Optimizer, directory: Path) -> int:
    drafter.load_state_dict(load_file(str(directory / "model.safetensors")))
    state = load_file(str(directory / "optimizer.safetensors"))
    for name, parameter in drafter.named_parameters():
        # AdamW keeps its step counter on the CPU; the moments live with their parameter.
        moments = {
            key.rsplit(".", 1)[1]: value if key.endswith(".step") else value.to(parameter.device)
            for key, value in state.items()
            if key.rsplit(".", 1)[0] == name
        }
        if moments:
            optimizer.state[parameter] = moments
    return json.loads((directory / "trainer_state.json").read_text())["step"]


def _sequence_loss(drafter: SemiARDrafter, sequence: TargetSequence, anchors: torch.Tensor, weights, precision: str = "float32") -> tuple[torch.Tensor, dict]:
    """The distillation loss of the anchor blocks ``anchors`` of one stored sequence, and its terms;
    the drafter's forward runs under autocast to ``precision`` (a key of PRECISIONS)."""
    device, dtype, width = drafter.draft_vocab.device, drafter.mask_embedding.dtype, drafter.config.max_draft_tokens
    # Block position k of anchor a predicts the token after a + k: label row a + k − (P − 1).
    block = anchors[:, None] + torch.arange(width)
    rows = block - (sequence.prompt_length - 1)
    tokens = sequence.tokens.to(device)
    autocast = PRECISIONS[precision]
    with torch.autocast(device_type=device.type, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
        logits, confidence = drafter.training_outputs(sequence.features[None].to(device, dtype), tokens[None], anchors[None].to(device))
    return distillation_loss(
        logits[0], confidence[0], sequence.top_ids[rows].to(device), sequence.top_probs[rows].to(device),
        tokens[block.to(device) + 1], drafter.draft_vocab, weights=weights,
    )


@torch.no_grad()
def validate(drafter: SemiARDrafter, sequences: list[TargetSequence], config: TrainConfig) -> dict:
    """Mean loss terms over held-out ``sequences`` on anchors fixed by ``config.seed``, so every call
    scores the same blocks; the number that tells learning from memorising."""
    generator = torch.Generator().manual_seed(config.seed)
    was_training = drafter.training
    drafter.eval()
    totals, count = collections.Counter(), 0
    for sequence in sequences:
        anchors = sample_anchors(sequence.prompt_length, sequence.tokens.numel(), drafter.config.max_draft_tokens, config.anchors_per_sequence, generator)
        if anchors is None:
            continue
        loss, terms = _sequence_loss(drafter, sequence, anchors, config.loss_weights, config.precision)
        totals.update(terms | {"loss": float(loss)})
        count += 1
    drafter.train(was_training)
    return {key: value / count for key, value in totals.items()} if count else {}


def train(
    drafter: SemiARDrafter,
    store: list[TargetSequence],
    config: TrainConfig,
    checkpoint_dir: str | Path | None = None,
    progress=None,
    log=print,
    validation: list[TargetSequence] | None = None,
) -> list[dict]:
    """Distil ``drafter`` from the target's precomputed view ``store`` (see ``build_target_store``);
    returns one log entry per step.

    Resumes from ``checkpoint_dir`` when it holds a checkpoint, and writes one every
    ``config.checkpoint_every`` steps and at the end. ``progress`` is an optional tqdm-like bar.
    With held-out ``validation`` sequences, every ``config.validate_every`` steps and at the end the
    entry also carries ``validation`` (see ``validate``), and the log line reports it.
    """
    if not store:
        raise ValueError("store must hold at least one target sequence, got none")
    feature_width = len(drafter.target_layers) * drafter.config.hidden_size
    if store[0].features.shape[-1] != feature_width:
        raise ValueError(f"store features must have width {feature_width} (the drafter's target_layers), got {store[0].features.shape[-1]}")
    generator = torch.Generator().manual_seed(config.seed)
    trainable = [parameter for parameter in drafter.parameters() if parameter.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=config.learning_rate, weight_decay=config.weight_decay)
    checkpoint_dir = None if checkpoint_dir is None else Path(checkpoint_dir)
    start = 0
    if checkpoint_dir is not None and (checkpoint_dir / "trainer_state.json").is_file():
        start = _load_checkpoint(drafter, optimizer, checkpoint_dir)
        log(f"resumed from step {start} in {checkpoint_dir}")
        if progress is not None:
            progress.update(start)
    sequences = _sequences_forever(store, config.seed + start)
    width = drafter.config.max_draft_tokens
    history, last_log = [], time.monotonic()
    drafter.train()
    for step in range(start, config.steps):
        for group in optimizer.param_groups:
            group["lr"] = _learning_rate(config, step)
        optimizer.zero_grad(set_to_none=True)
        step_terms, used = [], 0
        while used < config.sequences_per_step:
            sequence = next(sequences)
            anchors = sample_anchors(sequence.prompt_length, sequence.tokens.numel(), width, config.anchors_per_sequence, generator)
            if anchors is None:
                continue
            used += 1
            loss, terms = _sequence_loss(drafter, sequence, anchors, config.loss_weights, config.precision)
            (loss / config.sequences_per_step).backward()
            step_terms.append(terms | {"loss": float(loss.detach())})
        torch.nn.utils.clip_grad_norm_(trainable, config.gradient_clip)
        optimizer.step()
        entry = {"step": step + 1, "lr": _learning_rate(config, step)} | {
            key: sum(t[key] for t in step_terms) / len(step_terms) for key in step_terms[0]
        }
        if validation and ((step + 1) % config.validate_every == 0 or step + 1 == config.steps):
            entry["validation"] = validate(drafter, validation, config)
            log(json.dumps({"step": step + 1, "validation": entry["validation"]}))
        history.append(entry)
        if progress is not None:
            progress.update(1)
            progress.set_postfix(loss=f"{entry['loss']:.3f}", acc=f"{entry['acceptance']:.3f}")
        if time.monotonic() - last_log >= config.log_every_seconds:
            log(json.dumps(entry))
            last_log = time.monotonic()
        if checkpoint_dir is not None and ((step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps):
            _save_checkpoint(drafter, optimizer, step + 1, checkpoint_dir)
    drafter.eval()
    return history
