"""Confidence calibration: turning raw survival scores into probabilities (paper §3.2.1).

Notation, used throughout: a log holds N drafted blocks of width γ. For block i and draft position
k = 1..γ, ``c[i, k]`` is the raw survival c_k (the estimator's P(x_k accepted | x_1..x_{k-1} were)),
``a[i, k] = c_1·…·c_k`` the prefix survival, ℓ_i the verify length and n_i ≤ ℓ_i the accepted count.
Temperature scaling of a probability c by T > 0 is c' = σ(logit(c) / T); it preserves order.

Two fits are offered. Sequential Temperature Scaling (STS, the paper's) picks T_1, T_2, … left to
right, each by a 1-D grid search minimising the ECE of the calibrated a_k with T_1..T_{k-1} fixed.
The isotonic alternative fits one monotone map per position to the conditional outcomes of c_k.
Everything here is pure: tensors in, tensors (or plain values) out; fits run in float64 on the CPU.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import attrs
import torch
import torch.nn.functional as F

from dspark.checks import check_format, check_int

if TYPE_CHECKING:
    from dspark.stats import StepRecord

__all__ = [
    "BANDS",
    "CALIBRATION_FILE",
    "Calibration",
    "CalibrationFile",
    "CalibrationSet",
    "CalibrationLog",
    "IsotonicMap",
    "ReliabilityBins",
    "apply_temperatures",
    "band_of",
    "file_fingerprint",
    "brier_score",
    "conditional_outcomes",
    "expected_calibration_error",
    "fit_isotonic_positions",
    "fit_sequential_temperatures",
    "isotonic_fit",
    "prefix_outcomes",
    "reliability_bins",
    "roc_auc",
    "temperature_grid",
]

EPS = 1e-6  # keeps logit finite and calibrated survival strictly inside (0, 1), even after a float32 cast
FORMAT_VERSION = 1
METHODS = ("temperature", "isotonic")
# 301 log-spaced temperatures over 0.05..20: steps of 2%, refined further around the best one.
_DEFAULT_GRID = torch.logspace(math.log10(0.05), math.log10(20.0), 301, dtype=torch.float64)
_REFINE_POINTS = 41
_CHUNK_ELEMENTS = 1 << 24


def _check_tensor(name: str, value, dim: int, kind: str) -> torch.Tensor:
    """TypeError unless ``value`` is a tensor of ``kind`` ('float' | 'long' | 'bool'); ValueError unless it has ``dim`` dims."""
    allowed = {"float": "a floating-point", "long": "a LongTensor (int64)", "bool": "a BoolTensor"}[kind]
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be {allowed} tensor with {dim} dims, got {type(value).__name__}")
    ok = {"float": value.is_floating_point(), "long": value.dtype == torch.long, "bool": value.dtype == torch.bool}[kind]
    if not ok:
        raise TypeError(f"{name} must be {allowed} tensor, got dtype {value.dtype}")
    if value.dim() != dim:
        raise ValueError(f"{name} must have {dim} dims, got shape {tuple(value.shape)}")
    return value


def _check_values(name: str, value: torch.Tensor, ok: torch.Tensor, allowed: str) -> None:
    """ValueError naming the first entry of ``value`` where ``ok`` is False."""
    bad = ~ok
    if bool(bad.any()):
        index = int(bad.flatten().nonzero()[0])
        raise ValueError(f"{name} must be {allowed}, got {value.flatten()[index].item()} at flat index {index}")


# ----------------------------------------------------------------------------- logs


def _validate_survival(instance, attribute, value):
    _check_tensor("CalibrationLog.survival", value, 2, "float")
    _check_values("CalibrationLog.survival", value, (value >= 0) & (value <= 1), "in [0, 1]")


def _counts(lower: str | None, upper: str | None):
    """Validator of a LongTensor[N] field with ``lower`` ≤ value ≤ ``upper`` (field names; None: 0 and γ)."""

    def validate(instance, attribute, value):
        name = f"CalibrationLog.{attribute.name}"
        _check_tensor(name, value, 1, "long")
        rows, width = instance.survival.shape
        if value.shape[0] != rows:
            raise ValueError(f"{name} must have shape ({rows},), one entry per survival row, got {tuple(value.shape)}")
        low = 0 if lower is None else getattr(instance, lower)
        high = width if upper is None else getattr(instance, upper)
        _check_values(name, value, (value >= low) & (value <= high), f"between {lower or 0} and {upper or f'γ={width}'} in every block")

    return validate


@attrs.frozen(eq=False)  # tensors have no single truth value, so equality is identity
class CalibrationLog:
    """Verified draft blocks for fitting a calibration: ``survival`` FloatTensor[N, γ] of raw c_k,
    ``verified`` ℓ and ``accepted`` n (LongTensor[N], 0 ≤ n ≤ ℓ), and ``drafted`` (LongTensor[N],
    ℓ ≤ drafted ≤ γ, default γ): how many leading positions hold a real draft token, so logs of
    different widths can be concatenated (the survival beyond ``drafted`` is a placeholder never read)."""

    survival: torch.Tensor = attrs.field(validator=_validate_survival)
    verified: torch.Tensor = attrs.field(validator=_counts(None, None))
    accepted: torch.Tensor = attrs.field(validator=_counts(None, "verified"))
    drafted: torch.Tensor = attrs.field(validator=_counts("verified", None))

    @drafted.default
    def _every_position_drafted(self):
        # A malformed survival has no shape to take; its own validator (run first) reports it.
        if not isinstance(self.survival, torch.Tensor) or self.survival.dim() != 2:
            return None
        return torch.full((self.survival.shape[0],), self.survival.shape[1], dtype=torch.long, device=self.survival.device)

    @property
    def blocks(self) -> int:
        """N, the number of drafted blocks."""
        return self.survival.shape[0]

    @property
    def width(self) -> int:
        """γ, the number of draft positions."""
        return self.survival.shape[1]

    @classmethod
    def concat(cls, logs: Iterable[CalibrationLog]) -> CalibrationLog:
        """All blocks of ``logs`` in order, padded to the widest γ."""
        logs = tuple(logs)
        if not logs:
            raise ValueError("logs must hold at least one CalibrationLog, got none")
        for log in logs:
            if not isinstance(log, CalibrationLog):
                raise TypeError(f"logs must hold CalibrationLog values, got {type(log).__name__}")
        width = max(log.width for log in logs)
        return cls(
            # 0.5 only satisfies the range check: ``drafted`` keeps every mask off the padding.
            survival=torch.cat([F.pad(log.survival, (0, width - log.width), value=0.5) for log in logs]),
            verified=torch.cat([log.verified for log in logs]),
            accepted=torch.cat([log.accepted for log in logs]),
            drafted=torch.cat([log.drafted for log in logs]),
        )

    @classmethod
    def from_records(cls, records: Iterable[StepRecord]) -> CalibrationLog:
        """One block per (record, row) of ``dspark.stats.StepRecord`` values, with each row's real draft
        length (``StepRecord.drafted``); records without survival are skipped."""
        logs = [
            cls(survival=record.survival, verified=record.verify_lengths, accepted=record.accepted, drafted=record.drafted)
            for record in records
            if record.survival is not None
        ]
        if not logs:
            raise ValueError("records must include a StepRecord with survival (generate with a confidence estimator), got none")
        return cls.concat(logs)


def _positions(log: CalibrationLog) -> tuple[torch.Tensor, ...]:
    """k = 1..γ as [1, γ] and n, ℓ, drafted as [N, 1], ready to broadcast."""
    k = torch.arange(1, log.width + 1, device=log.survival.device)[None, :]
    return k, log.accepted[:, None], log.verified[:, None], log.drafted[:, None]


def prefix_outcomes(log: CalibrationLog) -> tuple[torch.Tensor, torch.Tensor]:
    """(known, outcome), BoolTensor[N, γ] each, for a_k: outcome 1[n ≥ k], False where unknown.

    a_k is known where the target checked position k (k ≤ ℓ), and also at every drafted k when the
    block was rejected (n < ℓ): the first rejection at n+1 settles 1[n ≥ k] = 0 for all k > n.
    When every verified token was accepted (n = ℓ), a_k beyond ℓ is unknown."""
    k, accepted, verified, drafted = _positions(log)
    known = (k <= verified) | ((accepted < verified) & (k <= drafted))
    return known, known & (accepted >= k)


def conditional_outcomes(log: CalibrationLog) -> tuple[torch.Tensor, torch.Tensor]:
    """(known, outcome), BoolTensor[N, γ] each, for c_k: known where position k was reached
    (n ≥ k−1) and checked (k ≤ ℓ); outcome 1[n ≥ k], False where unknown."""
    k, accepted, verified, _ = _positions(log)
    known = (k <= verified) & (accepted >= k - 1)
    return known, known & (accepted >= k)


# ----------------------------------------------------------------------------- metrics


def _check_predictions(predicted, outcome) -> tuple[torch.Tensor, torch.Tensor]:
    _check_tensor("predicted", predicted, 1, "float")
    _check_tensor("outcome", outcome, 1, "bool")
    if predicted.shape != outcome.shape:
        raise ValueError(f"outcome must have predicted's shape {tuple(predicted.shape)}, got {tuple(outcome.shape)}")
    _check_values("predicted", predicted, (predicted >= 0) & (predicted <= 1), "probabilities in [0, 1]")
    return predicted.double().cpu(), outcome.double().cpu()


def _binned_error(predicted: torch.Tensor, outcome: torch.Tensor, bins: int) -> torch.Tensor:
    """ECE of each row of ``predicted`` [G, M] against ``outcome`` [M], all G rows in one pass.
    Σ_b (m_b/M)·|mean_pred_b − rate_b| equals (1/M)·Σ_b |Σ_{i∈b} (p_i − y_i)|, a single scatter-add."""
    rows, count = predicted.shape
    index = (predicted * bins).long().clamp_(0, bins - 1)  # p = 1 belongs to the last bin
    flat = (index + bins * torch.arange(rows)[:, None]).flatten()
    sums = torch.zeros(rows * bins, dtype=torch.float64).index_add_(0, flat, (predicted - outcome).flatten())
    return sums.view(rows, bins).abs().sum(dim=1) / count


def expected_calibration_error(predicted: torch.Tensor, outcome: torch.Tensor, bins: int = 10) -> float:
    """ECE = Σ_b (m_b/M)·``|mean predicted_b − observed rate_b|`` over ``bins`` equal-width bins of [0, 1]
    (bin b holds b/bins ≤ p < (b+1)/bins, p = 1 in the last), m_b samples in bin b of M; NaN when M = 0."""
    check_int("bins", bins, 1)
    predicted, outcome = _check_predictions(predicted, outcome)
    return float(_binned_error(predicted[None], outcome, bins)[0]) if predicted.numel() else math.nan


def brier_score(predicted: torch.Tensor, outcome: torch.Tensor) -> float:
    """Mean squared error (p − y)² of probabilities against 0/1 outcomes; NaN when empty."""
    predicted, outcome = _check_predictions(predicted, outcome)
    return float(((predicted - outcome) ** 2).mean()) if predicted.numel() else math.nan


def roc_auc(predicted: torch.Tensor, outcome: torch.Tensor) -> float:
    """P(score of a random positive > score of a random negative), ties counting ½: the Mann–Whitney
    U statistic from average ranks. NaN unless both classes occur."""
    predicted, outcome = _check_predictions(predicted, outcome)
    positives = int(outcome.sum())
    negatives = predicted.numel() - positives
    if positives == 0 or negatives == 0:
        return math.nan
    order = predicted.argsort()
    _, group, counts = torch.unique_consecutive(predicted[order], return_inverse=True, return_counts=True)
    # A tie group occupying 1-based ranks s..e gets their mean, e − (size − 1)/2.
    average = counts.cumsum(0).double() - (counts.double() - 1) / 2
    ranks = torch.empty_like(predicted)
    ranks[order] = average[group]
    u = float(ranks[outcome.bool()].sum()) - positives * (positives + 1) / 2
    return u / (positives * negatives)


@attrs.frozen(eq=False)
class ReliabilityBins:
    """A reliability diagram: ``edges`` FloatTensor[bins+1]; per bin ``mean_predicted`` and
    ``observed_rate`` (FloatTensor[bins], NaN in empty bins) and ``count`` (LongTensor[bins])."""

    edges: torch.Tensor
    mean_predicted: torch.Tensor
    observed_rate: torch.Tensor
    count: torch.Tensor


def reliability_bins(predicted: torch.Tensor, outcome: torch.Tensor, bins: int = 10) -> ReliabilityBins:
    """The binned statistics behind ``expected_calibration_error`` (same bins)."""
    check_int("bins", bins, 1)
    predicted, outcome = _check_predictions(predicted, outcome)
    index = (predicted * bins).long().clamp_(0, bins - 1)
    count = torch.bincount(index, minlength=bins)
    predicted_sum = torch.zeros(bins, dtype=torch.float64).index_add_(0, index, predicted)
    outcome_sum = torch.zeros(bins, dtype=torch.float64).index_add_(0, index, outcome)
    return ReliabilityBins(
        edges=torch.linspace(0.0, 1.0, bins + 1, dtype=torch.float64),
        mean_predicted=predicted_sum / count,
        observed_rate=outcome_sum / count,
        count=count,
    )


# ----------------------------------------------------------------------------- temperature scaling


def _scale(survival: torch.Tensor, temperature: torch.Tensor | float, eps: float) -> torch.Tensor:
    """σ(logit(c) / T), c clamped into [eps, 1−eps] first and the result after (order is kept, ties may form)."""
    return torch.sigmoid(torch.logit(survival, eps=eps) / temperature).clamp(eps, 1.0 - eps)


def _check_temperatures(name: str, temperatures) -> tuple[float, ...]:
    values = tuple(temperatures)
    if not values or not all(
        isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t > 0 for t in values
    ):
        raise ValueError(f"{name} must be a non-empty sequence of finite temperatures > 0, got {values!r}")
    return values


def _per_position(parameters: tuple, width: int) -> tuple:
    """One parameter per position 1..width; positions past the fitted ones reuse the last."""
    return parameters[:width] + parameters[-1:] * max(width - len(parameters), 0)


def apply_temperatures(survival: torch.Tensor, temperatures: Sequence[float], eps: float = EPS) -> torch.Tensor:
    """c'_k = σ(logit(c_k) / T_k) for survival [R, γ'], in survival's dtype and on its device; positions
    past ``len(temperatures)`` use the last temperature. Output lies in [eps, 1−eps]."""
    _check_tensor("survival", survival, 2, "float")
    values = _per_position(_check_temperatures("temperatures", temperatures), survival.shape[1])
    # float32 at least, never float64 by force: some accelerators (MPS) have no float64.
    dtype = torch.promote_types(survival.dtype, torch.float32)
    scale = torch.tensor(values, dtype=dtype, device=survival.device)
    return _scale(survival.to(dtype), scale, eps).to(survival.dtype)


def temperature_grid(grid, default: torch.Tensor = _DEFAULT_GRID) -> torch.Tensor:
    """``grid`` (any sequence of temperatures > 0) as a sorted float64 tensor, ``default`` when None."""
    if grid is None:
        return default
    try:
        values = torch.as_tensor(grid, dtype=torch.float64).flatten()
    except (TypeError, ValueError, RuntimeError) as error:
        raise TypeError(f"grid must be a sequence of temperatures or a 1-D tensor, got {grid!r}") from error
    if values.numel() == 0 or not bool((values.isfinite() & (values > 0)).all()):
        raise ValueError(f"grid must be a non-empty sequence of finite temperatures > 0, got {grid!r}")
    return values.sort().values  # refinement looks at the best point's neighbours


def _grid_errors(before, raw, outcome, temperatures, bins, eps) -> torch.Tensor:
    """ECE of before·σ(logit(raw)/T) for every T, a few at a time so that [T, N] stays near 16M floats."""
    chunk = max(1, _CHUNK_ELEMENTS // max(raw.numel(), 1))
    return torch.cat([_binned_error(before * _scale(raw, part[:, None], eps), outcome, bins) for part in temperatures.split(chunk)])


def _best_temperature(before, raw, outcome, grid, bins, refine, eps) -> float:
    """The T in ``grid`` (then refined between its neighbours) minimising ECE of before·σ(logit(raw)/T)."""
    errors = _grid_errors(before, raw, outcome, grid, bins, eps)
    best = int(errors.argmin())  # among equal minima the first, i.e. the smallest T
    if not refine or grid.numel() == 1:
        return float(grid[best])
    low, high = grid[max(best - 1, 0)], grid[min(best + 1, grid.numel() - 1)]
    fine = torch.cat([grid[best : best + 1], torch.logspace(float(low.log10()), float(high.log10()), _REFINE_POINTS, dtype=torch.float64)])
    return float(fine[int(_grid_errors(before, raw, outcome, fine, bins, eps).argmin())])  # the coarse optimum is fine[0], so refining never loses


def fit_sequential_temperatures(
    log: CalibrationLog, grid: Sequence[float] | torch.Tensor | None = None, bins: int = 10, refine: bool = True, eps: float = EPS
) -> tuple[float, ...]:
    """STS: T_1..T_γ fitted left to right; T_k minimises the ECE (``bins`` bins) of the calibrated
    a_k = Π_{i≤k} σ(logit(c_i)/T_i) against 1[n ≥ k] over the blocks where a_k is known
    (``prefix_outcomes``), with T_1..T_{k−1} fixed. ``grid``: candidate temperatures (default 301
    log-spaced over 0.05..20), refined between the best one's neighbours unless ``refine`` is False.
    Positions without a known a_k get T = 1."""
    if not isinstance(log, CalibrationLog):
        raise TypeError(f"log must be a CalibrationLog, got {type(log).__name__}")
    check_int("bins", bins, 1)
    candidates = temperature_grid(grid)
    known, outcome = (mask.cpu() for mask in prefix_outcomes(log))
    raw = log.survival.detach().cpu().double()
    prefix = torch.ones(log.blocks, dtype=torch.float64)
    temperatures = []
    for k in range(log.width):
        rows = known[:, k]
        temperature = 1.0
        if bool(rows.any()):
            temperature = _best_temperature(prefix[rows], raw[rows, k], outcome[rows, k].double(), candidates, bins, refine, eps)
        temperatures.append(temperature)
        prefix = prefix * _scale(raw[:, k], temperature, eps)
    return tuple(temperatures)


# ----------------------------------------------------------------------------- isotonic regression


def _validate_knots(instance, attribute, value):
    if not value or not all(math.isfinite(v) for v in value):
        raise ValueError(f"IsotonicMap.{attribute.name} must be a non-empty sequence of finite floats, got {value!r}")
    if attribute.name == "knots" and any(b <= a for a, b in zip(value, value[1:])):
        raise ValueError(f"IsotonicMap.knots must be strictly increasing, got {value!r}")
    if attribute.name == "values":
        if len(value) != len(instance.knots):
            raise ValueError(f"IsotonicMap.values must have one value per knot ({len(instance.knots)}), got {len(value)}")
        if any(b < a for a, b in zip(value, value[1:])):
            raise ValueError(f"IsotonicMap.values must be non-decreasing, got {value!r}")


def _float_tuple(values) -> tuple[float, ...]:
    return tuple(float(v) for v in values)


@attrs.frozen
class IsotonicMap:
    """A monotone non-decreasing piecewise-linear map through (``knots[j]``, ``values[j]``), constant
    beyond the first and last knot."""

    knots: tuple[float, ...] = attrs.field(converter=_float_tuple, validator=_validate_knots)
    values: tuple[float, ...] = attrs.field(converter=_float_tuple, validator=_validate_knots)
    # (dtype, device) → the map's segments as tensors: built once, not on every decoding step.
    _tensors: dict = attrs.field(init=False, factory=dict, eq=False, repr=False)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The map applied elementwise, in x's dtype (at least float32) and on its device."""
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise TypeError(f"x must be a floating-point tensor, got {getattr(x, 'dtype', type(x).__name__)}")
        dtype = torch.promote_types(x.dtype, torch.float32)
        if (dtype, x.device) not in self._tensors:
            self._tensors[(dtype, x.device)] = _Segments.of([self], dtype, x.device)
        return self._tensors[(dtype, x.device)](x.reshape(1, -1)).reshape(x.shape)


