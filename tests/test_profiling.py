"""dspark/cost_models/profiling.py: step timings on a tiny Llama, the grids of cost_curve and draft_curve, their passes and their order, bad arguments, the cache between repeats."""

import types

import pytest

from dspark.cost_models import profiling
from dspark.cost_models.profiling import DraftTiming, StepTiming, cost_curve, draft_curve, measure_step_time, one_row_draft_seconds
from dspark.drafters import PromptLookupDrafter
from dspark.fast_path import FastPath, row_bucket
from tests.conftest import build_model, tiny_semi_ar_drafter


#: The forwards cost_curve runs per rows value and pass beyond its points: a reference, an untimed one, a reference.
_AROUND_POINTS = 3


@pytest.fixture(scope="module")
def model():
    return build_model("llama")


def test_measure_step_time_on_the_default_path(model):
    """A plain step timing carries its grid point, path "default", its repeat count and positive seconds."""
    timing = measure_step_time(model, rows=2, tokens=3, context=5, repeats=2)
    assert isinstance(timing, StepTiming)
    assert (timing.rows, timing.tokens, timing.context, timing.path, timing.repeats) == (2, 3, 5, "default", 2)
    assert timing.seconds > 0


def test_measure_step_time_on_the_fast_path(model):
    """With a FastPath the step runs on it (its choices cover rows × tokens) and is labelled "fast"."""
    path = FastPath()
    timing = measure_step_time(model, rows=2, tokens=3, context=5, fast_path=path, repeats=2)
    assert (timing.rows, timing.tokens, timing.context, timing.path, timing.repeats) == (2, 3, 5, "fast", 2)
    assert timing.seconds > 0
    assert row_bucket(6) in {choice.rows for choice in path.choices()}


def test_cost_curve_covers_the_grid_in_order(model):
    """cost_curve returns one timing per (context, rows, tokens), contexts outermost, all positive."""
    timings = cost_curve(model, rows=(1, 2), tokens=(1, 3), contexts=(0, 4), repeats=1, progress=False)
    assert [(t.context, t.rows, t.tokens) for t in timings] == [(c, r, k) for c in (0, 4) for r in (1, 2) for k in (1, 3)]
    assert all(t.seconds > 0 and t.path == "default" and t.repeats == 1 for t in timings)


def _forward_shapes(model, **grid) -> list[tuple[int, int]]:
    """The [rows, tokens] of every forward cost_curve runs on ``model`` for ``grid``."""
    shapes = []

    def record(module, args, kwargs):
        shapes.append(tuple(kwargs["input_ids"].shape))

    handle = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        cost_curve(model, progress=False, **grid)
    finally:
        handle.remove()
    return shapes[1:]  # shapes[0] is the one-token forward that reads the cache layout


def test_cost_curve_times_the_grid_in_passes(model):
    """After a warm-up pass, each pass times every point once (rows, then tokens), so a lasting disturbance lands in one pass."""
    shapes = _forward_shapes(model, rows=(1, 2), tokens=(1, 3), contexts=(4,), repeats=2)
    # Each rows value: a reference forward, one untimed forward, its points, a reference forward.
    group = _AROUND_POINTS + 2
    timed = [shape for index, shape in enumerate(shapes) if index % group in (2, 3)]
    assert sorted(timed) == sorted([(1, 1), (1, 3), (2, 1), (2, 3)] * 3)
    in_order, rotated = [(1, 1), (1, 3), (2, 1), (2, 3)], [(1, 3), (1, 1), (2, 3), (2, 1)]
    assert [timed[4 * index : 4 * index + 4] for index in range(3)] == [in_order, rotated, in_order]


def test_cost_curve_rotates_the_token_order_after_an_untimed_forward(model):
    """Each rows value of a pass starts with a one-row, one-token reference forward and an untimed forward on its fresh
    cache, then the token counts from the pass's offset, then another reference forward."""
    shapes = _forward_shapes(model, rows=(2,), tokens=(1, 2, 3), contexts=(4,), repeats=3)
    group = _AROUND_POINTS + 3
    passes = [shapes[group * index : group * (index + 1)] for index in range(4)]
    assert [one_pass[1] for one_pass in passes] == [(2, 1)] * 4
    assert all(one_pass[0] == one_pass[5] == (1, 1) for one_pass in passes)
    assert [[tokens for _, tokens in one_pass[2:5]] for one_pass in passes] == [[1, 2, 3], [2, 3, 1], [3, 1, 2], [1, 2, 3]]


