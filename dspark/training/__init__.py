"""Distilling a DSpark drafter from its target (paper §3.3): prompt data, regeneration, the target
store, losses, the trainer and the end-to-end pipeline behind ``dspark train``.

Not imported by ``import dspark``, and needs none of the optional extras: only dspark's own
dependencies.
"""

from dspark.training.agreement import ANCHOR_SETS, Agreement, TargetPass, agreeing_prefixes, greedy_agreement, walk
from dspark.training.data import EvalPrompt, PromptRecord, default_data_dir, eval_prompts, held_out_for_validation, spec_bench_questions, split_of, training_prompts
from dspark.training.losses import distillation_loss, position_weights
from dspark.training.pipeline import DataConfig, TrainingPools, checkpoint_dir, distill_drafter, regenerate_answers, training_pools
from dspark.training.regeneration import MODES, frequent_tokens, read_sequences, regenerate
from dspark.training.store import TargetSequence, build_target_store, target_features
from dspark.training.trainer import TrainConfig, sample_anchors, train, validate

__all__ = [
    "ANCHOR_SETS",
    "Agreement",
    "DataConfig",
    "EvalPrompt",
    "MODES",
    "PromptRecord",
    "TargetPass",
    "TargetSequence",
    "TrainConfig",
    "TrainingPools",
    "agreeing_prefixes",
    "build_target_store",
    "checkpoint_dir",
    "default_data_dir",
    "distill_drafter",
    "distillation_loss",
    "eval_prompts",
    "frequent_tokens",
    "greedy_agreement",
    "held_out_for_validation",
    "position_weights",
    "read_sequences",
    "regenerate",
    "regenerate_answers",
    "sample_anchors",
    "spec_bench_questions",
    "split_of",
    "target_features",
    "train",
    "training_pools",
    "training_prompts",
    "validate",
    "walk",
]
