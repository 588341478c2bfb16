"""Prompt lookup: copy what followed the latest earlier occurrence of the context's last n-gram."""

from __future__ import annotations

import attrs
import torch

from dspark.checks import deprecated_alias, int_at_least
from dspark.types import Draft, DraftContext, StepOutcome

__all__ = ["LOOKUP_SIGNALS", "LookupMatch", "PromptLookupDrafter", "batch_lookup", "lookup_continuation", "lookup_match"]

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
    last n tokens, the up to ``max_draft_tokens`` tokens after its latest occurrence (None when none matches).
    ``batch_lookup`` on one row."""
    length = context.shape[0]
    begin, end = torch.tensor([0, length], device=context.device).split(1)
    start, ngram, occurrences = (int(value) for value in batch_lookup(context[None], begin, end, max_ngram, min_ngram))
    if ngram == 0:
        return None
    return LookupMatch(context[start : start + max_draft_tokens], ngram, length - start, occurrences)


def batch_lookup(
    tokens: torch.Tensor, begin: torch.Tensor, end: torch.Tensor, max_ngram: int, min_ngram: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The latest earlier match of each context's last n-gram, for every row of ``tokens`` [R, L] at once,
    row r's context being ``tokens[r, begin[r]:end[r]]``: n runs from ``max_ngram`` down to ``min_ngram``
    and a row keeps the first n with a match (one that ends before the context's last token).

    Returns LongTensors [R]: the absolute index where the copied continuation starts (0 where no n-gram
    matched), the n that matched (0: none) and its earlier occurrences. One comparison of every window with
    its row's last n tokens per n (R × L × n element tests) instead of a loop over rows, whose per-row
    operations cost more than the comparisons themselves at 16-32 rows.
    """
    rows, width = tokens.shape
    start, ngram, occurrences = (torch.zeros(rows, dtype=torch.long, device=tokens.device) for _ in range(3))
    length = end - begin
    for n in range(max_ngram, min_ngram - 1, -1):
        if n >= width:
            continue
        windows = tokens.unfold(1, n, 1)  # [R, L − n + 1, n], window p covers p .. p + n − 1
        last = tokens.gather(1, ((end - n)[:, None] + torch.arange(n, device=tokens.device)).clamp_min(0))
        positions = torch.arange(windows.shape[1], device=tokens.device)[None, :]
        # A window must lie in the context and end before its last token; a row matches n only if n < its length.
        valid = (positions >= begin[:, None]) & (positions <= (end - 1 - n)[:, None]) & (n <= length - 1)[:, None]
        hits = (windows == last[:, None, :]).all(dim=2) & valid
        found = hits.any(dim=1) & (ngram == 0)
        latest = (hits * (positions + 1)).amax(dim=1) - 1
        start = torch.where(found, latest + n, start)
        occurrences = torch.where(found, hits.sum(dim=1), occurrences)
        ngram = torch.where(found, torch.full_like(ngram, n), ngram)
    return start, ngram, occurrences


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
        rows, device = context.tokens.shape[0], context.tokens.device
        selected = context.draft_rows
        if max_draft_tokens == 0 or (selected is not None and selected.numel() == 0):
            return Draft.empty(rows, device)
        selected = None if selected is None else selected.to(device)
        tokens, begin, end = (context.tokens, context.begin, context.end) if selected is None else (
            context.tokens[selected], context.begin[selected], context.end[selected])
        start, ngram, occurrences = batch_lookup(tokens, begin, end, self.max_ngram, self.min_ngram)
        matched, age = ngram > 0, end - start
        # The continuation runs from start to the context's end at most.
        lengths = torch.where(matched, age.clamp(0, max_draft_tokens), 0)
        offsets = torch.arange(max_draft_tokens, device=device)
        copied = tokens.gather(1, (start[:, None] + offsets).clamp_max(tokens.shape[1] - 1))
        signals = torch.stack([ngram.double(), age.clamp_min(1).double().log(), occurrences.clamp_min(1).double().log()], dim=1)
        draft = Draft(
            tokens=torch.where(offsets[None, :] < lengths[:, None], copied, 0), lengths=lengths,
            signals=torch.where(matched[:, None], signals, 0.0).float()[:, None, :].expand(-1, max_draft_tokens, -1),
        )
        return draft if selected is None else draft.placed(rows, selected)

    def observe(self, outcome: StepOutcome) -> None:
        """Nothing to learn: the context already holds the emitted tokens."""
