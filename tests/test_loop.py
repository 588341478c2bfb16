"""Greedy losslessness, EOS handling, KV memory and step records of the generate loop (dspark/loop.py)."""

import attrs
import pytest
import torch

import dspark
from dspark.drafters import DraftModelDrafter, PromptLookupDrafter
from dspark.verify import DrafterConfidence, DraftProbability, FixedLength, GoodputFallback, HardwareAwareScheduler, Threshold
from dspark.kv import HOLE_SHARE, hole_allowance
from tests.conftest import ARCHITECTURES, build_model, left_padded_batch

PROMPT_LENGTHS = [7, 12, 3, 9]


def _strategies(target):
    """(label, wrap keyword arguments) for every drafter × policy combination under test."""
    return [
        ("lookup-fixed", dict(drafter=PromptLookupDrafter(), max_draft_tokens=4)),
        ("lookup-autoregressive", dict(drafter=PromptLookupDrafter(), policy=FixedLength(0))),
        ("draft-model-fixed", dict(drafter=DraftModelDrafter(build_model(_name(target), seed=1)), max_draft_tokens=3)),
        ("draft-model-threshold", dict(drafter=DraftModelDrafter(build_model(_name(target), seed=1)), policy=Threshold(0.3), confidence=DraftProbability(), max_draft_tokens=5)),
        ("self-draft", dict(drafter=DraftModelDrafter(target), max_draft_tokens=6)),
    ]


def _name(model) -> str:
    return next(name for name, (config, _, _) in ARCHITECTURES.items() if type(model.config).__name__ == config)


@pytest.mark.parametrize("architecture", sorted(ARCHITECTURES))
def test_greedy_equals_hf_generate_on_mixed_length_batches(architecture):
    """Every drafter and policy reproduces model.generate(do_sample=False) token for token, row by row, with the prompt
    read in one forward or in chunks of 3 columns (12 tokens over 4 rows: 4 chunks for the 11 prefilled columns)."""
    target = build_model(architecture)
    input_ids, attention_mask = left_padded_batch(PROMPT_LENGTHS)
    expected = target.generate(input_ids, attention_mask=attention_mask, max_new_tokens=24, do_sample=False)
    for label, arguments in _strategies(target):
        drafter = arguments.pop("drafter")
        model = dspark.wrap(target, drafter, **arguments)
        for chunk in (dspark.loop.PREFILL_CHUNK_TOKENS, 12):
            result = model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=24, prefill_chunk_tokens=chunk)
            assert torch.equal(result.sequences, expected), (label, chunk)


@pytest.mark.parametrize("prefill_chunk_tokens, widths", [(12, [3, 3, 3, 2]), (5, [1] * 11), (44, [11]), (4096, [11])])
def test_the_prompt_is_read_in_forwards_of_at_most_the_chunks_columns(llama, prefill_chunk_tokens, widths):
    """Four rows' 11 prefilled columns take forwards of max(1, prefill_chunk_tokens // 4) columns, then one per step."""
    input_ids, attention_mask = left_padded_batch(PROMPT_LENGTHS)
    seen = []
    handle = llama.register_forward_pre_hook(lambda module, args, kwargs: seen.append(kwargs["input_ids"].shape[1]), with_kwargs=True)
    try:
        dspark.wrap(llama, PromptLookupDrafter(), policy=FixedLength(0)).generate(
            input_ids, attention_mask=attention_mask, max_new_tokens=3, eos_token_id=[], prefill_chunk_tokens=prefill_chunk_tokens
        )
    finally:
        handle.remove()
    assert seen == widths + [1, 1, 1]


def test_self_drafting_accepts_every_token(llama):
    """A drafter that is the target itself has every verified token accepted: τ = γ + 1."""
    input_ids, attention_mask = left_padded_batch([5, 8])
    result = dspark.wrap(llama, DraftModelDrafter(llama), max_draft_tokens=4).generate(input_ids, attention_mask=attention_mask, max_new_tokens=25, eos_token_id=[])
    assert result.stats.tau == 5.0
    assert torch.equal(result.stats.position_acceptance, torch.ones(4))


