"""Acceptance rules: which verified draft tokens the target keeps, and the token it adds.

Notation: row r drafted x_1..x_γ; the target checks the first ℓ_r of them in one forward over
[anchor, x_1..x_ℓ] and so has p_1..p_{ℓ+1} (p_k is its distribution for the k-th new token).
n_r is the number accepted (0 ≤ n ≤ ℓ); the step emits x_1..x_n and one more token: the target's
own choice at position n+1 (recovered after a rejection, bonus after ℓ acceptances), so every step
emits n + 1 tokens.
"""

from __future__ import annotations

import torch

__all__ = ["leading_true", "greedy_accept", "rejection_sample", "residual_distribution"]


def leading_true(mask: torch.Tensor) -> torch.Tensor:
    """Number of leading True entries along the last dimension, LongTensor[...]."""
    return mask.long().cumprod(dim=-1).sum(dim=-1)


def greedy_accept(
    draft_tokens: torch.Tensor, target_logits: torch.Tensor, verify_lengths: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy rule: accept the longest prefix where x_k = argmax p_k, then emit argmax p_{n+1}.

    ``draft_tokens`` LongTensor[R, γ'], ``target_logits`` [R, γ'+1, V], ``verify_lengths`` LongTensor[R]
    with ℓ_r ≤ γ'. Returns (accepted n LongTensor[R], next token LongTensor[R]).
    """
    choices = target_logits.argmax(dim=-1)
    width = draft_tokens.shape[1]
    in_block = torch.arange(width, device=draft_tokens.device)[None, :] < verify_lengths[:, None]
    accepted = leading_true((draft_tokens == choices[:, :width]) & in_block)
    return accepted, choices.gather(1, accepted[:, None]).squeeze(1)


def residual_distribution(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p − q)) along the last dimension; falls back to p where p ≤ q everywhere.

    The fallback is never sampled by ``rejection_sample`` (a rejection needs p(x) < q(x) somewhere,
    hence mass in p − q), but keeps the function total.
    """
    residual = (target_probs - draft_probs).clamp_min(0.0)
    mass = residual.sum(dim=-1, keepdim=True)
    return torch.where(mass > 0, residual / mass.clamp_min(torch.finfo(mass.dtype).tiny), target_probs)


def rejection_sample(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    verify_lengths: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling (Leviathan et al., Chen et al.): the emitted tokens follow p exactly.

    Accept x_k with probability min(1, p_k(x_k) / q_k(x_k)) while every earlier one was accepted;
    at the first rejection resample from norm(max(0, p_k − q_k)); after ℓ acceptances draw the
    bonus from p_{ℓ+1}. ``draft_probs`` None means point-mass drafts (q_k = δ_{x_k}).
    Both ``draft_probs`` [R, γ', V] and ``target_probs`` [R, γ'+1, V] must already be warped the same way.
    Returns (accepted n LongTensor[R], next token LongTensor[R]).
    """
    rows, width = draft_tokens.shape
    positions = torch.arange(width, device=draft_tokens.device)
    p_of_x = target_probs[:, :width].gather(2, draft_tokens[:, :, None]).squeeze(2)
    if draft_probs is None:
        q_of_x = torch.ones_like(p_of_x)
    else:
        q_of_x = draft_probs.gather(2, draft_tokens[:, :, None]).squeeze(2)
    uniform = torch.rand((rows, width), generator=generator, device=draft_tokens.device)
    keep = (uniform * q_of_x < p_of_x) & (positions[None, :] < verify_lengths[:, None])
    accepted = leading_true(keep)

    at_stop = accepted[:, None, None].expand(rows, 1, target_probs.shape[-1])
    target_at_stop = target_probs.gather(1, at_stop).squeeze(1)
    rejected = accepted < verify_lengths
    # Rows that rejected resample from the residual at the rejected position; the others take the bonus.
    stop_in_draft = at_stop.clamp_max(width - 1) if width > 0 else at_stop
    if draft_probs is None:
        draft_at_stop = torch.zeros_like(target_at_stop)
        if width > 0:
            rejected_token = draft_tokens.gather(1, stop_in_draft[:, :1, 0]).squeeze(1)
            draft_at_stop.scatter_(1, rejected_token[:, None], 1.0)
    else:
        draft_at_stop = draft_probs.gather(1, stop_in_draft).squeeze(1) if width > 0 else torch.zeros_like(target_at_stop)
    residual = residual_distribution(target_at_stop, draft_at_stop)
    final = torch.where(rejected[:, None], residual, target_at_stop)
    next_tokens = torch.multinomial(final, 1, generator=generator).squeeze(1)
    return accepted, next_tokens
