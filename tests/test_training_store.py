"""The target's stored view of training sequences, in dspark/training/store.py."""

import pytest
import torch

from dspark.training.store import build_target_store, target_features
from tests.conftest import build_model, regenerated_records


def test_target_store_holds_the_targets_view_and_reuses_its_shards(tmp_path):
    """The store keeps the target's features and top-K next-token law per sequence; a rerun reads its shards."""
    target = build_model("llama")
    records = regenerated_records(target, count=5, new_tokens=12)
    store = build_target_store(target, records, (1, 2), top_k=4, directory=tmp_path / "store", shard_size=2)
    assert sorted(path.name for path in (tmp_path / "store").iterdir()) == [f"shard-0000{index}.safetensors" for index in range(3)]
    tokens = torch.tensor(records[3]["prompt_ids"] + records[3]["response_ids"])[None]
    features, probs = target_features(target, tokens, (1, 2), torch.arange(5, tokens.shape[1]))
    assert torch.equal(store[3].tokens, tokens[0]) and store[3].prompt_length == 6
    assert torch.allclose(store[3].features.float(), features[0], atol=1e-2)
    assert torch.allclose(store[3].top_probs, probs[0].topk(4).values) and torch.equal(store[3].top_ids.long(), probs[0].topk(4).indices)
    reread = build_target_store(None, records, (1, 2), top_k=4, directory=tmp_path / "store", shard_size=2)  # no target needed
    assert all(torch.equal(a.features, b.features) and torch.equal(a.top_ids, b.top_ids) for a, b in zip(store, reread))
    recomputed = build_target_store(target, records, (1, 2), top_k=3, directory=tmp_path / "store", shard_size=2)
    assert recomputed[0].top_ids.shape[-1] == 3


def _mixed_length_records(target) -> list[dict]:
    """Regenerated records cut to prompts of 2 to 5 tokens and answers of 3 to 15, one longer than 16 tokens."""
    records = regenerated_records(target, count=7, new_tokens=14)
    for index, record in enumerate(records):
        record["prompt_ids"] = record["prompt_ids"][: 2 + index % 4]
        record["response_ids"] = record["response_ids"][: 3 + 2 * index]
    return records


def test_batched_store_equals_one_forward_per_sequence_and_reuses_its_shards(tmp_path):
    """Right-padded batches of mixed lengths give each sequence its own forward's view; an unbatched store is reused."""
    target = build_model("llama")
    records = _mixed_length_records(target)
    single = build_target_store(target, records, (1, 2), top_k=5, max_sequence_tokens=16, directory=tmp_path / "store", shard_size=4)
    batched = build_target_store(target, records, (1, 2), top_k=5, max_sequence_tokens=16, shard_size=4, batch_size=3)
    assert [sequence.tokens.numel() for sequence in batched] == [5, 8, 11, 14, 13, 16, 16]
    for one, many in zip(single, batched):
        assert torch.equal(one.tokens, many.tokens) and one.prompt_length == many.prompt_length
        assert torch.allclose(one.features.float(), many.features.float(), atol=1e-2)
        assert torch.allclose(one.top_probs, many.top_probs, atol=1e-5) and torch.equal(one.top_ids, many.top_ids)
    reread = build_target_store(None, records, (1, 2), top_k=5, max_sequence_tokens=16, directory=tmp_path / "store", shard_size=4, batch_size=3)
    assert all(torch.equal(a.features, b.features) for a, b in zip(single, reread))


def test_bad_batch_sizes_and_empty_prompts_are_refused():
    """batch_size must be an int of at least 1, and every record needs a prompt."""
    target = build_model("llama")
    records = regenerated_records(target, count=2, new_tokens=4)
    with pytest.raises(ValueError, match="batch_size"):
        build_target_store(target, records, (1,), batch_size=0)
    with pytest.raises(TypeError, match="batch_size"):
        build_target_store(target, records, (1,), batch_size=2.0)
    with pytest.raises(ValueError, match="prompt_ids"):
        build_target_store(target, [records[0] | {"prompt_ids": []}], (1,), batch_size=2)
