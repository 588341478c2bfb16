"""Per-step records of a generation and the summaries built on them."""

from __future__ import annotations

import functools

import attrs
import torch

__all__ = ["GenerationStats", "StepRecord", "VerifiedToken", "GenerationResult"]


@attrs.frozen
class StepRecord:
    """One target forward. Tensors are on the CPU and indexed like ``rows``.

    ``rows``: the active rows' indices in the batch; ``verify_lengths``: ℓ_r; ``accepted``: n_r;
    ``emitted``: tokens appended to each row (n_r + 1, fewer when EOS or max_new_tokens cut the step);
    ``drafted``: how many leading draft positions of each row hold a real proposal;
    ``survival``: c_k for every drafted position (FloatTensor[R, γ]) or None without an estimator;
    ``draft_seconds`` / ``verify_seconds``: host wall-clock time of proposing (with estimating and scheduling)
    and of the target forward with the acceptance rule (on an accelerator, asynchronous work may be
    counted in the later of the two); ``cache_slots``: the target cache's length after this step's
    tokens were committed, before finished rows leave the batch; ``estimator``: what the confidence
    estimator reported for this step (its optional ``report`` hook, e.g. recalibrated temperatures).
    ``drafted_for``: BoolTensor[R], the rows the drafter was asked to draft for (a policy's row fallback and
    per-request caps of 0 leave rows out; None in records not made by the loop).
    """

    rows: torch.Tensor
    verify_lengths: torch.Tensor
    accepted: torch.Tensor
    emitted: torch.Tensor
    drafted: torch.Tensor
    survival: torch.Tensor | None
    draft_seconds: float
    verify_seconds: float
    cache_slots: int
    estimator: dict | None = None
    drafted_for: torch.Tensor | None = None

    @property
    def asked(self) -> torch.Tensor:
        """BoolTensor[R], the rows the drafter was asked to draft for: ``drafted_for``, else (a record not made by the
        loop) the rows that hold a proposal."""
        return self.drafted > 0 if self.drafted_for is None else self.drafted_for


@attrs.frozen
class VerifiedToken:
    """One draft token the target checked. ``position`` is 1-based; ``survival`` is c_k (None without an
    estimator) and ``prefix_survival`` a_k = c_1·…·c_k; ``reached``: all earlier positions of its draft were
    accepted; ``accepted``: the target accepted it (it is emitted unless an EOS or max_new_tokens ended the
    row earlier in the same step)."""

    step: int
    row: int
    position: int
    survival: float | None
    prefix_survival: float | None
    reached: bool
    accepted: bool


@attrs.frozen
class GenerationStats:
    """Everything measured while generating; ``records`` has one ``StepRecord`` per target forward."""

    records: tuple[StepRecord, ...]
    max_draft_tokens: int

    @property
    def steps(self) -> int:
        """Target forwards after the prompt's prefill."""
        return len(self.records)

    @property
    def verify_lengths(self) -> tuple[torch.Tensor, ...]:
        """ℓ_r of every active row, one LongTensor[rows] per step."""
        return tuple(record.verify_lengths for record in self.records)

    @property
    def accepted(self) -> tuple[torch.Tensor, ...]:
        """n_r of every active row, one LongTensor[rows] per step."""
        return tuple(record.accepted for record in self.records)

    @property
    def tau(self) -> float:
        """Mean tokens emitted per target forward per row (accepted + 1 when nothing cuts the step)."""
        row_steps = sum(record.rows.numel() for record in self.records)
        return self.new_tokens / row_steps if row_steps else 0.0

    @property
    def new_tokens(self) -> int:
        """Tokens generated over all rows."""
        return int(sum(record.emitted.sum() for record in self.records))

    @property
    def draft_seconds(self) -> float:
        """Total time spent proposing, estimating and scheduling."""
        return sum(record.draft_seconds for record in self.records)

    @property
    def verify_seconds(self) -> float:
        """Total time spent in target forwards and acceptance."""
        return sum(record.verify_seconds for record in self.records)

    @functools.cached_property
    def verified(self) -> tuple[VerifiedToken, ...]:
        """One record per verified draft token, in step, row, position order."""
        tokens = []
        for step, record in enumerate(self.records):
            prefix = None if record.survival is None else record.survival.cumprod(dim=1)
            for index, row in enumerate(record.rows.tolist()):
                accepted = int(record.accepted[index])
                for position in range(1, int(record.verify_lengths[index]) + 1):
                    tokens.append(
                        VerifiedToken(
                            step=step,
                            row=row,
                            position=position,
                            survival=None if prefix is None else float(record.survival[index, position - 1]),
                            prefix_survival=None if prefix is None else float(prefix[index, position - 1]),
                            reached=accepted >= position - 1,
                            accepted=accepted >= position,
                        )
                    )
        return tuple(tokens)

    @property
    def position_acceptance(self) -> torch.Tensor:
        """P(position k accepted | positions 1..k-1 accepted) over verified tokens, FloatTensor[γ]; NaN where never reached."""
        reached, accepted = self.position_counts()
        return accepted / reached

    def position_counts(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(reached, accepted) verified-token counts per draft position 1..γ, FloatTensor[γ] each; sums over
        several generations give their pooled conditional acceptance."""
        reached = torch.zeros(self.max_draft_tokens)
        accepted = torch.zeros(self.max_draft_tokens)
        positions = torch.arange(1, self.max_draft_tokens + 1)
        for record in self.records:
            verified = positions[None, :] <= record.verify_lengths[:, None]
            reached += (verified & (record.accepted[:, None] >= positions[None, :] - 1)).sum(dim=0)
            accepted += (verified & (record.accepted[:, None] >= positions[None, :])).sum(dim=0)
        return reached, accepted

    def summary(self) -> dict:
        """Plain numbers for logs and JSON."""
        return {
            "steps": self.steps,
            "new_tokens": self.new_tokens,
            "tau": self.tau,
            "draft_seconds": self.draft_seconds,
            "verify_seconds": self.verify_seconds,
            "position_acceptance": [None if value != value else float(value) for value in self.position_acceptance.tolist()],
        }


@attrs.frozen
class GenerationResult:
    """``sequences``: LongTensor[batch, prompt_len + generated], left-padded prompts as given, rows that
    finished early padded with pad_token_id after their EOS (as Hugging Face ``generate`` returns them)."""

    sequences: torch.Tensor
    stats: GenerationStats
