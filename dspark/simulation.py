"""Trace-driven simulation of speculative decoding under load: how a verify policy would do at other
batch sizes and on other hardware, from recorded draft blocks and a cost model.

A ``BlockTrace`` holds draft blocks recorded with every drafted position verified (``FixedLength(γ)``
with a confidence estimator, so each block carries its survival c_1..c_γ): per block the survival, the
draft length and n, how many leading positions the target accepted. Verifying only ℓ ≤ γ of a block's
positions would have accepted min(ℓ, n): the target checks positions left to right and stops at the
first rejection, greedily and under rejection sampling alike (each position's accept draw does not
depend on how many positions follow it). Blocks are kept per recorded row (a stream, one prompt), so a
simulated row replays one prompt's blocks in order and easy and hard prompts stay distinct, which is
what a per-row fallback reacts to.

``simulate`` runs a static batch of R rows, each to ``new_tokens`` tokens, step by step like dspark's
loop: the cost model's ``start`` hook first learns the generation (its rows, sampling and, where given, the padded
prompt's length, from which ``AutoProfiledCostModel`` picks the table of the batch's shape and context, as it does in
the loop), the policy's row fallback (if any) names the rows to draft for, each drafted row takes its
stream's next block, the policy picks ℓ_r from the blocks' survival, the row emits min(ℓ_r, n) + 1
tokens, and the step costs D(k) + T(R, 1 + max_r ℓ_r) seconds, k the rows drafted (D(0) = 0). It
assumes what the cost model knows is the whole step: host overheads that it leaves out (estimating,
scheduling, the acceptance rule) are not simulated, nor EOS (every row runs to ``new_tokens``), nor the
feedback of the scheduler's choices on later blocks (verifying less does not change what is drafted next).
``synthetic_trace`` makes a trace with a chosen τ for targets and drafters there are no recordings of.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from dspark.checks import check_int
from dspark.protocols import COST_MODEL_HOOKS, POLICY_HOOKS, CostModel, VerifyPolicy, hook, run_drafts
from dspark.stats import StepRecord
from dspark.types import GenerationStart, SamplingConfig, VerifyContext
from dspark.verify.fallback import draft_depths

__all__ = ["BlockTrace", "SimulatedRun", "simulate", "synthetic_trace"]


@attrs.frozen
class BlockTrace:
    """Draft blocks per stream (one recorded row each): ``survival`` [n_i, γ] float, ``drafted`` [n_i] the
    draft lengths, ``accepted`` [n_i] the accepted counts with every drafted position verified."""

    survival: tuple[torch.Tensor, ...]
    drafted: tuple[torch.Tensor, ...]
    accepted: tuple[torch.Tensor, ...]

    def __attrs_post_init__(self):
        if not self.survival or not (len(self.survival) == len(self.drafted) == len(self.accepted)):
            raise ValueError(f"a BlockTrace needs the same number (>= 1) of survival, drafted and accepted streams, got {len(self.survival)}, {len(self.drafted)}, {len(self.accepted)}")
        width = self.survival[0].shape[1]
        for index, (survival, drafted, accepted) in enumerate(zip(self.survival, self.drafted, self.accepted)):
            if survival.dim() != 2 or survival.shape[1] != width or survival.shape[0] == 0:
                raise ValueError(f"survival stream {index} must be a non-empty FloatTensor[n, {width}], got shape {tuple(survival.shape)}")
            if tuple(drafted.shape) != (survival.shape[0],) or tuple(accepted.shape) != (survival.shape[0],):
                raise ValueError(f"drafted and accepted of stream {index} must have shape ({survival.shape[0]},), got {tuple(drafted.shape)} and {tuple(accepted.shape)}")
            if bool((accepted > drafted).any()) or bool((drafted > width).any()):
                raise ValueError(f"stream {index} must have accepted <= drafted <= γ={width}")

    @property
    def max_draft_tokens(self) -> int:
        """γ, the recorded block width."""
        return self.survival[0].shape[1]

    @property
    def tau(self) -> float:
        """Mean tokens per block with every drafted position verified, 1 + E[n]."""
        accepted = torch.cat(self.accepted).double()
        return 1.0 + float(accepted.mean())

    @classmethod
    def from_records(cls, records: Sequence) -> "BlockTrace":
        """The blocks of ``GenerationResult.stats.records`` from a run that verified every drafted position
        and scored survival (``FixedLength(γ)`` with a confidence estimator), one stream per row; each
        block's length is what was verified of it (less than drafted only where a row's budget ran out)."""
        streams: dict[int, list[tuple[torch.Tensor, int, int]]] = {}
        for step, record in enumerate(records):
            if record.survival is None and bool((record.verify_lengths > 0).any()):
                raise ValueError(f"records must carry survival (configure a confidence estimator); step {step} has none")
            if bool((record.verify_lengths > record.drafted).any()):
                raise ValueError(f"records must not verify more than was drafted; step {step} verified {record.verify_lengths.tolist()} of {record.drafted.tolist()}")
            if record.survival is None:
                continue  # a step that drafted nothing (the last one, with one token left per row)
            for index, row in enumerate(record.rows.tolist()):
                # A block counts for what was verified of it (a row's last steps verify less as its budget ends).
                if int(record.verify_lengths[index]) > 0:
                    streams.setdefault(row, []).append((record.survival[index].float(), int(record.verify_lengths[index]), int(record.accepted[index])))
        if not streams:
            raise ValueError("records hold no drafted block")
        width = max(blocks[0][0].numel() for blocks in streams.values())
        ordered = [streams[row] for row in sorted(streams)]
        return cls(
            survival=tuple(torch.stack([torch.nn.functional.pad(block[0], (0, width - block[0].numel())) for block in blocks]) for blocks in ordered),
            drafted=tuple(torch.tensor([block[1] for block in blocks]) for blocks in ordered),
            accepted=tuple(torch.tensor([block[2] for block in blocks]) for blocks in ordered),
        )


def synthetic_trace(tau: float, max_draft_tokens: int, streams: int = 64, blocks: int = 64, spread: float = 1.0, seed: int = 0) -> BlockTrace:
    """A trace whose mean tokens per fully verified block is ``tau``, with an ideal, calibrated estimator.

    Each stream (a prompt) has its acceptance rate u = σ(μ + s·z), z ~ N(0, 1) (s = ``spread``: larger
    spreads prompts further apart); each of its blocks keeps c_k = u at every position and accepts
    position k with probability u given the ones before, so 1 + E[Σ_k u^k] = ``tau``, μ found by bisection.
    """
    check_int("max_draft_tokens", max_draft_tokens, 1)
    check_int("streams", streams, 1)
    check_int("blocks", blocks, 1)
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not 1.0 < tau < 1.0 + max_draft_tokens:
        raise ValueError(f"tau must be a number in (1, 1 + max_draft_tokens={1 + max_draft_tokens}), got {tau!r}")
    if isinstance(spread, bool) or not isinstance(spread, (int, float)) or not spread >= 0:
        raise ValueError(f"spread must be a number >= 0, got {spread!r}")
    generator = torch.Generator().manual_seed(seed)
    # Fixed draws z: τ(μ) is then increasing in μ and the bisection converges to the wanted τ.
    logits = spread * torch.randn((streams,), generator=generator, dtype=torch.float64)
    powers = torch.arange(1, max_draft_tokens + 1, dtype=torch.float64)

    def expected_tau(mean: float) -> float:
        return 1.0 + float((torch.sigmoid(mean + logits)[:, None] ** powers).sum(dim=1).mean())

    low, high = -30.0, 30.0
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if expected_tau(middle) < tau else (low, middle)
    rate = torch.sigmoid((low + high) / 2 + logits)
    draws = torch.rand((streams, blocks, max_draft_tokens), generator=generator, dtype=torch.float64)
    accepted = (draws < rate[:, None, None]).long().cumprod(dim=2).sum(dim=2)
    survival = rate[:, None, None].expand(streams, blocks, max_draft_tokens).float()
    return BlockTrace(
        survival=tuple(survival[stream] for stream in range(streams)),
        drafted=tuple(torch.full((blocks,), max_draft_tokens) for _ in range(streams)),
        accepted=tuple(accepted[stream] for stream in range(streams)),
    )


@attrs.frozen
class SimulatedRun:
    """What ``simulate`` predicts for one static batch: tokens per second over all rows and per row (the
    same definitions as ``benchmarks/bench_load.py``), τ (tokens per row and step), the mean verify
    length per row and step, the seconds and the steps."""

    aggregate_tokens_per_s: float
    per_user_tokens_per_s: float
    tau: float
    mean_verify_length: float
    seconds: float
    steps: int

    def to_dict(self) -> dict:
        return attrs.asdict(self)


def simulate(
    trace: BlockTrace, policy: VerifyPolicy, cost_model: CostModel, rows: int, new_tokens: int,
    max_draft_tokens: int | None = None, priority: torch.Tensor | None = None, prompt_length: int | None = None,
    sampling: SamplingConfig | None = None,
) -> SimulatedRun:
    """Replay ``trace`` through ``policy`` on ``cost_model`` for a static batch of ``rows`` rows of
    ``new_tokens`` tokens each (module docstring). Row r replays stream r mod S from its start, cyclically.
    ``max_draft_tokens``: γ (default the trace's); a policy's ``max_draft_tokens`` caps it further.
    ``prompt_length``: the batch's padded prompt length P, which the cost model's ``start`` hook reads (the
    generation's ``max_length`` is then P + ``new_tokens``; None: unknown, ``max_length`` ``new_tokens`` + 1);
    ``sampling``: how the recorded tokens were drawn (default greedy), which the hook and the row fallback read."""
    check_int("rows", rows, 1)
    check_int("new_tokens", new_tokens, 1)
    if prompt_length is not None:
        check_int("prompt_length", prompt_length, 0)
    if not isinstance(policy, VerifyPolicy):
        raise TypeError(f"policy must implement dspark.VerifyPolicy, got {type(policy).__name__}")
    sampling = SamplingConfig() if sampling is None else sampling
    if not isinstance(sampling, SamplingConfig):
        raise TypeError(f"sampling must be a dspark.types.SamplingConfig, got {type(sampling).__name__}")
    gamma = trace.max_draft_tokens if max_draft_tokens is None else check_int("max_draft_tokens", max_draft_tokens, 0)
    policy_gamma = hook(policy, "max_draft_tokens", POLICY_HOOKS)
    gamma = min(gamma, trace.max_draft_tokens, gamma if policy_gamma is None else policy_gamma)
    weights = torch.ones(rows) if priority is None else priority.detach().float().cpu()
    streams = len(trace.survival)
    stream_of = [row % streams for row in range(rows)]
    cursor = [0] * rows
    emitted = torch.zeros(rows, dtype=torch.long)
    active = torch.arange(rows)
    fallback = hook(policy, "row_fallback", POLICY_HOOKS)
    max_length = new_tokens + 1 if prompt_length is None else prompt_length + new_tokens
    start = GenerationStart(rows=rows, device=torch.device("cpu"), max_draft_tokens=gamma, max_length=max_length, sampling=sampling,
                            priority=priority, prompt_length=prompt_length)
    # The cost model first, as in the loop: it may switch to a table of this generation's shape, which the fallback reads.
    cost_start = hook(cost_model, "start", COST_MODEL_HOOKS)
    if cost_start is not None:
        cost_start(start)
    run = None if fallback is None or gamma == 0 else fallback.start(start, cost_model)
    if run is not None and not run_drafts(run):
        gamma, run = 0, None  # as the loop does: the generation runs as plain decoding
    reads_context = hook(policy, "reads_context", POLICY_HOOKS)
    seconds, steps, verified, row_steps, tokens = 0.0, 0, 0, 0, 0
    while active.numel() > 0:
        count = active.numel()
        budget = new_tokens - emitted[active]
        depths = torch.full((count,), gamma) if run is None else draft_depths(run.draft_rows(active), count, gamma)
        drafting = (depths > 0) & (budget > 1)
        drafted_rows = int(drafting.sum())
        survival = torch.zeros((count, gamma))
        limits = torch.zeros(count, dtype=torch.long)
        full_accept = torch.zeros(count, dtype=torch.long)
        for index in drafting.nonzero().squeeze(1).tolist():
            row = int(active[index])
            stream = stream_of[row]
            block = cursor[row] % trace.survival[stream].shape[0]
            cursor[row] += 1
            survival[index] = trace.survival[stream][block, :gamma]
            limits[index] = min(int(trace.drafted[stream][block]), int(depths[index]), int(budget[index]) - 1)
            full_accept[index] = trace.accepted[stream][block]
        if drafted_rows > 0:
            context = VerifyContext(rows=active, priority=weights[active], drafted_rows=drafted_rows)
            arguments = (survival, cost_model, limits, context) if reads_context else (survival, cost_model, limits)
            verify_lengths = torch.minimum(policy.lengths(*arguments).long().clamp_min(0), limits)
        else:
            verify_lengths = torch.zeros(count, dtype=torch.long)
        accepted = torch.minimum(verify_lengths, full_accept)
        step_tokens = torch.minimum(accepted + 1, budget)
        draft_seconds = cost_model.draft_time(drafted_rows, int(depths[drafting].max())) if drafted_rows > 0 else 0.0
        seconds += draft_seconds + cost_model.step_time(count, 1 + int(verify_lengths.max()))
        if run is not None:
            run.observe(StepRecord(rows=active, verify_lengths=verify_lengths, accepted=accepted, emitted=step_tokens, drafted=limits,
                                   survival=survival, draft_seconds=0.0, verify_seconds=0.0, cache_slots=0, drafted_for=drafting))
        emitted[active] += step_tokens
        tokens += int(step_tokens.sum())
        verified += int(verify_lengths.sum())
        row_steps += count
        steps += 1
        active = active[emitted[active] < new_tokens]
    return SimulatedRun(
        aggregate_tokens_per_s=tokens / seconds, per_user_tokens_per_s=tokens / rows / seconds,
        tau=tokens / row_steps, mean_verify_length=verified / row_steps, seconds=seconds, steps=steps,
    )
