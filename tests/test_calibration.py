"""Confidence calibration math in dspark/verify/calibration.py."""

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import isotonic_regression

from dspark.stats import GenerationStats, StepRecord
from dspark.verify import calibration
from dspark.verify.calibration import (
    Calibration,
    CalibrationFile,
    CalibrationSet,
    CalibrationLog,
    IsotonicMap,
    apply_temperatures,
    band_of,
    brier_score,
    conditional_outcomes,
    expected_calibration_error,
    fit_isotonic_positions,
    fit_sequential_temperatures,
    isotonic_fit,
    prefix_outcomes,
    reliability_bins,
    roc_auc,
)
from tests.strategies import calibration_logs, isotonic_calibrations, isotonic_problems, scored_outcomes, survival_and_temperatures

PROPERTY = settings(max_examples=60, deadline=None, derandomize=True)
TRUE_TEMPERATURES = (0.5, 2.0, 1.0, 1.5)


def synthetic_log(temperatures, blocks: int, seed: int, mean: float = 2.0, spread: float = 1.5):
    """A log whose true c_k is p = σ(z), z ~ N(mean, spread²), reported as σ(z·T_k); acceptance is a
    sequential Bernoulli(p) per block that stops at the first rejection, every position verified.
    Returns the log and the true p [N, γ]."""
    generator = torch.Generator().manual_seed(seed)
    width = len(temperatures)
    logits = torch.randn((blocks, width), generator=generator, dtype=torch.float64) * spread + mean
    true = torch.sigmoid(logits)
    raw = torch.sigmoid(logits * torch.tensor(temperatures, dtype=torch.float64)).float()
    accepted = (torch.rand((blocks, width), generator=generator, dtype=torch.float64) < true).long().cumprod(dim=1).sum(dim=1)
    return CalibrationLog(survival=raw, verified=torch.full((blocks,), width), accepted=accepted), true


@pytest.fixture(scope="module")
def fitted():
    """STS temperatures fitted once on 20k synthetic blocks, with the log they came from."""
    log, _ = synthetic_log(TRUE_TEMPERATURES, 20_000, seed=0)
    return log, fit_sequential_temperatures(log)


def hand_log():
    """Six blocks, γ = 4: all accepted; rejected at 2 of ℓ=3; all of ℓ=2 accepted; ℓ=0; rejected at 1 with
    only 3 drafted; rejected at 1 of ℓ=1."""
    return CalibrationLog(
        survival=torch.full((6, 4), 0.5),
        verified=torch.tensor([4, 3, 2, 0, 2, 1]),
        accepted=torch.tensor([4, 1, 2, 0, 0, 0]),
        drafted=torch.tensor([4, 4, 4, 4, 3, 4]),
    )


def rows(*lists):
    return torch.tensor(lists, dtype=torch.bool)


# ----------------------------------------------------------------------------- logs


def test_prefix_outcomes_by_hand():
    """a_k is known up to ℓ, and at every drafted k once the block was rejected (n < ℓ)."""
    known, outcome = prefix_outcomes(hand_log())
    assert torch.equal(known, rows([1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]))
    assert torch.equal(outcome, rows([1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]))


def test_conditional_outcomes_by_hand():
    """c_k is known where position k was reached (n ≥ k−1) and checked (k ≤ ℓ)."""
    known, outcome = conditional_outcomes(hand_log())
    assert torch.equal(known, rows([1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0]))
    assert torch.equal(outcome, rows([1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]))


@PROPERTY
@given(calibration_logs())
def test_conditional_outcomes_agree_with_generation_stats(log):
    """Conditional known/outcome match GenerationStats' reached/accepted verified tokens and position counts."""
    record = StepRecord(rows=torch.arange(log.blocks), verify_lengths=log.verified, accepted=log.accepted,
                        emitted=log.accepted + 1, drafted=log.drafted, survival=log.survival, draft_seconds=0.0, verify_seconds=0.0, cache_slots=0)
    stats = GenerationStats(records=(record,), max_draft_tokens=log.width)
    known, outcome = conditional_outcomes(log)
    reached, accepted = stats.position_counts()
    assert torch.equal(known.sum(dim=0).float(), reached)
    assert torch.equal(outcome.sum(dim=0).float(), accepted)
    for token in stats.verified:
        assert bool(known[token.row, token.position - 1]) == token.reached
        assert bool(outcome[token.row, token.position - 1]) == (token.reached and token.accepted)