def test_a_spell_that_slows_one_rows_values_forwards_does_not_reach_the_table(model, monkeypatch):
    """Forwards run twice as slow for every other rows value of a pass (a spell of another process's work, its reference
    forwards included): the table keeps the steady machine's ratios, each point taken over the references beside it."""
    forwards = []

    def spell_timed(model_, inputs, fast_path):
        rows, tokens = inputs["input_ids"].shape
        spell = 2.0 if (len(forwards) // (_AROUND_POINTS + 2)) % 2 else 1.0  # one rows value's forwards, its two points included
        forwards.append((rows, tokens))
        return 0.001 * rows * (1 + tokens) * spell

    monkeypatch.setattr(profiling, "_time_forward", spell_timed)
    timings = {(t.rows, t.tokens): t.seconds for t in cost_curve(model, rows=(1, 2), tokens=(1, 3), contexts=(4,), repeats=3, progress=False)}
    steady = {(rows, tokens): 0.001 * rows * (1 + tokens) for rows in (1, 2) for tokens in (1, 3)}
    assert {point: seconds / timings[(1, 1)] for point, seconds in timings.items()} == pytest.approx({point: seconds / steady[(1, 1)] for point, seconds in steady.items()})


@pytest.mark.parametrize(
    "arguments, error, name",
    [
        ({"rows": 0}, ValueError, "rows"),
        ({"rows": 1.0}, TypeError, "rows"),
        ({"tokens": 0}, ValueError, "tokens"),
        ({"tokens": True}, TypeError, "tokens"),
        ({"context": -1}, ValueError, "context"),
        ({"repeats": 0}, ValueError, "repeats"),
    ],
)
def test_bad_grid_points_are_refused_by_name(model, arguments, error, name):
    """measure_step_time and cost_curve refuse bad rows, tokens, context or repeats, naming the argument."""
    point = {"rows": 1, "tokens": 1, "context": 0, "repeats": 1, **arguments}
    with pytest.raises(error, match=name):
        measure_step_time(model, **point)
    grid = {"rows": (point["rows"],), "tokens": (point["tokens"],), "contexts": (point["context"],), "repeats": point["repeats"]}
    with pytest.raises(error, match=name):
        cost_curve(model, progress=False, **grid)


@pytest.mark.parametrize("context", [0, 7])
def test_every_repeat_sees_the_same_context(model, context):
    """The cache the model is given holds exactly ``context`` tokens at every forward: repeats do not grow it."""
    seen = []

    def record(module, args, kwargs):
        seen.append(kwargs["cache"].get_seq_length())

    handle = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        measure_step_time(model, rows=2, tokens=3, context=context, repeats=3)
    finally:
        handle.remove()
    assert seen[1:] == [context] * 4  # seen[0] is the one-token forward that reads the cache layout


class _RecordingLookup(PromptLookupDrafter):
    """Prompt lookup that notes each proposal's rows, depth and step in ``events``, and calls ``on_propose`` first."""

    def __init__(self, events: list, on_propose=None):
        super().__init__()
        self.events, self.on_propose = events, on_propose

    def propose(self, context, max_draft_tokens):
        if self.on_propose is not None:
            self.on_propose(context, max_draft_tokens)
        self.events.append(("propose", context.tokens.shape[0], max_draft_tokens, context.step))
        return super().propose(context, max_draft_tokens)


@pytest.mark.parametrize("kind", ["lookup", "semi_ar"])
def test_draft_curve_covers_the_grid_in_order(model, kind):
    """draft_curve returns one timing per (rows, depth), rows outermost, all positive, for a drafter that reads the
    target's features and for one that does not."""
    drafter = PromptLookupDrafter() if kind == "lookup" else tiny_semi_ar_drafter(model, max_draft_tokens=3)
    timings = draft_curve(model, drafter, rows=(1, 3), depths=(1, 2, 3), context=6, repeats=2, progress=False)
    assert all(isinstance(timing, DraftTiming) for timing in timings)
    assert [(t.rows, t.depth) for t in timings] == [(r, d) for r in (1, 3) for d in (1, 2, 3)]
    assert all(t.seconds > 0 and t.repeats == 2 for t in timings)


def test_draft_curve_times_each_proposal_after_a_reference_forward_in_rotated_passes(model):
    """Per rows value and pass: an untimed whole-block proposal on a fresh generation, a one-row, one-token reference
    forward, then each depth from the pass's offset, each followed by another reference forward."""
    events = []
    handle = model.register_forward_pre_hook(lambda module, args, kwargs: events.append(("forward", *kwargs["input_ids"].shape)), with_kwargs=True)
    try:
        draft_curve(model, _RecordingLookup(events), rows=(2,), depths=(1, 2, 3), context=5, repeats=3, progress=False)
    finally:
        handle.remove()
    events = events[1:]  # the one-token forward that reads the cache layout
    group = 2 + 2 * 3
    passes = [events[group * index : group * (index + 1)] for index in range(4)]
    assert len(events) == 4 * group
    for one_pass in passes:
        assert one_pass[0] == ("propose", 2, 3, 0) and one_pass[1::2] == [("forward", 1, 1)] * 4
        assert [event[3] for event in one_pass[2::2]] == [1, 2, 3]  # one new committed token per proposal
    assert [[event[2] for event in one_pass[2::2]] for one_pass in passes] == [[1, 2, 3], [2, 3, 1], [3, 1, 2], [1, 2, 3]]


def test_a_spell_that_slows_one_rows_values_proposals_does_not_reach_the_drafting_table(model, monkeypatch):
    """Everything runs twice as slow for every other rows value of a pass (its reference forwards included): the table
    keeps the steady machine's ratios, each proposal taken over the reference forwards beside it."""
    clock = types.SimpleNamespace(now=0.0, generations=0)

    def spell() -> float:
        return 2.0 if clock.generations % 2 else 1.0

    def slow_proposal(context, depth):
        clock.generations += context.step == 0
        clock.now += 0.001 * context.tokens.shape[0] * (1 + depth) * spell()

    monkeypatch.setattr(profiling, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))
    monkeypatch.setattr(profiling, "_time_forward", lambda model_, inputs, fast_path: 0.01 * spell())
    drafter = _RecordingLookup([], on_propose=slow_proposal)
    timings = {(t.rows, t.depth): t.seconds for t in draft_curve(model, drafter, rows=(1, 2), depths=(1, 3), context=5, repeats=3, progress=False)}
    steady = {(rows, depth): 0.001 * rows * (1 + depth) for rows in (1, 2) for depth in (1, 3)}
    assert {point: seconds / timings[(1, 1)] for point, seconds in timings.items()} == pytest.approx({point: seconds / steady[(1, 1)] for point, seconds in steady.items()})


