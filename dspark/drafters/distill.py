"""Distilling a SemiARDrafter from its target (paper §3.3).

1. ``training_prompts``: prompts from ``shared/data/train`` (never ``eval/``), split by a stable hash
   into a training part and a held-out calibration part.
2. ``regenerate``: the target answers every prompt itself (greedy and temperature-1 samples), so the
   drafter learns the target's own output; appended to a JSONL file, resumable. Mode 'reference' adds
   the dataset's own answers as extra contexts (EAGLE-style fixed data): cheap, since they need one
   target forward instead of hundreds, and the labels are still the target's distributions there.
3. ``distillation_loss``: L = α_ce·L_ce + α_tv·L_tv + α_conf·L_conf with position weights
   w_k = exp(−(k−1)/γ) (eqs. 9–12), the confidence target c*_k = 1 − ½‖p_d − p_t‖₁ (eq. 8).
4. ``build_target_store``: one target forward per sequence gives its features and top-K next-token
   distributions (the LM head only where a block can sit), kept as safetensors shards.
5. ``train``: anchor blocks sampled from each stored sequence, AdamW, periodic safetensors
   checkpoints that a rerun resumes from.
"""

from __future__ import annotations

import collections
import hashlib
import json
import math
import random
import re
import time
from pathlib import Path
from typing import Iterator

import attrs
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from dspark.drafters.semi_ar import SemiARDrafter

__all__ = [
    "PromptRecord",
    "TrainConfig",
    "training_prompts",
    "split_of",
    "held_out_for_validation",
    "regenerate",
    "read_sequences",
    "sample_anchors",
    "frequent_tokens",
    "default_target_layers",
    "position_weights",
    "distillation_loss",
    "target_features",
    "TargetSequence",
    "build_target_store",
    "train",
    "validate",
]


def _instruction(record: dict) -> str:
    return (record["instruction"] + "\n" + record["input"]).strip()


# Per source file: the prompt text of a record, and its dataset answer (None where the source has none).
TRAIN_SOURCES = {
    "sharegpt_prompts.jsonl": (lambda record: record["prompt"], lambda record: None),
    "alpaca_5k.jsonl": (_instruction, lambda record: record["output"]),
    "code_alpaca_2k.jsonl": (_instruction, lambda record: record["output"]),
    # GSM8K's calculator annotations (<<48/2=24>>) are tool markup no chat model writes.
    "gsm8k_train.jsonl": (lambda record: record["question"], lambda record: re.sub(r"<<[^>]*>>", "", record["answer"])),
}
MODES = ("greedy", "sample", "reference")


@attrs.frozen
class PromptRecord:
    """One training prompt: a stable id (source and line), its text and the dataset's answer if any."""

    id: str
    text: str
    reference: str | None = None