@PROPERTY
@given(calibration_logs())
def test_prefix_outcomes_are_the_chain_of_conditionals(log):
    """Where a_k and a_{k−1} are known and a_{k−1} held, 1[a_k] is the conditional outcome of c_k; a failed prefix stays failed."""
    known, outcome = prefix_outcomes(log)
    c_known, c_outcome = conditional_outcomes(log)
    both = known[:, 1:] & known[:, :-1]
    assert not bool((both & ~outcome[:, :-1] & outcome[:, 1:]).any())
    chained = both & outcome[:, :-1]
    assert torch.equal(outcome[:, 1:][chained], c_outcome[:, 1:][chained])
    assert bool(c_known[:, 1:][chained].all())


def test_from_records_skips_missing_survival_and_pads_narrower_records():
    """Blocks are (record, row) in order; a record without survival is skipped; each row's draft length becomes ``drafted``."""
    common = dict(emitted=torch.tensor([1, 1]), draft_seconds=0.0, verify_seconds=0.0, cache_slots=0)
    records = [
        StepRecord(rows=torch.tensor([0, 1]), verify_lengths=torch.tensor([3, 1]), accepted=torch.tensor([2, 1]), drafted=torch.tensor([3, 2]),
                   survival=torch.tensor([[0.9, 0.8, 0.7], [0.6, 0.5, 0.4]]), **common),
        StepRecord(rows=torch.tensor([0, 1]), verify_lengths=torch.tensor([0, 0]), accepted=torch.tensor([0, 0]), drafted=torch.tensor([0, 0]),
                   survival=None, **common),
        StepRecord(rows=torch.tensor([0, 1]), verify_lengths=torch.tensor([2, 1]), accepted=torch.tensor([0, 1]), drafted=torch.tensor([2, 2]),
                   survival=torch.tensor([[0.3, 0.2], [0.1, 0.05]]), **common),
    ]
    log = CalibrationLog.from_records(records)
    assert (log.blocks, log.width) == (4, 3)
    assert torch.equal(log.verified, torch.tensor([3, 1, 2, 1]))
    assert torch.equal(log.accepted, torch.tensor([2, 1, 0, 1]))
    assert torch.equal(log.drafted, torch.tensor([3, 2, 2, 2]))
    assert torch.equal(log.survival[2:, :2], torch.tensor([[0.3, 0.2], [0.1, 0.05]]))
    known, _ = prefix_outcomes(log)
    assert torch.equal(known[2], torch.tensor([True, True, False]))  # rejected, but position 3 was never drafted
    with pytest.raises(ValueError, match="records"):
        CalibrationLog.from_records(records[1:2])


def _log(**changes):
    fields = dict(survival=torch.full((2, 3), 0.5), verified=torch.tensor([3, 1]), accepted=torch.tensor([1, 1]))
    return CalibrationLog(**{**fields, **changes})


