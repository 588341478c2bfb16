"""Strategy value type (dspark/strategy.py) and presets (dspark/strategies/)."""

import pytest
import torch

import dspark
from dspark import strategies
from dspark.drafters import DraftModelDrafter, PromptLookupDrafter
from dspark.verify import FixedLength, Threshold
from tests.conftest import build_model, left_padded_batch


def test_presets_compose_the_expected_parts():
    """autoregressive is ℓ = 0, fixed_length verifies k, threshold carries a confidence estimator."""
    drafter = PromptLookupDrafter()
    assert strategies.autoregressive(drafter).policy == FixedLength(0)
    assert strategies.fixed_length(drafter, 5).max_draft_tokens == 5
    preset = strategies.threshold(DraftModelDrafter(build_model("llama")), 6, 0.4)
    assert preset.policy == Threshold(0.4) and preset.confidence is not None


def test_presets_are_lossless(llama):
    """Each preset reproduces HF greedy output."""
    input_ids, attention_mask = left_padded_batch([6, 10])
    expected = llama.generate(input_ids, attention_mask=attention_mask, max_new_tokens=16, do_sample=False)
    for strategy in (
        strategies.autoregressive(PromptLookupDrafter()),
        strategies.fixed_length(PromptLookupDrafter(), 3),
        strategies.threshold(DraftModelDrafter(build_model("llama", seed=3)), 4, 0.2),
    ):
        result = dspark.SpeculativeModel(llama, strategy).generate(input_ids, attention_mask=attention_mask, max_new_tokens=16)
        assert torch.equal(result.sequences, expected)


@pytest.mark.parametrize(
    "overrides, error",
    [({"drafter": object()}, TypeError), ({"policy": "all"}, TypeError), ({"max_draft_tokens": -2}, ValueError), ({"cost_model": 3}, TypeError)],
)
def test_strategy_validates_its_parts(overrides, error):
    """Parts that do not implement their protocol are refused, naming the field."""
    arguments = {"drafter": PromptLookupDrafter(), "policy": FixedLength(2), "max_draft_tokens": 2, **overrides}
    with pytest.raises(error, match=next(iter(overrides))):
        dspark.Strategy(**arguments)