def _stable_fraction(key: str) -> float:
    """A number in [0, 1] fixed by ``key`` alone (the first 32 bits of its SHA-256)."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF


def split_of(prompt_id: str, calibration_share: float = 0.05) -> str:
    """'calibration' for a stable ``calibration_share`` of prompt ids, else 'train'."""
    return "calibration" if _stable_fraction(prompt_id) < calibration_share else "train"


def held_out_for_validation(record_id: str, share: float) -> bool:
    """True for a stable ``share`` of record ids (all answers to one prompt alike), scored by ``validate``
    and never trained on."""
    if isinstance(share, bool) or not 0.0 <= share < 1.0:
        raise ValueError(f"share must be a float in [0, 1), got {share!r}")
    # Salted, so the validation hold-out is independent of the calibration split.
    return _stable_fraction(f"validation:{record_id}") < share


def training_prompts(data_dir: str | Path, split: str = "train", limit: int | None = None, seed: int = 0) -> list[PromptRecord]:
    """Prompts of every source in ``data_dir`` (a ``train/`` folder), interleaved source by source.

    ``split`` is 'train' or 'calibration' (see ``split_of``); ``limit`` keeps the first prompts of a
    seeded shuffle of each source, taken in turn so every source is represented.
    """
    data_dir = Path(data_dir)
    if data_dir.name == "eval" or "eval" in data_dir.parts[-2:]:
        raise ValueError(f"data_dir must be a training folder, never eval/: got {str(data_dir)!r}")
    if split not in ("train", "calibration"):
        raise ValueError(f"split must be 'train' or 'calibration', got {split!r}")
    per_source = []
    for name, (text_of, reference_of) in TRAIN_SOURCES.items():
        path = data_dir / name
        if not path.is_file():
            raise ValueError(f"data_dir {str(data_dir)!r} lacks {name}; expected the shared/data/train folder")
        rows = [(line_number, json.loads(line)) for line_number, line in enumerate(path.read_text().splitlines()) if line.strip()]
        records = [PromptRecord(id=f"{name}:{line_number}", text=text_of(row), reference=reference_of(row)) for line_number, row in rows]
        records = [record for record in records if record.text and split_of(record.id) == split]
        random.Random(f"{seed}:{name}").shuffle(records)
        per_source.append(records)
    interleaved = [record for group in zip(*per_source) for record in group]
    return interleaved[:limit] if limit is not None else interleaved


def regenerate(
    target,
    tokenizer,
    prompts: list[PromptRecord],
    output: str | Path,
    max_new_tokens: int = 256,
    modes: tuple[str, ...] = ("greedy", "sample"),
    batch_size: int = 8,
    max_prompt_tokens: int = 512,
    seed: int = 0,
    progress=None,
) -> Path:
    """Append the target's own answers to ``output`` (JSONL: id, mode, prompt_ids, response_ids).

    Prompts already in ``output`` for a mode are skipped, so an interrupted run resumes; prompts longer
    than ``max_prompt_tokens`` after the chat template are skipped too. 'sample' draws at temperature 1
    with no truncation; 'reference' writes the dataset's answer as the assistant turn (no generation,
    at most ``max_new_tokens`` tokens; prompts without one are skipped). ``progress``: tqdm-like bar.
    """
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    done = {(record["id"], record["mode"]) for record in read_sequences(output)} if output.exists() else set()
    tokenizer.padding_side = "left"
    for mode in modes:
        if mode not in MODES:
            raise ValueError(f"modes must be among {MODES}, got {mode!r}")
        pending = [prompt for prompt in prompts if (prompt.id, mode) not in done and (mode != "reference" or prompt.reference)]
        texts = {
            prompt.id: tokenizer.apply_chat_template([{"role": "user", "content": prompt.text}], add_generation_prompt=True, tokenize=False)
            for prompt in pending
        }
        lengths = {key: len(tokenizer(text, add_special_tokens=False)["input_ids"]) for key, text in texts.items()}
        # Prompts over the limit are skipped, not truncated (a cut chat template loses its generation prompt).
        # Similar lengths share a batch so little compute goes to padding, but only within windows of the
        # interleaved order: a global sort would spend an interrupted run on one source's short prompts.
        pending = [p for p in pending if lengths[p.id] <= max_prompt_tokens]
        if mode == "reference":
            _write_references(tokenizer, pending, texts, output, max_new_tokens, target.generation_config.eos_token_id, progress)
            continue
        window = 8 * batch_size
        pending = [p for start in range(0, len(pending), window) for p in sorted(pending[start : start + window], key=lambda p: lengths[p.id])]
        for start in range(0, len(pending), batch_size):
            batch = pending[start : start + batch_size]
            encoded = tokenizer([texts[p.id] for p in batch], return_tensors="pt", padding=True, add_special_tokens=False)
            torch.manual_seed(seed + start)
            sampling = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0} if mode == "sample" else {"do_sample": False}
            with torch.inference_mode():
                sequences = target.generate(**encoded, max_new_tokens=max_new_tokens, **sampling)
            with output.open("a") as handle:
                for row, prompt in enumerate(batch):
                    prompt_ids = encoded["input_ids"][row][encoded["attention_mask"][row].bool()].tolist()
                    response = sequences[row, encoded["input_ids"].shape[1] :].tolist()
                    response = _until_eos(response, target.generation_config.eos_token_id)
                    handle.write(json.dumps({"id": prompt.id, "mode": mode, "prompt_ids": prompt_ids, "response_ids": response}) + "\n")
            if progress is not None:
                progress.update(len(batch))
    return output


def _write_references(tokenizer, prompts: list[PromptRecord], texts: dict[str, str], output: Path, max_new_tokens: int, eos, progress) -> None:
    """Each prompt's dataset answer, rendered as the assistant turn by the chat template, up to its EOS."""
    with output.open("a") as handle:
        for prompt in prompts:
            conversation = [{"role": "user", "content": prompt.text}, {"role": "assistant", "content": prompt.reference}]
            full = tokenizer.apply_chat_template(conversation, tokenize=False)
            if not full.startswith(texts[prompt.id]):
                raise ValueError(f"the chat template of {type(tokenizer).__name__} does not extend the generation prompt with the answer")
            prompt_ids = tokenizer(texts[prompt.id], add_special_tokens=False)["input_ids"]
            response_ids = _until_eos(tokenizer(full[len(texts[prompt.id]) :], add_special_tokens=False)["input_ids"], eos)[:max_new_tokens]
            handle.write(json.dumps({"id": prompt.id, "mode": "reference", "prompt_ids": prompt_ids, "response_ids": response_ids}) + "\n")
            if progress is not None:
                progress.update(1)