class _Segments(NamedTuple):
    """M piecewise-linear maps as tensors, each padded with copies of its last knot to K = max(2, longest) knots (a
    padded map reads as the same map, and every point has a segment): ``lowest`` and ``highest`` [M, 1], the ends;
    ``uppers`` [M, K − 1], each segment's upper knot; ``starts``, ``bases``, ``rises`` and ``spans`` [M, K − 1], segment
    j's x_j, y at x_j, y_{j+1} − y_j and x_{j+1} − x_j. Built once per dtype and device, so that a decoding step pays a
    handful of tensor ops, not the twenty that derive the segments."""

    lowest: torch.Tensor
    highest: torch.Tensor
    uppers: torch.Tensor
    starts: torch.Tensor
    bases: torch.Tensor
    rises: torch.Tensor
    spans: torch.Tensor

    @classmethod
    def of(cls, maps, dtype: torch.dtype, device: torch.device) -> "_Segments":
        """The segments of ``maps`` (IsotonicMap values) in ``dtype`` on ``device``."""
        longest = max(2, *(len(fitted.knots) for fitted in maps))
        knots, values = (
            torch.tensor([list(sequence) + [sequence[-1]] * (longest - len(sequence)) for sequence in sequences], dtype=dtype, device=device)
            for sequences in ([fitted.knots for fitted in maps], [fitted.values for fitted in maps])
        )
        x0, x1, y0, y1 = knots[:, :-1], knots[:, 1:], values[:, :-1], values[:, 1:]
        # Knots that collapse when cast to float32 would divide by zero; the upper end's value is right there.
        spread = x1 > x0
        bases, rises = torch.where(spread, y0, y1), torch.where(spread, y1 - y0, torch.zeros_like(y1))
        return cls(knots[:, :1], knots[:, -1:], x1.contiguous(), x0, bases, rises, torch.where(spread, x1 - x0, torch.ones_like(x1)))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Row m of ``x`` [M, N] through map m: linear between knots, constant beyond the ends, in the maps' dtype."""
        x = torch.clamp(x.to(self.lowest.dtype), self.lowest, self.highest).contiguous()
        # The segment of x: how many upper knots lie below it (x ≤ the last knot, so at most K − 2).
        segment = torch.searchsorted(self.uppers, x)
        # (x − x_j)·rise / span, not x times a precomputed slope: a span of a few ulps would make the slope overflow.
        rise = (x - self.starts.gather(1, segment)) * self.rises.gather(1, segment)
        return torch.addcdiv(self.bases.gather(1, segment), rise, self.spans.gather(1, segment))


