"""dspark: lossless, confidence-scheduled speculative decoding for Hugging Face causal language models."""

from dspark import cost_models, drafters, strategies, verify
from dspark.protocols import ConfidenceEstimator, CostModel, Drafter, VerifyPolicy
from dspark.speculative import SpeculativeModel, generate, wrap
from dspark.stats import GenerationResult, GenerationStats, StepRecord, VerifiedToken
from dspark.strategy import Strategy
from dspark.types import Draft, DraftContext, SamplingConfig, StepOutcome

__version__ = "0.1.0"

__all__ = [
    "ConfidenceEstimator",
    "CostModel",
    "Draft",
    "DraftContext",
    "Drafter",
    "GenerationResult",
    "GenerationStats",
    "SamplingConfig",
    "SpeculativeModel",
    "StepOutcome",
    "StepRecord",
    "Strategy",
    "VerifiedToken",
    "VerifyPolicy",
    "cost_models",
    "drafters",
    "generate",
    "strategies",
    "verify",
    "wrap",
]
