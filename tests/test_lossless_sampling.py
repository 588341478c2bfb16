"""Sampling is lossless: a G-test of the joint law of the first two sampled tokens against the exact
target law, for several warpings and drafters; the same test rejects the draft's law and a
deliberately anticipating policy (paper Appendix A), so it is known to be able to fail."""

import attrs
import pytest
import torch
from scipy.stats import chi2

import dspark
from dspark.drafters import CascadeDrafter, DraftModelDrafter, PromptLookupDrafter, SemiARConfig, SemiARDrafter, TargetSignature
from dspark.types import Draft, SamplingConfig
from dspark.verify import DrafterConfidence, DraftProbability, FixedLength, GoodputFallback, Threshold
from dspark.verify.calibration import Calibration, CalibrationSet
from dspark.verify.estimators import BandedConfidence, CalibratedConfidence, DriftCorrectedConfidence, LogisticConfidence, OnlineLogisticConfidence
from dspark.verify.schedulers import HardwareAwareScheduler, MinimumGainRule, VllmArgmaxRule, prefix_schedule
from dspark.verify.warping import warped_probs
from tests.conftest import FixedSurvival, build_model

VOCAB = 6
ROWS = 4000
PROMPT = torch.tensor([[3, 4, 3, 5, 3, 4]])
SIGNIFICANCE = 1e-3
WARPINGS = [
    SamplingConfig(do_sample=True),
    SamplingConfig(do_sample=True, temperature=0.7, top_k=4),
    SamplingConfig(do_sample=True, temperature=1.3, top_p=0.8),
]


def _joint_law(model, sampling: SamplingConfig, prompt: torch.Tensor = PROMPT) -> torch.Tensor:
    """Exact P(t1, t2) = p1(t1) · p2(t2 | t1) after ``prompt`` [1, 6] under the warping, [V, V]."""
    with torch.inference_mode():
        first = warped_probs(model(prompt).logits[0, -1], sampling)
        continuations = torch.cat([prompt.expand(VOCAB, -1), torch.arange(VOCAB)[:, None]], dim=1)
        second = warped_probs(model(continuations).logits[:, -1], sampling)
    return first[:, None] * second


def _g_test_p_value(sequences: torch.Tensor, law: torch.Tensor) -> float:
    """p-value of a G-test of the first two generated tokens against ``law``; sparse cells are pooled."""
    first, second = sequences[:, PROMPT.shape[1]], sequences[:, PROMPT.shape[1] + 1]
    observed = torch.bincount(first * VOCAB + second, minlength=VOCAB * VOCAB).double()
    expected = law.flatten().double() * sequences.shape[0]
    if bool((observed[expected == 0] > 0).any()):
        return 0.0
    sparse = expected < 5
    observed = torch.cat([observed[~sparse], observed[sparse].sum()[None]])
    expected = torch.cat([expected[~sparse], expected[sparse].sum()[None]])
    keep = expected > 0
    observed, expected = observed[keep], expected[keep]
    g = 2 * float((observed * torch.log(torch.where(observed > 0, observed / expected, 1.0))).sum())
    return float(chi2.sf(g, observed.numel() - 1))


