"""Property tests of the acceptance rules in dspark.verify.acceptance."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark.verify.acceptance import greedy_accept, leading_true, rejection_sample, residual_distribution
from tests.strategies import verify_problems


def _longest_common_prefix(draft: list[int], choices: list[int], limit: int) -> int:
    count = 0
    while count < limit and draft[count] == choices[count]:
        count += 1
    return count


@given(verify_problems())
def test_greedy_accepts_longest_prefix_matching_argmax(problem):
    """Greedy accepts exactly the longest prefix equal to the target's argmax, then emits argmax at n+1."""
    draft_tokens, verify_lengths, target_logits, _ = problem
    accepted, next_tokens = greedy_accept(draft_tokens, target_logits, verify_lengths)
    choices = target_logits.argmax(dim=-1)
    for row in range(draft_tokens.shape[0]):
        expected = _longest_common_prefix(draft_tokens[row].tolist(), choices[row].tolist(), int(verify_lengths[row]))
        assert int(accepted[row]) == expected
        assert int(next_tokens[row]) == int(choices[row, expected])
    assert bool(((accepted >= 0) & (accepted <= verify_lengths)).all())


@settings(max_examples=60)
@given(verify_problems(), st.booleans(), st.integers(0, 2**31 - 1))
def test_rejection_sampling_bounds(problem, point_mass, seed):
    """0 ≤ accepted ≤ ℓ and the next token lies in the support of the distribution it is drawn from."""
    draft_tokens, verify_lengths, target_logits, draft_logits = problem
    target_probs = target_logits.softmax(dim=-1)
    draft_probs = None if point_mass else draft_logits.softmax(dim=-1)
    generator = torch.Generator().manual_seed(seed)
    accepted, next_tokens = rejection_sample(draft_tokens, draft_probs, target_probs, verify_lengths, generator)
    assert bool(((accepted >= 0) & (accepted <= verify_lengths)).all())
    assert bool((target_probs[torch.arange(len(accepted)), accepted, next_tokens] > 0).all())


@given(verify_problems(), st.integers(0, 2**31 - 1))
def test_rejection_sampling_accepts_everything_when_draft_equals_target(problem, seed):
    """With q = p every verified token is accepted, so emitted = ℓ + 1."""
    draft_tokens, verify_lengths, target_logits, _ = problem
    target_probs = target_logits.softmax(dim=-1)
    width = draft_tokens.shape[1]
    accepted, _ = rejection_sample(draft_tokens, target_probs[:, :width], target_probs, verify_lengths, torch.Generator().manual_seed(seed))
    assert torch.equal(accepted, verify_lengths)


@given(verify_problems())
def test_rejection_sampling_rejects_tokens_the_target_rules_out(problem):
    """A draft token with p_k(x_k) = 0 is never accepted."""
    draft_tokens, verify_lengths, target_logits, draft_logits = problem
    width = draft_tokens.shape[1]
    target_probs = target_logits.softmax(dim=-1)
    target_probs[:, :width].scatter_(2, draft_tokens[:, :, None], 0.0)
    accepted, _ = rejection_sample(draft_tokens, draft_logits.softmax(dim=-1), target_probs, verify_lengths)
    assert bool((accepted == 0).all())


@given(verify_problems())
def test_residual_distributions_sum_to_one(problem):
    """norm(max(0, p − q)) is a distribution, zero wherever p ≤ q unless p ≤ q everywhere."""
    _, _, target_logits, draft_logits = problem
    width = draft_logits.shape[1]
    p, q = target_logits[:, :width].softmax(dim=-1), draft_logits.softmax(dim=-1)
    residual = residual_distribution(p, q)
    assert torch.allclose(residual.sum(dim=-1), torch.ones(residual.shape[:-1]), atol=1e-5)
    has_mass = ((p - q).clamp_min(0).sum(dim=-1) > 0)[..., None]
    assert bool(((residual == 0) | (p > q) | ~has_mass).all())


def test_rejection_sampling_marginal_is_target_law():
    """One position: the emitted token's empirical law is p, not q (chi-square bound on 200k draws)."""
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    q = torch.tensor([0.1, 0.2, 0.3, 0.4])
    rows = 200_000
    generator = torch.Generator().manual_seed(0)
    draft = torch.multinomial(q.expand(rows, -1), 1, replacement=True, generator=generator)
    accepted, next_tokens = rejection_sample(
        draft, q.expand(rows, 1, -1), p.expand(rows, 2, -1), torch.ones(rows, dtype=torch.long), generator
    )
    emitted = torch.where(accepted == 1, draft.squeeze(1), next_tokens)
    observed = torch.bincount(emitted, minlength=4).float()
    expected = p * rows
    chi_square = float(((observed - expected) ** 2 / expected).sum())
    assert chi_square < 16.3  # 99.9% quantile of chi-square with 3 degrees of freedom


def test_leading_true_counts_prefix():
    """leading_true counts only the unbroken run of True at the start."""
    mask = torch.tensor([[True, True, False, True], [False, True, True, True], [True, True, True, True]])
    assert leading_true(mask).tolist() == [2, 0, 4]
