"""Confidence estimators that learn: a logistic model of survival on draft signals (fitted offline from
logs, or online from the target's decisions), and wrappers that calibrate another estimator per
sampling band, keep one estimator per band, or correct an estimator's drift online.

Notation, used throughout: a draft has R rows and γ positions k = 1..γ; ``s[r, k]`` ∈ ℝ^F are the
signals of position k (``draft_signals``), all known before x_k is drawn; c_k = P(x_k accepted |
x_1..x_{k−1} accepted) is the survival; σ is the logistic function and logit its inverse. A step with
verify length ℓ and accepted count n settles the conditional outcome y_k = 1[n ≥ k] at each position
that was reached and checked, k ≤ ℓ and n ≥ k−1 (``calibration.conditional_outcomes``). The logistic
model is c_k = σ(b_k + w_k·s_k) with one coefficient vector β_k = [b_k, w_k] per position; positions
past the last fitted one reuse the last. Temperature scaling by T > 0 is c' = σ(logit(c) / T).

The online estimators learn only in ``observe``, which the loop calls after the step's survival was
used, so survival at step t depends on outcomes of steps < t only (non-anticipating). ``survival``
stays on the draft's device with no host copy; what was observed is queued there and moved to the
host in one copy per refit, where fits run in float64.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import attrs
import torch
import torch.nn.functional as F

from dspark.checks import check_format, check_int
from dspark.protocols import ESTIMATOR_HOOKS, ConfidenceEstimator, check_hooks, hook
from dspark.types import Draft, GenerationStart, StepOutcome
from dspark.verify.calibration import CalibrationFile, CalibrationLog, CalibrationSet, apply_temperatures, band_of, conditional_outcomes, temperature_grid
from dspark.verify.confidence import DraftProbability, DrafterConfidence

__all__ = [
    "BandedConfidence",
    "CalibratedConfidence",
    "DriftCorrectedConfidence",
    "LogisticConfidence",
    "OnlineLogisticConfidence",
    "calibrated_estimator",
    "draft_signals",
    "fit_logistic",
    "online_estimator",
]

EPS = 1e-6  # survival stays strictly inside (0, 1), also after a float32 cast
FORMAT_VERSION = 1
# 151 log-spaced temperatures over 0.05..20, steps of 4%: fine enough for drift, cheap per refit.
_DEFAULT_GRID = torch.logspace(math.log10(0.05), math.log10(20.0), 151, dtype=torch.float64)
_RIDGE = 1e-9  # keeps the Newton system solvable when a feature is constant or the fit saturates
_HALVINGS = 30


# ----------------------------------------------------------------------------- checks


def _tensor(name: str, value, dims: int, kind: str) -> torch.Tensor:
    """TypeError unless ``value`` is a tensor of ``kind`` ('float' | 'bool'); ValueError unless it has ``dims`` dims."""
    allowed = {"float": "a floating-point tensor", "bool": "a BoolTensor"}[kind]
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be {allowed} with {dims} dims, got {type(value).__name__}")
    if not (value.is_floating_point() if kind == "float" else value.dtype == torch.bool):
        raise TypeError(f"{name} must be {allowed}, got dtype {value.dtype}")
    if value.dim() != dims:
        raise ValueError(f"{name} must have {dims} dims, got shape {tuple(value.shape)}")
    return value


def _real(name: str, value, low: float, high: float = math.inf, open_interval: bool = False) -> float:
    """``value`` as a float in [low, high] (in (low, high) when ``open_interval``), else a TypeError/ValueError naming it."""
    allowed = f"a float in {'(' if open_interval else '['}{low}, {high}{')' if open_interval or high == math.inf else ']'}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be {allowed}, got {value!r}")
    inside = low < value < high if open_interval else low <= value <= high
    if not (math.isfinite(value) and inside):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return float(value)


def _check_estimator(name: str, value) -> None:
    if not isinstance(value, ConfidenceEstimator):
        raise TypeError(f"{name} must be a ConfidenceEstimator (a method survival(draft)), got {type(value).__name__}")
    check_hooks(value, ESTIMATOR_HOOKS, name)


def _check_survival(owner: str, survival, draft: Draft) -> torch.Tensor:
    """The base estimator's survival as float32 [R, γ] (what every wrapper computes in)."""
    if not isinstance(survival, torch.Tensor) or not survival.is_floating_point() or tuple(survival.shape) != tuple(draft.tokens.shape):
        raise ValueError(
            f"{owner}.base.survival must return a floating-point tensor of the draft's shape {tuple(draft.tokens.shape)}, "
            f"got {getattr(survival, 'dtype', type(survival).__name__)} {tuple(getattr(survival, 'shape', ()))}"
        )
    return survival.float()