@pytest.mark.parametrize(
    ("changes", "error", "name"),
    [
        (dict(survival=[[0.5]]), TypeError, "CalibrationLog.survival"),
        (dict(survival=torch.ones((2, 3), dtype=torch.long)), TypeError, "CalibrationLog.survival"),
        (dict(survival=torch.full((2,), 0.5)), ValueError, "CalibrationLog.survival"),
        (dict(survival=torch.tensor([[0.5, 1.5, 0.5], [0.5, 0.5, 0.5]])), ValueError, "CalibrationLog.survival"),
        (dict(survival=torch.tensor([[0.5, math.nan, 0.5], [0.5, 0.5, 0.5]])), ValueError, "CalibrationLog.survival"),
        (dict(verified=torch.tensor([3, 1], dtype=torch.int32)), TypeError, "CalibrationLog.verified"),
        (dict(verified=torch.tensor([3, 1, 1])), ValueError, "CalibrationLog.verified"),
        (dict(verified=torch.tensor([4, 1])), ValueError, "CalibrationLog.verified"),
        (dict(accepted=torch.tensor([1, 2])), ValueError, "CalibrationLog.accepted"),
        (dict(accepted=torch.tensor([-1, 0])), ValueError, "CalibrationLog.accepted"),
        (dict(drafted=torch.tensor([2, 3])), ValueError, "CalibrationLog.drafted"),
        (dict(drafted=torch.tensor([3, 4])), ValueError, "CalibrationLog.drafted"),
    ],
)
def test_log_validators_name_the_field(changes, error, name):
    """Malformed logs raise TypeError/ValueError naming the field."""
    with pytest.raises(error, match=name):
        _log(**changes)


def test_concat_refuses_empty_and_foreign_values():
    """concat needs at least one CalibrationLog and nothing else."""
    with pytest.raises(ValueError, match="logs"):
        CalibrationLog.concat([])
    with pytest.raises(TypeError, match="logs"):
        CalibrationLog.concat([_log(), "log"])


# ----------------------------------------------------------------------------- metrics


def test_ece_by_hand():
    """Per-bin |mean predicted − rate| weighted by count, over 10 bins and over a single bin."""
    predicted, outcome = torch.tensor([0.15, 0.15, 0.85, 0.95]), torch.tensor([False, False, True, False])
    assert expected_calibration_error(predicted, outcome) == pytest.approx(0.15 * 2 / 4 + 0.15 / 4 + 0.95 / 4)
    assert expected_calibration_error(predicted, outcome, bins=1) == pytest.approx(0.525 - 0.25)
    assert expected_calibration_error(torch.tensor([1.0, 0.0]), torch.tensor([True, False])) == 0.0


def test_ece_is_small_when_calibrated_and_large_when_biased():
    """Outcomes drawn from p: ECE of p is near 0, of p shifted by 0.15 near 0.15."""
    generator = torch.Generator().manual_seed(1)
    p = torch.rand(50_000, generator=generator, dtype=torch.float64)
    outcome = torch.rand(50_000, generator=generator, dtype=torch.float64) < p
    assert expected_calibration_error(p, outcome) < 0.01
    assert expected_calibration_error((p + 0.15).clamp(max=1.0), outcome) > 0.1


def test_brier_by_hand():
    """Mean of (p − y)²."""
    assert brier_score(torch.tensor([0.2, 0.9]), torch.tensor([False, True])) == pytest.approx((0.04 + 0.01) / 2)


@PROPERTY
@given(scored_outcomes())
def test_roc_auc_equals_a_pair_count(case):
    """AUC = share of (positive, negative) pairs ranked right, ties counting ½; NaN with one class."""
    predicted, outcome = case
    positives, negatives = predicted[outcome].tolist(), predicted[~outcome].tolist()
    if not positives or not negatives:
        assert math.isnan(roc_auc(predicted, outcome))
        return
    pairs = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in positives for n in negatives)
    assert roc_auc(predicted, outcome) == pytest.approx(pairs / (len(positives) * len(negatives)))


@PROPERTY
@given(scored_outcomes(), st.integers(1, 12))
def test_reliability_bins_add_up_to_ece(case, bins):
    """Bin counts sum to M and Σ count/M·|mean predicted − rate| is the ECE; empty bins are NaN."""
    predicted, outcome = case
    diagram = reliability_bins(predicted, outcome, bins=bins)
    assert int(diagram.count.sum()) == predicted.numel() and diagram.edges.numel() == bins + 1
    filled = diagram.count > 0
    weights = diagram.count[filled].double() / predicted.numel()
    ece = float((weights * (diagram.mean_predicted[filled] - diagram.observed_rate[filled]).abs()).sum())
    assert ece == pytest.approx(expected_calibration_error(predicted, outcome, bins=bins), abs=1e-12)
    assert bool(diagram.mean_predicted[~filled].isnan().all())


