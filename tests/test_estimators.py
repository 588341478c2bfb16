"""Learning confidence estimators in dspark/verify/estimators.py."""

import json
import math

import pytest
import torch
from hypothesis import given, settings
from scipy.optimize import minimize

import dspark
from dspark.drafters import DraftModelDrafter, PromptLookupDrafter
from dspark.types import Draft, GenerationStart, SamplingConfig, StepOutcome
from dspark.verify import DraftProbability, DrafterConfidence, Threshold
from dspark.verify.calibration import Calibration, CalibrationLog, CalibrationSet, apply_temperatures
from dspark.verify.estimators import (
    BandedConfidence,
    CalibratedConfidence,
    DriftCorrectedConfidence,
    LogisticConfidence,
    OnlineLogisticConfidence,
    draft_signals,
    fit_logistic,
    online_estimator,
)
from tests.conftest import build_model, left_padded_batch
from tests.strategies import estimator_streams, logistic_problems

PROPERTY = settings(max_examples=40, deadline=None, derandomize=True)


def signal_draft(signals: torch.Tensor, **fields) -> Draft:
    """A full-length draft of zeros with the given signals [R, γ, F] (and other Draft fields)."""
    rows, width = signals.shape[:2]
    return Draft(tokens=torch.zeros((rows, width), dtype=torch.long), lengths=torch.full((rows,), width), signals=signals, **fields)


def outcome(verified, accepted) -> StepOutcome:
    """A StepOutcome of the given ℓ and n for rows 0..R−1, none finished."""
    verified, accepted = torch.tensor(verified), torch.tensor(accepted)
    rows = verified.shape[0]
    return StepOutcome(rows=torch.arange(rows), verify_lengths=verified, accepted=accepted,
                       next_tokens=torch.zeros(rows, dtype=torch.long), finished=torch.zeros(rows, dtype=torch.bool))


def generation_start(do_sample=False, temperature=1.0) -> GenerationStart:
    return GenerationStart(rows=1, device=torch.device("cpu"), max_draft_tokens=4, max_length=32,
                           sampling=SamplingConfig(do_sample=do_sample, temperature=temperature))


def sequential_outcome(true_survival: torch.Tensor, generator: torch.Generator) -> StepOutcome:
    """Every position verified; x_k accepted with probability true_survival[r, k] until the first rejection."""
    accepted = (torch.rand(true_survival.shape, generator=generator) < true_survival).long().cumprod(dim=1).sum(dim=1)
    return outcome(torch.full((true_survival.shape[0],), true_survival.shape[1]).tolist(), accepted.tolist())


class RecordingEstimator:
    """A constant-survival estimator that records the hooks forwarded to it."""

    def __init__(self, value=0.7):
        self.value, self.events = value, []

    def start(self, start):
        self.events.append("start")

    def survival(self, draft):
        return torch.full(draft.tokens.shape, self.value)

    def observe(self, outcome):
        self.events.append("observe")

    def report(self):
        return {"events": len(self.events)}


# ----------------------------------------------------------------------------- draft_signals


def test_draft_signals_prefer_signals_then_probs_then_confidence():
    """Draft.signals win; else [max q, top-1 − top-2] of q; else [logit c]; else a ValueError naming all three."""
    probs = torch.tensor([[[0.6, 0.3, 0.1], [0.2, 0.2, 0.6]]])
    tokens = torch.tensor([[0, 2]])
    signals = torch.tensor([[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]])
    confidence = torch.tensor([[0.5, 0.8]])
    assert torch.equal(draft_signals(Draft(tokens=tokens, lengths=torch.tensor([2]), probs=probs, signals=signals)), signals)
    from_probs = draft_signals(Draft(tokens=tokens, lengths=torch.tensor([2]), probs=probs, confidence=confidence))
    assert torch.allclose(from_probs, torch.tensor([[[0.6, 0.3], [0.6, 0.4]]]))
    from_confidence = draft_signals(Draft(tokens=tokens, lengths=torch.tensor([2]), confidence=confidence))
    assert torch.allclose(from_confidence, torch.tensor([[[0.0], [math.log(4.0)]]]))
    with pytest.raises(ValueError, match="Draft.signals, Draft.probs or Draft.confidence"):
        draft_signals(Draft(tokens=tokens, lengths=torch.tensor([2])))


