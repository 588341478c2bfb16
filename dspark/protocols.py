"""The four extension points of a decoding step. Each is one or two methods."""

from __future__ import annotations

import torch
from typing_extensions import Protocol, runtime_checkable

from dspark.types import Draft, DraftContext, StepOutcome

__all__ = ["Drafter", "ConfidenceEstimator", "CostModel", "VerifyPolicy"]


@runtime_checkable
class Drafter(Protocol):
    """Proposes draft tokens, then learns from what the target kept.

    ``vocab_size`` is the size of the vocabulary the drafter's token ids live in (None when it only
    copies ids from the context, as n-gram lookup does); the loop refuses a mismatch with the target.
    A drafter that conditions on the target may also set ``target_layers`` (indices into the target's
    ``hidden_states``); the loop then asks the target for exactly those and hands them over in
    ``DraftContext.features``.
    """

    vocab_size: int | None

    def propose(self, context: DraftContext, max_tokens: int) -> Draft:
        """Return a draft of at most ``max_tokens`` tokens for every row of ``context``."""
        ...

    def observe(self, outcome: StepOutcome) -> None:
        """Update internal state (caches, statistics) with the target's decision for each row."""
        ...


@runtime_checkable
class ConfidenceEstimator(Protocol):
    """Estimates survival c_k = P(x_k accepted | x_1..x_{k-1} accepted) for every draft position."""

    def survival(self, draft: Draft) -> torch.Tensor:
        """FloatTensor[R, γ] of c_k in (0, 1); c_k may use only what was known before x_k was drawn."""
        ...


@runtime_checkable
class CostModel(Protocol):
    """Knows what a target forward and a drafting pass cost on this machine."""

    def step_time(self, rows: int, tokens: int) -> float:
        """Seconds for one target forward over ``rows`` rows of ``tokens`` new tokens each."""
        ...

    def draft_time(self, rows: int) -> float:
        """Seconds the drafter spends proposing one block for ``rows`` rows."""
        ...


@runtime_checkable
class VerifyPolicy(Protocol):
    """Chooses how many draft tokens ℓ_r of each row the target checks."""

    def lengths(self, survival: torch.Tensor | None, cost_model: CostModel, limits: torch.Tensor) -> torch.Tensor:
        """LongTensor[R] with 0 ≤ ℓ_r ≤ limits[r]; ``survival`` is None when no estimator is configured."""
        ...