@pytest.mark.parametrize(
    ("call", "error", "name"),
    [
        (lambda: expected_calibration_error(torch.tensor([1.5]), torch.tensor([True])), ValueError, "predicted"),
        (lambda: brier_score(torch.tensor([0.5]), torch.tensor([1.0])), TypeError, "outcome"),
        (lambda: roc_auc(torch.tensor([0.5, 0.5]), torch.tensor([True])), ValueError, "outcome"),
        (lambda: expected_calibration_error(torch.tensor([0.5]), torch.tensor([True]), bins=0), ValueError, "bins"),
        (lambda: reliability_bins(torch.tensor([0.5]), torch.tensor([True]), bins=2.5), TypeError, "bins"),
    ],
)
def test_metric_inputs_are_checked(call, error, name):
    """Out-of-range predictions, non-bool outcomes, shape mismatches and bad bin counts are refused by name."""
    with pytest.raises(error, match=name):
        call()


# ----------------------------------------------------------------------------- temperature scaling


def test_sts_recovers_the_true_temperatures(fitted):
    """On 20k blocks STS finds each T_k within ±20% (|log T̂/T| < 0.2; T = 1 everywhere would fail)."""
    _, temperatures = fitted
    errors = [abs(math.log(fit / true)) for fit, true in zip(temperatures, TRUE_TEMPERATURES)]
    assert max(errors) < 0.2, (temperatures, TRUE_TEMPERATURES)


def test_sts_calibrates_prefix_survival_on_held_out_blocks(fitted):
    """On fresh blocks the calibrated a_k has ECE < 0.02 at every k, the raw a_k above 0.05 at some k."""
    log, temperatures = fitted
    held_out, _ = synthetic_log(TRUE_TEMPERATURES, 20_000, seed=1)
    known, outcome = prefix_outcomes(held_out)
    calibrated = apply_temperatures(held_out.survival, temperatures).double().cumprod(dim=1)
    raw = held_out.survival.double().cumprod(dim=1)
    for k in range(held_out.width):
        assert expected_calibration_error(calibrated[:, k], outcome[:, k]) < 0.02
    assert max(expected_calibration_error(raw[:, k], outcome[:, k]) for k in range(held_out.width)) > 0.05


def test_sts_gives_unobserved_positions_temperature_one_and_respects_the_grid():
    """Positions whose a_k is never known get T = 1; without refinement every T comes from the grid."""
    log, _ = synthetic_log((0.5,), 2_000, seed=3)
    # Only position 1 was drafted beyond the placeholder columns, so a_2 and a_3 are never known.
    ones = torch.ones(log.blocks, dtype=torch.long)
    shallow = CalibrationLog(survival=log.survival.repeat(1, 3), verified=ones, accepted=log.accepted.clamp(max=1), drafted=ones)
    grid = [0.25, 0.5, 1.0, 2.0]
    temperatures = fit_sequential_temperatures(shallow, grid=grid, refine=False)
    assert temperatures[0] == 0.5 and temperatures[1:] == (1.0, 1.0)
    with pytest.raises(ValueError, match="grid"):
        fit_sequential_temperatures(shallow, grid=[1.0, 0.0])
    with pytest.raises(TypeError, match="grid"):
        fit_sequential_temperatures(shallow, grid="warm")


def test_sts_scans_the_grid_in_chunks_without_changing_the_fit(monkeypatch):
    """Splitting the [T, N] scan into many chunks (for big logs) gives the same temperatures."""
    log, _ = synthetic_log(TRUE_TEMPERATURES, 2_000, seed=5)
    whole = fit_sequential_temperatures(log)
    monkeypatch.setattr(calibration, "_CHUNK_ELEMENTS", 7 * 2_000)
    assert fit_sequential_temperatures(log) == whole