@pytest.mark.parametrize("eos_as_list", [False, True])
@pytest.mark.parametrize("drafter_kind", ["prompt-lookup", "draft-model"])
def test_rows_stop_at_eos_and_are_padded_like_hf(llama, eos_as_list, drafter_kind):
    """Rows stop at an EOS (int or list) mid-block, are padded with pad_token_id, and match HF generate."""
    input_ids, attention_mask = left_padded_batch(PROMPT_LENGTHS, seed=3)
    free_run = llama.generate(input_ids, attention_mask=attention_mask, max_new_tokens=30, do_sample=False, eos_token_id=None)
    eos = int(free_run[0, input_ids.shape[1] + 6])
    eos_argument = [eos, 127] if eos_as_list else eos
    expected = llama.generate(input_ids, attention_mask=attention_mask, max_new_tokens=30, do_sample=False, eos_token_id=eos_argument, pad_token_id=0)
    drafter = PromptLookupDrafter() if drafter_kind == "prompt-lookup" else DraftModelDrafter(llama)
    result = dspark.wrap(llama, drafter, max_draft_tokens=5).generate(
        input_ids, attention_mask=attention_mask, max_new_tokens=30, eos_token_id=eos_argument, pad_token_id=0
    )
    assert torch.equal(result.sequences, expected)
    first_row = result.sequences[0, input_ids.shape[1] :].tolist()
    stop = first_row.index(eos)
    assert stop <= 6 and all(token == 0 for token in first_row[stop + 1 :])


def test_long_generation_keeps_cache_holes_within_their_allowance():
    """Over 1,100 tokens with partial acceptance the cache's holes beyond the longest row stay within hole_allowance."""
    target = build_model("llama", max_position_embeddings=4096)
    input_ids, attention_mask = left_padded_batch([20, 5, 13], seed=7)
    gamma, new_tokens = 5, 1100
    expected = target.generate(input_ids, attention_mask=attention_mask, max_new_tokens=new_tokens, do_sample=False, eos_token_id=None)
    result = dspark.wrap(target, PromptLookupDrafter(), max_draft_tokens=gamma).generate(
        input_ids, attention_mask=attention_mask, max_new_tokens=new_tokens, eos_token_id=[]
    )
    assert torch.equal(result.sequences, expected)
    accepted_counts = torch.cat(result.stats.accepted)
    assert 0 < int(accepted_counts.sum()) and bool((accepted_counts < gamma).any()), "the run must both accept and reject"
    # The cache holds every row's context except its anchor: prompt − 1 + emitted tokens.
    live = attention_mask.sum(dim=1) - 1
    for record in result.stats.records:
        live[record.rows] += record.emitted
        assert record.cache_slots - int(live.max()) <= hole_allowance(record.cache_slots, gamma + 1)
    assert max(record.cache_slots for record in result.stats.records) <= int(live.max()) / (1 - HOLE_SHARE) + gamma + 1


def test_step_records_are_exact(llama):
    """verified records agree with per-step accepted counts, emitted tokens and position acceptance."""
    input_ids, attention_mask = left_padded_batch(PROMPT_LENGTHS, seed=5)
    result = dspark.wrap(llama, DraftModelDrafter(build_model("llama", seed=2)), policy=Threshold(0.05), confidence=DraftProbability(), max_draft_tokens=4).generate(
        input_ids, attention_mask=attention_mask, max_new_tokens=20, eos_token_id=[]
    )
    stats = result.stats
    assert stats.new_tokens == 20 * len(PROMPT_LENGTHS)
    by_step_row = {}
    for token in stats.verified:
        by_step_row.setdefault((token.step, token.row), []).append(token)
    for step, record in enumerate(stats.records):
        for index, row in enumerate(record.rows.tolist()):
            tokens = by_step_row.get((step, row), [])
            assert [t.position for t in tokens] == list(range(1, int(record.verify_lengths[index]) + 1))
            assert sum(t.accepted for t in tokens) == int(record.accepted[index])
            assert all(t.reached for t in tokens[: int(record.accepted[index]) + 1])
            prefix = 1.0
            for t in tokens:
                prefix *= t.survival
                assert t.prefix_survival == pytest.approx(prefix, rel=1e-5)
                assert t.survival >= 0.05
    for position in range(1, 5):
        reached = [t for t in stats.verified if t.position == position and t.reached]
        if reached:
            rate = sum(t.accepted for t in reached) / len(reached)
            assert float(stats.position_acceptance[position - 1]) == pytest.approx(rate)
    assert stats.tau == pytest.approx(stats.new_tokens / sum(r.rows.numel() for r in stats.records))


