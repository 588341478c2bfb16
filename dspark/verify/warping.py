"""Logit warping shared by the target and every drafter, so p and q are warped identically.

Order as in Hugging Face ``generate``: temperature, then top-k, then top-p (nucleus).
"""

from __future__ import annotations

import torch

from dspark.types import SamplingConfig

__all__ = ["warp_logits", "warped_probs", "draw"]


def warp_logits(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """Return float32 logits with temperature applied and tokens outside top-k / top-p set to -inf.

    Greedy configs (``do_sample=False``) leave the logits unwarped. Works on any leading shape.
    """
    logits = logits.float()
    if not sampling.do_sample:
        return logits
    if sampling.temperature != 1.0:
        logits = logits / sampling.temperature
    if sampling.top_k is not None and 0 < sampling.top_k < logits.shape[-1]:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p is not None and sampling.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=False, stable=True)  # ties: a fixed order
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        # Drop the low tail whose mass is at most 1 - top_p; the most likely token always stays.
        drop_sorted = cumulative <= 1.0 - sampling.top_p
        drop_sorted[..., -1] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def warped_probs(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """softmax(warp_logits(logits)): the distribution a token is drawn from, float32."""
    return warp_logits(logits, sampling).softmax(dim=-1)


def draw(probs: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of ``probs`` [R, V]: sampled under a sampling config, the argmax when greedy."""
    if sampling.do_sample:
        return torch.multinomial(probs, 1, generator=generator).squeeze(1)
    return probs.argmax(dim=-1)