def isotonic_fit(x: torch.Tensor, y: torch.Tensor, weights: torch.Tensor | None = None) -> IsotonicMap:
    """The non-decreasing least-squares fit of y on x (pool-adjacent-violators), y a BoolTensor or
    floats, optional positive ``weights``. Equal x are pooled first; each pooled block keeps only its
    first and last x as knots, which describes the same piecewise-linear map."""
    _check_tensor("x", x, 1, "float")
    if not isinstance(y, torch.Tensor) or not (y.dtype == torch.bool or y.is_floating_point()):
        raise TypeError(f"y must be a BoolTensor or floating-point tensor, got {getattr(y, 'dtype', type(y).__name__)}")
    weights = torch.ones_like(x, dtype=torch.float64) if weights is None else _check_tensor("weights", weights, 1, "float")
    if y.shape != x.shape or weights.shape != x.shape:
        raise ValueError(f"y and weights must have x's shape {tuple(x.shape)}, got {tuple(y.shape)} and {tuple(weights.shape)}")
    if x.numel() == 0:
        raise ValueError("x must hold at least one point, got an empty tensor")
    _check_values("x", x, x.isfinite(), "finite")
    _check_values("y", y, y.double().isfinite(), "finite")
    _check_values("weights", weights, weights.isfinite() & (weights > 0), "finite and > 0")
    x, y, weights = x.detach().cpu().double(), y.detach().cpu().double(), weights.detach().cpu().double()
    order = x.argsort(stable=True)
    unique, group = torch.unique_consecutive(x[order], return_inverse=True)
    total = torch.zeros(unique.numel(), dtype=torch.float64).index_add_(0, group, weights[order])
    weighted = torch.zeros(unique.numel(), dtype=torch.float64).index_add_(0, group, (weights * y)[order])
    blocks: list[list] = []  # [Σ w·y, Σ w, first unique index, last unique index]
    for index, (wy, w) in enumerate(zip(weighted.tolist(), total.tolist())):
        blocks.append([wy, w, index, index])
        # Merge while the previous block's mean is ≥ this one's (w > 0, so compare cross-products);
        # merging equal means too keeps block means strictly increasing and the knots few.
        while len(blocks) > 1 and blocks[-2][0] * blocks[-1][1] >= blocks[-1][0] * blocks[-2][1]:
            last = blocks.pop()
            blocks[-1] = [blocks[-1][0] + last[0], blocks[-1][1] + last[1], blocks[-1][2], last[3]]
    xs = unique.tolist()
    knots, values = [], []
    for wy, w, first, last in blocks:
        for index in sorted({first, last}):
            knots.append(xs[index])
            values.append(wy / w)
    return IsotonicMap(knots=knots, values=values)