def test_max_new_tokens_zero_returns_prompt(llama):
    """max_new_tokens=0 returns the prompt unchanged with no steps."""
    input_ids, attention_mask = left_padded_batch([4, 6])
    result = dspark.generate(llama, input_ids, drafter=PromptLookupDrafter(), attention_mask=attention_mask, max_new_tokens=0)
    assert torch.equal(result.sequences, input_ids)
    assert result.stats.steps == 0


def test_single_token_prompts(llama):
    """Prompts of one token (nothing to prefill) still match HF generate."""
    input_ids = torch.tensor([[5], [9]])
    expected = llama.generate(input_ids, max_new_tokens=12, do_sample=False)
    result = dspark.generate(llama, input_ids, drafter=PromptLookupDrafter(), max_new_tokens=12)
    assert torch.equal(result.sequences, expected)


class FeatureRecordingDrafter(PromptLookupDrafter):
    """Prompt lookup that also collects the target features the loop hands over, per row."""

    target_layers = (1, 2)

    def start(self, start):
        self.seen = {}

    def propose(self, context, max_draft_tokens):
        for index, row in enumerate(context.rows.tolist()):
            committed = context.features[index][context.feature_mask[index].bool()]
            self.seen[row] = torch.cat([self.seen.get(row, committed[:0]), committed])
        return super().propose(context, max_draft_tokens)


@pytest.mark.parametrize("prefill_chunk_tokens", [4096, 3, 1])
def test_target_features_of_committed_tokens_match_a_clean_forward(llama, prefill_chunk_tokens):
    """Drafters with target_layers get the hidden states of exactly the committed tokens, in order, however many
    forwards the prompt was read in (one; one column each, as 3 or 1 tokens over 3 rows both give)."""
    input_ids, attention_mask = left_padded_batch([6, 11, 4], seed=2)
    drafter = FeatureRecordingDrafter(max_ngram=2, min_ngram=1)
    result = dspark.wrap(llama, drafter, max_draft_tokens=3).generate(
        input_ids, attention_mask=attention_mask, max_new_tokens=20, eos_token_id=[], prefill_chunk_tokens=prefill_chunk_tokens
    )
    for row in range(3):
        tokens = result.sequences[row][attention_mask[row].bool().tolist() + [True] * 20]
        with torch.inference_mode():
            hidden = llama(tokens[None], output_hidden_states=True).hidden_states
        clean = torch.cat([hidden[1][0], hidden[2][0]], dim=-1)
        seen = drafter.seen[row]
        assert seen.shape[0] >= int(attention_mask[row].sum()) - 1 + 10
        assert torch.allclose(seen, clean[: seen.shape[0]], atol=1e-4)


@pytest.mark.parametrize("max_draft_tokens, hidden_states", [(0, False), (3, True)])
def test_hidden_states_are_asked_for_only_when_the_drafter_can_be_asked_to_propose(llama, max_draft_tokens, hidden_states):
    """With max_draft_tokens 0 (plain decoding) no forward returns hidden states, though the drafter reads features."""
    input_ids, attention_mask = left_padded_batch([6, 11, 4], seed=2)
    asked = []
    handle = llama.register_forward_pre_hook(lambda module, args, kwargs: asked.append(kwargs["output_hidden_states"]), with_kwargs=True)
    try:
        policy = FixedLength(max_draft_tokens)
        dspark.wrap(llama, FeatureRecordingDrafter(), policy=policy, max_draft_tokens=max_draft_tokens).generate(
            input_ids, attention_mask=attention_mask, max_new_tokens=4, eos_token_id=[]
        )
    finally:
        handle.remove()
    assert asked and set(asked) == {hidden_states}


class OverlongDrafter(PromptLookupDrafter):
    """Ignores max_draft_tokens: a broken third-party drafter."""

    def propose(self, context, max_draft_tokens):
        rows = context.tokens.shape[0]
        return dspark.Draft(tokens=torch.ones((rows, max_draft_tokens + 2), dtype=torch.long), lengths=torch.full((rows,), max_draft_tokens + 2))


def test_a_draft_longer_than_asked_is_refused(llama):
    """The loop refuses drafts wider than max_draft_tokens, naming the drafter."""
    with pytest.raises(ValueError, match="OverlongDrafter.propose"):
        dspark.generate(llama, torch.tensor([[3, 4, 5, 3, 4]]), drafter=OverlongDrafter(), max_new_tokens=6)


