"""Ragged KV bookkeeping in dspark/kv.py: holes, positions, compaction and cache checks."""

import pytest
import torch
from hypothesis import given, settings
from transformers.cache_utils import DynamicLayer

from dspark.kv import GrowingLayer, RaggedCache, check_cache_support, hole_allowance, last_live_column
from tests.conftest import build_model
from tests.strategies import cache_operations


def _clean_logits(model, tokens: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([tokens])).logits[0, -1]


@pytest.mark.parametrize("architecture", ["llama", "gpt2", "opt", "bloom", "falcon", "gpt_neox"])
def test_holes_are_invisible_to_the_next_forward(architecture):
    """After rejected slots are masked, the next logits equal a clean run of the kept tokens."""
    model = build_model(architecture)
    cache = RaggedCache(rows=2, device=torch.device("cpu"), hole_budget=10)
    position_ids = architecture != "bloom"
    with torch.inference_mode():
        prompt = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
        model(prompt, **cache.forward_inputs(torch.ones_like(prompt), position_ids))
        cache.commit(torch.ones_like(prompt))
        block = torch.tensor([[20, 21, 22], [30, 31, 32]])
        model(block, **cache.forward_inputs(torch.ones_like(block), position_ids))
        cache.commit(torch.tensor([[1, 0, 0], [1, 1, 0]]))  # row 0 keeps 20; row 1 keeps 30, 31
        anchors = torch.tensor([[40], [41]])
        logits = model(anchors, **cache.forward_inputs(torch.ones_like(anchors), position_ids)).logits[:, -1]
    assert torch.allclose(logits[0], _clean_logits(model, [5, 6, 7, 8, 20, 40]), atol=1e-4)
    assert torch.allclose(logits[1], _clean_logits(model, [9, 10, 11, 12, 30, 31, 41]), atol=1e-4)


@pytest.mark.parametrize("compact", [False, True])
def test_row_selection_and_compaction_preserve_logits(compact):
    """drop_finished drops rows in place and compact() drops holes without changing what the kept rows see."""
    model = build_model("llama")
    cache = RaggedCache(rows=3, device=torch.device("cpu"), hole_budget=100)
    with torch.inference_mode():
        prompt = torch.tensor([[0, 5, 6], [7, 8, 9], [0, 0, 4]])
        mask = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 0, 1]])
        model(prompt, **cache.forward_inputs(mask))
        cache.commit(mask)
        block = torch.tensor([[20, 21], [30, 31], [40, 41]])
        model(block, **cache.forward_inputs(torch.ones_like(block)))
        cache.commit(torch.tensor([[1, 0], [0, 0], [1, 1]]))
        cache.drop_finished(torch.tensor([False, True, False]))
        assert cache.slots == 5 and cache.lengths.tolist() == [3, 3] and cache.cache.get_seq_length() == 5
        if compact:
            cache.compact()
            assert cache.slots == 3 and cache.cache.get_seq_length() == 3
        anchors = torch.tensor([[50], [51]])
        logits = model(anchors, **cache.forward_inputs(torch.ones_like(anchors))).logits[:, -1]
    assert torch.allclose(logits[0], _clean_logits(model, [5, 6, 20, 50]), atol=1e-4)
    assert torch.allclose(logits[1], _clean_logits(model, [4, 40, 41, 51]), atol=1e-4)


def test_dead_tail_is_cropped_and_hole_budget_triggers_compaction():
    """Trailing dead slots are cropped at once; interior holes are gathered once they exceed the budget."""
    model = build_model("llama")
    cache = RaggedCache(rows=2, device=torch.device("cpu"), hole_budget=2)
    with torch.inference_mode():
        prompt = torch.tensor([[5, 6], [7, 8]])
        model(prompt, **cache.forward_inputs(torch.ones_like(prompt)))
        cache.commit(torch.ones_like(prompt))
        block = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4]])
        model(block, **cache.forward_inputs(torch.ones_like(block)))
        cache.commit(torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]]))
        assert cache.slots == 4 and cache.cache.get_seq_length() == 4  # two dead columns cropped
        model(block, **cache.forward_inputs(torch.ones_like(block)))
        cache.commit(torch.tensor([[1, 0, 0, 0], [1, 1, 1, 1]]))
    assert cache.lengths.tolist() == [5, 7]
    assert cache.slots - int(cache.lengths.max()) <= 2
    assert cache.cache.get_seq_length() == cache.slots


