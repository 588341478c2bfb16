"""The target's stored view of training sequences, in dspark/training/store.py."""

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
