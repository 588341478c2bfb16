"""Distilling a SemiARDrafter for a target, end to end (what ``dspark train`` runs).

1. ``regenerate_answers``: the target answers training prompts (``data.training_prompts``) into
   ``work_dir/data.jsonl``, resumable.
2. ``training_pools``: every regenerated sequence goes through the target once (``store``), then is
   held out for validation or drawn for training, the target's own answers ``own_weight`` times as
   often as dataset answers.
3. ``distill_drafter``: builds the drafter (draft vocabulary = the target's most frequent own tokens),
   trains it with resumable checkpoints and returns it.

``progress`` shows tqdm bars (tqdm comes with transformers); ``log`` receives one line per event.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
from pathlib import Path
from typing import Callable

import attrs
import torch
from tqdm.auto import tqdm

from dspark.checks import int_at_least
from dspark.drafters.semi_ar import SemiARConfig, SemiARDrafter
from dspark.training.data import held_out_for_validation, training_prompts
from dspark.training.regeneration import MODES, frequent_tokens, read_sequences, regenerate
from dspark.training.store import TargetSequence, build_target_store
from dspark.training.trainer import TrainConfig, train

__all__ = ["DataConfig", "TrainingPools", "distill_drafter", "regenerate_answers", "training_pools"]

STAGES = ("all", "data", "train")


def _modes(instance, attribute, value) -> None:
    if not value or any(mode not in MODES for mode in value):
        raise ValueError(f"modes must be a non-empty tuple of {MODES}, got {value!r}")


def _share(instance, attribute, value) -> None:
    if isinstance(value, bool) or not 0.0 <= value < 1.0:
        raise ValueError(f"{attribute.name} must be a float in [0, 1), got {value!r}")


@attrs.frozen
class DataConfig:
    """What to regenerate and how to hold out: prompts, answer modes, target-store resolution."""

    prompts: int = attrs.field(default=800, validator=int_at_least(1))
    max_new_tokens: int = attrs.field(default=256, validator=int_at_least(1))
    modes: tuple[str, ...] = attrs.field(default=("greedy", "sample"), converter=tuple, validator=_modes)
    generate_batch_size: int = attrs.field(default=8, validator=int_at_least(1))
    top_k: int = attrs.field(default=32, validator=int_at_least(1))  # target tokens kept per position
    max_sequence_tokens: int = attrs.field(default=768, validator=int_at_least(2))
    validation_share: float = attrs.field(default=0.05, validator=_share)
    own_weight: int = attrs.field(default=1, validator=int_at_least(1))  # draws of an own answer per dataset answer
    seed: int = 0


@attrs.frozen
class TrainingPools:
    """Stored sequences to draw training blocks from (own answers repeated ``own_weight`` times) and the
    held-out own answers ``validate`` scores."""

    training: list[TargetSequence]
    validation: list[TargetSequence]
    own_answers: int
    dataset_answers: int


def _bar(enabled: bool, total: int, desc: str, unit: str):
    """A tqdm bar when ``enabled``, else a context giving None."""
    return tqdm(total=total, desc=desc, unit=unit) if enabled else contextlib.nullcontext()


def regenerate_answers(target, tokenizer, work_dir: str | Path, data: DataConfig = DataConfig(), data_dir: str | Path | None = None, progress: bool = True) -> Path:
    """The target's answers to ``data.prompts`` training prompts, appended to ``work_dir/data.jsonl``
    (already answered prompts are skipped, so a rerun resumes). Returns that path."""
    output = Path(work_dir) / "data.jsonl"
    prompts = training_prompts(data_dir, "train", limit=data.prompts, seed=data.seed)
    with _bar(progress, len(prompts) * len(data.modes), "regenerating answers", "prompt") as bar:
        regenerate(
            target, tokenizer, prompts, output, max_new_tokens=data.max_new_tokens, modes=data.modes,
            batch_size=data.generate_batch_size, seed=data.seed, progress=bar,
        )
    return output


def training_pools(records: list[dict], store: list[TargetSequence], data: DataConfig) -> TrainingPools:
    """Split stored sequences into training draws and validation by ``held_out_for_validation``.

    Only the target's own answers are validated on: they are what drafting at inference time sees.
    """
    if len(records) != len(store):
        raise ValueError(f"records and store must align, got {len(records)} records and {len(store)} stored sequences")
    own, dataset, validation = [], [], []
    for record, sequence in zip(records, store):
        is_own = record["mode"] != "reference"
        if held_out_for_validation(record["id"], data.validation_share):
            if is_own:
                validation.append(sequence)
        else:
            (own if is_own else dataset).append(sequence)
    return TrainingPools(own * data.own_weight + dataset, validation, len(own), len(dataset))


def _draft_vocab(records: list[dict], config: SemiARConfig, data: DataConfig) -> torch.Tensor:
    """The target's most frequent own tokens in the training records; dataset answers rank the tokens the
    own answers leave tied (those they never use, when there are few of them)."""
    training = [record for record in records if not held_out_for_validation(record["id"], data.validation_share)]
    own = [record for record in training if record["mode"] != "reference"]
    dataset = [record for record in training if record["mode"] == "reference"]
    return frequent_tokens(own, config.vocab_size, config.target.vocab_size, then=dataset)


def distill_drafter(
    target,
    tokenizer,
    config: SemiARConfig,
    work_dir: str | Path,
    data: DataConfig = DataConfig(),
    train_config: TrainConfig = TrainConfig(),
    data_dir: str | Path | None = None,
    stage: str = "all",
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> SemiARDrafter | None:
    """Regenerate, store and train (``stage`` 'all'); 'data' stops after the target store and returns
    None; 'train' uses the answers regenerated so far. Every part resumes from ``work_dir``."""
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
    work_dir = Path(work_dir)
    if stage != "train":
        regenerate_answers(target, tokenizer, work_dir, data, data_dir, progress)
    path = work_dir / "data.jsonl"
    if not path.is_file():
        raise ValueError(f"no regenerated answers in {str(path)!r}: run stage 'data' or 'all' first")
    records = read_sequences(path)
    counts = dict(collections.Counter(record["mode"] for record in records))
    log(f"{len(records)} sequences ({counts}), {sum(len(r['response_ids']) for r in records)} response tokens in {path}")
    store_dir = work_dir / f"targets-{'-'.join(map(str, config.target_layers))}"
    with _bar(progress, len(records), "target features", "sequence") as bar:
        store = build_target_store(
            target, records, config.target_layers, top_k=data.top_k, max_sequence_tokens=data.max_sequence_tokens, directory=store_dir, progress=bar,
        )
    if stage == "data":
        return None
    torch.manual_seed(train_config.seed)
    drafter = SemiARDrafter(config, target, draft_vocab=_draft_vocab(records, config, data))
    pools = training_pools(records, store, data)
    log(f"training pool: {len(pools.training)} draws per pass, {pools.own_answers} own answers × {data.own_weight}, {pools.dataset_answers} dataset answers")
    # One checkpoint folder per drafter shape, so a changed configuration never resumes a mismatched run.
    checkpoint = work_dir / f"checkpoint-{hashlib.sha256(config.to_json().encode()).hexdigest()[:10]}"
    with _bar(progress, train_config.steps, "training drafter", "step") as bar:
        train(drafter, pools.training, train_config, checkpoint_dir=checkpoint, progress=bar, log=log, validation=pools.validation)
    return drafter