class LifecycleRecordingDrafter(PromptLookupDrafter):
    """Prompt lookup that records the lifecycle calls the loop makes, in order."""

    def start(self, start):
        self.events = [("start", start)]

    def propose(self, context, max_draft_tokens):
        self.events.append(("propose", context.rows.tolist()))
        return super().propose(context, max_draft_tokens)

    def observe(self, outcome):
        self.events.append(("observe", outcome.rows[outcome.finished].tolist()))


def test_drafter_lifecycle(llama):
    """start comes once per generation with the batch's shape, before any propose; each observe names the
    rows that finished, and exactly those rows are gone from the next propose."""
    input_ids, attention_mask = left_padded_batch([6, 11, 4], seed=3)
    plain = llama.generate(input_ids, attention_mask=attention_mask, max_new_tokens=12, do_sample=False, eos_token_id=None)
    eos = int(plain[1, input_ids.shape[1] + 2])  # row 1 stops within three tokens, the others later or at the budget
    drafter = LifecycleRecordingDrafter(max_ngram=2, min_ngram=1)
    model = dspark.wrap(llama, drafter, max_draft_tokens=3)
    for max_new_tokens in (12, 7):
        model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens, eos_token_id=eos)
        kind, start = drafter.events[0]
        assert kind == "start" and [event[0] for event in drafter.events].count("start") == 1
        assert (start.rows, start.max_draft_tokens, start.max_length) == (3, 3, input_ids.shape[1] + max_new_tokens)
        running, sizes = [0, 1, 2], []
        for kind, value in drafter.events[1:]:
            if kind == "propose":
                assert value == running
                sizes.append(len(value))
            else:
                running = [row for row in running if row not in value]
        assert running == [] and sizes[0] == 3 and min(sizes) < 3  # rows left one by one


class RecordingCostModel:
    """A cost model of 10 ms a step and no drafting cost that records its start hook and every call, in order."""

    def __init__(self):
        self.events = []

    def start(self, generation):
        self.events.append(("start", generation))
        return False

    def step_time(self, rows, tokens):
        self.events.append(("step_time", rows))
        return 0.01

    def draft_time(self, rows, depth=None):
        self.events.append(("draft_time", rows))
        return 0.0


def test_cost_model_start_comes_first_with_the_prompts_padded_length(llama):
    """The cost model's start hook runs once per generation, before the policy or its fallback read the model, and
    its GenerationStart carries the padded prompt length beside max_length."""
    input_ids, attention_mask = left_padded_batch([6, 11, 4], seed=3)
    cost_model = RecordingCostModel()
    policy = HardwareAwareScheduler(max_draft_tokens=3, row_fallback=GoodputFallback())
    model = dspark.wrap(llama, DraftModelDrafter(build_model("llama", seed=1)), policy=policy, confidence=DraftProbability(), cost_model=cost_model)
    model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=9)
    kind, generation = cost_model.events[0]
    assert kind == "start" and [event[0] for event in cost_model.events].count("start") == 1
    assert (generation.rows, generation.prompt_length, generation.max_length) == (3, input_ids.shape[1], input_ids.shape[1] + 9)
    assert len(cost_model.events) > 1


class RecordingEstimator:
    """Draft probability that records the estimator hooks the loop calls, in order."""

    def start(self, start):
        self.events = [("start", start.rows)]

    def survival(self, draft):
        self.events.append(("survival", draft.tokens.shape[0]))
        return DraftProbability().survival(draft)

    def observe(self, outcome):
        self.events.append(("observe", outcome.rows.numel()))

    def report(self):
        return {"events": len(self.events)}


