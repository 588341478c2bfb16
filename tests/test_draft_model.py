"""The independent draft model in dspark/drafters/draft_model.py."""

import pytest
import torch

import dspark

from dspark.drafters import DraftModelDrafter
from dspark.types import DraftContext, SamplingConfig, StepOutcome
from tests.conftest import build_model, start_generation


def _context(tokens, end, step=0, sampling=SamplingConfig()):
    return DraftContext(tokens=tokens, begin=torch.zeros(tokens.shape[0], dtype=torch.long), end=end, rows=torch.arange(tokens.shape[0]), step=step, sampling=sampling)


def test_greedy_draft_equals_the_draft_models_own_greedy_continuation():
    """Drafted tokens are the draft model's greedy continuation, with q returned per position."""
    model = build_model("llama", seed=4)
    prompt = torch.tensor([[5, 6, 7, 8]])
    expected = model.generate(prompt, max_new_tokens=3, do_sample=False, eos_token_id=None)[0, 4:]
    draft = start_generation(DraftModelDrafter(model), rows=1).propose(_context(prompt, torch.tensor([4])), 3)
    assert draft.tokens[0].tolist() == expected.tolist()
    assert draft.probs.shape == (1, 3, model.config.vocab_size)
    assert torch.allclose(draft.probs.sum(dim=-1), torch.ones(1, 3))


def test_observe_rolls_back_rejected_drafts():
    """After an outcome the cache holds exactly the committed tokens the model has consumed."""
    model = build_model("llama", seed=4)
    drafter = start_generation(DraftModelDrafter(model), rows=2)
    tokens = torch.zeros((2, 20), dtype=torch.long)
    tokens[:, :4] = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    drafter.propose(_context(tokens, torch.tensor([4, 4])), 4)
    drafter.observe(StepOutcome(rows=torch.arange(2), verify_lengths=torch.tensor([4, 4]), accepted=torch.tensor([1, 4]), next_tokens=torch.tensor([3, 3]), finished=torch.tensor([False, False])))
    # Row 0 keeps its 4 context tokens + x_1; row 1 keeps x_1..x_3 (x_4 was never fed).
    assert drafter._cache.lengths.tolist() == [5, 7]


def test_bad_block_width_is_refused():
    """max_draft_tokens below 1 is refused."""
    with pytest.raises(ValueError, match="max_draft_tokens"):
        DraftModelDrafter(build_model("llama"), max_draft_tokens=0)


def test_draft_model_with_a_shorter_context_is_refused(llama):
    """A draft model whose context cannot hold prompt + max_new_tokens is refused up front, naming its context."""
    short = build_model("llama", seed=1, max_position_embeddings=32)
    with pytest.raises(ValueError, match="draft model's context of 32 tokens"):
        dspark.generate(llama, torch.tensor([[3, 4, 5, 6]]), drafter=DraftModelDrafter(short), max_new_tokens=40)


def test_default_draft_tokens_is_a_deprecated_spelling(llama):
    """DraftModelDrafter(default_draft_tokens=) and .default_draft_tokens still mean max_draft_tokens, with a warning."""
    with pytest.warns(DeprecationWarning):
        drafter = DraftModelDrafter(llama, default_draft_tokens=6)
    with pytest.warns(DeprecationWarning):
        assert drafter.max_draft_tokens == drafter.default_draft_tokens == 6
