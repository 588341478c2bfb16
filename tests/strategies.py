"""Hypothesis strategies shared by the property tests."""

from __future__ import annotations

import attrs
import torch
from hypothesis import strategies as st

from dspark.types import SamplingConfig


@st.composite
def verify_problems(draw, max_rows: int = 4, max_width: int = 6, max_vocab: int = 12):
    """(draft_tokens [R, γ], verify_lengths [R], target_logits [R, γ+1, V], draft_logits [R, γ, V])."""
    rows = draw(st.integers(1, max_rows))
    width = draw(st.integers(0, max_width))
    vocab = draw(st.integers(2, max_vocab))
    seed = draw(st.integers(0, 2**31 - 1))
    generator = torch.Generator().manual_seed(seed)
    scale = draw(st.sampled_from([0.1, 1.0, 5.0]))
    target_logits = torch.randn((rows, width + 1, vocab), generator=generator) * scale
    draft_logits = torch.randn((rows, width, vocab), generator=generator) * scale
    # Mix drafts that copy the target's argmax with random ones so every prefix length occurs.
    copy = torch.rand((rows, width), generator=generator) < draw(st.sampled_from([0.0, 0.5, 0.9, 1.0]))
    random_tokens = torch.randint(0, vocab, (rows, width), generator=generator)
    draft_tokens = torch.where(copy, target_logits[:, :width].argmax(dim=-1), random_tokens)
    verify_lengths = torch.tensor([draw(st.integers(0, width)) for _ in range(rows)], dtype=torch.long)
    return draft_tokens, verify_lengths, target_logits, draft_logits


@st.composite
def sampling_configs(draw):
    """Sampling configs across temperature, top-k and top-p, including no warping at all."""
    return SamplingConfig(
        do_sample=True,
        temperature=draw(st.sampled_from([0.3, 0.7, 1.0, 1.5])),
        top_k=draw(st.sampled_from([None, 0, 1, 3, 50])),
        top_p=draw(st.sampled_from([None, 0.1, 0.5, 0.9, 1.0])),
    )


def logits_tensors(max_rows: int = 3, max_vocab: int = 20):
    """Random float logits [R, V] with occasional ties."""
    return st.builds(
        lambda rows, vocab, seed, ties: _logits(rows, vocab, seed, ties),
        st.integers(1, max_rows), st.integers(1, max_vocab), st.integers(0, 2**31 - 1), st.booleans(),
    )


def _logits(rows: int, vocab: int, seed: int, ties: bool) -> torch.Tensor:
    logits = torch.randn((rows, vocab), generator=torch.Generator().manual_seed(seed)) * 3
    return logits.round() if ties else logits


