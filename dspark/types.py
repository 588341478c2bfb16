"""Frozen value types that travel between the parts of one decoding step."""

from __future__ import annotations

import attrs
import torch

from dspark.checks import int_at_least

__all__ = ["SamplingConfig", "GenerationStart", "DraftContext", "Draft", "StepOutcome", "VerifyContext"]


@attrs.frozen
class SamplingConfig:
    """How the next token is chosen: greedy, or sampling after temperature / top-k / top-p warping."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = attrs.field(default=None, validator=int_at_least(0, optional=True))
    top_p: float | None = None

    def __attrs_post_init__(self):
        if not isinstance(self.do_sample, bool):
            raise TypeError(f"do_sample must be a bool, got {self.do_sample!r}")
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)):
            raise TypeError(f"temperature must be a float, got {self.temperature!r}")
        if self.do_sample and not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 when do_sample=True, got {self.temperature!r}")
        if self.top_p is not None and not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be None or in (0, 1], got {self.top_p!r}")


@attrs.frozen
class GenerationStart:
    """What a drafter learns when a generation begins (its optional ``start`` hook).

    ``rows``: the batch size; every later ``DraftContext.rows`` and ``StepOutcome.rows`` indexes it.
    ``max_draft_tokens``: the block width γ of this generation; ``max_length``: the longest a row's
    context can grow (prompt plus ``max_new_tokens``); ``sampling``: how tokens are chosen;
    ``priority``: each row's weight w_r > 0 as the caller of ``generate`` gave it (FloatTensor[rows],
    None: all equal), which goodput-maximising parts weigh the row's tokens by; ``prompt_length``: the
    padded prompt's length, the context every row's cache starts from (None where unknown), which
    cost models that depend on the context read.
    """

    rows: int = attrs.field(validator=int_at_least(0))
    device: torch.device = attrs.field(validator=attrs.validators.instance_of(torch.device))
    max_draft_tokens: int = attrs.field(validator=int_at_least(0))
    max_length: int = attrs.field(validator=int_at_least(1))
    sampling: SamplingConfig = attrs.field(validator=attrs.validators.instance_of(SamplingConfig))
    priority: torch.Tensor | None = None
    prompt_length: int | None = attrs.field(default=None, validator=int_at_least(0, optional=True))

    def __attrs_post_init__(self):
        if self.prompt_length is not None and self.prompt_length > self.max_length:
            raise ValueError(f"prompt_length must be <= max_length ({self.max_length}), got {self.prompt_length!r}")


@attrs.frozen
class DraftContext:
    """What a drafter may read when it proposes: the committed tokens of every active row.

    ``tokens[r, begin[r]:end[r]]`` is row r's context; its last token is the anchor, which the
    target has produced but not yet consumed. ``rows`` are the rows' indices in the caller's batch,
    ``step`` counts target forwards since the prompt (0 at the first proposal of a generation).

    For drafters with ``target_layers``: ``features`` [R, T, m·d] are the target's hidden states of
    those layers for the T tokens of its last forward (the prompt's prefill, then each verify step),
    and ``feature_mask`` [R, T] marks the ones that were committed (the rest were padding or rejected).
    Committed positions are, in order, the context tokens after those the drafter has already seen.

    ``draft_rows``: LongTensor[k], the positions (0..R−1, ascending) of the rows to draft for this step,
    or None for all of them. A verify policy's row fallback (``POLICY_HOOKS["row_fallback"]``) or a
    per-request cap of 0 leaves the other rows out: the target verifies none of their tokens, so a
    drafter should spend no work on them (``Draft.placed`` spreads a subset's draft over the batch); one
    that drafts them anyway stays correct and only wastes the time. A stateful drafter must still read
    every row's ``features``; that is why ``propose`` is called, with ``max_draft_tokens`` 0, on a step
    where the fallback drafts for no row.
    """

    tokens: torch.Tensor
    begin: torch.Tensor
    end: torch.Tensor
    rows: torch.Tensor
    step: int
    sampling: SamplingConfig
    generator: torch.Generator | None = None
    features: torch.Tensor | None = None
    feature_mask: torch.Tensor | None = None
    draft_rows: torch.Tensor | None = None

    @property
    def anchors(self) -> torch.Tensor:
        """The last committed token of every row, LongTensor[R]."""
        return self.tokens.gather(1, (self.end - 1)[:, None]).squeeze(1)


@attrs.frozen
class Draft:
    """A block of proposed tokens per row.

    ``tokens``: LongTensor[R, γ]; ``lengths``: LongTensor[R], how many leading tokens of each row are
    real proposals (the rest is padding). ``probs``: FloatTensor[R, γ, V], the draft distribution q_k
    each token was drawn from, warped exactly as the target's p will be (None for point-mass drafts
    such as n-gram lookup). ``confidence``: the drafter's own per-position confidence, if it has one.
    ``signals``: FloatTensor[R, γ, F] of features of each position known before its token was drawn
    (for n-gram lookup: the matched n, the match's age, how often it recurs), which estimators of
    drafters without a distribution or head read (``dspark.verify.draft_signals``).
    """

    tokens: torch.Tensor
    lengths: torch.Tensor
    probs: torch.Tensor | None = None
    confidence: torch.Tensor | None = None
    signals: torch.Tensor | None = None

    def __attrs_post_init__(self):
        if self.tokens.dim() != 2 or self.tokens.dtype != torch.long:
            raise ValueError(f"Draft.tokens must be a LongTensor[R, γ], got {self.tokens.dtype} {tuple(self.tokens.shape)}")
        rows, gamma = self.tokens.shape
        if tuple(self.lengths.shape) != (rows,):
            raise ValueError(f"Draft.lengths must have shape ({rows},), got {tuple(self.lengths.shape)}")
        if self.probs is not None and tuple(self.probs.shape[:2]) != (rows, gamma):
            raise ValueError(f"Draft.probs must have shape ({rows}, {gamma}, V), got {tuple(self.probs.shape)}")
        if self.confidence is not None and tuple(self.confidence.shape) != (rows, gamma):
            raise ValueError(f"Draft.confidence must have shape ({rows}, {gamma}), got {tuple(self.confidence.shape)}")
        if self.signals is not None and (self.signals.dim() != 3 or tuple(self.signals.shape[:2]) != (rows, gamma)):
            raise ValueError(f"Draft.signals must have shape ({rows}, {gamma}, F), got {tuple(self.signals.shape)}")

    @classmethod
    def empty(cls, rows: int, device: torch.device) -> "Draft":
        """A draft with no tokens for ``rows`` rows (nothing to verify)."""
        return cls(tokens=torch.zeros((rows, 0), dtype=torch.long, device=device), lengths=torch.zeros(rows, dtype=torch.long, device=device))

    @classmethod
    def from_positions(
        cls, tokens: list[torch.Tensor], probs: list[torch.Tensor], rows: int, device: torch.device, confidence: list[torch.Tensor] | None = None
    ) -> "Draft":
        """A full-length draft from per-position tokens [R], distributions [R, V] and confidences [R]."""
        if not tokens:
            return cls.empty(rows, device)
        return cls(
            tokens=torch.stack(tokens, dim=1),
            lengths=torch.full((rows,), len(tokens), dtype=torch.long, device=device),
            probs=torch.stack(probs, dim=1),
            confidence=None if confidence is None else torch.stack(confidence, dim=1).float(),
        )

    def placed(self, rows: int, positions: torch.Tensor) -> "Draft":
        """This draft of k rows spread over a batch of ``rows`` rows: its row i becomes row
        ``positions[i]``; every other row gets length 0 (and zero tokens, q, confidence and signals)."""
        if tuple(positions.shape) != (self.tokens.shape[0],):
            raise ValueError(f"positions must hold one batch row per draft row ({self.tokens.shape[0]}), got shape {tuple(positions.shape)}")

        def spread(values: torch.Tensor | None) -> torch.Tensor | None:
            if values is None:
                return None
            return values.new_zeros((rows, *values.shape[1:])).index_copy_(0, positions, values)

        return Draft(
            tokens=spread(self.tokens), lengths=spread(self.lengths), probs=spread(self.probs),
            confidence=spread(self.confidence), signals=spread(self.signals),
        )

    @property
    def num_tokens(self) -> int:
        """γ, the block width (the longest proposal in the batch)."""
        return self.tokens.shape[1]


@attrs.frozen
class StepOutcome:
    """What the target decided in one step, for ``Drafter.observe``.

    ``rows``: the rows' indices in the caller's batch; ``verify_lengths``: ℓ_r; ``accepted``: n_r ≤ ℓ_r;
    ``next_tokens``: the recovered or bonus token, the new anchor; ``finished``: rows that stop here
    and leave the batch, so the next ``DraftContext`` has only the rows where it is False.
    """

    rows: torch.Tensor
    verify_lengths: torch.Tensor
    accepted: torch.Tensor
    next_tokens: torch.Tensor
    finished: torch.Tensor


@attrs.frozen
class VerifyContext:
    """What a verify policy that declares ``reads_context`` (``POLICY_HOOKS``) learns besides survival,
    the cost model and the limits, for the R rows of this step.

    ``rows``: the rows' indices in the caller's batch, LongTensor[R]; ``priority``: each row's weight
    w_r > 0 (FloatTensor[R], all 1 unless the caller of ``generate`` passed ``priority``), so that a
    policy can maximise the weighted goodput Σ_r w_r·(tokens of row r) per second; ``drafted_rows``:
    how many rows were drafted this step (the others have limit 0), for the cost model's ``draft_time``;
    ``remaining``: the tokens each row may still emit, this step's included (LongTensor[R]; None where
    the caller does not know, as in a simulation of continuous batching).
    """

    rows: torch.Tensor
    priority: torch.Tensor
    drafted_rows: int = attrs.field(validator=int_at_least(0))
    remaining: torch.Tensor | None = None
