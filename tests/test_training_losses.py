"""The distillation loss in dspark/training/losses.py."""

import pytest
import torch

from dspark.training.losses import distillation_loss, position_weights


def test_loss_vanishes_when_draft_equals_target():
    """With p_d = p_t on the full vocabulary, TV is 0, acceptance is 1 and CE is −log p_t(x*)."""
    logits = torch.randn(3, 4, 10)
    probs = logits.softmax(dim=-1)
    tokens = torch.randint(0, 10, (3, 4))
    ids = torch.arange(10).expand(3, 4, 10)
    loss, terms = distillation_loss(logits, torch.full((3, 4), 0.999), ids, probs, tokens, torch.arange(10))
    assert terms["tv"] == pytest.approx(0.0, abs=1e-5)
    assert terms["acceptance"] == pytest.approx(1.0, abs=1e-5)
    expected_ce = (-(probs.gather(-1, tokens[..., None]).squeeze(-1).log()) * position_weights(4)).sum(-1).mean()
    assert terms["ce"] == pytest.approx(float(expected_ce), rel=1e-4)


def test_loss_counts_mass_outside_the_draft_vocabulary():
    """Target mass outside the draft vocabulary is total variation the drafter cannot remove."""
    target_probs = torch.tensor([[[0.5, 0.3, 0.2]]])
    draft_logits = torch.log(torch.tensor([[[0.625, 0.375]]]))  # p_t restricted to {0, 1}, renormalised
    _, terms = distillation_loss(draft_logits, torch.tensor([[0.5]]), torch.tensor([[[0, 1, 2]]]), target_probs, torch.tensor([[2]]), torch.tensor([0, 1]))
    assert terms["tv"] == pytest.approx(0.4, abs=1e-5)  # |.625−.5| + |.375−.3| + .2
    assert terms["ce"] == 0.0  # x* = 2 is outside the draft vocabulary


def test_summary_reports_first_position_acceptance_and_expected_tau():
    """acceptance_first is c*_1 and expected_tau is 1 + Σ_k Π_{j≤k} c*_j, by hand on a two-position block."""
    target_probs = torch.tensor([[[0.5, 0.5], [1.0, 0.0]]])
    draft_logits = torch.log(torch.tensor([[[0.9, 0.1], [0.6, 0.4]]]))  # c* = 1 − ½·0.8 = 0.6, then 1 − ½·0.8 = 0.6
    ids = torch.tensor([[[0, 1], [0, 1]]])
    _, terms = distillation_loss(draft_logits, torch.tensor([[0.5, 0.5]]), ids, target_probs, torch.tensor([[0, 0]]), torch.tensor([0, 1]))
    assert terms["acceptance_first"] == pytest.approx(0.6, abs=1e-6)
    assert terms["expected_tau"] == pytest.approx(1 + 0.6 + 0.36, abs=1e-6)


def test_greedy_summary_counts_argmax_agreement_until_the_first_miss():
    """greedy_first is the share of blocks whose first argmax is the target's top-1; greedy_tau stops a block at its first miss."""
    # Two blocks of three positions; the target's top-1 is id 0 everywhere (listed first).
    ids = torch.tensor([[[0, 1]] * 3, [[0, 1]] * 3])
    target_probs = torch.tensor([[[0.7, 0.3]] * 3] * 2)
    agree, miss = [0.9, 0.1], [0.2, 0.8]
    draft = torch.log(torch.tensor([[agree, miss, agree], [agree, agree, agree]]))
    _, terms = distillation_loss(draft, torch.full((2, 3), 0.5), ids, target_probs, torch.zeros((2, 3), dtype=torch.long), torch.tensor([0, 1]))
    assert terms["greedy_first"] == 1.0
    assert terms["greedy_tau"] == pytest.approx(1 + (1 + 3) / 2)  # the first block stops after one, the second runs through