def test_holes_grow_to_a_share_of_the_cache_before_compaction():
    """With hole_share, interior holes stay until they exceed max(hole_budget, share x slots)."""
    model = build_model("llama")
    with torch.inference_mode():
        for hole_share, compacted in ((0.0, True), (0.5, False)):
            cache = RaggedCache(rows=2, device=torch.device("cpu"), hole_budget=0, hole_share=hole_share)
            prompt = torch.arange(2, 10).reshape(2, 4)
            model(prompt, **cache.forward_inputs(torch.ones_like(prompt)))
            cache.commit(torch.ones_like(prompt))
            block = torch.tensor([[1, 2, 3], [1, 2, 3]])
            model(block, **cache.forward_inputs(torch.ones_like(block)))
            cache.commit(torch.tensor([[1, 0, 1], [0, 1, 1]]))
            assert (cache.slots == 6) is compacted, (hole_share, cache.slots)


def test_hole_allowance():
    """hole_allowance is max(hole_budget, floor(share x slots))."""
    assert hole_allowance(100, 8, 0.25) == 25
    assert hole_allowance(20, 8, 0.25) == 8
    assert hole_allowance(100, 0, 0.0) == 0


def test_rollback_keeps_a_prefix_of_the_speculative_slots():
    """rollback keeps the first keep[r] of the last slots and drops the rest."""
    model = build_model("llama")
    cache = RaggedCache(rows=2, device=torch.device("cpu"), hole_budget=10)
    with torch.inference_mode():
        tokens = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
        model(tokens, **cache.forward_inputs(torch.ones_like(tokens)))
        cache.commit(torch.ones_like(tokens))
    cache.rollback(3, torch.tensor([1, 3]))
    assert cache.lengths.tolist() == [2, 4]


def test_check_cache_support():
    """Plain dynamic caches pass; sliding windows pass only while they cannot slide; hybrids obey the same rule."""
    check_cache_support(build_model("llama").config, max_slots=10_000)
    check_cache_support(build_model("mistral", sliding_window=64).config, max_slots=64)
    with pytest.raises(ValueError, match="sliding-window cache of 64 tokens"):
        check_cache_support(build_model("mistral", sliding_window=64).config, max_slots=65)


def test_negative_hole_budget_and_bad_share_are_refused():
    """hole_budget < 0 and hole_share outside [0, 1) are ValueErrors naming them."""
    with pytest.raises(ValueError, match="hole_budget"):
        RaggedCache(rows=1, device=torch.device("cpu"), hole_budget=-1)
    with pytest.raises(ValueError, match="hole_share"):
        RaggedCache(rows=1, device=torch.device("cpu"), hole_budget=0, hole_share=1.0)


def test_last_live_column():
    """last_live_column is 1 + the last column holding a live slot in any row, 0 for no live slot or no column."""
    assert last_live_column(torch.tensor([[1, 0, 1, 0, 0], [0, 1, 0, 0, 0]])) == 3
    assert last_live_column(torch.tensor([[0, 0, 0, 1]])) == 4
    assert last_live_column(torch.zeros((2, 3), dtype=torch.long)) == 0
    assert last_live_column(torch.zeros((2, 0), dtype=torch.long)) == 0


@settings(max_examples=60, deadline=None)
@given(cache_operations())
def test_growing_layer_holds_what_a_dynamic_layer_holds(operations):
    """GrowingLayer answers every update, crop and row selection with exactly DynamicLayer's keys and values."""
    generator = torch.Generator().manual_seed(len(operations))
    growing, dynamic, rows = GrowingLayer(), DynamicLayer(), 3
    for kind, argument in operations:
        if kind == "update":
            keys, values = (torch.randn((rows, 2, argument, 4), generator=generator) for _ in range(2))
            answers = growing.update(keys, values), dynamic.update(keys, values)
            assert all(torch.equal(a, b) for a, b in zip(*answers))
        elif kind == "crop":
            growing.crop(-argument), dynamic.crop(-argument)
        elif dynamic.get_seq_length() > 0:  # HF's layer selects nothing from an empty cache, and keeps its rows
            growing.batch_select_indices(torch.tensor(argument)), dynamic.batch_select_indices(torch.tensor(argument))
            rows = len(argument)
        assert growing.get_seq_length() == dynamic.get_seq_length()
        if dynamic.get_seq_length() > 0:
            assert torch.equal(growing.keys, dynamic.keys) and torch.equal(growing.values, dynamic.values)


