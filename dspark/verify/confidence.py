"""Confidence estimators: survival c_k for each draft position."""

from __future__ import annotations

import attrs
import torch

from dspark.types import Draft

__all__ = ["DraftProbability", "DrafterConfidence", "survival_products"]


def survival_products(survival: torch.Tensor) -> torch.Tensor:
    """Prefix survival a_k = c_1·…·c_k along the last dimension."""
    return survival.cumprod(dim=-1)


@attrs.frozen
class DraftProbability:
    """Training-free confidence: the draft distribution's own belief, c_k = max_v q_k(v).

    For greedy drafts this is exactly q_k(x_k). Under sampling q_k(x_k) depends on the drawn x_k,
    and a policy that used it to decide whether to verify x_k would no longer be lossless
    (paper Appendix A); max_v q_k(v) is known before x_k is drawn.
    """

    floor: float = attrs.field(default=1e-6)

    def survival(self, draft: Draft) -> torch.Tensor:
        """FloatTensor[R, γ] of max_v q_k(v), clamped into (0, 1)."""
        if draft.probs is None:
            raise ValueError(
                "DraftProbability needs draft distributions, but the drafter returned Draft.probs=None "
                "(a point-mass drafter such as PromptLookupDrafter); use a policy without confidence"
            )
        return draft.probs.amax(dim=-1).clamp(self.floor, 1.0 - self.floor)


@attrs.frozen
class DrafterConfidence:
    """The drafter's own learned confidence head (``Draft.confidence``), e.g. the semi-AR drafter's
    c_k = σ(wᵀ[h_k; W1[x_{k−1}]]), which depends on x_{k−1} but never on x_k."""

    def survival(self, draft: Draft) -> torch.Tensor:
        """``Draft.confidence`` as FloatTensor[R, γ]."""
        if draft.confidence is None:
            raise ValueError("DrafterConfidence needs a drafter with a confidence head, but Draft.confidence is None")
        return draft.confidence.float()
