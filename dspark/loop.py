"""The speculative generate loop: one target forward per step over a ragged batch.

Before the first step the cost model's optional ``start`` hook learns the batch (``GenerationStart``), the
policy's row fallback, if it has one, starts a run (one whose ``drafts`` is False makes the whole generation
plain decoding: no target features, the drafter never runs), then the drafter's and the estimator's optional
``start`` hooks learn the batch too, unless nothing will be drafted. Each step: (0) the
fallback and the per-request caps name the rows worth drafting for and how deep, (1) the drafter
proposes for them (every row's features still reach it), (2) the estimator scores survival,
(3) the policy picks ℓ_r, (4) the target runs once on [anchor, x_1..x_ℓ] for every row, (5) the
acceptance rule keeps a prefix and adds one token, (6) the cache keeps accepted slots and the tokens
are written out, (7) the drafter (unless the generation drafts nothing) and an estimator that scored this step observe the outcome,
(8) finished rows leave the batch.
"""

from __future__ import annotations

import contextlib
import time

import attrs
import torch

from dspark.fast_path import FastPath
from dspark.kv import RaggedCache
from dspark.protocols import COST_MODEL_HOOKS, DRAFTER_HOOKS, ESTIMATOR_HOOKS, POLICY_HOOKS, hook, run_drafts
from dspark.stats import GenerationResult, GenerationStats, StepRecord
from dspark.strategy import Strategy
from dspark.types import Draft, DraftContext, GenerationStart, SamplingConfig, StepOutcome, VerifyContext
from dspark.verify.acceptance import greedy_accept, rejection_sample
from dspark.verify.fallback import draft_depths
from dspark.verify.warping import warped_probs

__all__ = ["PREFILL_CHUNK_TOKENS", "LoopSpec", "run_generation"]

#: The prompt's prefill reads at most about this many tokens (rows × columns) per target forward (``_prefill``).
PREFILL_CHUNK_TOKENS = 4096


@attrs.frozen
class LoopSpec:
    """Everything a generation needs besides the prompt, validated by the caller. ``draft_caps``: each
    request's cap on its verify length (LongTensor[B], None: no cap); ``priority``: each request's
    weight w_r > 0 (FloatTensor[B], None: all 1); ``prefill_chunk_tokens``: the prefill's tokens per forward
    (``_prefill``)."""

    target: torch.nn.Module
    strategy: Strategy
    forward_arguments: frozenset
    max_new_tokens: int
    sampling: SamplingConfig
    eos_token_ids: tuple[int, ...]
    pad_token_id: int
    generator: torch.Generator | None = None
    streamer: object | None = None
    fast_path: FastPath | None = None
    draft_caps: torch.Tensor | None = None
    priority: torch.Tensor | None = None
    prefill_chunk_tokens: int = PREFILL_CHUNK_TOKENS

    def forward_mode(self):
        """The block in which dspark's own forwards (target and drafter) run: the fast path when set."""
        return contextlib.nullcontext() if self.fast_path is None else self.fast_path.active()


