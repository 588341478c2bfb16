"""A drafter made of drafters: per row, the draft of one of its parts.

Each part is a drafter with the confidence estimator calibrated for it. Per row and step one part's
draft is kept, chosen by ``rule``:

* ``"first"``: the parts in order; the first whose draft for the row is non-empty and whose survival at
  the first position c_1 is at least ``claim_survival`` claims the row, and later parts draft only the
  rows still unclaimed (``DraftContext.draft_rows``). Prompt lookup first, the semi-AR drafter second:
  lookup where an n-gram match (of at least the lookup's ``min_ngram`` tokens) exists, the learnt drafter
  elsewhere, and the learnt drafter drafts only the other rows.
* ``"confidence"``: every part drafts every row; the part with the highest c_1 keeps it (ties to the
  earlier part).

Why c_1 and not the whole draft's expected acceptance: under sampling, a choice that depends on the
drawn tokens changes the law of the token kept (choosing a draft because x_1 looks good biases x_1),
and rejection sampling with that part's q would no longer be exact. c_1 is known before x_1 is drawn
(the semi-AR confidence head reads the anchor, lookup's signals the context), and whether a part
claims a row in ``"first"`` depends only on the parts before it and on lookup's deterministic match.
So each kept token was drawn from its part's q, which the draft carries (a point mass for lookup
rows), and sampling stays exact.

The kept survival of every position is put in ``Draft.confidence``: wrap the cascade with
``DrafterConfidence`` (its default) and any survival-reading policy sees each row's own part's estimate.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from dspark.protocols import DRAFTER_HOOKS, ESTIMATOR_HOOKS, ConfidenceEstimator, Drafter, check_hooks, hook
from dspark.types import Draft, DraftContext, GenerationStart, StepOutcome
from dspark.verify.confidence import DrafterConfidence
from dspark.verify.schedulers import HardwareAwareScheduler

__all__ = ["CASCADE_RULES", "CascadeDrafter"]

CASCADE_RULES = ("first", "confidence")


class CascadeDrafter:
    """Per row, one of ``parts``' drafts (module docstring). ``parts``: (drafter, its calibrated
    ``ConfidenceEstimator``) pairs, tried in order; ``rule``: ``"first"`` or ``"confidence"``;
    ``claim_survival``: the least c_1 with which a part claims a row under ``"first"``.

    ``observe`` forwards each part the outcome of its own draft: the rows another part drafted count as
    nothing accepted, so a part that keeps a cache of its drafts (``DraftModelDrafter``) rolls them back.
    """

    def __init__(self, parts: Sequence[tuple[Drafter, ConfidenceEstimator]], rule: str = "first", claim_survival: float = 0.0):
        parts = tuple(parts)
        if len(parts) < 2:
            raise ValueError(f"parts must hold at least two (drafter, confidence) pairs, got {len(parts)}")
        for index, part in enumerate(parts):
            if not (isinstance(part, tuple) and len(part) == 2 and isinstance(part[0], Drafter) and isinstance(part[1], ConfidenceEstimator)):
                raise TypeError(f"parts[{index}] must be a (Drafter, ConfidenceEstimator) pair, got {part!r}")
            check_hooks(part[0], DRAFTER_HOOKS, f"parts[{index}] drafter")
            check_hooks(part[1], ESTIMATOR_HOOKS, f"parts[{index}] confidence")
        if rule not in CASCADE_RULES:
            raise ValueError(f"rule must be one of {CASCADE_RULES}, got {rule!r}")
        if isinstance(claim_survival, bool) or not isinstance(claim_survival, (int, float)) or not 0.0 <= claim_survival <= 1.0:
            raise ValueError(f"claim_survival must be a number in [0, 1], got {claim_survival!r}")
        self.parts, self.rule, self.claim_survival = parts, rule, float(claim_survival)
        self.vocab_size = _agreed("vocab_size", [part.vocab_size for part, _ in parts])
        self.target_layers = _agreed("target_layers", [tuple(hook(part, "target_layers", DRAFTER_HOOKS)) for part, _ in parts], empty=()) or ()
        self.max_draft_tokens = max(hook(part, "max_draft_tokens", DRAFTER_HOOKS) or 1 for part, _ in parts)
        self._sources: torch.Tensor | None = None

    @property
    def sources(self) -> torch.Tensor | None:
        """Which part's draft each row of the last proposal carries (an index into ``parts``; −1: no
        part's), until ``observe`` has forwarded that step's outcome; None outside that window."""
        return self._sources

    def __repr__(self) -> str:
        names = ", ".join(type(part).__name__ for part, _ in self.parts)
        return f"CascadeDrafter([{names}], rule={self.rule!r})"

    @property
    def default_policy(self):
        """The hardware-aware scheduler on the parts' calibrated survival."""
        return HardwareAwareScheduler(max_draft_tokens=self.max_draft_tokens)

    @property
    def default_confidence(self):
        """``DrafterConfidence``: the survival each row's own part gave (``Draft.confidence``)."""
        return DrafterConfidence()

    def start(self, start: GenerationStart) -> None:
        """Start every part and every part's estimator that has a ``start`` hook."""
        for drafter, confidence in self.parts:
            for begin in (hook(drafter, "start", DRAFTER_HOOKS), hook(confidence, "start", ESTIMATOR_HOOKS)):
                if begin is not None:
                    begin(start)
        self._sources = None

    def propose(self, context: DraftContext, max_draft_tokens: int) -> Draft:
        """Each part drafts its rows (all of them under ``"confidence"``, the unclaimed ones under
        ``"first"``); every row keeps one part's draft, q and survival."""
        rows, device = context.rows.numel(), context.tokens.device
        wanted = torch.zeros(rows, dtype=torch.bool, device=device)
        wanted[torch.arange(rows, device=device) if context.draft_rows is None else context.draft_rows] = True
        drafts, survivals, sources = [], [], torch.full((rows,), -1, dtype=torch.long, device=device)
        best_first = torch.full((rows,), -1.0, device=device)
        for index, (drafter, confidence) in enumerate(self.parts):
            asked = wanted & (sources < 0) if self.rule == "first" else wanted
            part_context = attrs.evolve(context, draft_rows=asked.nonzero().squeeze(1))
            draft = drafter.propose(part_context, max_draft_tokens if bool(asked.any()) else 0)
            survival = confidence.survival(draft) if draft.num_tokens > 0 else torch.zeros((rows, 0), device=device)
            first = survival[:, 0].float() if draft.num_tokens > 0 else torch.full((rows,), -1.0, device=device)
            usable = asked & (draft.lengths > 0) & (first >= self.claim_survival) if draft.num_tokens > 0 else torch.zeros_like(asked)
            better = usable & (first > best_first) if self.rule == "confidence" else usable
            sources = torch.where(better, index, sources)
            best_first = torch.where(better, first, best_first)
            drafts.append(draft)
            survivals.append(survival)
        self._sources = sources
        return _combine(drafts, survivals, sources, self.vocab_size, max_draft_tokens)

    def observe(self, outcome: StepOutcome) -> None:
        """Forward each part the outcome of its own draft (others' rows: nothing verified or accepted)."""
        for index, (drafter, _) in enumerate(self.parts):
            own = self._sources == index if self._sources is not None else torch.zeros_like(outcome.finished)
            drafter.observe(attrs.evolve(
                outcome, verify_lengths=torch.where(own, outcome.verify_lengths, 0), accepted=torch.where(own, outcome.accepted, 0),
            ))
        self._sources = None