def test_apply_temperatures_by_hand_and_past_the_fitted_width():
    """σ(logit(c)/T) per position; positions past the given temperatures reuse the last one."""
    survival = torch.sigmoid(torch.tensor([[2.0, 2.0, 2.0, 2.0]], dtype=torch.float64))
    calibrated = apply_temperatures(survival, (1.0, 2.0))
    expected = torch.sigmoid(torch.tensor([[2.0, 1.0, 1.0, 1.0]], dtype=torch.float64))
    assert torch.allclose(calibrated, expected) and calibrated.dtype == torch.float64
    with pytest.raises(ValueError, match="temperatures"):
        apply_temperatures(survival, (1.0, 0.0))
    with pytest.raises(ValueError, match="temperatures"):
        apply_temperatures(survival, ())


@PROPERTY
@given(survival_and_temperatures())
def test_temperature_scaling_preserves_order_within_a_position(case):
    """raw c_i < c_j in a column ⇒ calibrated c'_i ≤ c'_j, and every c' lies strictly inside (0, 1) in the input dtype."""
    survival, temperatures = case
    calibrated = apply_temperatures(survival, temperatures)
    assert calibrated.dtype == survival.dtype and bool(((calibrated > 0) & (calibrated < 1)).all())
    for k in range(survival.shape[1]):
        below = survival[:, k, None] < survival[None, :, k]
        assert bool((calibrated[:, k, None] <= calibrated[None, :, k])[below].all())


# ----------------------------------------------------------------------------- isotonic regression


@given(case=isotonic_calibrations())
@settings(max_examples=80, deadline=None)
def test_isotonic_calibration_applies_each_positions_map(case):
    """Calibration.apply (all positions in one pass) equals each position's IsotonicMap on its column, the last map past γ."""
    fitted, survival = case
    maps = fitted.parameters
    expected = torch.stack([maps[min(k, len(maps) - 1)](survival[:, k]) for k in range(survival.shape[1])], dim=1)
    assert torch.allclose(fitted.apply(survival), expected, rtol=0, atol=1e-6)


@given(case=isotonic_calibrations())
@settings(max_examples=80, deadline=None)
def test_isotonic_map_is_linear_interpolation_through_its_knots(case):
    """In float64 each IsotonicMap is numpy's interp through its knots (linear between them, constant past the ends),
    on the survival and on points beyond both ends."""
    fitted, survival = case
    points = torch.cat([survival.double().reshape(-1), torch.tensor([-0.5, 1.5, 2.0], dtype=torch.float64)])
    for position in fitted.parameters:
        expected = np.interp(points.numpy(), position.knots, position.values)
        assert np.allclose(position(points).numpy(), expected, rtol=0, atol=1e-12)


def test_isotonic_knots_that_collapse_in_float32_take_the_upper_value():
    """Two first knots 1e-9 apart are one point in float32: a survival at or below it maps to the upper knot's value, never
    a division by zero, and the next segment interpolates as usual."""
    collapsed = IsotonicMap(knots=(0.25, 0.25 + 1e-9, 1.0), values=(0.1, 0.3, 0.9))
    mapped = collapsed(torch.tensor([0.0, 0.25, 0.625], dtype=torch.float32))
    assert mapped.tolist() == pytest.approx([0.3, 0.3, 0.6], abs=1e-6)


def test_isotonic_fit_by_hand():
    """PAV pools the violating pair, equal x and weights as least squares requires; the map interpolates and clamps."""
    fitted = isotonic_fit(torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([True, False, True, True]))
    assert fitted.knots == (1.0, 2.0, 3.0, 4.0) and fitted.values == (0.5, 0.5, 1.0, 1.0)
    assert fitted(torch.tensor([0.0, 2.5, 9.0])).tolist() == [0.5, 0.75, 1.0]
    weighted = isotonic_fit(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 0.0]), torch.tensor([3.0, 1.0]))
    assert weighted.values == (0.75, 0.75)
    ties = isotonic_fit(torch.tensor([1.0, 1.0, 2.0]), torch.tensor([1.0, 0.0, 1.0]))
    assert ties.knots == (1.0, 2.0) and ties.values == (0.5, 1.0)


