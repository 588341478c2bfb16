"""The semi-autoregressive DSpark drafter in dspark/drafters/semi_ar.py (untrained, on tiny targets)."""

import pytest
import torch

import dspark
from dspark.drafters import SemiARConfig, SemiARDrafter, TargetSignature
from dspark.verify import FixedLength, Threshold
from tests.conftest import build_model, left_padded_batch


def _drafter(target, seed: int = 0, **overrides) -> SemiARDrafter:
    config = SemiARConfig(target=TargetSignature.of(target), target_layers=(1, 2), block_size=4, num_heads=4, intermediate_size=64, rank=8, **overrides)
    torch.manual_seed(seed)
    drafter = SemiARDrafter(config, target)
    with torch.no_grad():  # a non-zero transition so the sequential head matters in these tests
        drafter.transition_out.normal_(0, 0.5)
        drafter.mask_embedding.normal_(0, 0.5)
    return drafter.eval()


@pytest.mark.parametrize("sequential", ["markov", "rnn", None])
@pytest.mark.parametrize("architecture", ["llama", "qwen2", "gpt2"])
def test_greedy_equals_hf_generate(architecture, sequential):
    """Any semi-AR drafter (here untrained) reproduces HF greedy output on mixed-length batches."""
    target = build_model(architecture)
    input_ids, attention_mask = left_padded_batch([7, 12, 3])
    expected = target.generate(input_ids, attention_mask=attention_mask, max_new_tokens=20, do_sample=False)
    drafter = _drafter(target, sequential=sequential)
    for policy in (None, Threshold(0.5)):
        result = dspark.wrap(target, drafter, policy=policy, confidence=None if policy is None else ConfidenceFromDraft()).generate(
            input_ids, attention_mask=attention_mask, max_new_tokens=20
        )
        assert torch.equal(result.sequences, expected)


class ConfidenceFromDraft:
    """Reads the drafter's confidence head c_k = σ(wᵀ[h_k; W1[x_{k−1}]])."""

    def survival(self, draft):
        return draft.confidence


def test_draft_carries_probabilities_and_confidence(llama):
    """Drafts carry q over the full vocabulary (zero outside the draft vocabulary) and c_k in (0, 1)."""
    target = llama
    config = SemiARConfig(target=TargetSignature.of(target), target_layers=(2,), block_size=3, rank=4, intermediate_size=32, draft_vocab_size=50)
    drafter = SemiARDrafter(config, target, draft_vocab=torch.arange(10, 60))
    input_ids, attention_mask = left_padded_batch([5, 9])
    result = dspark.wrap(target, drafter, policy=FixedLength(3)).generate(input_ids, attention_mask=attention_mask, max_new_tokens=8)
    assert torch.equal(result.sequences, target.generate(input_ids, attention_mask=attention_mask, max_new_tokens=8, do_sample=False))
    context = dspark.DraftContext(
        tokens=input_ids, begin=torch.tensor([4, 0]), end=torch.tensor([9, 9]), rows=torch.arange(2), step=0,
        sampling=dspark.SamplingConfig(),
    )
    draft = drafter.propose(context, 3)
    assert bool(((draft.tokens >= 10) & (draft.tokens < 60)).all())
    assert torch.allclose(draft.probs.sum(dim=-1), torch.ones(2, 3))
    assert float(draft.probs[:, :, :10].sum()) == 0.0
    assert bool(((draft.confidence > 0) & (draft.confidence < 1)).all())


def test_save_load_round_trip(tmp_path, llama):
    """save_pretrained/from_pretrained restore identical drafts; the shared target weights are not saved."""
    drafter = _drafter(llama, sequential="rnn")
    drafter.save_pretrained(tmp_path)
    loaded = SemiARDrafter.from_pretrained(tmp_path, target=llama)
    assert set(loaded.state_dict()) == set(drafter.state_dict())
    shared_shape = llama.get_input_embeddings().weight.shape
    assert all(tensor.shape != shared_shape for tensor in loaded.state_dict().values())
    input_ids, attention_mask = left_padded_batch([6, 8])
    first = dspark.wrap(llama, drafter).generate(input_ids, attention_mask=attention_mask, max_new_tokens=10)
    second = dspark.wrap(llama, loaded).generate(input_ids, attention_mask=attention_mask, max_new_tokens=10)
    assert [record.accepted.tolist() for record in first.stats.records] == [record.accepted.tolist() for record in second.stats.records]


def test_loading_for_another_target_is_refused(tmp_path, llama):
    """A drafter trained for one target refuses a target of another architecture or size."""
    _drafter(llama).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="target must match"):
        SemiARDrafter.from_pretrained(tmp_path, target=build_model("qwen2"))


@pytest.mark.parametrize(
    "overrides, message",
    [({"sequential": "lstm"}, "sequential"), ({"target_layers": ()}, "target_layers"), ({"num_heads": 5}, "num_heads"), ({"draft_vocab_size": 0}, "draft_vocab_size"), ({"block_size": 0}, "block_size")],
)
def test_bad_configs_are_refused(llama, overrides, message):
    """Invalid configuration values raise ValueError naming the field."""
    arguments = {"target": TargetSignature.of(llama), "target_layers": (1,), **overrides}
    with pytest.raises(ValueError, match=message):
        SemiARConfig(**arguments)
