"""dspark/benchmarking.py, the helpers the benchmark scripts share, and the scripts' own start-up."""

import collections
import json
import math
import random
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings

from dspark.benchmarking import (
    across_categories, best_static, first_difference, generated_tokens, load_table, log_ratio_spread, noise_table, pairs_needed, paired_ratio,
    paired_ratio_interval, paired_vs_best_static, run_strategy, write_json,
)
from dspark.drafters import PromptLookupDrafter
from dspark.strategies import autoregressive
from tests.conftest import left_padded_batch
from tests.strategies import paired_rates

SCRIPTS = sorted((Path(__file__).resolve().parents[1] / "benchmarks").glob("*.py"))


def test_first_difference():
    """The first differing index, the shorter end when one is a prefix of the other, None when equal."""
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 5, 3], [1, 2, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2
    assert first_difference([], [4]) == 0


def test_across_categories_takes_each_categorys_prompts_in_turn():
    """The first prompt of every category (in order of first appearance), then every second one, and so on."""
    Prompt = collections.namedtuple("Prompt", "category name")
    prompts = [Prompt("a", 1), Prompt("a", 2), Prompt("a", 3), Prompt("b", 4), Prompt("c", 5), Prompt("c", 6)]
    assert [prompt.name for prompt in across_categories(prompts)] == [1, 4, 5, 2, 6, 3]
    assert across_categories([]) == []


def test_generated_tokens_stop_after_the_first_eos():
    """Each row's new tokens end at (and include) its first EOS; rows without one are kept whole."""
    sequences = torch.tensor([[9, 9, 5, 2, 0, 0], [9, 9, 5, 6, 7, 8]])
    assert generated_tokens(sequences, prompt_length=2, eos_token_id=2) == [[5, 2], [5, 6, 7, 8]]


def test_write_json_is_atomic(tmp_path):
    """write_json creates parent folders and leaves the report and no temporary file behind."""
    path = tmp_path / "deep" / "report.json"
    write_json(path, {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in path.parent.iterdir()] == ["report.json"]


def test_run_strategy_reports_speed_and_tau(llama):
    """run_strategy generates every prompt and reports tokens/s, τ = 1 for plain decoding and the verify share."""
    input_ids, attention_mask = left_padded_batch([6])
    report = run_strategy(llama, autoregressive(PromptLookupDrafter()), [{"input_ids": input_ids, "attention_mask": attention_mask}], 8)
    assert report["tokens_per_s"] > 0 and report["tau"] == pytest.approx(1.0) and report["verify_share"] == 0


def _load_entry(vs_plain: float, rounds: list[float], tau: float = 1.0, verify: float = 0.0) -> dict:
    return {
        "vs_plain": vs_plain, "vs_best_static": vs_plain / 1.25, "decode_vs_plain": vs_plain + 0.5, "decode_vs_best_static": vs_plain / 2,
        "vs_plain_rounds": rounds, "decode_vs_plain_rounds": [ratio + 0.5 for ratio in rounds], "tau": tau, "mean_verify_length": verify,
        "paired_vs_plain": vs_plain - 0.25, "paired_vs_best_static": vs_plain / 4, "paired_vs_plain_rounds": [ratio - 0.25 for ratio in rounds],
    }


def _load_report() -> dict:
    """A bench_load report of one drafter at c = 1 and 4, greedy and temperature 1, every figure distinct by mode."""
    def setting(shift: float, dspark_ratio: float) -> dict:
        return {
            "plain": _load_entry(1.0, [1.0, 1.0]), "mtp1": _load_entry(1.25 + shift, [1.2, 1.3]), "vllm_rule": _load_entry(0.8 + shift, [0.8, 0.8]),
            "dspark": _load_entry(dspark_ratio + shift, [dspark_ratio - 0.02, dspark_ratio + 0.02], 1.3 + shift, 1.2 + shift),
        }
    return {"results": {"shipped": {"greedy": {"1": setting(0.0, 1.04), "4": setting(0.0, 0.96)}, "temperature_1": {"1": setting(0.1, 1.04), "4": setting(0.1, 0.96)}}}}


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.split("  ") if cell.strip()]


def test_load_table_shows_each_policy_and_dsparks_ratios_by_mode():
    """load_table gives a row per c: every policy over plain, DSpark over the best static and the vLLM rule, its rounds, τ and ℓ, per mode."""
    lines = load_table(_load_report(), "shipped").splitlines()
    assert _cells(lines[1]) == ["c", "MTP-1", "vLLM rule", "DSpark", "DSpark/best", "DSpark/vLLM", "DSpark by round", "DSpark τ", "DSpark ℓ"]
    assert _cells(lines[3]) == ["1", "1.25 / 1.35", "0.80 / 0.90", "1.04 / 1.14", "0.83 / 0.91", "1.30 / 1.27", "1.02, 1.06 / 1.02, 1.06", "1.30 / 1.40", "1.20 / 1.30"]
    assert _cells(lines[4])[:4] == ["4", "1.25 / 1.35", "0.80 / 0.90", "0.96 / 1.06"]
    assert lines[0] == lines[2] == lines[-1] and set(lines[0]) == {"=", " "} and len(lines) == 6


def test_load_table_reads_decoding_alone():
    """With the decode_ prefix every ratio column, the rounds included, reads decoding alone; τ and ℓ stay."""
    row = _cells(load_table(_load_report(), "shipped", "decode_").splitlines()[3])
    assert row == ["1", "1.75 / 1.85", "1.30 / 1.40", "1.54 / 1.64", "0.52 / 0.57", "1.18 / 1.17", "1.52, 1.56 / 1.52, 1.56", "1.30 / 1.40", "1.20 / 1.30"]


def test_load_table_marks_what_a_cut_or_older_report_lacks():
    """A setting a cut run did not reach reads '–'; a report without rounds has no rounds column; an unknown policy keeps its name."""
    report = _load_report()
    del report["results"]["shipped"]["temperature_1"]["4"]
    report["results"]["shipped"]["greedy"]["1"]["lookahead"] = _load_entry(1.1, [1.1])
    lines = load_table(report, "shipped").splitlines()
    assert _cells(lines[4])[:4] == ["4", "1.25 / –", "0.80 / –", "0.96 / –"]
    assert _cells(lines[1])[4] == "lookahead" and _cells(lines[3])[4] == "1.10 / –" and _cells(lines[4])[4] == "– / –"
    for by_c in report["results"]["shipped"].values():
        for entries in by_c.values():
            for entry in entries.values():
                del entry["vs_plain_rounds"]
    assert "DSpark by round" not in load_table(report, "shipped")


def test_load_table_shows_the_a_a_control_and_its_rounds():
    """A report with plain decoding timed twice shows that control's ratio as a policy column and its ratio in each round."""
    report = _load_report()
    for by_c in report["results"]["shipped"].values():
        for entries in by_c.values():
            entries["plain_again"] = _load_entry(0.99, [0.97, 1.01])
    lines = load_table(report, "shipped").splitlines()
    header = _cells(lines[1])
    assert header[1] == "plain again" and header[header.index("DSpark by round") + 1] == "A/A by round"
    row = _cells(lines[3])
    assert row[1] == "0.99 / 0.99" and row[header.index("A/A by round")] == "0.97, 1.01 / 0.97, 1.01"


def test_load_table_shows_the_drafted_share_where_the_report_keeps_it():
    """A report whose entries keep drafted_share gets a last column of DSpark's, '–' where a setting lacks it."""
    report = _load_report()
    assert "DSpark drafted" not in load_table(report, "shipped")
    report["results"]["shipped"]["greedy"]["1"]["dspark"]["drafted_share"] = 0.36
    lines = load_table(report, "shipped").splitlines()
    assert _cells(lines[1])[-1] == "DSpark drafted" and _cells(lines[3])[-1] == "0.36 / –" and _cells(lines[4])[-1] == "– / –"


def test_load_table_reads_the_paired_medians():
    """With the paired_ prefix every ratio column, the rounds included, reads the medians of per-batch ratios; τ and ℓ stay."""
    row = _cells(load_table(_load_report(), "shipped", "paired_").splitlines()[3])
    assert row == ["1", "1.00 / 1.10", "0.55 / 0.65", "0.79 / 0.89", "0.26 / 0.29", "1.44 / 1.37", "0.77, 0.81 / 0.77, 0.81", "1.30 / 1.40", "1.20 / 1.30"]


def test_paired_table_pairs_dspark_with_the_best_static_policy_batch_by_batch():
    """Where a report keeps every batch, the paired table adds DSpark over the best static policy (by paired_vs_plain) batch by batch."""
    report = _load_report()
    assert "DSpark/best by batch" not in load_table(report, "shipped", "paired_")
    entries = report["results"]["shipped"]["greedy"]["1"]
    entries["plain"]["round_batch_tokens_per_s"] = [[10.0, 10.0, 10.0], [10.0, 10.0, 10.0]]
    entries["mtp1"]["round_batch_tokens_per_s"] = [[10.0, 20.0, 40.0], [10.0, 20.0, 40.0]]
    entries["dspark"]["round_batch_tokens_per_s"] = [[9.0, 22.0, 40.0], [11.0, 18.0, 44.0]]  # ratios 0.9, 1.1, 1, 1.1, 0.9, 1.1
    assert paired_vs_best_static(entries) == pytest.approx(1.05)
    lines = load_table(report, "shipped", "paired_").splitlines()
    column = _cells(lines[1]).index("DSpark/best by batch")
    assert _cells(lines[3])[column] == "1.05 / –" and _cells(lines[4])[column] == "– / –"
    assert "DSpark/best by batch" not in load_table(report, "shipped")


def test_paired_table_shows_the_intervals_of_dsparks_paired_ratios_to_plain_and_to_the_best_static_policy():
    """Where a report keeps every batch, the paired table shows the 95% intervals of DSpark over plain and over the best static policy."""
    report = _load_report()
    entries = report["results"]["shipped"]["greedy"]["1"]
    entries["plain"]["round_batch_tokens_per_s"] = [[10.0, 10.0, 10.0], [10.0, 10.0, 10.0]]
    entries["mtp1"]["round_batch_tokens_per_s"] = [[10.0, 20.0, 40.0], [10.0, 20.0, 40.0]]
    entries["dspark"]["round_batch_tokens_per_s"] = [[9.0, 22.0, 40.0], [11.0, 18.0, 44.0]]
    lines = load_table(report, "shipped", "paired_").splitlines()
    header, row = _cells(lines[1]), _cells(lines[3])
    assert header.index("DSpark/plain, 95%") == header.index("DSpark/best by batch") + 1
    assert best_static(entries) == "mtp1"
    over_plain = paired_ratio_interval(entries["dspark"]["round_batch_tokens_per_s"], entries["plain"]["round_batch_tokens_per_s"])
    over_best = paired_ratio_interval(entries["dspark"]["round_batch_tokens_per_s"], entries["mtp1"]["round_batch_tokens_per_s"])
    assert over_plain != over_best
    assert row[header.index("DSpark/plain, 95%")] == f"{over_plain[0]:.2f}–{over_plain[1]:.2f} / –"
    assert row[header.index("DSpark/best, 95%")] == f"{over_best[0]:.2f}–{over_best[1]:.2f} / –"
    assert _cells(lines[4])[header.index("DSpark/best, 95%")] == "– / –"


def test_best_static_is_the_static_policy_fastest_paired_and_refuses_entries_without_one():
    """best_static picks the static policy with the highest paired_vs_plain, never a dynamic one; entries without a static policy are a ValueError."""
    entries = {name: {"paired_vs_plain": ratio} for name, ratio in (("plain", 1.0), ("mtp1", 1.1), ("fixed_gamma", 1.2), ("dspark", 1.3))}
    assert best_static(entries) == "fixed_gamma"
    with pytest.raises(ValueError, match="static policy.*'dspark'"):
        best_static({"dspark": {"paired_vs_plain": 1.0}})


def test_paired_ratio_is_the_median_of_per_batch_ratios():
    """paired_ratio gives the median of x/y over every round and batch, and each round's median."""
    overall, by_round = paired_ratio([[2.0, 3.0, 8.0], [1.0, 4.0, 5.0]], [[1.0, 2.0, 4.0], [1.0, 2.0, 2.0]])
    assert overall == 2.0 and by_round == [2.0, 2.0]  # ratios 2, 1.5, 2 and 1, 2, 2.5


def test_a_burst_on_one_batch_moves_the_ratio_of_sums_but_not_the_paired_median():
    """One generation run at a fifth of its speed pulls the ratio of the round's sums far below 1; the paired median stays 1."""
    seconds = [4.0, 4.0, 4.0, 4.0, 4.0]
    burst = [4.0, 4.0, 20.0, 4.0, 4.0]
    tokens = 64.0
    overall, by_round = paired_ratio([[tokens / wall for wall in burst]], [[tokens / wall for wall in seconds]])
    assert overall == 1.0 and by_round == [1.0] and sum(seconds) / sum(burst) == pytest.approx(0.555, abs=1e-3)


def test_paired_ratio_refuses_rounds_or_batches_that_do_not_pair():
    """Other numbers of rounds, of batches in a round, or none at all, are a ValueError naming both arguments."""
    for mine, theirs in (([[1.0]], [[1.0], [1.0]]), ([[1.0, 2.0]], [[1.0]]), ([], []), ([[]], [[]])):
        with pytest.raises(ValueError, match="mine and theirs"):
            paired_ratio(mine, theirs)


@settings(max_examples=40, deadline=None)
@given(paired_rates())
def test_paired_ratio_interval_lies_within_the_ratios_and_repeats_for_a_seed(rates):
    """The interval's ends are ordered, lie between the least and the greatest paired ratio, and one seed gives one interval."""
    mine, theirs = rates
    ratios = [x / y for row, other in zip(mine, theirs) for x, y in zip(row, other)]
    low, high = paired_ratio_interval(mine, theirs, resamples=200)
    assert min(ratios) <= low <= high <= max(ratios)
    assert paired_ratio_interval(mine, theirs, resamples=200) == (low, high)


def test_paired_ratio_interval_of_one_ratio_is_that_ratio():
    """Where every batch in every round reads one ratio, or one generation was timed, the interval is that ratio."""
    assert paired_ratio_interval([[2.0]], [[1.0]]) == (2.0, 2.0)
    assert paired_ratio_interval([[3.0, 6.0], [9.0, 12.0]], [[2.0, 4.0], [6.0, 8.0]]) == (1.5, 1.5)


def test_paired_ratio_interval_counts_a_batch_once_however_many_rounds_timed_it():
    """Eight batches whose four rounds each read the batch's one ratio give the interval of those batches timed once, wider than 32 batches'."""
    values = [0.90, 0.94, 0.97, 0.99, 1.00, 1.03, 1.06, 1.12]
    once = paired_ratio_interval([values], [[1.0] * 8])
    assert paired_ratio_interval([values] * 4, [[1.0] * 8] * 4) == once
    low, high = paired_ratio_interval([values * 4], [[1.0] * 32])
    assert once[1] - once[0] > high - low


def test_paired_ratio_interval_covers_the_true_median_about_as_often_as_its_level():
    """Over 200 simulated runs of 8 batches by 2 rounds (a batch effect times round noise, true median 1), the 90% interval holds 1 in 80–97% of them."""
    generator = random.Random(0)
    covered = 0
    for _ in range(200):
        effects = [generator.lognormvariate(0.0, 0.05) for _ in range(8)]
        mine = [[effect * generator.lognormvariate(0.0, 0.03) for effect in effects] for _ in range(2)]
        low, high = paired_ratio_interval(mine, [[1.0] * 8] * 2, level=0.9, resamples=400, seed=generator.randrange(2**31))
        covered += low <= 1.0 <= high
    assert 0.80 <= covered / 200 <= 0.97


def test_paired_ratio_interval_refuses_a_level_resamples_or_rounds_it_cannot_use():
    """A level outside (0, 1) or not a number, resamples below 1 and rounds of other numbers of batches are errors naming the argument and value."""
    with pytest.raises(ValueError, match="level.*1.0"):
        paired_ratio_interval([[1.0]], [[1.0]], level=1.0)
    with pytest.raises(TypeError, match="level.*'0.9'"):
        paired_ratio_interval([[1.0]], [[1.0]], level="0.9")
    with pytest.raises(ValueError, match="resamples.*0"):
        paired_ratio_interval([[1.0]], [[1.0]], resamples=0)
    with pytest.raises(ValueError, match="as many batches in every round"):
        paired_ratio_interval([[1.0, 2.0], [1.0]], [[1.0, 2.0], [1.0]])


@settings(max_examples=40, deadline=None)
@given(paired_rates())
def test_log_ratio_spread_is_the_standard_deviation_of_the_log_paired_ratios(rates):
    """log_ratio_spread is the sample standard deviation of log(x/y) over every round and batch, or a ValueError for a single pair."""
    mine, theirs = rates
    logs = [math.log(x / y) for row, other in zip(mine, theirs) for x, y in zip(row, other)]
    if len(logs) < 2:
        with pytest.raises(ValueError, match="at least two pairs"):
            log_ratio_spread(mine, theirs)
    else:
        assert log_ratio_spread(mine, theirs) == pytest.approx(statistics.stdev(logs), abs=1e-12)


def test_log_ratio_spread_of_an_a_a_pair_that_ran_alike_is_zero():
    """Two policies that ran every batch at the same speed, whatever that speed, spread by nothing."""
    assert log_ratio_spread([[3.0, 5.0], [4.0, 6.0]], [[3.0, 5.0], [4.0, 6.0]]) == 0.0


def test_pairs_needed_follows_the_medians_standard_error():
    """pairs_needed is ⌈(z·√(π/2)·s / log(1 + h))²⌉: 261 pairs for s = 0.13 and ±2% at 95%; four times as many for twice the spread."""
    assert pairs_needed(0.13, 0.02) == 261
    assert pairs_needed(0.1, 0.03) == 70
    assert pairs_needed(0.2, 0.03) == 277
    assert pairs_needed(0.1, 0.03, level=0.5) < pairs_needed(0.1, 0.03) < pairs_needed(0.1, 0.03, level=0.99)
    assert pairs_needed(0.0, 0.03) == 1


def test_pairs_needed_puts_the_median_within_the_half_width_about_as_often_as_its_level():
    """Over 1000 simulated runs of pairs_needed(0.1, 0.03) normal log ratios, the median lies within ×(1 ± 3%) in 92–98.5% of them; with half as many, in under 90%."""
    generator = random.Random(0)
    pairs = pairs_needed(0.1, 0.03)

    def share_within(count: int) -> float:
        medians = [statistics.median(generator.gauss(0.0, 0.1) for _ in range(count)) for _ in range(1000)]
        return sum(abs(median) <= math.log1p(0.03) for median in medians) / 1000

    assert 0.92 <= share_within(pairs) <= 0.985
    assert share_within(pairs // 2) < 0.90


def test_pairs_needed_refuses_a_spread_half_width_or_level_it_cannot_use():
    """A negative or infinite spread, a half-width or level outside (0, 1), and non-numbers are errors naming the argument and value."""
    with pytest.raises(ValueError, match="spread.*-0.1"):
        pairs_needed(-0.1, 0.03)
    with pytest.raises(ValueError, match="spread.*inf"):
        pairs_needed(math.inf, 0.03)
    with pytest.raises(TypeError, match="spread.*'0.1'"):
        pairs_needed("0.1", 0.03)
    with pytest.raises(ValueError, match="half_width.*0"):
        pairs_needed(0.1, 0)
    with pytest.raises(TypeError, match="level.*True"):
        pairs_needed(0.1, 0.03, level=True)


def test_noise_table_shows_the_a_a_controls_spread_the_pairs_timed_and_the_pairs_needed():
    """noise_table gives a row per c: the control's spread against plain decoding, the pairs timed and pairs_needed at ±3% and ±2%, per mode."""
    report = _load_report()
    for mode, control in (("greedy", [[3.0, 3.3], [3.6, 3.0]]), ("temperature_1", [[3.0, 3.0], [3.0, 3.0]])):
        report["results"]["shipped"][mode]["1"]["plain"]["round_batch_tokens_per_s"] = [[3.0, 3.0], [3.0, 3.0]]
        report["results"]["shipped"][mode]["1"]["plain_again"] = _load_entry(1.0, [1.0, 1.0]) | {"round_batch_tokens_per_s": control}
    spread = log_ratio_spread([[3.0, 3.3], [3.6, 3.0]], [[3.0, 3.0], [3.0, 3.0]])
    lines = noise_table(report, "shipped").splitlines()
    assert _cells(lines[1]) == ["c", "A/A spread", "pairs timed", "pairs for ±3%", "pairs for ±2%"]
    assert _cells(lines[3]) == [
        "1", f"{spread:.3f} / 0.000", "4 / 4", f"{pairs_needed(spread, 0.03)} / 1", f"{pairs_needed(spread, 0.02)} / 1",
    ]
    assert _cells(lines[4]) == ["4", "– / –", "– / –", "– / –", "– / –"]  # no control timed at c = 4


def test_noise_table_refuses_an_unknown_drafter_or_half_width():
    """An unknown drafter or a half-width outside (0, 1) is a ValueError naming it."""
    with pytest.raises(ValueError, match="'prompt_lookup'"):
        noise_table(_load_report(), "prompt_lookup")
    with pytest.raises(ValueError, match="half_widths.*1.5"):
        noise_table(_load_report(), "shipped", half_widths=(1.5,))


def test_load_table_refuses_what_it_cannot_show():
    """An unknown drafter or prefix is a ValueError naming it."""
    with pytest.raises(ValueError, match="'prompt_lookup'"):
        load_table(_load_report(), "prompt_lookup")
    with pytest.raises(ValueError, match="'wall_'"):
        load_table(_load_report(), "shipped", "wall_")


@pytest.mark.parametrize("script", SCRIPTS, ids=[script.name for script in SCRIPTS])
def test_benchmark_scripts_start(script, tmp_path):
    """Every benchmark script imports what it needs and parses --help from any folder (no sys.path edits)."""
    completed = subprocess.run([sys.executable, str(script), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert "usage:" in completed.stdout