def _until_eos(tokens: list[int], eos) -> list[int]:
    eos_ids = {eos} if isinstance(eos, int) else set(eos or ())
    for index, token in enumerate(tokens):
        if token in eos_ids:
            return tokens[: index + 1]
    return tokens


def read_sequences(path: str | Path) -> list[dict]:
    """The records of a regenerated JSONL file (a torn last line from an interruption is skipped)."""
    records = []
    for line in Path(path).read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def frequent_tokens(records: list[dict], size: int, vocab_size: int) -> torch.Tensor:
    """The ``size`` token ids most frequent in the regenerated responses (ties: lower id first), sorted.

    This is the reduced draft vocabulary (FR-Spec style): the drafter proposes only these tokens.
    """
    if not 1 <= size <= vocab_size:
        raise ValueError(f"size must be in [1, {vocab_size}], got {size!r}")
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for record in records:
        counts += torch.bincount(torch.tensor(record["response_ids"], dtype=torch.long), minlength=vocab_size)
    order = torch.argsort(-counts, stable=True)
    return order[:size].sort().values


def default_target_layers(num_layers: int, count: int = 3) -> tuple[int, ...]:
    """``count`` evenly spaced indices into the target's hidden states, from its first layer to its last but one."""
    if num_layers < 2:
        return (num_layers,)
    return tuple(sorted({round(1 + index * (num_layers - 2) / max(count - 1, 1)) for index in range(count)}))


def sample_anchors(prompt_length: int, length: int, block_size: int, count: int, generator: torch.Generator) -> torch.Tensor | None:
    """Up to ``count`` distinct anchor positions a ∈ [prompt_length − 1, length − 1 − γ] (None if none fit)."""
    low, high = prompt_length - 1, length - 1 - block_size
    if high < low:
        return None
    candidates = torch.arange(low, high + 1)
    chosen = torch.randperm(candidates.numel(), generator=generator)[:count]
    return candidates[chosen].sort().values


def position_weights(block_size: int) -> torch.Tensor:
    """w_k = exp(−(k−1)/γ) for k = 1..γ."""
    return torch.exp(-torch.arange(block_size, dtype=torch.float32) / block_size)