def _forward(base, name: str, *arguments):
    """Call ``base``'s optional estimator hook ``name`` when it has one; None otherwise."""
    method = hook(base, name, ESTIMATOR_HOOKS)
    return None if method is None else method(*arguments)


# ----------------------------------------------------------------------------- signals


def draft_signals(draft: Draft) -> torch.Tensor:
    """FloatTensor[R, γ, F] of per-position features known before x_k is drawn, float32 on the draft's device.

    ``Draft.signals`` when the drafter gives them (prompt lookup: matched n, log age, log occurrences);
    else, from the draft distributions, F = 2: [max_v q_k(v), top-1 minus top-2 probability of q_k],
    never q_k(x_k), which depends on the drawn token and would make a policy anticipating under
    sampling; else, from the drafter's confidence head, F = 1: [logit c_k].
    """
    if not isinstance(draft, Draft):
        raise TypeError(f"draft must be a Draft, got {type(draft).__name__}")
    if draft.signals is not None:
        return draft.signals.float()
    if draft.probs is not None:
        probs = draft.probs.float()
        if probs.shape[-1] == 1:
            return torch.cat([probs, probs], dim=-1)  # one token: the runner-up has probability 0
        top = probs.topk(2, dim=-1).values
        return torch.stack([top[..., 0], top[..., 0] - top[..., 1]], dim=-1)
    if draft.confidence is not None:
        return torch.logit(draft.confidence.float(), eps=EPS)[..., None]
    raise ValueError(
        "draft must carry Draft.signals, Draft.probs or Draft.confidence to derive survival features from, got all three None"
    )


def _check_width(signals: torch.Tensor, features: int, owner: str) -> None:
    if signals.shape[-1] != features:
        raise ValueError(
            f"draft signals must have {features} features per position for {owner}, which was fitted on {features}, "
            f"got signals of shape {tuple(signals.shape)} (see draft_signals for where they come from)"
        )


def _logistic_survival(signals: torch.Tensor, coefficients: torch.Tensor) -> torch.Tensor:
    """σ(b_k + w_k·s[r, k]) clamped into [EPS, 1−EPS], for signals [R, γ, F] and coefficients [γ, F+1]."""
    logits = coefficients[:, 0] + (signals * coefficients[:, 1:]).sum(dim=-1)
    return torch.sigmoid(logits).clamp(EPS, 1.0 - EPS)


# ----------------------------------------------------------------------------- logistic regression


def _bias_only(outcome: torch.Tensor, weights: torch.Tensor, features: int) -> torch.Tensor:
    """[log((Σu·y + 1)/(Σu·(1−y) + 1)), 0, …]: the add-one smoothed log-odds, finite for any sample."""
    positives = float((weights * outcome).sum())
    negatives = float((weights * (1 - outcome)).sum())
    beta = torch.zeros(features + 1, dtype=torch.float64)
    beta[0] = math.log((positives + 1.0) / (negatives + 1.0))
    return beta


def _penalised_loss(design: torch.Tensor, outcome: torch.Tensor, weights: torch.Tensor, penalty: torch.Tensor, beta: torch.Tensor) -> float:
    """Σ u·(softplus(z) − y·z) + ½·Σ λ_j β_j², z = Xβ: the negative penalised log-likelihood, stable for any z."""
    z = design @ beta
    return float((weights * (F.softplus(z) - outcome * z)).sum() + 0.5 * (penalty * beta * beta).sum())