@PROPERTY
@given(isotonic_problems())
def test_isotonic_fit_is_monotone_and_matches_scipy(case):
    """Output is non-decreasing in x and equals scipy's weighted isotonic regression at every data point."""
    x, y, weights = case
    fitted = isotonic_fit(x, y, weights)
    grid = torch.linspace(float(x.min()) - 1, float(x.max()) + 1, 101, dtype=torch.float64)
    assert bool((fitted(grid).diff() >= 0).all())
    unique, group = torch.unique(x, return_inverse=True)
    w = torch.ones_like(x) if weights is None else weights
    pooled_w = torch.zeros_like(unique).index_add_(0, group, w)
    pooled_y = torch.zeros_like(unique).index_add_(0, group, w * y.double()) / pooled_w
    reference = isotonic_regression(pooled_y.numpy(), weights=pooled_w.numpy()).x
    assert torch.allclose(fitted(unique), torch.from_numpy(reference), atol=1e-9)


def test_fit_isotonic_positions_recovers_the_true_conditional():
    """Per-position maps bring raw c_k to within 0.025 of the true p on average (raw is > 0.05 off), inside [eps, 1−eps]."""
    log, true = synthetic_log(TRUE_TEMPERATURES, 20_000, seed=2)
    maps = fit_isotonic_positions(log)
    calibrated = Calibration("isotonic", maps).apply(log.survival).double()
    assert float((calibrated - true).abs().mean(dim=0).max()) < 0.025
    assert float((log.survival.double() - true).abs().mean()) > 0.05
    assert all(1e-6 <= v <= 1 - 1e-6 for fitted in maps for v in fitted.values)


def test_isotonic_positions_never_reached_get_the_identity():
    """A position no block reached maps c to itself (clamped)."""
    log = CalibrationLog(survival=torch.full((3, 2), 0.3), verified=torch.tensor([1, 1, 1]), accepted=torch.tensor([0, 0, 0]))
    maps = fit_isotonic_positions(log)
    assert maps[1](torch.tensor([0.3])).item() == pytest.approx(0.3, abs=1e-6)
    assert maps[0].values == (1e-6,)


@pytest.mark.parametrize(
    ("knots", "values", "name"),
    [((1.0, 1.0), (0.1, 0.2), "knots"), ((1.0, 2.0), (0.3, 0.2), "values"), ((1.0, 2.0), (0.3,), "values"), ((), (), "knots")],
)
def test_isotonic_map_validators(knots, values, name):
    """Knots must increase strictly, values must not decrease and match the knots in number."""
    with pytest.raises(ValueError, match=f"IsotonicMap.{name}"):
        IsotonicMap(knots, values)


# ----------------------------------------------------------------------------- fitted calibration


@pytest.mark.parametrize("method", ["temperature", "isotonic"])
def test_calibration_round_trips_through_json(method):
    """from_dict(json(to_dict())) is the same calibration and calibrates the same way."""
    log, _ = synthetic_log(TRUE_TEMPERATURES, 2_000, seed=4)
    calibration = Calibration.fit(log, method)
    data = json.loads(json.dumps(calibration.to_dict()))
    assert data["format_version"] == 1 and data["method"] == method
    restored = Calibration.from_dict(data)
    assert restored == calibration
    assert torch.equal(restored.apply(log.survival), calibration.apply(log.survival))