def test_estimator_hooks_follow_the_steps_they_scored(llama):
    """An estimator's start comes first; each observe follows the survival of the same step with the same rows;
    report lands in that step's StepRecord.estimator, and StepRecord.drafted holds each row's draft length."""
    input_ids, attention_mask = left_padded_batch([5, 9], seed=4)
    estimator = RecordingEstimator()
    result = dspark.wrap(llama, DraftModelDrafter(build_model("llama", seed=2)), policy=Threshold(0.05), confidence=estimator, max_draft_tokens=3).generate(
        input_ids, attention_mask=attention_mask, max_new_tokens=9, eos_token_id=[]
    )
    kinds = [kind for kind, _ in estimator.events]
    assert estimator.events[0] == ("start", 2) and kinds.count("start") == 1
    assert kinds[1:] == ["survival", "observe"] * (len(kinds[1:]) // 2)
    assert all(a[1] == b[1] for a, b in zip(estimator.events[1::2], estimator.events[2::2]))
    scored = [record for record in result.stats.records if record.survival is not None]
    assert [record.estimator["events"] for record in scored] == list(range(3, 2 * len(scored) + 2, 2))
    assert all(torch.equal(record.drafted, torch.full_like(record.rows, record.survival.shape[1])) for record in scored)


def test_a_bad_estimator_hook_is_refused_at_wrap(llama):
    """A present estimator hook of the wrong kind is a TypeError naming it."""

    class Broken(DraftProbability):
        observe = "later"

    with pytest.raises(TypeError, match="confidence.observe of Broken must be a method observe"):
        dspark.wrap(llama, PromptLookupDrafter(), policy=Threshold(0.5), confidence=Broken())


class DraftRowsRecordingDrafter(PromptLookupDrafter):
    """Prompt lookup that records, per step, the batch rows it was asked to draft for."""

    def start(self, start):
        self.asked = []

    def propose(self, context, max_draft_tokens):
        wanted = context.rows if context.draft_rows is None else context.rows[context.draft_rows]
        self.asked.append(set(wanted.tolist()) if max_draft_tokens > 0 else set())
        return super().propose(context, max_draft_tokens)


def test_per_request_caps_bound_verify_lengths_and_cap_zero_is_never_drafted(llama):
    """max_draft_tokens_per_row caps each row's ℓ (0: the row is never drafted for), and the output equals HF greedy."""
    input_ids, attention_mask = left_padded_batch(PROMPT_LENGTHS, seed=4)
    drafter = DraftRowsRecordingDrafter(max_ngram=2, min_ngram=1)
    caps = [0, 2, 4, 1]
    result = dspark.wrap(llama, drafter, max_draft_tokens=4).generate(
        input_ids, attention_mask=attention_mask, max_new_tokens=20, eos_token_id=[], max_draft_tokens_per_row=caps
    )
    expected = llama.generate(input_ids, attention_mask=attention_mask, max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(result.sequences, expected)
    for record in result.stats.records:
        assert bool((record.verify_lengths <= torch.tensor(caps)[record.rows]).all())
    assert all(0 not in asked for asked in drafter.asked) and any(asked for asked in drafter.asked)


@pytest.mark.parametrize(
    "arguments, match",
    [
        ({"max_draft_tokens_per_row": [1, 2]}, "max_draft_tokens_per_row must be a sequence .* of 4"),
        ({"max_draft_tokens_per_row": [1, -1, 0, 2]}, "max_draft_tokens_per_row must hold ints >= 0"),
        ({"max_draft_tokens_per_row": [1, 1.5, 0, 2]}, "max_draft_tokens_per_row must hold ints >= 0"),
        ({"priority": [1.0, 0.0, 1.0, 1.0]}, "priority must hold finite numbers > 0"),
        ({"priority": [1.0, float("nan"), 1.0, 1.0]}, "priority must hold finite numbers > 0"),
        ({"priority": "high"}, "priority must be a sequence"),
    ],
)
def test_bad_per_request_settings_are_refused(llama, arguments, match):
    """Per-request caps and priorities are refused with the argument's name unless one valid value per row is given."""
    input_ids, attention_mask = left_padded_batch(PROMPT_LENGTHS)
    with pytest.raises(ValueError, match=match):
        dspark.wrap(llama, PromptLookupDrafter()).generate(input_ids, attention_mask=attention_mask, max_new_tokens=4, **arguments)


@attrs.frozen
class CheapWideningCosts:
    """A forward barely grows with its width; drafting has a fixed cost of a third of a step."""

    def step_time(self, rows: int, tokens: int) -> float:
        return 1.0 + 0.02 * (tokens - 1)

    def draft_time(self, rows: int, depth: int | None = None) -> float:
        return 0.3 + 0.01 * rows


class OddRowsWrongDrafter(DraftModelDrafter):
    """Self-drafting (always right) for even batch rows, a wrong token for odd ones; records the rows it was asked for."""

    def start(self, start):
        super().start(start)
        self.asked = []

    def propose(self, context, max_draft_tokens):
        wanted = context.rows if context.draft_rows is None else context.rows[context.draft_rows]
        self.asked.append(set(wanted.tolist()) if max_draft_tokens > 0 else set())
        draft = super().propose(context, max_draft_tokens)
        odd = (context.rows % 2 == 1)[:, None]
        # It knows which of its drafts are good: a calibrated confidence of 0.9 or 0.05 per position.
        confidence = torch.where(odd, 0.05, 0.9).expand(draft.tokens.shape).float()
        return attrs.evolve(draft, tokens=torch.where(odd, (draft.tokens + 1) % self.vocab_size, draft.tokens), confidence=confidence)


def test_row_fallback_skips_rows_that_do_not_pay_and_reprobes_them(llama):
    """Under the scheduler's row fallback, rows whose drafts are rejected stop being drafted for while the
    others continue, are re-probed later, verify nothing while skipped, and the output equals HF greedy."""
    input_ids, attention_mask = left_padded_batch(PROMPT_LENGTHS, seed=5)
    drafter = OddRowsWrongDrafter(llama)
    policy = HardwareAwareScheduler(row_fallback=GoodputFallback(probe_after=2))
    result = dspark.wrap(llama, drafter, policy=policy, confidence=DrafterConfidence(), cost_model=CheapWideningCosts(), max_draft_tokens=4).generate(
        input_ids, attention_mask=attention_mask, max_new_tokens=40, eos_token_id=[]
    )
    expected = llama.generate(input_ids, attention_mask=attention_mask, max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(result.sequences, expected)
    asked, active = drafter.asked, [set(record.rows.tolist()) for record in result.stats.records]
    assert all(active_rows & {0, 2} <= rows for rows, active_rows in zip(asked, active)), "rows whose drafts are accepted keep being drafted for"
    probes = [step for step, rows in enumerate(asked) if 1 in rows]
    assert probes[0] == 0 and len(probes) >= 3, "the wrong row is skipped after its first step and re-probed"
    gaps = [later - earlier for earlier, later in zip(probes, probes[1:])]
    assert gaps == sorted(gaps) and gaps[-1] > gaps[0], "each probe that fails waits longer"
    for record, rows in zip(result.stats.records, asked):
        skipped = torch.tensor([row not in rows for row in record.rows.tolist()])
        assert int(record.verify_lengths[skipped].sum()) == 0


class ObservedCosts(CheapWideningCosts):
    """CheapWideningCosts that keeps what the loop reports through the online-correction hooks."""

    def __init__(self):
        object.__setattr__(self, "steps", [])
        object.__setattr__(self, "drafts", [])

    def observe_step(self, rows, tokens, seconds):
        self.steps.append((rows, tokens))

    def observe_draft(self, rows, seconds, depth):
        self.drafts.append(rows)


class ScriptedFallback:
    """A row fallback, its own run, that answers ``script(step, rows)`` at each step of a generation."""

    def __init__(self, script):
        self.script, self.step = script, 0

    def start(self, generation, cost_model):
        self.step = 0
        return self

    def draft_rows(self, rows):
        self.step += 1
        return self.script(self.step - 1, rows)

    def observe(self, record):
        pass


@attrs.frozen
class VerifyAll:
    """Verify every drafted token, up to ``max_draft_tokens``; draft as ``row_fallback`` says."""

    row_fallback: ScriptedFallback
    max_draft_tokens: int = 3

    def lengths(self, survival, cost_model, limits):
        return limits.clamp_max(self.max_draft_tokens)


class DecidedFallback(ScriptedFallback):
    """A ScriptedFallback drafting every row whose run says, before the prefill, whether its generation drafts."""

    def __init__(self, drafts):
        super().__init__(lambda step, rows: torch.ones(rows.numel(), dtype=torch.bool))
        self.drafts = drafts


@pytest.mark.parametrize("drafts", [False, True])
def test_a_run_that_drafts_nothing_makes_the_generation_plain_decoding(llama, drafts):
    """drafts False: greedy output equals model.generate, no forward returns hidden states, the drafter is never started
    or asked, the fallback never asked, and the steps still reach the cost model; drafts True: the same parts draft."""
    input_ids, attention_mask = left_padded_batch([6, 11, 4], seed=2)
    expected = llama.generate(input_ids, attention_mask=attention_mask, max_new_tokens=8, do_sample=False, eos_token_id=None)
    asked = []
    handle = llama.register_forward_pre_hook(lambda module, args, kwargs: asked.append(kwargs["output_hidden_states"]), with_kwargs=True)
    drafter, fallback, costs = LifecycleRecordingDrafter(max_ngram=2, min_ngram=1), DecidedFallback(drafts), ObservedCosts()
    try:
        result = dspark.wrap(llama, drafter, policy=VerifyAll(fallback), cost_model=costs, max_draft_tokens=3).generate(
            input_ids, attention_mask=attention_mask, max_new_tokens=8, eos_token_id=[]
        )
    finally:
        handle.remove()
    assert torch.equal(result.sequences, expected)
    assert result.stats.max_draft_tokens == 3 and len(costs.steps) == len(result.stats.records) - 1
    if drafts:
        assert fallback.step == len(result.stats.records) and any(kind == "propose" for kind, _ in drafter.events)
    else:
        assert set(asked) == {False} and not hasattr(drafter, "events") and fallback.step == 0
        assert not any(bool(record.drafted_for.any()) for record in result.stats.records)


def test_a_run_whose_drafts_is_not_a_bool_is_refused(llama):
    """A fallback run's drafts must be a bool: the error names it and the value."""
    with pytest.raises(TypeError, match="drafts .*'no'"):
        dspark.wrap(llama, PromptLookupDrafter(), policy=VerifyAll(DecidedFallback("no")), max_draft_tokens=3).generate(
            torch.tensor([[3, 4, 5, 3, 4]]), max_new_tokens=2
        )


def test_only_drafting_that_follows_drafting_is_reported(llama):
    """Every step's forward but the first (which also grows the cache the prefill filled) is reported; a step's
    drafting only when the step before it drafted too (the first step also reads the prompt's features, and a step
    after skipped ones reads theirs)."""
    input_ids, attention_mask = left_padded_batch(PROMPT_LENGTHS, seed=6)
    costs = ObservedCosts()
    policy = VerifyAll(ScriptedFallback(lambda step, rows: torch.full((rows.numel(),), step not in {2, 3, 6})))
    result = dspark.wrap(llama, PromptLookupDrafter(max_ngram=2, min_ngram=1), policy=policy, cost_model=costs).generate(
        input_ids, attention_mask=attention_mask, max_new_tokens=12, eos_token_id=[]
    )
    records = result.stats.records
    assert costs.steps == [(record.rows.numel(), 1 + int(record.verify_lengths.max())) for record in records[1:]]
    asked = [bool(record.drafted_for.any()) for record in records]
    assert asked[:8] == [True, True, False, False, True, True, False, True]
    reported = [
        record.rows.numel() for before, now, record in zip(asked, asked[1:], records[1:]) if before and now and int(record.drafted.max()) > 0
    ]
    assert len(reported) >= 3 and costs.drafts == reported


class DepthRecordingDrafter(PromptLookupDrafter):
    """Prompt lookup that records how many tokens each step asked it for."""

    def start(self, start):
        self.depths = []

    def propose(self, context, max_draft_tokens):
        self.depths.append(max_draft_tokens)
        return super().propose(context, max_draft_tokens)


def test_draft_depths_bound_the_draft_and_each_rows_verify_length(llama):
    """A fallback's per-row depths: the drafter is asked for the deepest, each row verifies at most its own depth, and a
    request's cap bounds the depth too; greedy output is still model.generate's."""
    input_ids, attention_mask = left_padded_batch(PROMPT_LENGTHS, seed=7)
    drafter = DepthRecordingDrafter(max_ngram=2, min_ngram=1)
    policy = VerifyAll(ScriptedFallback(lambda step, rows: torch.tensor([2, 0, 3, 1])[rows]), max_draft_tokens=4)
    model = dspark.wrap(llama, drafter, policy=policy, cost_model=CheapWideningCosts())
    result = model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=16, eos_token_id=[], max_draft_tokens_per_row=torch.tensor([4, 4, 1, 4]))
    expected = llama.generate(input_ids, attention_mask=attention_mask, max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(result.sequences, expected)
    assert max(drafter.depths) == 2  # row 2's depth 3 is cut to its cap 1, so row 0's 2 is the deepest
    for record in result.stats.records:
        bound = torch.tensor([2, 0, 1, 1])[record.rows]
        assert bool((record.verify_lengths <= bound).all())