def fit_isotonic_positions(log: CalibrationLog, eps: float = EPS) -> tuple[IsotonicMap, ...]:
    """One isotonic map per position k, fitted on c_k against 1[x_k accepted | position k reached]
    (``conditional_outcomes``), values clamped into [eps, 1−eps]. Positions never reached get the identity."""
    if not isinstance(log, CalibrationLog):
        raise TypeError(f"log must be a CalibrationLog, got {type(log).__name__}")
    known, outcome = conditional_outcomes(log)
    maps = []
    for k in range(log.width):
        rows = known[:, k]
        fitted = isotonic_fit(log.survival[rows, k], outcome[rows, k]) if bool(rows.any()) else IsotonicMap((0.0, 1.0), (0.0, 1.0))
        maps.append(IsotonicMap(fitted.knots, [min(max(v, eps), 1.0 - eps) for v in fitted.values]))
    return tuple(maps)


# ----------------------------------------------------------------------------- fitted calibration


def _validate_parameters(instance, attribute, value):
    if instance.method == "temperature":
        _check_temperatures("Calibration.parameters", value)
    elif not value or not all(isinstance(p, IsotonicMap) for p in value):
        raise ValueError(f"Calibration.parameters must be a non-empty tuple of IsotonicMap for method 'isotonic', got {value!r}")