def fit_logistic(
    features: torch.Tensor,
    outcome: torch.Tensor,
    weights: torch.Tensor | None = None,
    l2: float = 1e-2,
    iterations: int = 25,
    *,
    initial: torch.Tensor | None = None,
    tolerance: float = 1e-8,
) -> torch.Tensor:
    """β = [b, w_1..w_F], FloatTensor[F+1] (float64, CPU), maximising the penalised log-likelihood
    Σ_i u_i·[y_i log p_i + (1−y_i) log(1−p_i)] − (l2/2)·‖w‖², p_i = σ(b + w·x_i); the bias is not penalised.

    ``features`` [M, F], ``outcome`` BoolTensor[M], ``weights`` u ≥ 0 [M] (default 1). Newton's method
    (IRLS) with step halving, from ``initial`` (a warm start) or zero, for at most ``iterations`` steps;
    it stops once no coefficient moves more than ``tolerance``. When the sample is empty or holds one
    class only the likelihood has no finite maximiser, so it returns the add-one smoothed bias-only
    fit b = log((Σu·y + 1)/(Σu·(1−y) + 1)), w = 0. Cost: O(iterations · M · F²).
    """
    _tensor("features", features, 2, "float")
    _tensor("outcome", outcome, 1, "bool")
    samples, width = features.shape
    if outcome.shape[0] != samples:
        raise ValueError(f"outcome must have one entry per features row ({samples}), got shape {tuple(outcome.shape)}")
    if weights is not None:
        _tensor("weights", weights, 1, "float")
        if weights.shape[0] != samples:
            raise ValueError(f"weights must have one entry per features row ({samples}), got shape {tuple(weights.shape)}")
    l2 = _real("l2", l2, 0.0)
    check_int("iterations", iterations, 1)
    tolerance = _real("tolerance", tolerance, 0.0)
    x = features.detach().cpu().double()
    y = outcome.detach().cpu().double()
    u = torch.ones(samples, dtype=torch.float64) if weights is None else weights.detach().cpu().double()
    if not bool(x.isfinite().all()):
        raise ValueError("features must be finite, got a NaN or infinite entry")
    if not bool((u.isfinite() & (u >= 0)).all()):
        raise ValueError("weights must be finite and >= 0, got a negative, NaN or infinite entry")
    beta = torch.zeros(width + 1, dtype=torch.float64)
    if initial is not None:
        _tensor("initial", initial, 1, "float")
        if initial.shape[0] != width + 1 or not bool(initial.isfinite().all()):
            raise ValueError(f"initial must be {width + 1} finite coefficients [bias, w_1..w_{width}], got {initial.tolist()}")
        beta = initial.detach().cpu().double().clone()
    if float((u * y).sum()) == 0.0 or float((u * (1 - y)).sum()) == 0.0:
        return _bias_only(y, u, width)

    design = torch.cat([torch.ones((samples, 1), dtype=torch.float64), x], dim=1)
    penalty = torch.full((width + 1,), l2, dtype=torch.float64)
    penalty[0] = 0.0
    ridge = _RIDGE * torch.eye(width + 1, dtype=torch.float64)
    loss = _penalised_loss(design, y, u, penalty, beta)
    for _ in range(iterations):
        p = torch.sigmoid(design @ beta)
        gradient = design.T @ (u * (p - y)) + penalty * beta
        hessian = (design * (u * p * (1 - p))[:, None]).T @ design + torch.diag(penalty) + ridge
        step = torch.linalg.solve(hessian, gradient)
        # Halve the Newton step until the objective does not rise: without a penalty (or on separable
        # data) a full step can overshoot far into the flat tail of σ.
        for _ in range(_HALVINGS):
            candidate = beta - step
            candidate_loss = _penalised_loss(design, y, u, penalty, candidate)
            if candidate_loss <= loss:
                break
            step = step / 2
        else:
            break  # no descent left at machine precision: converged
        beta, loss = candidate, candidate_loss
        if float(step.abs().max()) <= tolerance:
            break
    return beta


# ----------------------------------------------------------------------------- offline logistic model


def _coefficient_rows(value) -> tuple[tuple[float, ...], ...]:
    try:
        return tuple(tuple(float(entry) for entry in row) for row in value)
    except (TypeError, ValueError) as error:
        raise TypeError(f"coefficients must be a sequence of [bias, w_1..w_F] float sequences, one per draft position, got {value!r:.200}") from error


def _validate_coefficients(instance, attribute, value) -> None:
    allowed = "a non-empty sequence of equally long [bias, w_1..w_F] rows (F >= 1) of finite floats, one per draft position"
    if not value or len(value[0]) < 2 or any(len(row) != len(value[0]) for row in value):
        raise ValueError(f"coefficients must be {allowed}, got {value!r:.200}")
    if not all(math.isfinite(entry) for row in value for entry in row):
        raise ValueError(f"coefficients must be {allowed}, got a NaN or infinite entry in {value!r:.200}")


def _per_position(rows: tuple, width: int) -> tuple:
    """One row per position 1..width; positions past the given rows reuse the last."""
    return rows[:width] + rows[-1:] * max(width - len(rows), 0)


