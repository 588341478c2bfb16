"""Prompt lookup: copy what followed the latest earlier occurrence of the context's last n-gram."""

from __future__ import annotations

import math

import attrs
import torch

from dspark.checks import deprecated_alias, int_at_least
from dspark.types import Draft, DraftContext, StepOutcome

__all__ = ["LOOKUP_SIGNALS", "LookupMatch", "PromptLookupDrafter", "lookup_continuation", "lookup_match"]

#: The columns of ``Draft.signals`` a PromptLookupDrafter fills, the same at every position of a row.
LOOKUP_SIGNALS = ("ngram", "log_age", "log_occurrences")


@attrs.frozen(eq=False)
class LookupMatch:
    """The continuation copied after the latest earlier match of the context's last ``ngram`` tokens;
    ``age``: how many tokens back the copied continuation starts; ``occurrences``: earlier matches."""

    continuation: torch.Tensor
    ngram: int
    age: int
    occurrences: int


def lookup_match(context: torch.Tensor, max_ngram: int, min_ngram: int, max_draft_tokens: int) -> LookupMatch | None:
    """Tries n = max_ngram down to min_ngram; for the first n with an earlier match of the context's
    last n tokens, the up to ``max_draft_tokens`` tokens after its latest occurrence (None when none matches)."""
    length = context.shape[0]
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        windows = context[: length - 1].unfold(0, n, 1)  # windows ending before the last token
        matches = (windows == context[length - n :]).all(dim=1).nonzero().squeeze(1)
        if matches.numel() > 0:
            start = int(matches[-1]) + n
            return LookupMatch(context[start : start + max_draft_tokens], n, length - start, matches.numel())
    return None


def lookup_continuation(context: torch.Tensor, max_ngram: int, min_ngram: int, max_draft_tokens: int) -> torch.Tensor:
    """Tokens that followed the most recent earlier match of the context's last n-gram (``lookup_match``),
    an empty tensor when none matches."""
    match = lookup_match(context, max_ngram, min_ngram, max_draft_tokens)
    return context[:0] if match is None else match.continuation


@attrs.define
class PromptLookupDrafter:
    """Training-free n-gram drafter (prompt lookup decoding) over each row's own context.

    ``max_ngram`` / ``min_ngram`` bound the n-gram sizes tried (longest first); ``max_draft_tokens``
    is the block width γ used when the caller does not choose one. The defaults (min_ngram=2, γ=4)
    come from ``benchmarks/tune_prompt_lookup.py`` on training prompts: single-token matches are
    right too rarely to pay for a multi-token verify forward on a CPU.
    """

    max_ngram: int = attrs.field(default=3, validator=int_at_least(1))
    min_ngram: int = attrs.field(default=2, validator=int_at_least(1))
    max_draft_tokens: int = attrs.field(default=4, validator=int_at_least(1))
    vocab_size = None
    default_draft_tokens = deprecated_alias("max_draft_tokens", "default_draft_tokens")

    def __attrs_post_init__(self):
        if self.min_ngram > self.max_ngram:
            raise ValueError(f"min_ngram must be <= max_ngram={self.max_ngram}, got {self.min_ngram!r}")

    def propose(self, context: DraftContext, max_draft_tokens: int) -> Draft:
        """Look up the continuation of every row in ``context.draft_rows`` (all by default); other rows and
        rows without a match get an empty draft. ``Draft.signals`` holds ``LOOKUP_SIGNALS`` per row (known
        before any token is drafted, so non-anticipating)."""
        rows = context.tokens.shape[0]
        # Built on the host (one copy of the contexts, a handful of small tensor ops per row), moved once.
        tokens = torch.zeros((rows, max_draft_tokens), dtype=torch.long)
        lengths = torch.zeros(rows, dtype=torch.long)
        signals = torch.zeros((rows, len(LOOKUP_SIGNALS)))
        drafted = range(rows) if context.draft_rows is None else context.draft_rows.tolist()
        if max_draft_tokens == 0 or not drafted:
            return Draft.empty(rows, context.tokens.device)
        host_tokens, begin, end = context.tokens.cpu(), context.begin.tolist(), context.end.tolist()
        for row in drafted:
            match = lookup_match(host_tokens[row, begin[row] : end[row]], self.max_ngram, self.min_ngram, max_draft_tokens)
            if match is not None:
                found = match.continuation.numel()
                tokens[row, :found], lengths[row] = match.continuation, found
                signals[row] = torch.tensor([match.ngram, math.log(match.age), math.log(match.occurrences)])
        device = context.tokens.device
        return Draft(
            tokens=tokens.to(device), lengths=lengths.to(device),
            signals=signals[:, None, :].expand(rows, max_draft_tokens, -1).to(device),
        )

    def observe(self, outcome: StepOutcome) -> None:
        """Nothing to learn: the context already holds the emitted tokens."""
