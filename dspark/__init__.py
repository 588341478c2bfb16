"""dspark: lossless, confidence-scheduled speculative decoding for Hugging Face causal language models."""

from typing import TYPE_CHECKING

from dspark import cost_models, drafters, strategies, verify
from dspark.protocols import ConfidenceEstimator, CostModel, Drafter, FallbackRun, RowFallback, VerifyPolicy
from dspark.speculative import SpeculativeModel, generate, profiled_cost_model, wrap
from dspark.stats import GenerationResult, GenerationStats, StepRecord, VerifiedToken
from dspark.strategy import Strategy
from dspark.types import Draft, DraftContext, GenerationStart, SamplingConfig, StepOutcome, VerifyContext

if TYPE_CHECKING:
    from dspark import pretrained, training

__version__ = "0.1.0"

__all__ = [
    "ConfidenceEstimator",
    "CostModel",
    "Draft",
    "DraftContext",
    "Drafter",
    "FallbackRun",
    "GenerationResult",
    "GenerationStart",
    "GenerationStats",
    "RowFallback",
    "SamplingConfig",
    "SpeculativeModel",
    "StepOutcome",
    "StepRecord",
    "Strategy",
    "VerifiedToken",
    "VerifyContext",
    "VerifyPolicy",
    "cost_models",
    "drafters",
    "generate",
    "pretrained",
    "profiled_cost_model",
    "strategies",
    "training",
    "verify",
    "wrap",
]


# Imported on first use: pretrained's model-loading imports double ``import dspark``'s time, and
# training is needed only by those who distil a drafter.
_LAZY_MODULES = ("pretrained", "training")


def __getattr__(name: str):
    """``dspark.pretrained`` and ``dspark.training``, imported on first use."""
    if name in _LAZY_MODULES:
        import importlib

        return importlib.import_module(f"dspark.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