def distillation_loss(
    draft_logits: torch.Tensor,
    confidence: torch.Tensor,
    target_ids: torch.Tensor,
    target_probs: torch.Tensor,
    target_tokens: torch.Tensor,
    draft_vocab: torch.Tensor,
    weights: tuple[float, float, float] = (0.1, 0.9, 1.0),
) -> tuple[torch.Tensor, dict]:
    """α_ce·L_ce + α_tv·L_tv + α_conf·L_conf (eqs. 9–12), averaged over blocks.

    ``draft_logits`` [..., γ, N] over the draft vocabulary ``draft_vocab`` [N]; ``confidence`` [..., γ];
    the target's distributions p_t given sparsely as its top-K tokens ``target_ids`` [..., γ, K] with
    probabilities ``target_probs`` [..., γ, K]; ``target_tokens`` [..., γ] the tokens x*_k it produced.

    ‖p_d − p_t‖₁ is summed exactly over the K listed tokens; the unlisted remainder contributes
    |p_d(rest) − p_t(rest)|, its lower bound, which is exact when K covers the vocabulary. Tokens
    outside the draft vocabulary have p_d = 0: they count fully and are skipped by the cross-entropy.
    """
    block_size = draft_logits.shape[-2]
    w = position_weights(block_size).to(draft_logits.device)
    draft_log_probs = draft_logits.float().log_softmax(dim=-1)
    draft_probs = draft_log_probs.exp()
    vocab_size = int(max(target_ids.max(), target_tokens.max(), draft_vocab.max())) + 1
    slot_of = torch.full((vocab_size,), -1, dtype=torch.long, device=draft_logits.device)
    slot_of[draft_vocab] = torch.arange(draft_vocab.numel(), device=draft_logits.device)
    listed_slots = slot_of[target_ids.long()]
    draft_listed = draft_probs.gather(-1, listed_slots.clamp_min(0)) * (listed_slots >= 0)
    target_listed = target_probs.float()
    l1 = (draft_listed - target_listed).abs().sum(dim=-1) + (target_listed.sum(dim=-1) - draft_listed.sum(dim=-1)).abs()
    acceptance = (1.0 - 0.5 * l1).clamp(0.0, 1.0).detach()
    token_slots = slot_of[target_tokens]
    cross_entropy = -draft_log_probs.gather(-1, token_slots.clamp_min(0)[..., None]).squeeze(-1) * (token_slots >= 0)
    confidence_bce = torch.nn.functional.binary_cross_entropy(confidence.float().clamp(1e-6, 1 - 1e-6), acceptance, reduction="none")
    terms = {
        "ce": (cross_entropy * w).sum(dim=-1).mean(),
        "tv": (l1 * w).sum(dim=-1).mean(),
        "conf": (confidence_bce * w).sum(dim=-1).mean(),
    }
    loss = weights[0] * terms["ce"] + weights[1] * terms["tv"] + weights[2] * terms["conf"]
    summary = {name: float(value.detach()) for name, value in terms.items()}
    summary["acceptance"] = float(acceptance.mean())
    return loss, summary


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


def _target_sequence(target, record: dict, layers: tuple[int, ...], top_k: int, max_tokens: int) -> TargetSequence:
    tokens = torch.tensor(record["prompt_ids"] + record["response_ids"])[:max_tokens]
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


def _sequence_loss(drafter: SemiARDrafter, sequence: TargetSequence, anchors: torch.Tensor, weights) -> tuple[torch.Tensor, dict]:
    """The distillation loss of the anchor blocks ``anchors`` of one stored sequence, and its terms."""
    device, dtype, width = drafter.draft_vocab.device, drafter.mask_embedding.dtype, drafter.config.block_size
    # Block position k of anchor a predicts the token after a + k: label row a + k − (P − 1).
    block = anchors[:, None] + torch.arange(width)
    rows = block - (sequence.prompt_length - 1)
    tokens = sequence.tokens.to(device)
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
        anchors = sample_anchors(sequence.prompt_length, sequence.tokens.numel(), drafter.config.block_size, config.anchors_per_sequence, generator)
        if anchors is None:
            continue
        loss, terms = _sequence_loss(drafter, sequence, anchors, config.loss_weights)
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
    width = drafter.config.block_size
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
            loss, terms = _sequence_loss(drafter, sequence, anchors, config.loss_weights)
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