def _sample(target, drafter, sampling, seed, prompts: torch.Tensor = PROMPT, **wrap_arguments):
    """ROWS rows of ``prompts`` [P, 6] repeated (row i holds prompt i mod P), three tokens each."""
    speculative = dspark.wrap(target, drafter, **wrap_arguments)
    return speculative.generate(
        prompts.repeat(ROWS // prompts.shape[0], 1), max_new_tokens=3, do_sample=True, temperature=sampling.temperature,
        top_k=sampling.top_k, top_p=sampling.top_p, eos_token_id=[], generator=torch.Generator().manual_seed(seed),
    )


@pytest.fixture(scope="module")
def models():
    return build_model("llama", seed=0, vocab_size=VOCAB, initializer_range=0.5), build_model("llama", seed=11, vocab_size=VOCAB, initializer_range=0.5)


def _semi_ar_drafter(target, backbone: str = "parallel") -> SemiARDrafter:
    config = SemiARConfig(target=TargetSignature.of(target), target_layers=(1, 2), max_draft_tokens=2, num_heads=4, intermediate_size=32, rank=4, backbone=backbone)
    torch.manual_seed(3)
    drafter = SemiARDrafter(config, target)
    with torch.no_grad():
        drafter.transition_out.normal_(0, 1.0)
    return drafter.eval()


@pytest.mark.parametrize("warping", range(len(WARPINGS)))
@pytest.mark.parametrize("drafter_kind", ["draft-model", "prompt-lookup", "semi-ar", "autoregressive-head"])
def test_sampled_tokens_follow_the_target_law(models, warping, drafter_kind):
    """The first two sampled tokens pass a G-test against the target's exact warped joint law."""
    target, draft_model = models
    sampling = WARPINGS[warping]
    drafter = {
        "draft-model": lambda: DraftModelDrafter(draft_model),
        "prompt-lookup": lambda: PromptLookupDrafter(max_ngram=2),
        "semi-ar": lambda: _semi_ar_drafter(target),
        "autoregressive-head": lambda: _semi_ar_drafter(target, backbone="autoregressive"),
    }[drafter_kind]()
    result = _sample(target, drafter, sampling, seed=warping, max_draft_tokens=2)
    assert result.stats.tau > 1.1, "drafts must be accepted often enough for the test to exercise acceptance"
    assert _g_test_p_value(result.sequences, _joint_law(target, sampling)) > SIGNIFICANCE


@pytest.mark.parametrize("warping", range(len(WARPINGS)))
def test_the_test_rejects_the_draft_law(models, warping):
    """Power: the same samples are rejected when tested against the draft model's own law."""
    target, draft_model = models
    sampling = WARPINGS[warping]
    result = _sample(target, DraftModelDrafter(draft_model), sampling, seed=warping, max_draft_tokens=2)
    assert _g_test_p_value(result.sequences, _joint_law(draft_model, sampling)) < SIGNIFICANCE


@attrs.frozen
class AnticipatingDraftProbability:
    """A deliberately biased estimator: c_k = q_k(x_k) looks at the drawn token itself."""

    def survival(self, draft: Draft) -> torch.Tensor:
        return draft.probs.gather(2, draft.tokens[:, :, None]).squeeze(2)


def test_the_test_rejects_an_anticipating_policy(models):
    """Power: verifying x_k only when q_k(x_k) is high (a decision that sees x_k) biases the output law."""
    target, draft_model = models
    sampling = WARPINGS[0]
    result = _sample(target, DraftModelDrafter(draft_model), sampling, seed=0, max_draft_tokens=2, policy=Threshold(0.3), confidence=AnticipatingDraftProbability())
    assert _g_test_p_value(result.sequences, _joint_law(target, sampling)) < SIGNIFICANCE


def test_same_seed_same_output(models):
    """generator= makes sampling reproducible; a different seed gives different samples."""
    target, draft_model = models
    runs = [_sample(target, DraftModelDrafter(draft_model), WARPINGS[1], seed=seed, max_draft_tokens=2).sequences for seed in (5, 5, 6)]
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], runs[2])


def test_plain_sampling_through_the_loop_is_lossless(models):
    """FixedLength(0) sampling (no drafts) follows the target law too."""
    target, _ = models
    result = _sample(target, PromptLookupDrafter(), WARPINGS[2], seed=9, policy=FixedLength(0))
    assert _g_test_p_value(result.sequences, _joint_law(target, WARPINGS[2])) > SIGNIFICANCE


def test_threshold_on_the_confidence_head_is_lossless(models):
    """A threshold on c_k that depends on x_{k−1} only keeps the target law (invariant 3)."""
    target, _ = models
    drafter = _semi_ar_drafter(target)
    with torch.no_grad():
        drafter.confidence_head.weight.normal_(0, 2.0)
    result = _sample(target, drafter, WARPINGS[0], seed=4, max_draft_tokens=2, policy=Threshold(0.5), confidence=DrafterConfidence())
    lengths = torch.cat(result.stats.verify_lengths)
    assert bool((lengths == 0).any()) and bool((lengths > 0).any()), "the threshold must both cut and admit drafts"
    assert _g_test_p_value(result.sequences, _joint_law(target, WARPINGS[0])) > SIGNIFICANCE



