"""An independent small draft model with its own KV cache, rolled back by every outcome."""

from __future__ import annotations

import warnings

import torch

from dspark.checks import check_int, deprecated_alias
from dspark.kv import RaggedCache, check_cache_support
from dspark.types import Draft, DraftContext, GenerationStart, StepOutcome
from dspark.validation import check_forward_signature, context_length
from dspark.verify.warping import draw, warped_probs

__all__ = ["DraftModelDrafter"]


class DraftModelDrafter:
    """Drafts γ tokens autoregressively with a small Hugging Face causal LM sharing the target's vocabulary.

    The draft model keeps a ragged cache of every row's committed tokens; each proposal first feeds
    the tokens the target committed since the last one (the accepted drafts it has not seen and the
    new anchor), then samples γ tokens from q (warped like the target's p), returning q for
    rejection sampling. ``observe`` drops the rejected drafts from the cache.
    """

    def __init__(self, model: torch.nn.Module, max_draft_tokens: int = 4, *, default_draft_tokens: int | None = None):
        self.model = model
        if default_draft_tokens is not None:
            warnings.warn("DraftModelDrafter(default_draft_tokens=) is deprecated; use max_draft_tokens=", DeprecationWarning, stacklevel=2)
            max_draft_tokens = default_draft_tokens
        self.max_draft_tokens = check_int("max_draft_tokens", max_draft_tokens, 1)
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self._forward_arguments = check_forward_signature(model)
        self._cache: RaggedCache | None = None
        self._speculative = 0

    default_draft_tokens = deprecated_alias("max_draft_tokens", "default_draft_tokens")

    def __repr__(self) -> str:
        return f"DraftModelDrafter({type(self.model).__name__}, max_draft_tokens={self.max_draft_tokens})"

    def _logits(self, tokens: torch.Tensor, new_mask: torch.Tensor, keep_last: torch.Tensor) -> torch.Tensor:
        inputs = self._cache.forward_inputs(new_mask, position_ids="position_ids" in self._forward_arguments)
        logits = self.model(input_ids=tokens, **inputs).logits
        self._cache.commit(new_mask)
        return logits.gather(1, keep_last[:, None, None].expand(-1, 1, logits.shape[-1])).squeeze(1).float()

    def start(self, start: GenerationStart) -> None:
        """A new generation: check the draft model can hold it and give it an empty ragged cache."""
        # The token buffer spans prompt + max_new_tokens: the draft model must hold that plus one block.
        needed = start.max_length + 2 * (start.max_draft_tokens + 1)
        limit = context_length(self.model.config)
        if limit is not None and needed > limit:
            raise ValueError(
                f"the draft model's context of {limit} tokens is shorter than this generation needs ({needed}: "
                f"prompt + max_new_tokens + draft blocks); use a draft model with a longer context or fewer max_new_tokens"
            )
        check_cache_support(self.model.config, needed)
        self._cache = RaggedCache(start.rows, start.device, hole_budget=start.max_draft_tokens + 1)
        self._speculative = 0

    @torch.inference_mode()
    def propose(self, context: DraftContext, max_draft_tokens: int) -> Draft:
        """Catch the cache up with the committed tokens, then draft ``max_draft_tokens`` tokens per row."""
        if self._cache is None:
            raise ValueError("DraftModelDrafter.propose needs start(GenerationStart) first; dspark's generate calls it")
        device = context.tokens.device
        # Tokens committed since the last proposal: context[begin + fed : end], the anchor last.
        missing = context.end - context.begin - self._cache.lengths
        width = int(missing.max())
        offsets = torch.arange(width, device=device)[None, :]
        gather_at = (context.begin + self._cache.lengths)[:, None] + offsets
        new_tokens = context.tokens.gather(1, gather_at.clamp_max(context.tokens.shape[1] - 1))
        logits = self._logits(new_tokens, offsets < missing[:, None], (missing - 1).clamp_min(0))

        tokens, probs = [], []
        for k in range(max_draft_tokens):
            q = warped_probs(logits, context.sampling)
            token = draw(q, context.sampling, context.generator)
            tokens.append(token)
            probs.append(q)
            if k + 1 < max_draft_tokens:
                ones = torch.ones((token.shape[0], 1), dtype=torch.long, device=device)
                logits = self._logits(token[:, None], ones, torch.zeros_like(token))
        self._speculative = max(max_draft_tokens - 1, 0)
        return Draft.from_positions(tokens, probs, context.rows.numel(), device)

    def observe(self, outcome: StepOutcome) -> None:
        """Keep the accepted drafts the model has already consumed; the rest, and finished rows, leave its cache."""
        if self._cache is not None:
            self._cache.rollback(self._speculative, outcome.accepted)
            self._speculative = 0
            self._cache.drop_finished(outcome.finished)
