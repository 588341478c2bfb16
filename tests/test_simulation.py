"""The trace-driven load simulator: traces from records, synthetic traces with a chosen τ, and simulated
runs checked against hand computations and against the real loop on a tiny model."""

import attrs
import pytest
import torch

import dspark
from dspark.cost_models import ConstantCostModel
from dspark.drafters import DraftModelDrafter
from dspark.simulation import BlockTrace, simulate, synthetic_trace
from dspark.types import SamplingConfig
from dspark.verify import DraftProbability, FixedLength, HardwareAwareScheduler
from tests.conftest import build_model, left_padded_batch


def one_stream(survival, drafted, accepted) -> BlockTrace:
    return BlockTrace(survival=(torch.tensor(survival),), drafted=(torch.tensor(drafted),), accepted=(torch.tensor(accepted),))


def test_fixed_length_replay_by_hand():
    """One row, blocks accepting 2 then 0 (γ = 3), 5 tokens: steps emit 3, 1, 1 and the last, with one token left,
    drafts nothing (as in the loop); τ = 5/3, 1.5 + 1.5 + 1 seconds."""
    trace = one_stream([[0.9, 0.8, 0.5], [0.2, 0.1, 0.1]], [3, 3], [2, 0])
    run = simulate(trace, FixedLength(3), ConstantCostModel(step_seconds=1.0, draft_seconds=0.5), rows=1, new_tokens=5)
    assert run.steps == 3 and run.seconds == pytest.approx(4.0)
    assert run.tau == pytest.approx(5 / 3) and run.aggregate_tokens_per_s == pytest.approx(5 / 4.0)
    # Verifying fewer positions accepts min(ℓ, n): MTP-1 emits 2, 1, 2 tokens.
    mtp1 = simulate(trace, FixedLength(1), ConstantCostModel(), rows=1, new_tokens=5)
    assert mtp1.steps == 3 and mtp1.mean_verify_length == pytest.approx(1.0)


def test_plain_decoding_costs_one_forward_per_token():
    """FixedLength(0): no drafting time, one token per row and step."""
    trace = one_stream([[0.9]], [1], [1])
    run = simulate(trace, FixedLength(0), ConstantCostModel(step_seconds=0.1, draft_seconds=1.0), rows=3, new_tokens=4)
    assert run.steps == 4 and run.seconds == pytest.approx(0.4) and run.aggregate_tokens_per_s == pytest.approx(30.0)


def test_synthetic_trace_hits_its_tau():
    """The fully verified τ of a synthetic trace is the τ asked for, within sampling error."""
    for tau in (1.4, 3.5, 5.5):
        trace = synthetic_trace(tau, 7, streams=64, blocks=256, seed=1)
        assert trace.tau == pytest.approx(tau, rel=0.05)


def test_trace_from_records_and_replay_match_the_loop():
    """A trace recorded with FixedLength(γ) and replayed with FixedLength(γ) on a unit cost per step predicts the
    loop's step count (the same blocks in the same order, for rows that never hit EOS)."""
    target = build_model("llama")
    input_ids, attention_mask = left_padded_batch([5, 9, 3])
    result = dspark.wrap(target, DraftModelDrafter(target), policy=FixedLength(3), confidence=DraftProbability(), max_draft_tokens=3).generate(
        input_ids, attention_mask=attention_mask, max_new_tokens=16, eos_token_id=[]
    )
    trace = BlockTrace.from_records(result.stats.records)
    assert len(trace.survival) == 3 and trace.max_draft_tokens == 3
    run = simulate(trace, FixedLength(3), ConstantCostModel(), rows=3, new_tokens=16)
    assert run.steps == len(result.stats.records)
    assert run.tau == pytest.approx(result.stats.tau)


def test_records_that_did_not_verify_everything_are_refused():
    """A trace needs every drafted position verified and survival scored."""
    target = build_model("llama")
    input_ids, attention_mask = left_padded_batch([5, 9])
    result = dspark.wrap(target, DraftModelDrafter(target), policy=FixedLength(3), max_draft_tokens=3).generate(
        input_ids, attention_mask=attention_mask, max_new_tokens=8, eos_token_id=[]
    )
    with pytest.raises(ValueError, match="survival"):
        BlockTrace.from_records(result.stats.records)


def test_the_scheduler_with_its_fallback_stops_drafting_when_it_cannot_pay():
    """Drafting costs as much as a step and blocks are never accepted: after the first step nothing is drafted
    or verified, so the prediction approaches plain decoding's."""
    trace = synthetic_trace(1.05, 4, streams=8, blocks=16)
    costs = ConstantCostModel(step_seconds=1.0, draft_seconds=1.0)
    scheduled = simulate(trace, HardwareAwareScheduler(), costs, rows=8, new_tokens=64)
    plain = simulate(trace, FixedLength(0), costs, rows=8, new_tokens=64)
    fixed = simulate(trace, FixedLength(4), costs, rows=8, new_tokens=64)
    assert scheduled.aggregate_tokens_per_s > fixed.aggregate_tokens_per_s
    assert scheduled.aggregate_tokens_per_s > 0.9 * plain.aggregate_tokens_per_s