@st.composite
def linear_problems(draw, max_features: int = 40, max_rows: int = 24):
    """(x, weight [out, in], bias [out] or None) for y = x Wᵀ + b: x is 1-D, 2-D (sometimes a
    non-contiguous view) or 3-D, with one row or several."""
    out_features = draw(st.integers(1, max_features))
    in_features = draw(st.integers(1, max_features))
    leading = draw(st.one_of(st.just(()), st.tuples(st.integers(1, max_rows)), st.tuples(st.integers(1, 4), st.integers(1, max_rows // 4))))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    weight = torch.randn((out_features, in_features), generator=generator) / in_features**0.5
    bias = torch.randn((out_features,), generator=generator) if draw(st.booleans()) else None
    if len(leading) == 1 and draw(st.booleans()):
        x = torch.randn((in_features, *leading), generator=generator).T  # a strided view, as after a transpose
    else:
        x = torch.randn((*leading, in_features), generator=generator)
    return x, weight, bias


@st.composite
def calibration_logs(draw, max_blocks: int = 12, max_width: int = 5):
    """CalibrationLog with partial verification: random survival [N, γ] (exact 0 and 1 included),
    ℓ ≤ drafted ≤ γ and n ≤ ℓ per block, so every case n < ℓ, n = ℓ, ℓ < γ, ℓ = 0 occurs."""
    from dspark.verify.calibration import CalibrationLog

    blocks = draw(st.integers(0, max_blocks))
    width = draw(st.integers(1, max_width))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    survival = torch.rand((blocks, width), generator=generator)
    survival[torch.rand((blocks, width), generator=generator) < 0.1] = 1.0
    survival[torch.rand((blocks, width), generator=generator) < 0.1] = 0.0
    drafted = torch.tensor([draw(st.integers(0, width)) for _ in range(blocks)], dtype=torch.long)
    verified = torch.tensor([draw(st.integers(0, int(d))) for d in drafted], dtype=torch.long)
    accepted = torch.tensor([draw(st.integers(0, int(v))) for v in verified], dtype=torch.long)
    return CalibrationLog(survival=survival, verified=verified, accepted=accepted, drafted=drafted)


@st.composite
def scored_outcomes(draw, max_size: int = 30):
    """(predicted FloatTensor[M] in [0, 1], outcome BoolTensor[M]), M ≥ 1, often with tied scores."""
    size = draw(st.integers(1, max_size))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    predicted = torch.rand(size, generator=generator, dtype=torch.float64)
    if draw(st.booleans()):
        predicted = (predicted * 4).round() / 4  # few distinct values: many ties, exact 0 and 1
    outcome = torch.rand(size, generator=generator, dtype=torch.float64) < draw(st.sampled_from([0.0, 0.2, 0.5, 0.9]))
    return predicted, outcome


@st.composite
def isotonic_problems(draw, max_size: int = 40):
    """(x FloatTensor[M], y FloatTensor[M] or BoolTensor[M], weights FloatTensor[M] or None), M ≥ 1, x with ties."""
    size = draw(st.integers(1, max_size))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    x = torch.randn(size, generator=generator, dtype=torch.float64)
    if draw(st.booleans()):
        x = x.round()
    if draw(st.booleans()):
        y = torch.rand(size, generator=generator, dtype=torch.float64) < torch.sigmoid(2 * x)
    else:
        y = x + torch.randn(size, generator=generator, dtype=torch.float64)
    weights = torch.rand(size, generator=generator, dtype=torch.float64) + 0.1 if draw(st.booleans()) else None
    return x, y, weights


@st.composite
def survival_and_temperatures(draw, max_rows: int = 20, max_width: int = 5):
    """(survival FloatTensor[R, γ] in [0, 1] with ties and exact 0/1, temperatures: 1..γ+1 floats > 0)."""
    rows, width = draw(st.integers(1, max_rows)), draw(st.integers(1, max_width))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    survival = torch.rand((rows, width), generator=generator)
    if draw(st.booleans()):
        survival = (survival * 5).round() / 5
    temperatures = draw(st.lists(st.floats(0.05, 20.0), min_size=1, max_size=width + 1))
    return survival, tuple(temperatures)


@st.composite
def logistic_problems(draw, max_size: int = 60, max_features: int = 3):
    """(features FloatTensor[M, F], outcome BoolTensor[M] holding both classes, weights FloatTensor[M] or None,
    l2 > 0): scaled, sometimes a constant column, sometimes perfectly separable (the penalty keeps the fit finite)."""
    size = draw(st.integers(2, max_size))
    width = draw(st.integers(1, max_features))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    features = torch.randn((size, width), generator=generator, dtype=torch.float64) * draw(st.sampled_from([0.1, 1.0, 5.0]))
    if width > 1 and draw(st.booleans()):
        features[:, -1] = 1.0
    if draw(st.booleans()):
        outcome = features[:, 0] > features[:, 0].median()
    else:
        outcome = torch.rand(size, generator=generator, dtype=torch.float64) < torch.sigmoid(features[:, 0])
    outcome[0], outcome[1] = True, False
    weights = torch.rand(size, generator=generator, dtype=torch.float64) * 2 if draw(st.booleans()) else None
    if weights is not None:
        weights[:2] = 1.0  # both classes keep some weight
    return features, outcome, weights, draw(st.sampled_from([0.1, 1.0]))


@st.composite
def estimator_streams(draw, max_steps: int = 6, max_rows: int = 3, max_width: int = 4, features: int = 2):
    """(drafts, outcomes, other_outcomes, split): a stream of scored steps for an online estimator, as
    lists of ``Draft`` (signals [R, γ, F] and confidence [R, γ]) and ``StepOutcome`` with ℓ ≤ γ, n ≤ ℓ;
    ``other_outcomes`` equals ``outcomes`` before step ``split`` and is redrawn from it on."""
    from dspark.types import Draft, StepOutcome

    steps = draw(st.integers(2, max_steps))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))

    def outcome_for(rows: int, width: int) -> StepOutcome:
        verified = torch.randint(0, width + 1, (rows,), generator=generator)
        accepted = (torch.rand(rows, generator=generator) * (verified + 1)).long().clamp_max(verified)
        return StepOutcome(rows=torch.arange(rows), verify_lengths=verified, accepted=accepted,
                           next_tokens=torch.zeros(rows, dtype=torch.long), finished=torch.zeros(rows, dtype=torch.bool))

    drafts, outcomes, other = [], [], []
    for _ in range(steps):
        rows, width = draw(st.integers(1, max_rows)), draw(st.integers(1, max_width))
        drafts.append(Draft(
            tokens=torch.zeros((rows, width), dtype=torch.long), lengths=torch.full((rows,), width),
            signals=torch.randn((rows, width, features), generator=generator),
            confidence=torch.rand((rows, width), generator=generator) * 0.98 + 0.01,
        ))
        outcomes.append(outcome_for(rows, width))
        other.append(outcome_for(rows, width))
    split = draw(st.integers(0, steps - 1))
    return drafts, outcomes, outcomes[:split] + other[split:], split


@st.composite
def schedule_problems(draw, max_rows: int = 5, max_width: int = 5):
    """(survival c FloatTensor[R, γ] float64 in [0, 1], often tied, with exact 0 and 1; limits LongTensor[R]
    in 0..γ+1), R ≥ 1, γ ≥ 0. Schedulers take the prefix survival c.cumprod(dim=1)."""
    rows, width = draw(st.integers(1, max_rows)), draw(st.integers(0, max_width))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    survival = torch.rand((rows, width), generator=generator, dtype=torch.float64)
    if draw(st.booleans()):
        survival = (survival * 4).round() / 4  # few distinct values: ties within and across rows, exact 0 and 1
    limits = torch.tensor([draw(st.integers(0, width + 1)) for _ in range(rows)], dtype=torch.long)
    return survival, limits


@st.composite
def step_curves(draw, max_width: int = 5):
    """(seconds, doublings): T(w) > 0 for w = 1..max_width+1 in any shape, and non-decreasing integers e_w ≥ 0,
    so T(w)·2^{e_w} is a steeper curve (scaling by powers of two keeps every comparison exact)."""
    seconds = draw(st.lists(st.floats(0.05, 20.0), min_size=max_width + 1, max_size=max_width + 1))
    steps = draw(st.lists(st.integers(0, 2), min_size=max_width + 1, max_size=max_width + 1))
    doublings = [sum(steps[: index + 1]) for index in range(len(steps))]
    return seconds, doublings


@st.composite
def gentle_step_curves(draw, max_width: int = 5):
    """T(w) for w = 1..max_width+1 within a factor of two of each other, in any shape: widths whose costs are near
    enough that the survivals, not the curve alone, decide what a scheduler verifies."""
    return draw(st.lists(st.floats(0.7, 1.4), min_size=max_width + 1, max_size=max_width + 1))


@st.composite
def depth_cost_curves(draw, max_depth: int = 6):
    """(γ ≥ 1, T(w) for w = 1..γ+1, D(d) for d = 1..γ): positive step and drafting seconds in any shape, drawn from
    few values so that ties between widths are common."""
    gamma = draw(st.integers(1, max_depth))
    seconds = st.sampled_from([0.25, 0.5, 0.75, 1.0, 1.25, 1.5])
    steps = draw(st.lists(seconds, min_size=gamma + 1, max_size=gamma + 1))
    drafts = draw(st.lists(st.sampled_from([0.0, 0.125, 0.25, 0.5]), min_size=gamma, max_size=gamma))
    return gamma, steps, drafts


@st.composite
def cost_grids(draw, max_size: int = 5):
    """(rows, tokens, step_seconds): strictly increasing grids of ints ≥ 1 and a noisy table of
    seconds [len(rows)][len(tokens)] (often not monotone, sometimes with ties and zeros)."""
    rows = tuple(sorted(draw(st.sets(st.integers(1, 64), min_size=1, max_size=max_size))))
    tokens = tuple(sorted(draw(st.sets(st.integers(1, 16), min_size=1, max_size=max_size))))
    value = st.one_of(st.just(0.0), st.floats(0.001, 10.0), st.sampled_from([0.5, 1.0]))
    seconds = [[draw(value) for _ in tokens] for _ in rows]
    return rows, tokens, seconds


@attrs.frozen
class AffineCosts:
    """T(R, w) = step + widen·(w − 1) + per_row·R; D(k) = draft_base + draft_row·k."""

    step: float
    widen: float
    per_row: float
    draft_base: float
    draft_row: float

    def step_time(self, rows: int, tokens: int) -> float:
        return self.step + self.widen * (tokens - 1) + self.per_row * rows

    def draft_time(self, rows: int, depth: int | None = None) -> float:
        return self.draft_base + self.draft_row * rows


@st.composite
def fallback_problems(draw, max_rows: int = 8):
    """(gains FloatTensor[n] float64 ≥ 0 with ties and zeros, widths LongTensor[n] in 0..4, AffineCosts)."""
    rows = draw(st.integers(1, max_rows))
    gains = torch.tensor(draw(st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0, 3.5]), min_size=rows, max_size=rows)), dtype=torch.float64)
    widths = torch.tensor(draw(st.lists(st.integers(0, 4), min_size=rows, max_size=rows)), dtype=torch.long)
    seconds = st.floats(0.0, 2.0)
    costs = AffineCosts(step=draw(st.floats(0.1, 2.0)), widen=draw(seconds), per_row=draw(seconds), draft_base=draw(seconds), draft_row=draw(seconds))
    return gains, widths, costs