def test_growing_layer_writes_in_place_until_full():
    """Updates within the buffer's capacity keep its storage; a crop's slots are written over."""
    layer = GrowingLayer()
    assert layer.capacity == 0
    layer.update(torch.zeros(1, 1, 10, 2), torch.zeros(1, 1, 10, 2))
    storage, capacity = layer.keys.data_ptr(), layer.capacity
    assert capacity >= 13
    layer.update(torch.ones(1, 1, 3, 2), torch.ones(1, 1, 3, 2))
    layer.crop(-2)
    layer.update(torch.full((1, 1, 2, 2), 2.0), torch.full((1, 1, 2, 2), 2.0))
    assert layer.keys.data_ptr() == storage and layer.capacity == capacity
    assert layer.keys[0, 0, :, 0].tolist() == [0.0] * 10 + [1.0, 2.0, 2.0]


def test_growing_layer_drops_rows_within_its_buffer():
    """Rows leaving (rising indices) keep the buffer's storage and capacity, and the next update still writes in place."""
    layer, states = GrowingLayer(), torch.arange(4 * 5 * 2, dtype=torch.float32).reshape(4, 1, 5, 2)
    layer.update(states, -states)
    storage, capacity = layer.keys.data_ptr(), layer.capacity
    layer.batch_select_indices(torch.tensor([0, 2, 3]))
    assert torch.equal(layer.keys, states[[0, 2, 3]]) and torch.equal(layer.values, -states[[0, 2, 3]])
    layer.update(torch.ones(3, 1, 1, 2), torch.ones(3, 1, 1, 2))
    assert layer.keys.data_ptr() == storage and layer.capacity == capacity
    assert torch.equal(layer.keys[:, :, :5], states[[0, 2, 3]]) and bool((layer.keys[:, :, 5] == 1).all())


@pytest.mark.parametrize("layer_class", [DynamicLayer, GrowingLayer])
def test_ragged_cache_with_either_layer_class_preserves_logits(layer_class):
    """A RaggedCache of DynamicLayer or GrowingLayer layers gives a clean run's logits after holes and compaction."""
    model = build_model("llama")
    cache = RaggedCache(rows=2, device=torch.device("cpu"), hole_budget=10, layer_class=layer_class)
    with torch.inference_mode():
        prompt = torch.tensor([[5, 6, 7], [8, 9, 10]])
        model(prompt, **cache.forward_inputs(torch.ones_like(prompt)))
        cache.commit(torch.ones_like(prompt))
        block = torch.tensor([[20, 21], [30, 31]])
        model(block, **cache.forward_inputs(torch.ones_like(block)))
        cache.commit(torch.tensor([[1, 0], [1, 1]]))
        cache.compact()
        assert cache.slots == 5 and cache.lengths.tolist() == [4, 5] and cache.cache.get_seq_length() == 5
        anchors = torch.tensor([[50], [51]])
        logits = model(anchors, **cache.forward_inputs(torch.ones_like(anchors))).logits[:, -1]
    assert torch.allclose(logits[0], _clean_logits(model, [5, 6, 7, 20, 50]), atol=1e-4)
    assert torch.allclose(logits[1], _clean_logits(model, [8, 9, 10, 30, 31, 51]), atol=1e-4)


def test_layer_class_must_be_a_dynamic_layer():
    """layer_class outside DynamicLayer's family is a TypeError naming it."""
    with pytest.raises(TypeError, match="layer_class"):
        RaggedCache(rows=1, device=torch.device("cpu"), hole_budget=0, layer_class=dict)