class DecidedRun:
    """A row fallback whose runs draft for every row and say, with ``drafts``, whether their generation drafts."""

    def __init__(self, drafts: bool):
        self.drafts = drafts

    def start(self, generation, cost_model):
        return self

    def draft_rows(self, rows):
        return None

    def observe(self, record):
        pass


@attrs.frozen
class FixedWithFallback(FixedLength):
    """FixedLength(γ) carrying a row fallback."""

    row_fallback: DecidedRun = attrs.field(kw_only=True)


def test_a_run_that_drafts_nothing_replays_as_plain_decoding():
    """As in the loop, a fallback run whose drafts is False makes the generation plain decoding: the same steps and
    seconds as FixedLength(0); with drafts True the same policy drafts and verifies."""
    trace = synthetic_trace(3.0, 4, streams=4, blocks=16, seed=2)
    costs = ConstantCostModel(step_seconds=1.0, draft_seconds=0.2)
    plain = simulate(trace, FixedLength(0), costs, rows=4, new_tokens=32)
    declined = simulate(trace, FixedWithFallback(4, row_fallback=DecidedRun(False)), costs, rows=4, new_tokens=32)
    assert (declined.steps, declined.seconds, declined.mean_verify_length) == (plain.steps, plain.seconds, 0.0)
    assert simulate(trace, FixedWithFallback(4, row_fallback=DecidedRun(True)), costs, rows=4, new_tokens=32).mean_verify_length > 0


class PricedByPrompt:
    """A constant cost model whose ``start`` hook prices each forward by the generation's padded prompt: one second
    plus a millisecond per prompt token (a stand-in for attention's reads, which grow with the context)."""

    def __init__(self):
        self.starts = []
        self.step_seconds = 1.0

    def start(self, generation):
        self.starts.append(generation)
        self.step_seconds = 1.0 + 1e-3 * (generation.prompt_length or 0)

    def step_time(self, rows, tokens):
        return self.step_seconds

    def draft_time(self, rows, depth=None):
        return 0.0


def test_the_cost_model_learns_each_generation_before_its_steps():
    """As in the loop, the cost model's start hook sees the generation first (its rows, sampling, padded prompt and
    max_length P + new tokens), so a cost model of the prompt's shape prices every step of it; without a prompt
    length the generation is priced as before, with max_length new_tokens + 1."""
    trace = synthetic_trace(2.0, 3, streams=2, blocks=8, seed=4)
    costs = PricedByPrompt()
    sampled = SamplingConfig(do_sample=True, temperature=1.0)
    long = simulate(trace, FixedLength(0), costs, rows=2, new_tokens=8, prompt_length=500, sampling=sampled)
    assert long.seconds == pytest.approx(8 * 1.5)
    assert (costs.starts[-1].rows, costs.starts[-1].prompt_length, costs.starts[-1].max_length, costs.starts[-1].sampling) == (2, 500, 508, sampled)
    unknown = simulate(trace, FixedLength(0), costs, rows=2, new_tokens=8)
    assert unknown.seconds == pytest.approx(8 * 1.0)
    assert (costs.starts[-1].prompt_length, costs.starts[-1].max_length, costs.starts[-1].sampling.do_sample) == (None, 9, False)


def test_bad_simulation_arguments_are_refused():
    """A negative prompt length or a sampling that is not a SamplingConfig is refused naming the argument."""
    trace = synthetic_trace(2.0, 3, streams=2, blocks=8)
    with pytest.raises(ValueError, match="prompt_length"):
        simulate(trace, FixedLength(1), ConstantCostModel(), rows=1, new_tokens=4, prompt_length=-1)
    with pytest.raises(TypeError, match="sampling"):
        simulate(trace, FixedLength(1), ConstantCostModel(), rows=1, new_tokens=4, sampling={"do_sample": True})


@pytest.mark.parametrize(
    "arguments, match",
    [({"tau": 0.9}, "tau"), ({"tau": 9.0}, "tau"), ({"spread": -1.0}, "spread"), ({"streams": 0}, "streams")],
)
def test_bad_synthetic_settings_are_refused(arguments, match):
    """Out-of-range settings are refused naming the argument."""
    with pytest.raises(ValueError, match=match):
        synthetic_trace(**{"tau": 2.0, "max_draft_tokens": 7, **arguments})