# c = σ(8·max q − 4): a threshold of 0.5 verifies x_k exactly when max_v q_k(v) ≥ 0.5, known before x_k is drawn.
MAX_Q_MODEL = LogisticConfidence([[-4.0, 8.0, 0.0]])
# name -> (estimator factory, threshold): each threshold both cuts and admits drafts at this seed. The online
# estimators refit after the first step (outcomes of all 4000 rows) and so change the second step's decisions.
LEARNING_ESTIMATORS = {
    "logistic": (lambda: MAX_Q_MODEL, 0.5),
    "online-logistic": (lambda: OnlineLogisticConfidence(MAX_Q_MODEL, refit_every=1, min_samples=10), 0.25),
    "banded-online-logistic": (lambda: BandedConfidence(lambda band: OnlineLogisticConfidence(MAX_Q_MODEL, refit_every=1, min_samples=10)), 0.25),
    "calibrated": (
        lambda: CalibratedConfidence(
            DraftProbability(), CalibrationSet("DraftProbability", {"greedy": Calibration("temperature", (1.0,)), "high": Calibration("temperature", (0.5, 2.0))})
        ),
        0.5,
    ),
    "drift-corrected": (lambda: DriftCorrectedConfidence(DraftProbability(), refit_every=1, min_samples=10, tolerance=0.0), 0.5),
}


@pytest.mark.parametrize("estimator_kind", sorted(LEARNING_ESTIMATORS))
def test_threshold_on_a_learning_estimator_is_lossless(models, estimator_kind):
    """Thresholds on the logistic, online (alone and one per band), band-calibrated and drift-corrected estimators keep
    the target law; the online ones refit between the steps of this very generation."""
    target, draft_model = models
    make, threshold = LEARNING_ESTIMATORS[estimator_kind]
    result = _sample(target, DraftModelDrafter(draft_model), WARPINGS[0], seed=7, max_draft_tokens=2, policy=Threshold(threshold), confidence=make())
    lengths = torch.cat(result.stats.verify_lengths)
    assert bool((lengths == 0).any()) and bool((lengths > 0).any()), "the threshold must both cut and admit drafts"
    if estimator_kind in ("online-logistic", "banded-online-logistic", "drift-corrected"):
        assert result.stats.records[0].estimator is not None, "the first step's refit must reach the second step"
    assert _g_test_p_value(result.sequences, _joint_law(target, WARPINGS[0])) > SIGNIFICANCE


@attrs.frozen
class LogisticOfTheDrawnToken:
    """A deliberately biased use of the same logistic model: its signal is q_k(x_k), not max_v q_k(v)."""

    def survival(self, draft: Draft) -> torch.Tensor:
        drawn = draft.probs.gather(2, draft.tokens[:, :, None])
        return MAX_Q_MODEL.survival(Draft(tokens=draft.tokens, lengths=draft.lengths, signals=torch.cat([drawn, torch.zeros_like(drawn)], dim=2)))


def test_the_test_rejects_a_logistic_model_of_the_drawn_token(models):
    """Power: the logistic model and threshold that pass above fail once their signal reads x_k itself."""
    target, draft_model = models
    result = _sample(target, DraftModelDrafter(draft_model), WARPINGS[0], seed=7, max_draft_tokens=2, policy=Threshold(0.5), confidence=LogisticOfTheDrawnToken())
    assert _g_test_p_value(result.sequences, _joint_law(target, WARPINGS[0])) < SIGNIFICANCE


# ----------------------------------------------------------------------------- throughput-aware schedulers
# With PROMPT the draft is confident about x_1 (a_1 = max q_1 = 0.81), and c_2 = max q_2(· | x_1) is high
# (0.77-0.94) for x_1 in {0, 1, 2, 4} and low (0.35, 0.43) for x_1 in {3, 5}; with PROMPT_B a_1 = 0.38.
PROMPT_B = torch.tensor([[4, 5, 5, 3, 4, 3]])


@attrs.frozen
class StepCurve:
    """A cost model from a table: T(R, w) = seconds[w − 1] for any R (the last entry beyond), fixed drafting time."""

    seconds: tuple[float, ...]
    draft_seconds: float = 0.0

    def step_time(self, rows: int, tokens: int) -> float:
        return self.seconds[min(tokens, len(self.seconds)) - 1]

    def draft_time(self, rows: int, depth: int | None = None) -> float:
        return self.draft_seconds


# Flat up to two tokens a row (memory-bound), a third costs 75% more.
ROOFLINE = StepCurve((1.0, 1.0, 1.75), draft_seconds=0.1)
# Paper Appendix A: SPS(1) = 1.0, SPS(2) = 0.5, SPS(3) = 0.45 (seconds are 1 / SPS).
APPENDIX_A = StepCurve((1.0, 2.0, 1 / 0.45))