def test_draft_signals_never_read_the_drawn_token():
    """Two drafts with the same q but different drawn tokens (likely and unlikely) give the same signals."""
    probs = torch.softmax(torch.randn((3, 4, 10), generator=torch.Generator().manual_seed(0)), dim=-1)
    likely, unlikely = probs.argmax(dim=-1), probs.argmin(dim=-1)
    first = draft_signals(Draft(tokens=likely, lengths=torch.full((3,), 4), probs=probs))
    second = draft_signals(Draft(tokens=unlikely, lengths=torch.full((3,), 4), probs=probs))
    assert torch.equal(first, second)
    assert not torch.allclose(probs.gather(2, likely[..., None]), probs.gather(2, unlikely[..., None]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_draft_signals_are_float32_for_any_input_precision(dtype):
    """Half-precision q, confidence and signals all come out as float32."""
    probs = torch.softmax(torch.randn((2, 3, 5)), dim=-1).to(dtype)
    tokens = torch.zeros((2, 3), dtype=torch.long)
    lengths = torch.full((2,), 3)
    assert draft_signals(Draft(tokens=tokens, lengths=lengths, probs=probs)).dtype == torch.float32
    assert draft_signals(Draft(tokens=tokens, lengths=lengths, confidence=torch.full((2, 3), 0.5, dtype=dtype))).dtype == torch.float32
    assert draft_signals(Draft(tokens=tokens, lengths=lengths, signals=torch.ones((2, 3, 3), dtype=dtype))).dtype == torch.float32


# ----------------------------------------------------------------------------- fit_logistic


def test_fit_logistic_recovers_known_coefficients():
    """On 20k seeded samples of y ~ Bernoulli(σ(b + w·x)) the fit lands within 0.1 of [b, w]."""
    generator = torch.Generator().manual_seed(0)
    truth = torch.tensor([-0.5, 1.5, -2.0], dtype=torch.float64)
    x = torch.randn((20_000, 2), generator=generator, dtype=torch.float64)
    y = torch.rand(20_000, generator=generator, dtype=torch.float64) < torch.sigmoid(truth[0] + x @ truth[1:])
    fitted = fit_logistic(x.float(), y)
    assert fitted.dtype == torch.float64 and fitted.shape == (3,)
    assert torch.allclose(fitted, truth, atol=0.1)


@PROPERTY
@given(logistic_problems())
def test_fit_logistic_matches_an_independent_optimiser(problem):
    """Same optimum as scipy's BFGS on the penalised negative log-likelihood (bias unpenalised)."""
    features, y, weights, l2 = problem
    u = torch.ones(len(y), dtype=torch.float64) if weights is None else weights
    design = torch.cat([torch.ones((len(y), 1), dtype=torch.float64), features], dim=1).numpy()
    target, u_np = y.double().numpy(), u.numpy()

    def objective(beta):
        z = design @ beta
        loss = (u_np * (torch.nn.functional.softplus(torch.from_numpy(z)).numpy() - target * z)).sum() + 0.5 * l2 * (beta[1:] ** 2).sum()
        gradient = design.T @ (u_np * (1 / (1 + torch.exp(-torch.from_numpy(z)).numpy()) - target)) + l2 * torch.cat([torch.zeros(1), torch.from_numpy(beta[1:])]).numpy()
        return loss, gradient

    reference = minimize(objective, x0=torch.zeros(design.shape[1]).numpy(), jac=True, method="BFGS", options={"gtol": 1e-9, "maxiter": 5000})
    fitted = fit_logistic(features, y, weights, l2=l2, iterations=100)
    assert objective(fitted.numpy())[0] <= reference.fun + 1e-6 * max(1.0, abs(reference.fun))


def test_fit_logistic_handles_one_class_and_an_empty_sample():
    """One class or no samples: the add-one smoothed bias, log((Σy+1)/(Σ(1−y)+1)), and zero weights."""
    features = torch.randn((7, 2))
    accepted = fit_logistic(features, torch.ones(7, dtype=torch.bool))
    rejected = fit_logistic(features, torch.zeros(7, dtype=torch.bool), weights=torch.full((7,), 2.0))
    empty = fit_logistic(features[:0], torch.zeros(0, dtype=torch.bool))
    assert torch.allclose(accepted, torch.tensor([math.log(8.0), 0.0, 0.0], dtype=torch.float64))
    assert torch.allclose(rejected, torch.tensor([math.log(1 / 15), 0.0, 0.0], dtype=torch.float64))
    assert torch.equal(empty, torch.zeros(3, dtype=torch.float64))


def test_fit_logistic_weights_count_like_repeated_samples():
    """Weight 2 on a sample fits exactly as that sample written twice; a warm start reaches the same fit."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn((40, 2), generator=generator)
    y = torch.rand(40, generator=generator) < torch.sigmoid(x[:, 0])
    weights = torch.ones(40)
    weights[:10] = 2.0
    repeated = fit_logistic(torch.cat([x, x[:10]]), torch.cat([y, y[:10]]), l2=0.5)
    weighted = fit_logistic(x, y, weights, l2=0.5)
    warm = fit_logistic(x, y, weights, l2=0.5, initial=torch.tensor([1.0, -1.0, 2.0]))
    assert torch.allclose(weighted, repeated, atol=1e-6)
    assert torch.allclose(warm, weighted, atol=1e-6)


@pytest.mark.parametrize(
    "arguments, error, message",
    [
        (dict(features=torch.ones((3, 2), dtype=torch.long)), TypeError, "features must be a floating-point tensor"),
        (dict(outcome=torch.ones(3)), TypeError, "outcome must be a BoolTensor"),
        (dict(outcome=torch.ones(4, dtype=torch.bool)), ValueError, r"outcome must have one entry per features row \(3\)"),
        (dict(weights=torch.tensor([1.0, -1.0, 1.0])), ValueError, "weights must be finite and >= 0"),
        (dict(l2=-0.1), ValueError, r"l2 must be a float in \[0.0, inf\), got -0.1"),
        (dict(iterations=0), ValueError, "iterations must be an int >= 1, got 0"),
        (dict(features=torch.tensor([[math.nan, 1.0]] * 3)), ValueError, "features must be finite"),
        (dict(initial=torch.zeros(2)), ValueError, r"initial must be 3 finite coefficients"),
    ],
)
def test_fit_logistic_refuses_bad_input(arguments, error, message):
    """Each bad argument is refused with a message naming it, its value and what is allowed."""
    base = dict(features=torch.ones((3, 2)), outcome=torch.tensor([True, False, True]))
    with pytest.raises(error, match=message):
        fit_logistic(**{**base, **arguments})


# ----------------------------------------------------------------------------- LogisticConfidence

TRUE_COEFFICIENTS = ((1.0, 1.5, 0.0), (0.0, -1.0, 2.0), (-0.5, 0.5, 0.5))


def synthetic_signal_log(blocks: int, seed: int) -> tuple[torch.Tensor, CalibrationLog]:
    """Signals [N, 3, 2] ~ N(0, 1) and a log where x_k is accepted with probability σ(β_k·[1, s_k]) until
    the first rejection, every position verified (survival is a placeholder the fit never reads)."""
    generator = torch.Generator().manual_seed(seed)
    signals = torch.randn((blocks, 3, 2), generator=generator)
    truth = LogisticConfidence(TRUE_COEFFICIENTS).survival(signal_draft(signals))
    accepted = (torch.rand((blocks, 3), generator=generator) < truth).long().cumprod(dim=1).sum(dim=1)
    return signals, CalibrationLog(survival=torch.full((blocks, 3), 0.5), verified=torch.full((blocks,), 3), accepted=accepted)


def test_logistic_fit_recovers_a_known_relation_per_position():
    """Each position's coefficients come back within 0.15 of the ones that generated the log."""
    signals, log = synthetic_signal_log(30_000, seed=0)
    fitted = LogisticConfidence.fit(signals, log)
    assert torch.allclose(torch.tensor(fitted.coefficients), torch.tensor(TRUE_COEFFICIENTS), atol=0.15)


def test_logistic_survival_reuses_the_last_position_and_stays_inside_the_unit_interval():
    """Positions past the fitted ones use the last coefficients; extreme logits are clamped into (0, 1)."""
    model = LogisticConfidence([[0.0, 1.0], [100.0, 0.0]])
    survival = model.survival(signal_draft(torch.tensor([[[-100.0], [0.0], [0.0]]])))
    assert survival.dtype == torch.float32
    assert 0.0 < float(survival[0, 0]) < 1e-5 and 1 - 1e-5 < float(survival[0, 1]) < 1.0
    assert torch.equal(survival[0, 2], survival[0, 1])


def test_logistic_round_trips_through_json():
    """to_dict → JSON → from_dict gives an equal model; an unknown format version is refused."""
    model = LogisticConfidence(TRUE_COEFFICIENTS)
    data = json.loads(json.dumps(model.to_dict()))
    assert LogisticConfidence.from_dict(data) == model
    with pytest.raises(ValueError, match="format_version"):
        LogisticConfidence.from_dict({**data, "format_version": 99})


def test_logistic_refuses_the_wrong_signal_width():
    """A model of F = 2 signals refuses drafts of 3, naming the signals; fit refuses signals not shaped like the log."""
    with pytest.raises(ValueError, match=r"draft signals must have 2 features per position.*got signals of shape \(1, 3, 3\)"):
        LogisticConfidence(TRUE_COEFFICIENTS).survival(signal_draft(torch.zeros((1, 3, 3))))
    signals, log = synthetic_signal_log(10, seed=1)
    with pytest.raises(ValueError, match=r"signals must have shape \(10, 3, F\)"):
        LogisticConfidence.fit(signals[:, :2], log)


@pytest.mark.parametrize(
    "coefficients, error",
    [([], ValueError), ([[1.0]], ValueError), ([[1.0, 2.0], [1.0]], ValueError), ([[math.inf, 1.0]], ValueError), (3, TypeError)],
)
def test_logistic_refuses_bad_coefficients(coefficients, error):
    """Empty, bias-only, ragged, non-finite or non-sequence coefficients are refused, naming the field."""
    with pytest.raises(error, match="coefficients must be"):
        LogisticConfidence(coefficients)


# ----------------------------------------------------------------------------- OnlineLogisticConfidence


@pytest.fixture(scope="module")
def repetitive_llama():
    """A tiny Llama whose greedy output repeats itself often enough for prompt lookup to be accepted (τ ≈ 1.6)."""
    return build_model("llama", initializer_range=0.02)


def test_online_logistic_refits_during_generation_and_stays_lossless(repetitive_llama):
    """Greedy output equals HF generate; survival equals the prior until the first refit, which StepRecord.estimator shows."""
    input_ids, attention_mask = left_padded_batch([9, 14], seed=0)
    prior = LogisticConfidence([[1.0, 0.0, 0.0, 0.0], [0.5, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    estimator = OnlineLogisticConfidence(prior, refit_every=5, min_samples=5)
    result = dspark.wrap(repetitive_llama, PromptLookupDrafter(max_ngram=2, max_draft_tokens=3), policy=Threshold(0.2), confidence=estimator).generate(
        input_ids, attention_mask=attention_mask, max_new_tokens=60, eos_token_id=[]
    )
    expected = repetitive_llama.generate(input_ids, attention_mask=attention_mask, max_new_tokens=60, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(result.sequences, expected)
    records = result.stats.records
    reports = [index for index, record in enumerate(records) if record.estimator is not None]
    assert reports and reports[0] == 4 and records[4].estimator["refits"] == 1 and len(records[4].estimator["samples"]) == 3
    assert estimator.refits == len(reports) >= 2
    prior_survival = torch.sigmoid(torch.tensor([1.0, 0.5, 0.0]))
    assert all(torch.allclose(record.survival, prior_survival.expand_as(record.survival)) for record in records[:5])
    learned = torch.cat([record.survival[:, 0] for record in records[5:] if record.survival is not None])
    assert not torch.allclose(learned, prior_survival[0].expand_as(learned)), "a refit must change what later steps see"


def test_online_logistic_learns_the_true_relation_from_a_stream():
    """On a stream where c = σ(−1 + 3s) at every position, the learned survival approaches the truth."""
    generator = torch.Generator().manual_seed(0)
    estimator = OnlineLogisticConfidence(window=2000, refit_every=10, min_samples=20)
    for _ in range(200):
        signals = torch.randn((16, 2, 1), generator=generator)
        survival = estimator.survival(signal_draft(signals))
        estimator.observe(sequential_outcome(torch.sigmoid(-1 + 3 * signals[..., 0]), generator))
    probe = torch.linspace(-2, 2, 9)[:, None, None].expand(9, 2, 1)
    learned = estimator.survival(signal_draft(probe.contiguous()))
    assert torch.allclose(learned, torch.sigmoid(-1 + 3 * probe[..., 0]), atol=0.08)
    assert survival.shape == (16, 2) and estimator.refits == 20
    assert estimator.snapshot().features == 1


def test_online_logistic_keeps_what_it_learned_across_generations_and_bounds_its_window():
    """start() keeps coefficients and samples (no more than ``window`` per position); it drops the pending scored draft."""
    estimator = OnlineLogisticConfidence(initial_survival=0.9, window=7, refit_every=3, min_samples=1)
    draft = signal_draft(torch.randn((4, 2, 3)))
    assert torch.allclose(estimator.survival(draft), torch.tensor(0.9))
    for _ in range(3):
        estimator.survival(draft)
        estimator.observe(outcome([2, 2, 1, 0], [0, 2, 1, 0]))
    report = estimator.report()
    assert report == {"refits": 1, "samples": [7, 3]} and estimator.report() is None
    before = estimator.survival(draft)
    estimator.start(generation_start())
    assert torch.equal(estimator.survival(draft), before)
    estimator.start(generation_start())
    with pytest.raises(ValueError, match="observe.outcome. must follow survival.draft."):
        estimator.observe(outcome([1], [1]))


@pytest.mark.parametrize(
    "arguments, error, message",
    [
        (dict(window=0), ValueError, "window must be an int >= 1, got 0"),
        (dict(refit_every=1.5), TypeError, "refit_every must be an int >= 1"),
        (dict(initial_survival=1.0), ValueError, r"initial_survival must be a float in \(0.0, 1.0\), got 1.0"),
        (dict(prior=LogisticConfidence([[0.0, 1.0]]), initial_survival=0.5), ValueError, "initial_survival must be None when a prior is given"),
        (dict(prior=DraftProbability()), TypeError, "prior must be a LogisticConfidence or None"),
    ],
)
def test_online_logistic_refuses_bad_settings(arguments, error, message):
    """Each bad setting names itself and what is allowed."""
    with pytest.raises(error, match=message):
        OnlineLogisticConfidence(**arguments)


def test_online_logistic_refuses_signals_unlike_its_prior():
    """A prior fitted on 3 signals refuses a draft with 2."""
    with pytest.raises(ValueError, match="draft signals must have 3 features"):
        OnlineLogisticConfidence(LogisticConfidence([[0.0, 1.0, 1.0, 1.0]])).survival(signal_draft(torch.zeros((1, 2, 2))))


def replay(estimator, drafts, outcomes) -> list[torch.Tensor]:
    """The survival an estimator gives each step of a stream, observing each step's outcome after it."""
    seen = []
    for draft, step_outcome in zip(drafts, outcomes):
        seen.append(estimator.survival(draft))
        estimator.observe(step_outcome)
    return seen


@PROPERTY
@given(estimator_streams())
def test_online_estimators_are_non_anticipating(stream):
    """Survival at step t is identical across two streams whose outcomes differ only from step t on."""
    drafts, outcomes, other_outcomes, split = stream
    for make in (
        lambda: OnlineLogisticConfidence(refit_every=1, min_samples=1),
        lambda: DriftCorrectedConfidence(DrafterConfidence(), refit_every=1, min_samples=1, tolerance=0.0),
    ):
        first, second = replay(make(), drafts, outcomes), replay(make(), drafts, other_outcomes)
        assert all(torch.equal(a, b) for a, b in zip(first[: split + 1], second[: split + 1]))


def test_online_estimators_do_react_to_outcomes():
    """Control for the property above: with different outcomes at step 0, step 1's survival differs."""
    draft = Draft(tokens=torch.zeros((4, 2), dtype=torch.long), lengths=torch.full((4,), 2),
                  signals=torch.linspace(-1, 1, 8).view(4, 2, 1), confidence=torch.full((4, 2), 0.8))
    for make in (
        lambda: OnlineLogisticConfidence(refit_every=1, min_samples=1),
        lambda: DriftCorrectedConfidence(DrafterConfidence(), refit_every=1, min_samples=1, tolerance=0.0),
    ):
        accepted = replay(make(), [draft, draft], [outcome([2] * 4, [2] * 4)] * 2)
        rejected = replay(make(), [draft, draft], [outcome([2] * 4, [0] * 4)] * 2)
        assert torch.equal(accepted[0], rejected[0]) and not torch.allclose(accepted[1], rejected[1])


# ----------------------------------------------------------------------------- CalibratedConfidence

BANDED = CalibrationSet("RecordingEstimator", {"greedy": Calibration("temperature", (0.5,)), "high": Calibration("temperature", (3.0, 0.25))})


def test_calibrated_confidence_applies_the_band_of_the_generation():
    """Greedy (and before any start) uses the greedy band's temperatures, sampling at T = 1 the high band's."""
    estimator = CalibratedConfidence(RecordingEstimator(0.7), BANDED)
    draft = signal_draft(torch.zeros((2, 3, 1)))
    raw = torch.full((2, 3), 0.7)
    assert torch.allclose(estimator.survival(draft), apply_temperatures(raw, (0.5,)))
    estimator.start(generation_start(do_sample=True, temperature=1.0))
    assert estimator.band == "high"
    assert torch.allclose(estimator.survival(draft), apply_temperatures(raw, (3.0, 0.25)))
    estimator.start(generation_start())
    assert estimator.band == "greedy" and torch.allclose(estimator.survival(draft), apply_temperatures(raw, (0.5,)))


def test_calibrated_confidence_forwards_hooks():
    """start, observe and report reach the base estimator; the base's report is the wrapper's."""
    base = RecordingEstimator()
    estimator = CalibratedConfidence(base, BANDED)
    estimator.start(generation_start())
    estimator.survival(signal_draft(torch.zeros((1, 2, 1))))
    estimator.observe(outcome([1], [1]))
    assert base.events == ["start", "observe"] and estimator.report() == {"events": 2}
    assert CalibratedConfidence(DraftProbability(), BANDED).report() is None


def test_calibrated_confidence_forwards_hooks_through_the_loop(llama):
    """Wrapped around an online estimator inside dspark.wrap, the base's refit reports land in the step records."""
    input_ids, attention_mask = left_padded_batch([6, 10], seed=2)
    estimator = CalibratedConfidence(OnlineLogisticConfidence(refit_every=2, min_samples=1), BANDED)
    result = dspark.wrap(llama, DraftModelDrafter(build_model("llama", seed=2)), policy=Threshold(0.1), confidence=estimator, max_draft_tokens=3).generate(
        input_ids, attention_mask=attention_mask, max_new_tokens=8, eos_token_id=[]
    )
    refits = [record.estimator["refits"] for record in result.stats.records if record.estimator is not None]
    assert refits and refits == list(range(1, len(refits) + 1))
    assert torch.equal(result.sequences, llama.generate(input_ids, attention_mask=attention_mask, max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0))


def test_calibrated_confidence_refuses_bad_parts():
    """A base without survival and calibrations that are not a CalibrationSet are TypeErrors naming them."""
    with pytest.raises(TypeError, match="base must be a ConfidenceEstimator"):
        CalibratedConfidence(object(), BANDED)
    with pytest.raises(TypeError, match="calibrations must be a CalibrationSet"):
        CalibratedConfidence(DraftProbability(), Calibration("temperature", (1.0,)))


# ----------------------------------------------------------------------------- BandedConfidence


def test_banded_confidence_keeps_one_estimator_per_band():
    """Each band's estimator is made on its first start and kept; greedy answers before any start; what one band
    learns online leaves another's survival as it was."""
    made = []

    def make(band):
        made.append(band)
        return OnlineLogisticConfidence(initial_survival=0.5, refit_every=1, min_samples=1)

    estimator = BandedConfidence(make)
    draft = signal_draft(torch.zeros((4, 2, 1)))
    assert torch.allclose(estimator.survival(draft), torch.tensor(0.5)) and made == ["greedy"]
    estimator.start(generation_start(do_sample=True, temperature=1.0))
    estimator.survival(draft)
    estimator.observe(outcome([2, 2, 2, 2], [0, 0, 0, 0]))  # every first position rejected: the high band learns c_1 < 0.5
    high = estimator.survival(draft)
    assert made == ["greedy", "high"] and float(high[0, 0]) < 0.2
    estimator.start(generation_start())
    assert torch.allclose(estimator.survival(draft), torch.tensor(0.5)), "the greedy band must not see the high band's outcomes"
    estimator.start(generation_start(do_sample=True, temperature=1.0))
    assert torch.equal(estimator.survival(draft), high) and made == ["greedy", "high"]


def test_banded_confidence_forwards_hooks_and_refuses_bad_parts():
    """start, observe and report reach the current band's estimator; a make that is not callable, or that makes no
    estimator, is a TypeError naming it."""
    base = RecordingEstimator()
    estimator = BandedConfidence(lambda band: base)
    estimator.start(generation_start())
    estimator.survival(signal_draft(torch.zeros((1, 2, 1))))
    estimator.observe(outcome([1], [1]))
    assert base.events == ["start", "observe"] and estimator.report() == {"events": 2}
    with pytest.raises(TypeError, match="make must be a callable"):
        BandedConfidence(DraftProbability())
    with pytest.raises(TypeError, match=r"make\('greedy'\) must be a ConfidenceEstimator"):
        BandedConfidence(lambda band: object()).survival(signal_draft(torch.zeros((1, 2, 1))))


def test_online_estimator_starts_each_band_from_the_files_logistic_model():
    """online_estimator refits the file's fitted logistic model per band, without the file's calibration; a file
    without one, and options OnlineLogisticConfidence refuses, are refused at once."""
    from dspark.verify import Calibration, CalibrationFile, CalibrationSet

    bands = {"greedy": Calibration("temperature", (2.0,))}
    logistic = LogisticConfidence(((0.5, 1.0),))
    calibration_file = CalibrationFile(
        {"LogisticConfidence": CalibrationSet("LogisticConfidence", bands), "DraftProbability": CalibrationSet("DraftProbability", bands)},
        "LogisticConfidence", estimators={"LogisticConfidence": logistic.to_dict()},
    )
    estimator = online_estimator(calibration_file, refit_every=3)
    draft = signal_draft(torch.full((2, 2, 1), 0.5))
    assert torch.allclose(estimator.survival(draft), logistic.survival(draft))
    assert isinstance(estimator.current, OnlineLogisticConfidence) and estimator.current.prior == logistic and estimator.current.refit_every == 3
    estimator.start(generation_start(do_sample=True, temperature=1.0))
    assert estimator.current is not estimator.estimators["greedy"] and estimator.current.prior == logistic
    without = CalibrationFile({"DraftProbability": CalibrationSet("DraftProbability", bands)}, "DraftProbability")
    with pytest.raises(ValueError, match="must hold a fitted LogisticConfidence"):
        online_estimator(without)
    with pytest.raises(ValueError, match="refit_every"):
        online_estimator(calibration_file, refit_every=0)
    with pytest.raises(TypeError, match="calibration_file must be a CalibrationFile"):
        online_estimator(logistic)


# ----------------------------------------------------------------------------- DriftCorrectedConfidence


def drifting_stream(estimator, steps: int, true_temperature: float, seed: int = 0) -> list[dict]:
    """Feed ``estimator`` (around DrafterConfidence) drafts whose reported c = σ(z) while the truth is
    σ(z / true_temperature) at both positions; returns its non-None reports."""
    generator = torch.Generator().manual_seed(seed)
    reports = []
    for _ in range(steps):
        logits = torch.randn((32, 2), generator=generator) * 2 + 1
        draft = Draft(tokens=torch.zeros((32, 2), dtype=torch.long), lengths=torch.full((32,), 2), confidence=torch.sigmoid(logits))
        estimator.survival(draft)
        estimator.observe(sequential_outcome(torch.sigmoid(logits / true_temperature), generator))
        report = estimator.report()
        if report is not None:
            reports.append(report)
    return reports


def test_drift_correction_moves_temperatures_toward_the_truth():
    """An overconfident base (true T = 2.5) gets T_k near 2.5 and a drift that shrinks below the tolerance."""
    estimator = DriftCorrectedConfidence(DrafterConfidence(), refit_every=16, tolerance=0.03)
    reports = drifting_stream(estimator, 160, true_temperature=2.5)
    assert len(reports) == 10 and reports[0]["refitted"]
    assert all(abs(t - 2.5) < 0.5 for t in estimator.temperatures)
    assert all(drift > 0.05 for drift in reports[0]["drift"]), "an overconfident base predicts more than is accepted"
    assert all(abs(drift) < 0.03 for drift in reports[-1]["drift"])


def test_drift_correction_leaves_a_calibrated_base_alone():
    """When the base is right (true T = 1) no position drifts past the tolerance and every T_k stays 1."""
    estimator = DriftCorrectedConfidence(DrafterConfidence(), refit_every=16, tolerance=0.05)
    reports = drifting_stream(estimator, 96, true_temperature=1.0)
    assert estimator.temperatures == [1.0, 1.0] and not any(report["refitted"] for report in reports)


def test_drift_correction_forwards_hooks_and_nests_the_base_report():
    """The base starts and observes; its report appears under "base", the wrapper's own keys beside it at check steps."""
    base = RecordingEstimator(0.9)
    estimator = DriftCorrectedConfidence(base, refit_every=2, min_samples=1)
    estimator.start(generation_start())
    draft = signal_draft(torch.zeros((2, 1, 1)))
    estimator.survival(draft)
    estimator.observe(outcome([1, 1], [0, 0]))
    assert estimator.report() == {"base": {"events": 2}}
    estimator.survival(draft)
    estimator.observe(outcome([1, 1], [0, 1]))
    report = estimator.report()
    assert base.events == ["start", "observe", "observe"] and report["base"] == {"events": 3}
    assert report["refitted"] and report["drift"] == [pytest.approx(0.9 - 0.25)]


@pytest.mark.parametrize(
    "arguments, error, message",
    [
        (dict(window=0), ValueError, "window must be an int >= 1"),
        (dict(tolerance=-0.1), ValueError, r"tolerance must be a float in \[0.0, 1.0\]"),
        (dict(grid=[]), ValueError, "grid must be a non-empty sequence of finite temperatures > 0"),
        (dict(grid=[1.0, -2.0]), ValueError, "grid must be a non-empty sequence"),
        (dict(base=object()), TypeError, "base must be a ConfidenceEstimator"),
    ],
)
def test_drift_correction_refuses_bad_settings(arguments, error, message):
    """Each bad setting names itself and what is allowed."""
    with pytest.raises(error, match=message):
        DriftCorrectedConfidence(**{"base": DraftProbability(), **arguments})


def test_wrappers_compute_in_float32_for_half_precision_bases():
    """A base giving bfloat16 survival yields float32 survival from both wrappers."""

    class HalfBase:
        def survival(self, draft):
            return torch.full(draft.tokens.shape, 0.6, dtype=torch.bfloat16)

    draft = signal_draft(torch.zeros((2, 2, 1)))
    assert CalibratedConfidence(HalfBase(), BANDED).survival(draft).dtype == torch.float32
    assert DriftCorrectedConfidence(HalfBase()).survival(draft).dtype == torch.float32


def test_calibrated_estimator_builds_what_the_file_names():
    """calibrated_estimator wraps the file's default (or a named) estimator, rebuilding a fitted logistic model; unknown names are refused."""
    from dspark.verify import Calibration, CalibrationFile, CalibrationSet, calibrated_estimator

    bands = {"greedy": Calibration("temperature", (2.0,))}
    logistic = LogisticConfidence(((0.5, 1.0),))
    calibration_file = CalibrationFile(
        {"LogisticConfidence": CalibrationSet("LogisticConfidence", bands), "DraftProbability": CalibrationSet("DraftProbability", bands)},
        "LogisticConfidence", estimators={"LogisticConfidence": logistic.to_dict()},
    )
    assert calibrated_estimator(calibration_file).base == logistic
    assert isinstance(calibrated_estimator(calibration_file, "DraftProbability").base, DraftProbability)
    with pytest.raises(ValueError, match="name must be one of the calibrated estimators"):
        calibrated_estimator(calibration_file, "DrafterConfidence")