@attrs.frozen
class LogisticConfidence:
    """c_k = σ(b_k + w_k·s_k) on ``draft_signals``, clamped into [1e-6, 1−1e-6]: a survival estimate for
    drafters without a distribution (prompt lookup), fitted offline from logs with ``fit``.

    ``coefficients``: one [b_k, w_k1..w_kF] per draft position; positions past the last reuse it.
    """

    coefficients: tuple[tuple[float, ...], ...] = attrs.field(converter=_coefficient_rows, validator=_validate_coefficients)
    # (width, device) → the coefficient tensor ``survival`` reads: built once, not on every decoding step.
    _tensors: dict = attrs.field(init=False, factory=dict, eq=False, repr=False)

    @property
    def features(self) -> int:
        """F, the number of signals per position the model reads."""
        return len(self.coefficients[0]) - 1

    def coefficient_tensor(self, width: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """FloatTensor[width, F+1] (float32) of β_1..β_width on ``device``."""
        check_int("width", width, 0)
        rows = _per_position(self.coefficients, width)
        return torch.tensor(rows, dtype=torch.float32, device=device).reshape(width, self.features + 1)

    def survival(self, draft: Draft) -> torch.Tensor:
        """FloatTensor[R, γ] (float32, on the draft's device) of σ(b_k + w_k·s_k)."""
        signals = draft_signals(draft)
        _check_width(signals, self.features, "LogisticConfidence")
        key = (signals.shape[1], signals.device)
        if key not in self._tensors:
            self._tensors[key] = self.coefficient_tensor(*key)
        return _logistic_survival(signals, self._tensors[key])

    @classmethod
    def fit(cls, signals: torch.Tensor, log: CalibrationLog, l2: float = 1e-2, iterations: int = 25) -> LogisticConfidence:
        """One ``fit_logistic`` per position k on the blocks where c_k's outcome is known
        (``conditional_outcomes(log)``): signals[i, k] against 1[n_i ≥ k]. ``signals``: FloatTensor[N, γ, F],
        row i the draft signals of the log's block i. A position never reached gets the smoothed
        bias-only fit of an empty sample, c = 0.5."""
        if not isinstance(log, CalibrationLog):
            raise TypeError(f"log must be a CalibrationLog, got {type(log).__name__}")
        _tensor("signals", signals, 3, "float")
        if tuple(signals.shape[:2]) != (log.blocks, log.width) or signals.shape[2] < 1:
            raise ValueError(
                f"signals must have shape ({log.blocks}, {log.width}, F), one row of F >= 1 signals per block and position of the log, "
                f"got {tuple(signals.shape)}"
            )
        if log.width == 0:
            raise ValueError("log must have at least one draft position to fit, got γ = 0")
        known, outcome = (mask.cpu() for mask in conditional_outcomes(log))
        host = signals.detach().cpu().double()
        rows = [fit_logistic(host[known[:, k], k], outcome[known[:, k], k], l2=l2, iterations=iterations).tolist() for k in range(log.width)]
        return cls(rows)

    def to_dict(self) -> dict:
        """Plain JSON-safe data; ``from_dict`` reads it back."""
        return {"format_version": FORMAT_VERSION, "coefficients": [list(row) for row in self.coefficients]}

    @classmethod
    def from_dict(cls, data: Mapping) -> LogisticConfidence:
        """The inverse of ``to_dict``; ValueError on an unknown format version or missing coefficients."""
        check_format(data, "LogisticConfidence", FORMAT_VERSION)
        if not isinstance(data.get("coefficients"), list):
            raise ValueError(f"data['coefficients'] must be a list of [bias, w_1..w_F] lists, got {data.get('coefficients')!r:.200}")
        return cls(data["coefficients"])


# ----------------------------------------------------------------------------- observed samples


class _Window:
    """The latest ``capacity`` (value [W], outcome) samples of one draft position; the oldest are overwritten first."""

    def __init__(self, capacity: int, width: int):
        self.values = torch.empty((capacity, width), dtype=torch.float64)
        self.outcome = torch.empty(capacity, dtype=torch.bool)
        self.count = 0
        self._next = 0

    def extend(self, values: torch.Tensor, outcome: torch.Tensor) -> None:
        capacity, added = self.outcome.shape[0], outcome.shape[0]
        if added >= capacity:
            values, outcome, added = values[-capacity:], outcome[-capacity:], capacity
        index = (self._next + torch.arange(added)) % capacity
        self.values[index], self.outcome[index] = values, outcome
        self._next = (self._next + added) % capacity
        self.count = min(self.count + added, capacity)

    def samples(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(values [count, W], outcome [count]); the order does not matter to any fit here."""
        return self.values[: self.count], self.outcome[: self.count]


class _PositionSamples:
    """Per draft position, a window of (value, y_k) samples from observed steps. ``add`` only queues a
    step's values and counts where they are (no host copy); ``flush`` moves the queue to the host in
    one copy and settles which positions' outcomes are known."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.windows: list[_Window] = []
        self._queue: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def add(self, values: torch.Tensor, outcome: StepOutcome) -> None:
        """Queue ``values`` [R, γ, W] of a scored step with its ``outcome`` (the same R rows)."""
        if not isinstance(outcome, StepOutcome):
            raise TypeError(f"outcome must be a StepOutcome, got {type(outcome).__name__}")
        rows = values.shape[0]
        if tuple(outcome.verify_lengths.shape) != (rows,) or tuple(outcome.accepted.shape) != (rows,):
            raise ValueError(
                f"outcome must describe the {rows} rows of the survival it follows, got verify_lengths of shape "
                f"{tuple(outcome.verify_lengths.shape)} and accepted of shape {tuple(outcome.accepted.shape)}"
            )
        self._queue.append((values, outcome.verify_lengths, outcome.accepted))

    def flush(self) -> None:
        if not self._queue:
            return
        width = max(values.shape[1] for values, _, _ in self._queue)
        columns = self._queue[0][0].shape[2]
        # One tensor per step, [R, γ_max·W + 2] (values, then ℓ and n as floats: exact for any draft
        # length), so the whole queue reaches the host in a single copy.
        packed = torch.cat([
            torch.cat([F.pad(values, (0, 0, 0, width - values.shape[1])).flatten(1), verified[:, None].to(values.dtype),
                       accepted[:, None].to(values.dtype)], dim=1)
            for values, verified, accepted in self._queue
        ]).cpu().double()
        self._queue.clear()
        values = packed[:, :-2].view(-1, width, columns)
        verified, accepted = packed[:, -2].long(), packed[:, -1].long()
        placeholder = torch.full((packed.shape[0], width), 0.5)  # conditional outcomes read only ℓ and n
        known, outcome = conditional_outcomes(CalibrationLog(survival=placeholder, verified=verified, accepted=accepted))
        while len(self.windows) < width:
            self.windows.append(_Window(self.capacity, columns))
        for k in range(width):
            self.windows[k].extend(values[known[:, k], k], outcome[known[:, k], k])

    def drop_queue(self) -> None:
        self._queue.clear()

    def samples(self, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(values [m, W], outcome [m]) of 0-based ``position``; empty when it was never reached."""
        if position < len(self.windows):
            return self.windows[position].samples()
        return torch.empty((0, 0), dtype=torch.float64), torch.empty(0, dtype=torch.bool)

    def counts(self, positions: int) -> list[int]:
        return [self.windows[k].count if k < len(self.windows) else 0 for k in range(positions)]


# ----------------------------------------------------------------------------- online logistic model


class OnlineLogisticConfidence:
    """c_k = σ(b_k + w_k·s_k) on ``draft_signals`` with coefficients learned online from the target's
    decisions (as vLLM's online acceptance models do), per draft position.

    Starts from ``prior`` (a ``LogisticConfidence``), else from b_k = logit(``initial_survival``)
    (default 0.5), w_k = 0. ``observe`` adds a sample (s_k, y_k) for each position reached and
    checked to a window of the latest ``window`` samples per position; every ``refit_every`` observed
    steps each position with at least ``min_samples`` samples is refitted with ``fit_logistic``
    (``l2``, ``iterations``; warm-started from its current coefficients unless ``warm_start`` is
    False, the penalty pulling w_k toward 0 either way). A refit costs O(γ · window · F² · iterations)
    on the host; between refits a step costs one logistic evaluation on the device. Coefficients and
    windows persist across generations; ``start`` only settles what the last generation left queued.
    """

    def __init__(
        self,
        prior: LogisticConfidence | None = None,
        *,
        initial_survival: float | None = None,
        window: int = 4096,
        refit_every: int = 100,
        min_samples: int = 20,
        l2: float = 1e-2,
        iterations: int = 25,
        warm_start: bool = True,
    ):
        if prior is not None and not isinstance(prior, LogisticConfidence):
            raise TypeError(f"prior must be a LogisticConfidence or None, got {type(prior).__name__}")
        if prior is not None and initial_survival is not None:
            raise ValueError(f"initial_survival must be None when a prior is given (the prior sets it), got {initial_survival!r}")
        survival = 0.5 if initial_survival is None else _real("initial_survival", initial_survival, 0.0, 1.0, open_interval=True)
        if not isinstance(warm_start, bool):
            raise TypeError(f"warm_start must be a bool, got {warm_start!r}")
        self.prior = prior
        self.window = check_int("window", window, 1)
        self.refit_every = check_int("refit_every", refit_every, 1)
        self.min_samples = check_int("min_samples", min_samples, 1)
        self.iterations = check_int("iterations", iterations, 1)
        self.l2 = _real("l2", l2, 0.0)
        self.warm_start = warm_start
        self.refits = 0
        self._initial_bias = math.log(survival / (1.0 - survival))
        self._samples = _PositionSamples(self.window)
        self._coefficients: torch.Tensor | None = None  # [P, F+1] float32, on the latest draft's device
        self._scored: torch.Tensor | None = None  # the signals of the step awaiting its outcome
        self._observed = 0  # steps observed since the last refit
        self._report: dict | None = None

    def _initial_rows(self, first: int, last: int, features: int, device: torch.device) -> torch.Tensor:
        """Starting coefficients of positions first..last−1 (0-based)."""
        if self.prior is not None:
            return self.prior.coefficient_tensor(last, device)[first:]
        rows = torch.zeros((last - first, features + 1), dtype=torch.float32, device=device)
        rows[:, 0] = self._initial_bias
        return rows

    def _coefficients_for(self, signals: torch.Tensor) -> torch.Tensor:
        """The current [γ, F+1] coefficients, grown to γ positions and moved to the signals' device."""
        width, features = signals.shape[1], signals.shape[2]
        if self._coefficients is None:
            _check_width(signals, features if self.prior is None else self.prior.features, "OnlineLogisticConfidence's prior")
            self._coefficients = self._initial_rows(0, max(width, 1), features, signals.device)
        _check_width(signals, self._coefficients.shape[1] - 1, "OnlineLogisticConfidence")
        if self._coefficients.device != signals.device:
            self._coefficients = self._coefficients.to(signals.device)
        have = self._coefficients.shape[0]
        if have < width:
            self._coefficients = torch.cat([self._coefficients, self._initial_rows(have, width, features, signals.device)])
        return self._coefficients[:width]

    def start(self, start: GenerationStart) -> None:
        """A new generation: outcomes still queued from the last one join the windows; nothing is lost."""
        self._samples.flush()
        self._scored, self._report = None, None

    def survival(self, draft: Draft) -> torch.Tensor:
        """FloatTensor[R, γ] (float32, on the draft's device) from coefficients fitted on earlier steps only."""
        signals = draft_signals(draft)
        coefficients = self._coefficients_for(signals)
        self._scored = signals
        return _logistic_survival(signals, coefficients)

    def observe(self, outcome: StepOutcome) -> None:
        """Queue the samples of the step just scored; refit every ``refit_every`` observed steps."""
        if self._scored is None:
            raise ValueError("observe(outcome) must follow survival(draft) of the same step, got no scored draft")
        self._samples.add(self._scored, outcome)
        self._scored = None
        self._observed += 1
        if self._observed >= self.refit_every:
            self._refit()

    def _refit(self) -> None:
        self._samples.flush()
        device = self._coefficients.device
        current = self._coefficients.detach().cpu().double()
        rows = []
        for k in range(current.shape[0]):
            features, outcome = self._samples.samples(k)
            if outcome.shape[0] < self.min_samples:
                rows.append(current[k])
                continue
            initial = current[k] if self.warm_start else None
            rows.append(fit_logistic(features, outcome, l2=self.l2, iterations=self.iterations, initial=initial))
        self._coefficients = torch.stack(rows).float().to(device)
        self.refits += 1
        self._observed = 0
        self._report = {"refits": self.refits, "samples": self._samples.counts(current.shape[0])}

    def report(self) -> dict | None:
        """{"refits": refits so far, "samples": window size per position} after a step that refitted, else
        None; each report is returned once (the loop reads it once per step)."""
        report, self._report = self._report, None
        return report

    def snapshot(self) -> LogisticConfidence | None:
        """The current coefficients as a frozen ``LogisticConfidence`` (None before the first draft, or the prior)."""
        if self._coefficients is None:
            return self.prior
        return LogisticConfidence(self._coefficients.detach().cpu().double().tolist())


# ----------------------------------------------------------------------------- wrappers


class CalibratedConfidence:
    """``base``'s survival through the calibration fitted for the current sampling band.

    ``start`` picks ``calibrations.for_band(band_of(sampling))``; before any start the 'greedy' band
    is used. The base's own hooks (start, observe, report) are forwarded.
    """

    def __init__(self, base: ConfidenceEstimator, calibrations: CalibrationSet):
        _check_estimator("base", base)
        if not isinstance(calibrations, CalibrationSet):
            raise TypeError(f"calibrations must be a CalibrationSet, got {type(calibrations).__name__}")
        self.base = base
        self.calibrations = calibrations
        self.band = "greedy"
        self.calibration = calibrations.for_band(self.band)

    def start(self, start: GenerationStart) -> None:
        """Choose the band's calibration, then start the base."""
        self.band = band_of(start.sampling)
        self.calibration = self.calibrations.for_band(self.band)
        _forward(self.base, "start", start)

    def survival(self, draft: Draft) -> torch.Tensor:
        """The calibrated base survival, FloatTensor[R, γ] (float32, on the draft's device)."""
        raw = _check_survival("CalibratedConfidence", self.base.survival(draft), draft)
        return raw if self.calibration is None else self.calibration.apply(raw)

    def observe(self, outcome: StepOutcome) -> None:
        """Forwarded to the base."""
        _forward(self.base, "observe", outcome)

    def report(self) -> dict | None:
        """The base's report."""
        return _forward(self.base, "report")


class BandedConfidence:
    """One estimator per sampling band (``band_of``: 'greedy', 'low', 'high'), each made by ``make(band)`` when a
    generation of that band first starts, and kept: an estimator that learns online (``OnlineLogisticConfidence``,
    ``DriftCorrectedConfidence``) then learns each band's acceptance from that band's steps only. Greedy and sampled
    steps accept at different rates (``CalibratedConfidence`` keeps a calibration per band for the same reason), so
    one shared estimator would carry a greedy run's fit into the first sampled generations and back.

    Before any ``start``, the 'greedy' band's estimator answers. The current estimator's hooks (start, observe,
    report) are forwarded.
    """

    def __init__(self, make: Callable[[str], ConfidenceEstimator]):
        if not callable(make):
            raise TypeError(f"make must be a callable band -> ConfidenceEstimator, got {make!r}")
        self.make = make
        self.estimators: dict[str, ConfidenceEstimator] = {}
        self.band = "greedy"

    @property
    def current(self) -> ConfidenceEstimator:
        """The estimator of the band last started, made on first use."""
        estimator = self.estimators.get(self.band)
        if estimator is None:
            estimator = self.make(self.band)
            _check_estimator(f"make({self.band!r})", estimator)
            self.estimators[self.band] = estimator
        return estimator

    def start(self, start: GenerationStart) -> None:
        """Switch to the band of the generation's sampling, then start its estimator."""
        self.band = band_of(start.sampling)
        _forward(self.current, "start", start)

    def survival(self, draft: Draft) -> torch.Tensor:
        """The current band's survival, FloatTensor[R, γ]."""
        return self.current.survival(draft)

    def observe(self, outcome: StepOutcome) -> None:
        """Forwarded to the current band's estimator."""
        _forward(self.current, "observe", outcome)

    def report(self) -> dict | None:
        """The current band's report."""
        return _forward(self.current, "report")


def _scaled(survival: torch.Tensor, temperature) -> torch.Tensor:
    return torch.sigmoid(torch.logit(survival, eps=EPS) / temperature)


def _log_loss_temperature(survival: torch.Tensor, outcome: torch.Tensor, grid: torch.Tensor) -> float:
    """The T in ``grid`` minimising the mean log-loss of σ(logit(c)/T) against y, one [G, m] pass."""
    scaled = torch.logit(survival, eps=EPS)[None, :] / grid[:, None]
    losses = (F.softplus(scaled) - outcome.double()[None, :] * scaled).mean(dim=1)
    return float(grid[int(losses.argmin())])


class DriftCorrectedConfidence:
    """``base``'s survival rescaled online by a temperature per position, c'_k = σ(logit(c_k) / T_k),
    when what the target accepts drifts away from what the base predicts (T_k starts at 1).

    ``observe`` adds (c_k, y_k) for each position reached and checked to a window of the latest
    ``window`` samples per position. Every ``refit_every`` observed steps, the drift of each position,
    mean c'_k − observed rate over its window, is measured; where at least ``min_samples`` samples show
    ``|drift|`` > ``tolerance``, T_k is refitted by grid search over ``grid`` (default 151 log-spaced
    temperatures over 0.05..20) minimising the mean log-loss of σ(logit(c)/T) on the window. Log-loss,
    not ECE: it is a proper scoring rule, convex in 1/T (a one-parameter logistic regression on logit c)
    and needs no binning, so small windows give a stable minimum. A temperature changes confidence,
    not order, and cannot move a prediction across 0.5. Cost: O(γ · window · grid) per refit, amortised
    over ``refit_every`` steps; a step between refits only rescales. The base's hooks are forwarded.
    """

    def __init__(
        self,
        base: ConfidenceEstimator,
        *,
        window: int = 2048,
        refit_every: int = 32,
        tolerance: float = 0.03,
        min_samples: int = 50,
        grid: Sequence[float] | torch.Tensor | None = None,
    ):
        _check_estimator("base", base)
        self.base = base
        self.window = check_int("window", window, 1)
        self.refit_every = check_int("refit_every", refit_every, 1)
        self.min_samples = check_int("min_samples", min_samples, 1)
        self.tolerance = _real("tolerance", tolerance, 0.0, 1.0)
        self.grid = temperature_grid(grid, _DEFAULT_GRID)
        self.temperatures: list[float] = []  # T_k per position seen; 1 until refitted
        self._samples = _PositionSamples(self.window)
        self._scored: torch.Tensor | None = None
        self._observed = 0
        self._report: dict | None = None

    def start(self, start: GenerationStart) -> None:
        """A new generation: queued outcomes join the windows; the base starts too."""
        self._samples.flush()
        self._scored, self._report = None, None
        _forward(self.base, "start", start)

    def survival(self, draft: Draft) -> torch.Tensor:
        """FloatTensor[R, γ] (float32, on the draft's device): the base survival under the current temperatures."""
        raw = _check_survival("DriftCorrectedConfidence", self.base.survival(draft), draft)
        width = raw.shape[1]
        self.temperatures.extend([1.0] * (width - len(self.temperatures)))
        self._scored = raw
        if width == 0:
            return raw
        return apply_temperatures(raw, self.temperatures[:width], eps=EPS)

    def observe(self, outcome: StepOutcome) -> None:
        """The base observes; then queue this step's (c_k, y_k) and check for drift every ``refit_every`` steps."""
        _forward(self.base, "observe", outcome)
        if self._scored is None:
            raise ValueError("observe(outcome) must follow survival(draft) of the same step, got no scored draft")
        self._samples.add(self._scored[:, :, None], outcome)
        self._scored = None
        self._observed += 1
        if self._observed >= self.refit_every:
            self._refit()

    def _refit(self) -> None:
        self._samples.flush()
        drift, refitted = [], False
        for k, temperature in enumerate(self.temperatures):
            values, outcome = self._samples.samples(k)
            if outcome.shape[0] == 0:
                drift.append(None)
                continue
            survival = values[:, 0]
            gap = float(_scaled(survival, temperature).mean() - outcome.double().mean())
            drift.append(gap)
            if outcome.shape[0] >= self.min_samples and abs(gap) > self.tolerance:
                fitted = _log_loss_temperature(survival, outcome, self.grid)
                refitted |= fitted != temperature
                self.temperatures[k] = fitted
        self._observed = 0
        self._report = {"temperatures": list(self.temperatures), "drift": drift, "refitted": refitted}

    def report(self) -> dict | None:
        """{"temperatures": T_k, "drift": mean c'_k − observed rate before the refit (None: no samples),
        "refitted": whether any T_k changed} after a drift-check step, else None, each returned once; the
        base's report, if any, under "base"."""
        report, self._report = self._report, None
        base = _forward(self.base, "report")
        if base is None:
            return report
        return {**(report or {}), "base": base}


def _raw_estimator(name: str, calibration_file: CalibrationFile) -> ConfidenceEstimator:
    """The estimator a calibration file names: a training-free one by class name, or one fitted from
    logs whose parameters the file keeps (``CalibrationFile.estimators``)."""
    if name == "DrafterConfidence":
        return DrafterConfidence()
    if name == "DraftProbability":
        return DraftProbability()
    if name == "LogisticConfidence" and name in calibration_file.estimators:
        return LogisticConfidence.from_dict(calibration_file.estimators[name])
    raise ValueError(
        f"name must be DrafterConfidence, DraftProbability or an estimator the file fitted ({sorted(calibration_file.estimators)}), got {name!r}"
    )


def calibrated_estimator(calibration_file: CalibrationFile, name: str | None = None) -> CalibratedConfidence:
    """The estimator ``name`` (default: the file's default) wrapped with its per-band calibration."""
    name = calibration_file.default if name is None else name
    if name not in calibration_file.sets:
        raise ValueError(f"name must be one of the calibrated estimators {sorted(calibration_file.sets)}, got {name!r}")
    return CalibratedConfidence(_raw_estimator(name, calibration_file), calibration_file.sets[name])


def online_estimator(calibration_file: CalibrationFile, **options) -> BandedConfidence:
    """The file's fitted ``LogisticConfidence`` as the prior of an ``OnlineLogisticConfidence`` per sampling band
    (``BandedConfidence``; ``options`` are ``OnlineLogisticConfidence``'s): the same model, refitted on the running
    outcomes. For a drafter whose offline fit transfers poorly to the prompts served (prompt lookup's signals,
    ``docs/calibration.rst``). The file's per-band calibration is not applied: a refit on the running outcomes is
    calibrated to them, and until a band's first refit its model answers as fitted offline."""
    if not isinstance(calibration_file, CalibrationFile):
        raise TypeError(f"calibration_file must be a CalibrationFile, got {type(calibration_file).__name__}")
    if "LogisticConfidence" not in calibration_file.estimators:
        raise ValueError(
            f"calibration_file must hold a fitted LogisticConfidence to start from, got estimators {sorted(calibration_file.estimators)}"
        )
    prior = LogisticConfidence.from_dict(calibration_file.estimators["LogisticConfidence"])
    estimator = BandedConfidence(lambda band: OnlineLogisticConfidence(prior, **options))
    estimator.current  # the greedy band's model, made now: options it refuses fail here, not at the first generation
    return estimator