def test_calibration_apply_reuses_the_last_position_past_the_fitted_width():
    """A calibration fitted on γ = 2 calibrates γ' = 4 with position 2's parameters at 3 and 4."""
    survival = torch.tensor([[0.2, 0.7, 0.7, 0.7]])
    by_temperature = Calibration("temperature", (1.0, 0.5)).apply(survival)
    assert torch.allclose(by_temperature[0, 1:], torch.sigmoid(torch.logit(torch.tensor(0.7)) / 0.5).expand(3))
    maps = (IsotonicMap((0.0, 1.0), (0.0, 1.0)), IsotonicMap((0.0, 1.0), (0.5, 0.5)))
    assert Calibration("isotonic", maps).apply(survival)[0].tolist() == pytest.approx([0.2, 0.5, 0.5, 0.5])


@pytest.mark.parametrize(
    ("call", "error", "name"),
    [
        (lambda: Calibration("platt", (1.0,)), ValueError, "method"),
        (lambda: Calibration("temperature", (-1.0,)), ValueError, "Calibration.parameters"),
        (lambda: Calibration("isotonic", (1.0,)), ValueError, "parameters"),
        (lambda: Calibration.from_dict({"format_version": 2, "method": "temperature", "parameters": [1.0]}), ValueError, "format_version"),
        (lambda: Calibration.from_dict({"format_version": 1, "method": "platt", "parameters": [1.0]}), ValueError, "method"),
        (lambda: Calibration.from_dict({"format_version": 1, "method": "isotonic", "parameters": [1.0]}), ValueError, "parameters"),
        (lambda: Calibration.from_dict([("format_version", 1)]), TypeError, "data"),
    ],
)
def test_calibration_inputs_are_checked(call, error, name):
    """Unknown methods and format versions, bad parameters and non-mappings are refused by name."""
    with pytest.raises(error, match=name):
        call()


def test_bands_follow_the_sampling_temperature():
    """Greedy decoding is 'greedy'; sampling at T ≤ 0.7 is 'low', above it 'high'."""
    from dspark.types import SamplingConfig

    assert [band_of(SamplingConfig(do_sample=d, temperature=t)) for d, t in [(False, 1.0), (True, 0.3), (True, 0.7), (True, 0.71), (True, 1.5)]] == [
        "greedy", "low", "low", "high", "high"
    ]


def test_calibration_set_round_trips_and_borrows_the_nearest_band():
    """A CalibrationSet survives JSON; a band it lacks uses the nearest fitted one; unknown bands are refused."""
    greedy, high = Calibration("temperature", (1.5, 2.0)), Calibration("temperature", (0.5,))
    calibrations = CalibrationSet("DrafterConfidence", {"greedy": greedy, "high": high}, fingerprint="abc")
    assert CalibrationSet.from_dict(json.loads(json.dumps(calibrations.to_dict()))) == calibrations
    assert calibrations.for_band("greedy") is greedy and calibrations.for_band("low") is high
    assert CalibrationSet("DraftProbability", {"greedy": greedy}).for_band("high") is greedy
    with pytest.raises(ValueError, match="band must be one of"):
        calibrations.for_band("warm")
    with pytest.raises(ValueError, match="CalibrationSet.bands"):
        CalibrationSet("DrafterConfidence", {"tepid": greedy})


def test_calibration_file_round_trips_and_refuses_other_weights(tmp_path):
    """A CalibrationFile saved beside a drafter loads back; a fingerprint other than the one it names is refused; no file gives None."""
    fitted = CalibrationSet("DrafterConfidence", {"greedy": Calibration("temperature", (1.5,))}, fingerprint="aaaa")
    saved = CalibrationFile({"DrafterConfidence": fitted}, "DrafterConfidence", fitted_on={"prompts": 8})
    saved.save(tmp_path)
    assert CalibrationFile.load(tmp_path, fingerprint="aaaa") == saved
    with pytest.raises(ValueError, match="fitted for drafter weights aaaa, but these weights are bbbb"):
        CalibrationFile.load(tmp_path, fingerprint="bbbb")
    assert CalibrationFile.load(tmp_path / "elsewhere") is None
    with pytest.raises(ValueError, match="default must name one of the sets"):
        CalibrationFile({"DrafterConfidence": fitted}, "DraftProbability")