@attrs.frozen
class RetrospectiveScheduler:
    """Test double: Algorithm 1 without its break, i.e. the best prefix of the admission order (Appendix A)."""

    needs_survival = True

    def lengths(self, survival, cost_model, limits):
        return prefix_schedule(survival.cumprod(dim=1), limits, cost_model.step_time, cost_model.draft_time(survival.shape[0]), early_stop=False)


@attrs.frozen
class SingleRequestBatches:
    """Schedules every row as its own batch (R = 1), as ROWS independent single-request engines would."""

    policy: object
    needs_survival = True

    def lengths(self, survival, cost_model, limits):
        return torch.cat([self.policy.lengths(survival[row : row + 1], cost_model, limits[row : row + 1]) for row in range(survival.shape[0])])


@pytest.mark.parametrize(
    "policy",
    [HardwareAwareScheduler(admission="candidates", static_batch=False), HardwareAwareScheduler(admission="candidates"), MinimumGainRule()],
    ids=["hardware-aware-candidates", "hardware-aware-candidates-static-batch", "minimum-gain"],
)
def test_throughput_aware_policies_are_lossless_on_a_mixed_batch(models, policy):
    """On one 4000-row batch of two prompts the first step verifies x_1 for PROMPT's rows only, and both prompts' samples pass."""
    target, draft_model = models
    sampling = WARPINGS[0]
    prompts = torch.cat([PROMPT, PROMPT_B])
    result = _sample(target, DraftModelDrafter(draft_model), sampling, seed=1, prompts=prompts, max_draft_tokens=2,
                     policy=policy, confidence=DraftProbability(), cost_model=ROOFLINE)
    first_step = result.stats.verify_lengths[0]
    assert first_step[0::2].eq(1).all() and first_step[1::2].eq(0).all(), "ℓ must differ between the rows of one step"
    for index, prompt in enumerate(prompts):
        assert _g_test_p_value(result.sequences[index::2], _joint_law(target, sampling, prompt[None])) > SIGNIFICANCE


def test_early_stop_may_read_c2_to_decide_x2(models):
    """Single-request batches on a curve where verifying x_2 pays only when c_2 is high: ℓ ∈ {1, 2} follows x_1, and the law holds."""
    target, draft_model = models
    result = _sample(target, DraftModelDrafter(draft_model), WARPINGS[0], seed=0, max_draft_tokens=2,
                     policy=SingleRequestBatches(HardwareAwareScheduler()), confidence=DraftProbability(), cost_model=StepCurve((1.0, 1.0, 1.3)))
    assert set(result.stats.verify_lengths[0].tolist()) == {1, 2}
    assert _g_test_p_value(result.sequences, _joint_law(target, WARPINGS[0])) > SIGNIFICANCE


def test_look_ahead_columns_are_lossless(models):
    """Single-request batches on a curve where the second token alone is dear (T = 1, 1.85, 2.3) and a_1 = 0.81:
    the plain stop verifies nothing, the look-ahead opens column 1 on a_2 projected as a_1·c_1, then opens column 2
    only when the real c_2 (which reads x_1) is high: ℓ ∈ {1, 2} follows x_1, and the law holds."""
    target, draft_model = models
    cost_model = StepCurve((1.0, 1.85, 2.3))
    result = _sample(target, DraftModelDrafter(draft_model), WARPINGS[0], seed=0, max_draft_tokens=2,
                     policy=SingleRequestBatches(HardwareAwareScheduler(look_ahead=True)), confidence=DraftProbability(), cost_model=cost_model)
    first = result.stats.records[0]
    assert set(first.verify_lengths.tolist()) == {1, 2}
    assert HardwareAwareScheduler().lengths(first.survival[:1], cost_model, torch.tensor([2])).tolist() == [0], "the plain stop must open nothing here"
    assert _g_test_p_value(result.sequences, _joint_law(target, WARPINGS[0])) > SIGNIFICANCE


