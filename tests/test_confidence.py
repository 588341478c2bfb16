"""Confidence estimators in dspark/verify/confidence.py."""

import pytest
import torch

from dspark.types import Draft
from dspark.verify import DraftProbability, survival_products


def test_draft_probability_is_q_of_the_greedy_token():
    """For greedy drafts c_k = q_k(x_k) = max_v q_k(v), clamped into (0, 1)."""
    probs = torch.tensor([[[0.7, 0.2, 0.1], [0.0, 1.0, 0.0]]])
    draft = Draft(tokens=probs.argmax(dim=-1), lengths=torch.tensor([2]), probs=probs)
    survival = DraftProbability().survival(draft)
    assert survival[0, 0] == pytest.approx(0.7)
    assert 0.999 < float(survival[0, 1]) < 1.0


def test_draft_probability_needs_distributions():
    """Point-mass drafts (no q) are refused with a message naming Draft.probs."""
    with pytest.raises(ValueError, match="Draft.probs"):
        DraftProbability().survival(Draft(tokens=torch.zeros((1, 2), dtype=torch.long), lengths=torch.tensor([2])))


def test_survival_products_are_cumulative():
    """a_k = c_1·…·c_k."""
    assert torch.allclose(survival_products(torch.tensor([[0.5, 0.5, 0.8]])), torch.tensor([[0.5, 0.25, 0.2]]))