@st.composite
def isotonic_calibrations(draw, max_positions: int = 5, max_knots: int = 8):
    """(Calibration with one IsotonicMap per position, one to ``max_knots`` + 1 knots each (some equal in float32),
    survival FloatTensor[R, γ] in [0, 1] with exact 0 and 1, γ possibly beyond the fitted positions)."""
    from dspark.verify.calibration import Calibration, IsotonicMap

    maps = []
    for _ in range(draw(st.integers(1, max_positions))):
        count = draw(st.integers(1, max_knots))
        knots = sorted(draw(st.lists(st.floats(0.0, 0.9), min_size=count, max_size=count, unique=True)))
        if draw(st.booleans()):
            knots.append(knots[-1] + 1e-9)  # equal once cast to float32, as fitted knots can be
            count += 1
        values = sorted(draw(st.lists(st.floats(0.0, 1.0), min_size=count, max_size=count)))
        maps.append(IsotonicMap(knots=knots, values=values))
    rows, width = draw(st.integers(1, 6)), draw(st.integers(1, max_positions + 2))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    survival = torch.rand((rows, width), generator=generator)
    survival[0, 0] = float(draw(st.sampled_from([0.0, 1.0, 0.5])))
    return Calibration("isotonic", maps), survival


@st.composite
def cache_operations(draw, max_operations: int = 12):
    """A sequence of cache-layer operations on 3 rows at first: ("update", new slots), ("crop", slots) or ("select", row
    indices), the indices rising (rows leaving) or in any order with repeats (a reordering)."""
    operations, rows = [], 3
    for _ in range(draw(st.integers(1, max_operations))):
        kind = draw(st.sampled_from(["update", "update", "crop", "select"]))
        if kind == "update":
            operations.append(("update", draw(st.integers(1, 40))))
        elif kind == "crop":
            operations.append(("crop", draw(st.integers(1, 5))))
        elif draw(st.booleans()):  # rows leaving the batch: rising indices
            keep = sorted(draw(st.sets(st.integers(0, rows - 1), min_size=1, max_size=rows)))
            operations.append(("select", keep))
            rows = len(keep)
        else:  # a reordering, possibly with repeats (beam search)
            keep = draw(st.lists(st.integers(0, rows - 1), min_size=1, max_size=rows))
            operations.append(("select", keep))
            rows = len(keep)
    return operations


