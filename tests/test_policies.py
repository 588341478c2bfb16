"""Verify policies in dspark/verify/policies.py."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dspark.cost_models import ConstantCostModel
from dspark.verify import FixedLength, Threshold

COST = ConstantCostModel()


@given(st.integers(0, 8), st.lists(st.integers(0, 8), min_size=1, max_size=6))
def test_fixed_length_is_gamma_capped_by_limits(k, limits):
    """FixedLength(γ) verifies min(γ, limit) tokens of every row, survival unused."""
    limits = torch.tensor(limits)
    assert torch.equal(FixedLength(k).lengths(None, COST, limits), limits.clamp_max(k))


@given(st.floats(0, 1), st.lists(st.lists(st.floats(0.001, 0.999), min_size=4, max_size=4), min_size=1, max_size=5))
def test_threshold_stops_before_first_low_survival(t, survival):
    """Threshold(t) verifies exactly the leading positions with c_k ≥ t (compared in survival's dtype)."""
    survival = torch.tensor(survival)
    t = float(torch.tensor(t, dtype=survival.dtype))
    lengths = Threshold(t).lengths(survival, COST, torch.full((survival.shape[0],), 4))
    for row, values in enumerate(survival.tolist()):
        expected = next((k for k, value in enumerate(values) if value < t), 4)
        assert int(lengths[row]) == expected


def test_threshold_without_survival_is_refused():
    """Threshold needs survival estimates."""
    with pytest.raises(ValueError, match="survival"):
        Threshold(0.5).lengths(None, COST, torch.tensor([3]))


@pytest.mark.parametrize(
    "factory, value, error", [(FixedLength, -1, ValueError), (FixedLength, 1.5, TypeError), (Threshold, 1.5, ValueError), (Threshold, -0.1, ValueError)]
)
def test_bad_parameters_are_refused(factory, value, error):
    """Bad policy parameters raise (TypeError for a wrong type, ValueError out of range) with the value in the message."""
    with pytest.raises(error, match=repr(value)):
        factory(value)


def test_fixed_length_earlier_names_still_read():
    """FixedLength.k and .max_length, the earlier names of max_draft_tokens, still read it (with a warning)."""
    policy = FixedLength(3)
    with pytest.warns(DeprecationWarning):
        assert policy.k == policy.max_length == policy.max_draft_tokens == 3