@pytest.mark.parametrize("policy", [RetrospectiveScheduler(), VllmArgmaxRule()], ids=["retrospective", "vllm-argmax"])
def test_the_test_rejects_retrospective_scheduling(models, policy):
    """Power (Appendix A's setting: R = 1, γ = 2, its SPS curve): choosing the best prefix after seeing c_2 verifies
    x_1 exactly when c_2, which reads x_1, is high, and the output law is rejected. In one 4000-row batch the
    argmax follows batch averages and the bias shrinks like 1/R (not detectable here), hence one row per batch."""
    target, draft_model = models
    result = _sample(target, DraftModelDrafter(draft_model), WARPINGS[0], seed=0, max_draft_tokens=2,
                     policy=SingleRequestBatches(policy), confidence=DraftProbability(), cost_model=APPENDIX_A)
    assert set(result.stats.verify_lengths[0].tolist()) == {0, 2}, "x_1 must be verified for some rows and not others"
    assert _g_test_p_value(result.sequences, _joint_law(target, WARPINGS[0])) < SIGNIFICANCE


@attrs.frozen
class PairBatches:
    """Schedules rows 2i and 2i + 1 as one batch of two, as ROWS / 2 independent two-request engines would."""

    policy: object
    needs_survival = True

    def lengths(self, survival, cost_model, limits):
        return torch.cat([self.policy.lengths(survival[row : row + 2], cost_model, limits[row : row + 2]) for row in range(0, survival.shape[0], 2)])


@attrs.frozen
class ColumnArgmax:
    """Test double: column-wise admission without its early stop, i.e. the best number of columns K after seeing
    every column's survival (the retrospective search, by columns)."""

    needs_survival = True

    def lengths(self, survival, cost_model, limits):
        prefix = survival.cumprod(dim=1).double()
        rows, gamma = prefix.shape
        reachable = torch.arange(1, gamma + 1)[None, :] <= limits[:, None]
        tau = rows + torch.cat([torch.zeros(1, dtype=torch.float64), (prefix * reachable).sum(dim=0).cumsum(dim=0)])
        seconds = torch.tensor([cost_model.draft_time(rows) + cost_model.step_time(rows, 1 + width) for width in range(gamma + 1)], dtype=torch.float64)
        return torch.minimum(limits, (tau / seconds).argmax())


def test_column_admission_is_lossless_in_pair_batches(models):
    """Column-wise admission in batches of two, on a curve where the second column pays only when both rows' c_2 are
    high enough: ℓ ∈ {1, 2} follows both rows' x_1, and the law holds."""
    target, draft_model = models
    policy = PairBatches(HardwareAwareScheduler(admission="columns"))
    result = _sample(target, DraftModelDrafter(draft_model), WARPINGS[0], seed=7, max_draft_tokens=2,
                     policy=policy, confidence=DraftProbability(), cost_model=StepCurve((1.0, 1.0, 1.3)))
    assert set(result.stats.verify_lengths[0].tolist()) == {1, 2}
    assert _g_test_p_value(result.sequences, _joint_law(target, WARPINGS[0])) > SIGNIFICANCE


def test_the_test_rejects_column_admission_without_its_early_stop(models):
    """Power, by columns: in batches of two on a curve where one column never pays and two pay only when both rows'
    a_2 are high (T = 1, 2, 2.41), the best K verifies x_1 only when its own c_2, which reads x_1, is high, and the
    output law is rejected (column-wise admission with its early stop verifies nothing there)."""
    target, draft_model = models
    result = _sample(target, DraftModelDrafter(draft_model), WARPINGS[0], seed=7, max_draft_tokens=2,
                     policy=PairBatches(ColumnArgmax()), confidence=DraftProbability(), cost_model=StepCurve((1.0, 2.0, 2.41)))
    assert set(result.stats.verify_lengths[0].tolist()) == {0, 2}, "x_1 must be verified for some rows and not others"
    assert _g_test_p_value(result.sequences, _joint_law(target, WARPINGS[0])) < SIGNIFICANCE


class EvenRowsAfterRejection:
    """Test double of a row fallback whose choice reads the past: after the first step, draft only for the
    even rows that accepted nothing at their last drafted step (so half of the rows whose second token is
    still to come are drafted for, half decode plainly)."""

    def start(self, generation, cost_model):
        return self

    def draft_rows(self, rows):
        if not hasattr(self, "rejected"):
            return None
        return self.rejected[rows] & (rows % 2 == 0)

    def observe(self, record):
        rows, drafted = record.rows, record.drafted_for
        if not hasattr(self, "rejected"):
            self.rejected = torch.zeros(int(rows.max()) + 1, dtype=torch.bool)
        self.rejected[rows[drafted]] = record.accepted[drafted] == 0


