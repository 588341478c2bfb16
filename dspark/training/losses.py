"""The distillation loss (paper §3.3, eqs. 8–12).

L = α_ce·L_ce + α_tv·L_tv + α_conf·L_conf with position weights w_k = exp(−(k−1)/γ); the confidence
target is the analytic acceptance rate c*_k = 1 − ½‖p_d − p_t‖₁ (eq. 8).
"""

from __future__ import annotations

import torch

__all__ = ["distillation_loss", "position_weights"]


def position_weights(max_draft_tokens: int) -> torch.Tensor:
    """w_k = exp(−(k−1)/γ) for k = 1..γ."""
    return torch.exp(-torch.arange(max_draft_tokens, dtype=torch.float32) / max_draft_tokens)


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
    ``|p_d(rest) − p_t(rest)|``, its lower bound, which is exact when K covers the vocabulary. Tokens
    outside the draft vocabulary have p_d = 0: they count fully and are skipped by the cross-entropy.
    """
    w = position_weights(draft_logits.shape[-2]).to(draft_logits.device)
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
    # The first position's acceptance, and 1 + Σ_k Π_{j≤k} c*_j: the expected tokens per verify step with
    # every position verified, were acceptances independent along the block (teacher-forced, so optimistic).
    summary["acceptance_first"] = float(acceptance[..., 0].mean())
    summary["expected_tau"] = float(1.0 + acceptance.cumprod(dim=-1).sum(dim=-1).mean())
    # Greedy verification: the draft's argmax must be the target's (its top-1, target_ids[..., 0]). On
    # the target's own greedy text this is what the loop accepts, block by block, with no optimism.
    agrees = (draft_vocab[draft_logits.argmax(dim=-1)] == target_ids[..., 0].long()).float()
    summary["greedy_first"] = float(agrees[..., 0].mean())
    summary["greedy_tau"] = float(1.0 + agrees.cumprod(dim=-1).sum(dim=-1).mean())
    return loss, summary
