"""Named presets in dspark/strategies: each composes the policy it names, and all stay lossless."""

import pytest
import torch

import dspark
from dspark import strategies
from dspark.cost_models import ConstantCostModel
from dspark.drafters import DraftModelDrafter, PromptLookupDrafter
from dspark.verify import DraftProbability, FixedLength, HardwareAwareScheduler, MinimumGainRule, VllmArgmaxRule
from tests.conftest import build_model, left_padded_batch


def test_presets_compose_the_policy_they_name():
    """mtp1 verifies one token; dspark, vllm_rule and minimum_gain_rule schedule with their rule, the cost model and draft probability by default."""
    drafter, cost = PromptLookupDrafter(), ConstantCostModel(step_seconds=0.01)
    assert strategies.mtp1(drafter).policy == FixedLength(1) and strategies.mtp1(drafter).max_draft_tokens == 1
    for preset, rule in [(strategies.dspark, HardwareAwareScheduler), (strategies.vllm_rule, VllmArgmaxRule), (strategies.minimum_gain_rule, MinimumGainRule)]:
        strategy = preset(drafter, 5, cost)
        assert isinstance(strategy.policy, rule) and strategy.policy.max_draft_tokens == 5 and strategy.cost_model is cost
        assert isinstance(strategy.confidence, DraftProbability)


def test_the_dspark_preset_admits_columns_unless_told_otherwise():
    """strategies.dspark schedules whole verify columns by default and the paper's single candidates on request;
    it weighs rows by when they finish unless told static_batch=False."""
    drafter, cost = PromptLookupDrafter(), ConstantCostModel(step_seconds=0.01)
    assert strategies.dspark(drafter, 5, cost).policy.admission == "columns"
    assert strategies.dspark(drafter, 5, cost).policy.static_batch and not strategies.dspark(drafter, 5, cost, static_batch=False).policy.static_batch
    assert strategies.dspark(drafter, 5, cost, admission="candidates").policy.admission == "candidates"
    with pytest.raises(ValueError, match="admission"):
        strategies.dspark(drafter, 5, cost, admission="rows")


@pytest.mark.parametrize("preset", [strategies.dspark, strategies.vllm_rule, strategies.minimum_gain_rule])
def test_scheduled_presets_reproduce_greedy_generate(preset, llama):
    """Every scheduled preset gives HF's greedy output on a mixed-length batch."""
    input_ids, attention_mask = left_padded_batch([5, 9, 3], seed=2)
    strategy = preset(DraftModelDrafter(llama), 3, ConstantCostModel(step_seconds=0.01))
    result = dspark.SpeculativeModel(llama, strategy).generate(input_ids, attention_mask=attention_mask, max_new_tokens=10, eos_token_id=[])
    assert torch.equal(result.sequences, llama.generate(input_ids, attention_mask=attention_mask, max_new_tokens=10, do_sample=False, eos_token_id=None))


def test_wrap_profiles_a_cost_model_for_a_policy_that_reads_one():
    """A policy with needs_cost_model and no cost model given gets one profiled on this machine, cached for the next wrap and corrected by every step."""
    target, drafter = build_model("llama"), DraftModelDrafter(build_model("llama", seed=3))
    first = dspark.wrap(target, drafter, policy=HardwareAwareScheduler(max_draft_tokens=3), confidence=DraftProbability()).strategy.cost_model
    again = dspark.wrap(target, drafter, policy=HardwareAwareScheduler(max_draft_tokens=3), confidence=DraftProbability()).strategy.cost_model
    assert first.base.table == again.base.table and first.base.table.tokens == (1, 2, 3, 4)
    input_ids, attention_mask = left_padded_batch([6, 4])
    model = dspark.SpeculativeModel(target, dspark.Strategy(drafter=drafter, policy=HardwareAwareScheduler(), max_draft_tokens=3,
                                                               confidence=DraftProbability(), cost_model=first))
    model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=6)
    assert first.report()["step_cells"] > 0