@pytest.mark.parametrize(
    "arguments, error, name",
    [
        ({"rows": (0,)}, ValueError, "rows"),
        ({"rows": ()}, ValueError, "rows"),
        ({"depths": (1.0,)}, TypeError, "depths"),
        ({"depths": ()}, ValueError, "depths"),
        ({"context": 0}, ValueError, "context"),
        ({"repeats": 0}, ValueError, "repeats"),
        ({"max_draft_tokens": 2}, ValueError, "max_draft_tokens"),
    ],
)
def test_draft_curve_refuses_bad_arguments_by_name(model, arguments, error, name):
    """draft_curve refuses bad rows, depths, context, repeats, or a block narrower than its deepest depth, naming the argument."""
    with pytest.raises(error, match=name):
        draft_curve(model, PromptLookupDrafter(), **{"rows": (1,), "depths": (1, 3), "context": 4, "repeats": 1, "progress": False, **arguments})


def test_one_row_draft_seconds_times_a_shallow_and_a_whole_block_pass_after_reference_forwards(model):
    """one_row_draft_seconds: on a one-row generation, an untimed whole-block proposal, then per repeat a reference
    forward, a one-deep proposal, a reference forward and a whole-block proposal; positive seconds; a block below one
    token is refused by name."""
    events = []
    handle = model.register_forward_pre_hook(lambda module, args, kwargs: events.append(("forward", *kwargs["input_ids"].shape)), with_kwargs=True)
    try:
        seconds = one_row_draft_seconds(model, _RecordingLookup(events), None, 3, context=5, repeats=2)
    finally:
        handle.remove()
    whole, reference = 3, ("forward", 1, 1)
    assert seconds > 0
    assert events[1:] == [("propose", 1, whole, 0), reference, ("propose", 1, 1, 1), reference, ("propose", 1, whole, 2),
                          reference, ("propose", 1, 1, 3), reference, ("propose", 1, whole, 4)]
    with pytest.raises(ValueError, match="max_draft_tokens"):
        one_row_draft_seconds(model, PromptLookupDrafter(), None, 0)