@attrs.frozen
class Calibration:
    """A fitted calibration: ``method`` 'temperature' (``parameters``: T_1..T_γ) or 'isotonic'
    (``parameters``: one ``IsotonicMap`` per position). Positions past the fitted γ reuse the last."""

    method: str = attrs.field(validator=attrs.validators.in_(METHODS))
    parameters: tuple = attrs.field(converter=tuple, validator=_validate_parameters)
    # (width, dtype, device) → every position's isotonic segments stacked (``_Segments``): applied in one pass per step.
    _stacked: dict = attrs.field(init=False, factory=dict, eq=False, repr=False)

    @classmethod
    def fit(cls, log: CalibrationLog, method: str = "temperature", *, grid=None, bins: int = 10, eps: float = EPS) -> Calibration:
        """STS (``fit_sequential_temperatures``, which alone uses ``grid`` and ``bins``) or per-position
        isotonic maps (``fit_isotonic_positions``) fitted on ``log``."""
        if method == "temperature":
            return cls(method, fit_sequential_temperatures(log, grid=grid, bins=bins, eps=eps))
        if method == "isotonic":
            return cls(method, fit_isotonic_positions(log, eps=eps))
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")

    def apply(self, survival: torch.Tensor) -> torch.Tensor:
        """Calibrated survival for raw survival [R, γ'], same dtype and device."""
        if self.method == "temperature":
            return apply_temperatures(survival, self.parameters)
        _check_tensor("survival", survival, 2, "float")
        if survival.shape[1] == 0:
            return survival.clone()
        key = (survival.shape[1], torch.promote_types(survival.dtype, torch.float32), survival.device)
        if key not in self._stacked:
            self._stacked[key] = _Segments.of(_per_position(self.parameters, key[0]), key[1], key[2])
        return self._stacked[key](survival.T).T.to(survival.dtype)

    def to_dict(self) -> dict:
        """Plain JSON-safe data; ``from_dict`` reads it back."""
        if self.method == "temperature":
            parameters = [float(t) for t in self.parameters]
        else:
            parameters = [{"knots": list(m.knots), "values": list(m.values)} for m in self.parameters]
        return {"format_version": FORMAT_VERSION, "method": self.method, "parameters": parameters}

    @classmethod
    def from_dict(cls, data: Mapping) -> Calibration:
        """The inverse of ``to_dict``; ValueError on an unknown format version or method."""
        check_format(data, "Calibration", FORMAT_VERSION)
        method, parameters = data.get("method"), data.get("parameters")
        if method not in METHODS:
            raise ValueError(f"data['method'] must be one of {METHODS}, got {method!r}")
        if not isinstance(parameters, list):
            raise ValueError(f"data['parameters'] must be a list, got {parameters!r}")
        if method == "isotonic":
            if not all(isinstance(p, Mapping) and {"knots", "values"} <= p.keys() for p in parameters):
                raise ValueError(f"data['parameters'] must be a list of {{'knots': [...], 'values': [...]}} for 'isotonic', got {parameters!r}")
            parameters = [IsotonicMap(p["knots"], p["values"]) for p in parameters]
        return cls(method, tuple(parameters))


