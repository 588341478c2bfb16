"""Tests for benchmarks/bench_load.py's helpers."""

from types import SimpleNamespace

import pytest
import torch

import dspark
from dspark import strategies
from dspark.cost_models import ConstantCostModel, OnlineCorrectedCostModel
from dspark.drafters import PromptLookupDrafter
from dspark.verify import OnlineLogisticConfidence
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


class _RowPriced(ConstantCostModel):
    """A cost model whose step price grows with rows and tokens, so that a price read at the wrong row count shows."""

    def step_time(self, rows: int, tokens: int) -> float:
        return 0.01 * rows + 0.001 * tokens


def test_step_costs_keep_each_widths_step_times_and_a_cost_models_prices(bench_load):
    """A costed policy's entry keeps its steps' median time and count at each width and its cost model's prices for
    the setting's rows and every fewer; a policy that reads no cost model (fixed γ) keeps the step times alone."""
    target = build_model("llama")
    batch = {"input_ids": torch.tensor([[1, 5, 9, 5, 9, 5], [2, 7, 3, 7, 3, 7]]), "attention_mask": torch.ones(2, 6, dtype=torch.long)}
    drafter = PromptLookupDrafter()
    costed = strategies.dspark(drafter, 3, _RowPriced(draft_seconds=0.001), OnlineLogisticConfidence())
    for strategy, priced in ((costed, True), (strategies.fixed_length(drafter, 3), False)):
        result = dspark.SpeculativeModel(target, strategy).generate(**batch, max_new_tokens=16)
        costs = bench_load._step_costs(strategy, 2, [result])
        steps = [record for record in result.stats.records[1:] if record.rows.numel() == 2]
        assert sum(count for _, count in costs["step_ms_by_width"].values()) == len(steps)
        assert all(median > 0 for median, _ in costs["step_ms_by_width"].values())
        assert ("priced_step_ms" in costs) is priced and ("priced_draft_ms" in costs) is priced
        assert ("priced_step_ms_by_rows" in costs) is priced and ("cost_table" in costs) is priced
        if priced:
            assert costs["priced_step_ms"] == [1e3 * strategy.cost_model.step_time(2, width) for width in range(1, 5)]
            assert costs["priced_step_ms_by_rows"] == {
                str(rows): [1e3 * strategy.cost_model.step_time(rows, width) for width in range(1, 5)] for rows in (1, 2)
            }
            assert costs["priced_step_ms_by_rows"]["1"] != costs["priced_step_ms_by_rows"]["2"]
            assert costs["cost_table"] is None  # a cost model without table_key names no table
            assert len(costs["priced_draft_ms"]) == 3


def _record(verify_lengths: list[int], seconds: float) -> SimpleNamespace:
    """A step record with what ``_step_costs`` reads: the step's rows, verify lengths and verify time."""
    return SimpleNamespace(rows=torch.arange(len(verify_lengths)), verify_lengths=torch.tensor(verify_lengths), verify_seconds=seconds)


def test_step_costs_group_steps_by_the_row_count_a_batch_shrank_to(bench_load):
    """Each step counts at its own row count and width 1 + max ℓ (median ms, count), the prompt's record at none, and
    the whole batch's steps are also step_ms_by_width."""
    records = [_record([0, 0], 9.0), _record([1, 0], 0.05), _record([0, 0], 0.03), _record([2], 0.02), _record([2], 0.04)]
    result = SimpleNamespace(stats=SimpleNamespace(records=records))
    costs = bench_load._step_costs(strategies.fixed_length(PromptLookupDrafter(), 3), 2, [result])
    assert costs["step_ms_by_rows"] == {"1": {"3": [pytest.approx(30.0), 2]}, "2": {"1": [pytest.approx(30.0), 1], "2": [pytest.approx(50.0), 1]}}
    assert costs["step_ms_by_width"] == costs["step_ms_by_rows"]["2"]


class _NamedTable(ConstantCostModel):
    """A constant cost model that names the one table it answers from."""

    table_key = ("rows", 256)


@pytest.mark.parametrize("online", [False, True])
def test_step_costs_name_the_table_a_cost_model_answers_from(bench_load, online):
    """The entry names the table_key of the costed policy's cost model, or of the base it corrects online."""
    target = build_model("llama")
    batch = {"input_ids": torch.tensor([[1, 5, 9, 5, 9, 5]]), "attention_mask": torch.ones(1, 6, dtype=torch.long)}
    base = _NamedTable(step_seconds=0.01, draft_seconds=0.001)
    strategy = strategies.dspark(PromptLookupDrafter(), 3, OnlineCorrectedCostModel(base) if online else base, OnlineLogisticConfidence())
    result = dspark.SpeculativeModel(target, strategy).generate(**batch, max_new_tokens=8)
    assert bench_load._step_costs(strategy, 1, [result])["cost_table"] == repr(("rows", 256))