def _agreed(name: str, values: list, empty=None):
    """The one value the parts share, ignoring None (and ``empty``); refuse a disagreement."""
    present = {value for value in values if value is not None and value != empty}
    if len(present) > 1:
        raise ValueError(f"the parts' {name} must agree, got {values!r}")
    return next(iter(present), None)


def _combine(drafts: list[Draft], survivals: list[torch.Tensor], sources: torch.Tensor, vocab_size: int | None, width: int) -> Draft:
    """One draft whose row r is part sources[r]'s (empty where no part drafted), padded to ``width``."""
    rows, device = sources.shape[0], sources.device
    width = min(width, max(draft.num_tokens for draft in drafts))
    if width == 0 or not bool((sources >= 0).any()):
        return Draft.empty(rows, device)
    tokens = torch.zeros((rows, width), dtype=torch.long, device=device)
    lengths = torch.zeros(rows, dtype=torch.long, device=device)
    confidence = torch.zeros((rows, width), device=device)
    has_probs = any(draft.probs is not None for draft in drafts)
    probs = torch.zeros((rows, width, vocab_size), device=device) if has_probs else None
    for index, (draft, survival) in enumerate(zip(drafts, survivals)):
        mine = sources == index
        if draft.num_tokens == 0 or not bool(mine.any()):
            continue
        span = min(width, draft.num_tokens)
        tokens[mine, :span] = draft.tokens[mine, :span]
        lengths[mine] = draft.lengths[mine].clamp_max(span)
        confidence[mine, :span] = survival[mine, :span].float()
        if probs is not None:
            # A point-mass part's q is the one-hot of its token.
            part_probs = draft.probs[mine, :span] if draft.probs is not None else torch.nn.functional.one_hot(draft.tokens[mine, :span], vocab_size).float()
            probs[mine, :span] = part_probs.to(probs.dtype)
    return Draft(tokens=tokens, lengths=lengths, probs=probs, confidence=confidence.clamp(1e-6, 1 - 1e-6))