@attrs.frozen
class FixedLengthWithFallback:
    """FixedLength(γ) behind a row fallback."""

    max_draft_tokens: int
    row_fallback: object
    needs_survival = False

    def lengths(self, survival, cost_model, limits):
        return FixedLength(self.max_draft_tokens).lengths(survival, cost_model, limits)


@pytest.mark.parametrize("drafter_kind", ["semi-ar", "draft-model"])
def test_a_row_fallback_reading_the_past_keeps_the_law(models, drafter_kind):
    """Rows drafted for or not by what earlier steps accepted (the semi-AR drafter drafts only that subset, the
    draft model drafts every row and the loop verifies the subset) still sample the target's exact law."""
    target, draft_model = models
    drafter = _semi_ar_drafter(target) if drafter_kind == "semi-ar" else DraftModelDrafter(draft_model)
    policy = FixedLengthWithFallback(2, EvenRowsAfterRejection())
    result = _sample(target, drafter, WARPINGS[0], seed=4, policy=policy)
    second = result.stats.records[1]
    fell_back = second.drafted == 0 if drafter_kind == "semi-ar" else second.verify_lengths == 0
    assert bool(fell_back.any()) and bool((~fell_back).any()), "the second step must draft for some rows and not others"
    assert _g_test_p_value(result.sequences, _joint_law(target, WARPINGS[0])) > SIGNIFICANCE


@attrs.frozen
class PerRowDrafting:
    """ROOFLINE's step curve with drafting that costs per row drafted (0.07 of a step per thousand rows)."""

    def step_time(self, rows: int, tokens: int) -> float:
        return ROOFLINE.step_time(rows, tokens)

    def draft_time(self, rows: int, depth: int | None = None) -> float:
        return 0.00007 * rows


def test_the_dspark_scheduler_with_its_row_fallback_is_lossless_at_batch_size_above_one(models):
    """HardwareAwareScheduler with a GoodputFallback that reads each row's own gain (prior_weight=0, so the rows'
    estimates are not pulled towards each other) on a 4000-row batch of two prompts and the semi-AR
    drafter: at the second step only the rows of the prompt whose first draft promised more (expected gain 0.57
    against 0.43 tokens, both times ρ = 0.61, the first step's accepted over expected tokens) are drafted for,
    and both prompts' samples follow the law."""
    target, _ = models
    prompts = torch.cat([PROMPT, PROMPT_B])
    policy = HardwareAwareScheduler(row_fallback=GoodputFallback(prior_weight=0.0))
    result = _sample(target, _semi_ar_drafter(target), WARPINGS[0], seed=5, prompts=prompts, policy=policy,
                     confidence=DrafterConfidence(), cost_model=PerRowDrafting())
    second = result.stats.records[1]
    assert bool(second.drafted_for[0::2].all()) and not bool(second.drafted_for[1::2].any())
    for index, prompt in enumerate(prompts):
        assert _g_test_p_value(result.sequences[index::2], _joint_law(target, WARPINGS[0], prompt[None])) > SIGNIFICANCE


@pytest.mark.parametrize("rule", ["first", "confidence"])
def test_a_cascade_of_lookup_and_the_semi_ar_drafter_is_lossless(models, rule):
    """Per row prompt lookup (a point mass) or the semi-AR drafter (its q), chosen by lookup's match or by c_1:
    both kinds of rows occur in one step, and the samples follow the target law."""
    target, _ = models
    cascade = CascadeDrafter([(PromptLookupDrafter(max_ngram=2, min_ngram=1), FixedSurvival(0.5)), (_semi_ar_drafter(target), DrafterConfidence())], rule=rule)
    sources = []
    observe = cascade.observe

    def recording_observe(outcome):
        if cascade.sources is not None:  # None on a last step that drafted nothing
            sources.append(cascade.sources.clone())
        observe(outcome)

    cascade.observe = recording_observe
    result = _sample(target, cascade, WARPINGS[0], seed=6, policy=FixedLength(2))
    assert set(sources[1].tolist()) == {0, 1}, "the second step must mix lookup rows and semi-AR rows"
    assert _g_test_p_value(result.sequences, _joint_law(target, WARPINGS[0])) > SIGNIFICANCE
