"""Tests for benchmarks/bench_load.py's helpers."""

import pytest
import torch

import dspark
from dspark import strategies
from dspark.drafters import PromptLookupDrafter
from tests.conftest import build_model, load_script


@pytest.fixture(scope="module")
def bench_load():
    return load_script("bench_load")


def test_a_sampled_generation_draws_from_the_seed_it_is_given(bench_load):
    """Sampling with seed 0 twice draws the same tokens, and with seed 1 other ones (each round of the benchmark draws
    anew); greedy generation does not depend on the seed."""
    model = dspark.SpeculativeModel(build_model("llama"), strategies.mtp1(PromptLookupDrafter()))
    batch = {"input_ids": torch.tensor([[1, 5, 9, 5, 9, 5]]), "attention_mask": torch.ones(1, 6, dtype=torch.long)}
    sampled = bench_load.MODES["temperature_1"]
    tokens = [bench_load._timed(model, batch, sampled, 24, seed=seed)[2].sequences for seed in (0, 0, 1)]
    assert torch.equal(tokens[0], tokens[1]) and not torch.equal(tokens[0], tokens[2])
    greedy = [bench_load._timed(model, batch, bench_load.MODES["greedy"], 24, seed=seed)[2].sequences for seed in (0, 1)]
    assert torch.equal(greedy[0], greedy[1])