def _target_forward(
    spec: LoopSpec, tokens: torch.Tensor, cache: RaggedCache, new_mask: torch.Tensor, keep: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run the target on ``tokens`` appended to the cache.

    Returns float32 logits of the last ``keep`` positions and, when the drafter reads target
    features, the hidden states of its ``target_layers`` concatenated, [R, T, m·d] (else None).
    """
    inputs = cache.forward_inputs(new_mask, position_ids="position_ids" in spec.forward_arguments)
    if "logits_to_keep" in spec.forward_arguments:
        inputs["logits_to_keep"] = keep
    layers = spec.strategy.target_layers
    with spec.forward_mode():
        outputs = spec.target(input_ids=tokens, output_hidden_states=bool(layers), **inputs)
    features = torch.cat([outputs.hidden_states[layer] for layer in layers], dim=-1).to(tokens.device) if layers else None
    return outputs.logits[:, -keep:].float().to(tokens.device), features


def _prefill(spec: LoopSpec, prompt: torch.Tensor, cache: RaggedCache, mask: torch.Tensor) -> torch.Tensor | None:
    """Step 0: the target reads ``prompt`` [R, P] into the cache, ``max(1, prefill_chunk_tokens // R)`` columns per
    forward, and returns the features of every column (None when the drafter reads none). In chunks, because a
    forward that returns hidden states keeps every layer's for all its tokens alive until it ends, and attention
    under an explicit mask computes the whole square of a forward's columns where chunks compute about half of it
    (docs: fast_path.rst, "The prompt: read in chunks")."""
    rows, width = prompt.shape
    columns = max(1, spec.prefill_chunk_tokens // rows)
    features = []
    for start in range(0, width, columns):
        chunk_mask = mask[:, start : start + columns]
        _, chunk_features = _target_forward(spec, prompt[:, start : start + columns], cache, chunk_mask, keep=1)
        cache.commit(chunk_mask)
        if chunk_features is not None:
            features.append(chunk_features)
    return torch.cat(features, dim=1) if features else None


def _emitted_block(draft_tokens: torch.Tensor, accepted: torch.Tensor, next_tokens: torch.Tensor, width: int) -> torch.Tensor:
    """[x_1..x_n, next, ...] per row, LongTensor[R, width]; entries past n are meaningless."""
    block = torch.cat([draft_tokens[:, : width - 1], next_tokens[:, None]], dim=1)
    block.scatter_(1, accepted[:, None], next_tokens[:, None])
    return block


def _cut(block: torch.Tensor, count: torch.Tensor, budget: torch.Tensor, eos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Shorten each row's emission at its first EOS and at its token budget; return (count, finished)."""
    positions = torch.arange(block.shape[1], device=block.device)[None, :]
    is_eos = torch.isin(block, eos) & (positions < count[:, None])
    first_eos = torch.where(is_eos.any(dim=1), is_eos.long().argmax(dim=1) + 1, count)
    count = torch.minimum(first_eos, budget)
    return count, is_eos.any(dim=1) | (count == budget)


def _depths(run, caps: torch.Tensor | None, host_rows: torch.Tensor, gamma: int) -> torch.Tensor | None:
    """Step 0: how many tokens to draft for each of this step's rows (host LongTensor[R], 0: none), from the
    fallback and the per-request caps (drafting past a cap is never verified); None: γ for every row."""
    depths = None if run is None else draft_depths(run.draft_rows(host_rows), host_rows.numel(), gamma)
    if caps is not None:
        capped = caps[host_rows].clamp(0, gamma)
        depths = capped if depths is None else torch.minimum(capped, depths)
    return None if depths is None or bool((depths == gamma).all()) else depths


def _limits(spec: LoopSpec, rows: torch.Tensor, budget: torch.Tensor, depths: torch.Tensor | None) -> torch.Tensor:
    """The most draft tokens each row may have verified: what it may still emit after one more token, its
    request's cap, and its draft depth (0 for rows not drafted for)."""
    limits = budget - 1 if spec.draft_caps is None else torch.minimum(budget - 1, spec.draft_caps[rows])
    return limits if depths is None else torch.minimum(limits, depths.to(limits.device))


def _schedule(spec: LoopSpec, draft: Draft, context: VerifyContext, max_draft_tokens: int, limits: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Steps 2 and 3: survival c[r, k] (None without an estimator) and verify lengths ℓ_r ≤ ``limits``
    (what each row may emit, its cap, 0 for rows not drafted) and ≤ its draft's length."""
    strategy, rows = spec.strategy, limits.shape[0]
    if draft.tokens.shape[0] != rows or draft.num_tokens > max_draft_tokens:
        raise ValueError(
            f"{type(strategy.drafter).__name__}.propose must return at most {max_draft_tokens} tokens for each of {rows} rows, "
            f"got tokens of shape {tuple(draft.tokens.shape)}"
        )
    if draft.num_tokens == 0:
        return None, torch.zeros_like(limits)
    survival = strategy.confidence.survival(draft) if strategy.confidence is not None else None
    limits = torch.minimum(draft.lengths.clamp(0, draft.num_tokens), limits)
    if hook(strategy.policy, "reads_context", POLICY_HOOKS):
        verify_lengths = strategy.policy.lengths(survival, strategy.cost_model, limits, context)
    else:
        verify_lengths = strategy.policy.lengths(survival, strategy.cost_model, limits)
    return survival, torch.minimum(verify_lengths.long().clamp_min(0), limits)


def _accept(spec: LoopSpec, draft: Draft, logits: torch.Tensor, verify_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 5: the acceptance rule over the verified prefix; returns (accepted n, next token)."""
    draft_tokens = draft.tokens[:, : logits.shape[1] - 1]
    if not spec.sampling.do_sample:
        return greedy_accept(draft_tokens, logits, verify_lengths)
    draft_probs = None if draft.probs is None else draft.probs[:, : draft_tokens.shape[1]]
    if draft_probs is not None and draft_probs.shape[-1] != logits.shape[-1]:
        raise ValueError(f"Draft.probs must cover the target's {logits.shape[-1]} tokens, got {draft_probs.shape[-1]}")
    target_probs = warped_probs(logits, spec.sampling)
    return rejection_sample(draft_tokens, draft_probs, target_probs, verify_lengths, spec.generator)


def run_generation(spec: LoopSpec, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> GenerationResult:
    """Generate up to ``spec.max_new_tokens`` tokens per row; see the module docstring for the steps."""
    strategy, device = spec.strategy, input_ids.device
    batch, prompt_length = input_ids.shape
    sequences = torch.full((batch, prompt_length + spec.max_new_tokens), spec.pad_token_id, dtype=torch.long, device=device)
    sequences[:, :prompt_length] = input_ids
    begin = (attention_mask == 0).sum(dim=1)
    end = torch.full((batch,), prompt_length, dtype=torch.long, device=device)
    emitted = torch.zeros(batch, dtype=torch.long, device=device)
    rows = torch.arange(batch, device=device)
    eos = torch.tensor(spec.eos_token_ids, dtype=torch.long, device=device)
    cache = RaggedCache(batch, device, hole_budget=strategy.max_draft_tokens + 1)
    records = []
    generation = GenerationStart(rows=batch, device=device, max_draft_tokens=strategy.max_draft_tokens,
                                 max_length=prompt_length + spec.max_new_tokens, sampling=spec.sampling, priority=spec.priority,
                                 prompt_length=prompt_length)
    # The cost model first: it may switch to a table of this generation's shape, which the fallback reads.
    cost_start = hook(strategy.cost_model, "start", COST_MODEL_HOOKS)
    if cost_start is not None:
        cost_start(generation)
    priority = torch.ones(batch, device=device) if spec.priority is None else spec.priority
    host_caps, host_rows = None if spec.draft_caps is None else spec.draft_caps.cpu(), torch.arange(batch)
    fallback = hook(strategy.policy, "row_fallback", POLICY_HOOKS)
    # A generation that cannot draft (γ 0, no new tokens) does not start a run: it would count as a plain one.
    starts_run = fallback is not None and strategy.max_draft_tokens > 0 and spec.max_new_tokens > 0
    fallback_run = fallback.start(generation, strategy.cost_model) if starts_run else None
    if fallback_run is not None and not run_drafts(fallback_run):
        # The run says this generation drafts nothing: plain decoding, which asks the target for no hidden states
        # (the prompt's included) and never runs the drafter, the estimator or the fallback.
        spec = attrs.evolve(spec, strategy=attrs.evolve(strategy, max_draft_tokens=0))
        strategy, fallback_run = spec.strategy, None
    estimator = strategy.confidence
    estimator_observe, estimator_report = (hook(estimator, name, ESTIMATOR_HOOKS) if estimator is not None else None for name in ("observe", "report"))
    observe_step, observe_draft = (hook(strategy.cost_model, name, COST_MODEL_HOOKS) for name in ("observe_step", "observe_draft"))
    for start in (hook(strategy.drafter, "start", DRAFTER_HOOKS), estimator and hook(estimator, "start", ESTIMATOR_HOOKS)):
        if start is not None and strategy.max_draft_tokens > 0:
            start(generation)
    if spec.streamer is not None:
        spec.streamer.put(input_ids.cpu())

    # 0. Prefill: the target consumes the prompt except its last token, which is the first anchor.
    features, feature_mask = None, attention_mask[:, :-1]
    if prompt_length > 1:
        features = _prefill(spec, input_ids[:, :-1], cache, feature_mask)
    if spec.max_new_tokens == 0:
        rows = rows[:0]

    step, drafted_before = 0, False
    while rows.numel() > 0:
        started = time.perf_counter()
        budget = spec.max_new_tokens - emitted[rows]
        # 0. The rows worth drafting for, and how deep (decided on the host from earlier steps only).
        depths = _depths(fallback_run, host_caps, host_rows, strategy.max_draft_tokens)
        drafting = None if depths is None or bool((depths > 0).all()) else depths > 0
        drafted_rows, most_left = rows.numel() if drafting is None else int(drafting.sum()), int(budget.max())
        deepest = strategy.max_draft_tokens if depths is None else int(depths.max())
        # 1. Draft: never more tokens than any row could still emit after its anchor's successor. When the
        # fallback drafts for no row, propose still runs (for 0 tokens) so that stateful drafters read the features.
        max_draft_tokens = max(min(deepest, most_left - 1), 0) if drafted_rows > 0 else 0
        reads_features = drafted_rows == 0 and strategy.max_draft_tokens > 0 and most_left > 1
        context = DraftContext(
            tokens=sequences[rows], begin=begin[rows], end=end[rows], rows=rows, step=step,
            sampling=spec.sampling, generator=spec.generator, features=features, feature_mask=feature_mask,
            draft_rows=None if drafting is None else drafting.nonzero().squeeze(1).to(device),
        )
        with spec.forward_mode():
            draft = strategy.drafter.propose(context, max_draft_tokens) if max_draft_tokens > 0 or reads_features else Draft.empty(rows.numel(), device)
        # 2. Survival, 3. verify lengths.
        verify_context = VerifyContext(rows=rows, priority=priority[rows], drafted_rows=drafted_rows if max_draft_tokens > 0 else 0, remaining=budget)
        survival, verify_lengths = _schedule(spec, draft, verify_context, max_draft_tokens, _limits(spec, rows, budget, depths))

        # 4. One target forward over [anchor, x_1..x_ℓ] for every row.
        width = 1 + int(verify_lengths.max())  # a host sync: the drafting time below includes the device's work
        drafted = time.perf_counter()
        positions = torch.arange(width, device=device)[None, :]
        tokens = torch.cat([context.anchors[:, None], draft.tokens[:, : width - 1]], dim=1)
        logits, features = _target_forward(spec, tokens, cache, positions < 1 + verify_lengths[:, None], keep=width)

        # 5. Acceptance rule.
        accepted, next_tokens = _accept(spec, draft, logits, verify_lengths)

        # 6. Keep the anchor and accepted slots; write the emitted tokens.
        feature_mask = (positions < 1 + accepted[:, None]).long()
        cache.commit(feature_mask)
        block = _emitted_block(draft.tokens, accepted, next_tokens, width)
        count, finished = _cut(block, accepted + 1, budget, eos)
        written = positions < count[:, None]
        row_index = rows[:, None].expand_as(block)
        sequences[row_index[written], (end[rows][:, None] + positions)[written]] = block[written]
        end[rows] += count
        emitted[rows] += count
        # One device-to-host copy for the step's counts (each .cpu() is a sync on an accelerator), so the
        # verify time below includes the device's work too.
        counts = torch.stack([rows, verify_lengths, accepted.long(), count.long(), draft.lengths.clamp(0, draft.num_tokens), finished.long()]).cpu()
        verified = time.perf_counter()
        if spec.streamer is not None:
            spec.streamer.put(block[0, : int(count[0])].cpu())

        # 7. Observe: the estimator learns only from steps it scored, after their survival was used.
        outcome = StepOutcome(rows=rows, verify_lengths=verify_lengths, accepted=accepted, next_tokens=next_tokens, finished=finished)
        if strategy.max_draft_tokens > 0:  # a generation that drafts nothing never started the drafter
            strategy.drafter.observe(outcome)
        if survival is not None and estimator_observe is not None:
            estimator_observe(outcome)
        records.append(
            StepRecord(
                rows=counts[0], verify_lengths=counts[1], accepted=counts[2], emitted=counts[3], drafted=counts[4],
                survival=None if survival is None else survival.float().cpu(),
                draft_seconds=drafted - started, verify_seconds=verified - drafted, cache_slots=cache.slots,
                estimator=estimator_report() if survival is not None and estimator_report is not None else None,
                drafted_for=torch.full((rows.numel(),), max_draft_tokens > 0) if drafting is None else drafting & (max_draft_tokens > 0),
            )
        )
        # The cost model learns what this step's forward and drafting actually took; not from the first step, whose
        # forward also pays for what the prefill left (the cache's buffers, filled by the prompt, grow: a copy of the
        # whole cache), and one such step in a cell observed rarely (a batch's one-token step, where it mostly drafts)
        # would price every later skip too high.
        if observe_step is not None and step > 0:
            observe_step(rows.numel(), width, verified - drafted)
        # Only a pass that followed a drafting pass teaches the drafting time: one that follows steps with no
        # drafting (or the prefill, at step 0) also reads every feature column committed since, a cost of
        # having skipped, which would make steady drafting look dearer than it is.
        drafted_now = max_draft_tokens > 0 and verify_context.drafted_rows > 0
        if observe_draft is not None and drafted_now and drafted_before and bool(counts[4].any()):
            observe_draft(verify_context.drafted_rows, drafted - started, max_draft_tokens)
        drafted_before = drafted_now
        if fallback_run is not None:
            fallback_run.observe(records[-1])
        # 8. Finished rows stop costing compute.
        host_finished = counts[5].bool()
        if bool(host_finished.any()):
            still = ~finished
            rows, feature_mask, host_rows = rows[still], feature_mask[still], host_rows[~host_finished]
            features = None if features is None else features[still]
            cache.drop_finished(finished)
        step += 1

    if spec.streamer is not None:
        spec.streamer.end()
    sequences = sequences[:, : prompt_length + int(emitted.max())]
    return GenerationResult(sequences=sequences, stats=GenerationStats(records=tuple(records), max_draft_tokens=generation.max_draft_tokens))