# ----------------------------------------------------------------------------- bands and files

#: Sampling bands with their own calibration: acceptance under greedy decoding, mild and full
#: temperature differ, so one fit cannot serve all three.
BANDS = ("greedy", "low", "high")
LOW_BAND_MAX_TEMPERATURE = 0.7


def band_of(sampling) -> str:
    """The band of a ``SamplingConfig``: 'greedy', 'low' (temperature ≤ 0.7) or 'high'."""
    if not sampling.do_sample:
        return "greedy"
    return "low" if sampling.temperature <= LOW_BAND_MAX_TEMPERATURE else "high"


def _bands_mapping(instance, attribute, value) -> None:
    if not value or any(band not in BANDS or not isinstance(fit, Calibration) for band, fit in value.items()):
        raise ValueError(f"CalibrationSet.bands must map some of {BANDS} to a Calibration, got {value!r}")


@attrs.frozen
class CalibrationSet:
    """The calibrations of one raw estimator (``estimator``, its class name), one per sampling band,
    fitted for the drafter whose weights file hashes to ``fingerprint`` (None: any drafter)."""

    estimator: str
    bands: Mapping[str, Calibration] = attrs.field(validator=_bands_mapping)
    fingerprint: str | None = None

    def for_band(self, band: str) -> Calibration | None:
        """The band's calibration; a missing band borrows the nearest fitted one (greedy ↔ low ↔ high)."""
        if band not in BANDS:
            raise ValueError(f"band must be one of {BANDS}, got {band!r}")
        index = BANDS.index(band)
        for candidate in sorted(BANDS, key=lambda other: (abs(BANDS.index(other) - index), -BANDS.index(other))):
            if candidate in self.bands:
                return self.bands[candidate]
        return None

    def to_dict(self) -> dict:
        """JSON-safe data; ``from_dict`` reads it back."""
        bands = {band: fit.to_dict() for band, fit in self.bands.items()}
        return {"format_version": FORMAT_VERSION, "estimator": self.estimator, "fingerprint": self.fingerprint, "bands": bands}

    @classmethod
    def from_dict(cls, data: Mapping) -> CalibrationSet:
        """The inverse of ``to_dict``; ValueError on an unknown format version."""
        check_format(data, "CalibrationSet", FORMAT_VERSION)
        bands = {band: Calibration.from_dict(fit) for band, fit in data["bands"].items()}
        return cls(data["estimator"], bands, data.get("fingerprint"))