@st.composite
def ragged_token_rows(draw, max_rows: int = 5, max_width: int = 30, vocab: int = 4):
    """(tokens [R, L], begin [R], end [R]): rows of a small vocabulary (so n-grams repeat), each row's
    context tokens[r, begin:end] somewhere inside the buffer, possibly empty."""
    rows, width = draw(st.integers(1, max_rows)), draw(st.integers(1, max_width))
    tokens = torch.tensor(draw(st.lists(st.lists(st.integers(0, vocab - 1), min_size=width, max_size=width), min_size=rows, max_size=rows)))
    begin, end = [], []
    for _ in range(rows):
        first = draw(st.integers(0, width))
        begin.append(first)
        end.append(draw(st.integers(first, width)))
    return tokens, torch.tensor(begin), torch.tensor(end)


@st.composite
def paired_rates(draw, max_rounds: int = 4, max_batches: int = 6):
    """(mine, theirs): two policies' tokens/s on the same batches, a list per timed round of a value per batch."""
    rounds = draw(st.integers(1, max_rounds))
    batches = draw(st.integers(1, max_batches))
    rate = st.floats(0.5, 50.0, allow_nan=False, allow_infinity=False)
    table = st.lists(st.lists(rate, min_size=batches, max_size=batches), min_size=rounds, max_size=rounds)
    return draw(table), draw(table)