CALIBRATION_FILE = "calibration.json"


def file_fingerprint(path: str | Path) -> str:
    """The first 16 hex digits of the SHA-256 of a file: how a calibration names the drafter weights
    (``model.safetensors``) it was fitted for."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"path must be a file, got {str(path)!r}")
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def _sets_mapping(instance, attribute, value) -> None:
    if not value or any(not isinstance(item, CalibrationSet) or item.estimator != name for name, item in value.items()):
        raise ValueError(f"CalibrationFile.sets must map estimator names to their CalibrationSet, got {value!r:.300}")


@attrs.frozen
class CalibrationFile:
    """What ``dspark calibrate`` saves beside a drafter (``calibration.json``): one ``CalibrationSet``
    per raw estimator it measured, the name of the one ``wrap`` uses by default, the parameters of
    estimators fitted from the logs (e.g. ``LogisticConfidence.to_dict()``), and how it was fitted."""

    sets: Mapping[str, CalibrationSet] = attrs.field(validator=_sets_mapping)
    default: str
    estimators: Mapping[str, dict] = attrs.field(factory=dict)
    fitted_on: Mapping[str, object] = attrs.field(factory=dict)

    def __attrs_post_init__(self):
        if self.default not in self.sets:
            raise ValueError(f"default must name one of the sets {sorted(self.sets)}, got {self.default!r}")

    def save(self, directory: str | Path) -> Path:
        """Write ``directory/calibration.json`` (through a temporary file) and return its path."""
        path = Path(directory) / CALIBRATION_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {
            "format_version": FORMAT_VERSION, "default": self.default, "sets": [item.to_dict() for item in self.sets.values()],
            "estimators": dict(self.estimators), "fitted_on": dict(self.fitted_on),
        }
        partial = path.with_name(path.name + ".partial")
        partial.write_text(json.dumps(data, indent=2) + "\n")
        partial.replace(path)
        return path

    @classmethod
    def load(cls, directory: str | Path, fingerprint: str | None = None) -> CalibrationFile | None:
        """``directory/calibration.json``, or None when there is none. With ``fingerprint`` (the drafter's
        weights), a file fitted for other weights is refused with a ValueError naming both."""
        path = Path(directory) / CALIBRATION_FILE
        if not path.is_file():
            return None
        data = check_format(json.loads(path.read_text()), "CalibrationFile", FORMAT_VERSION)
        sets = {item["estimator"]: CalibrationSet.from_dict(item) for item in data["sets"]}
        for item in sets.values():
            if fingerprint is not None and item.fingerprint not in (None, fingerprint):
                raise ValueError(
                    f"{str(path)!r} was fitted for drafter weights {item.fingerprint}, but these weights are {fingerprint}: "
                    "recalibrate with `dspark calibrate` or delete the file"
                )
        return cls(sets, data["default"], data.get("estimators", {}), data.get("fitted_on", {}))
