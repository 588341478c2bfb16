"""Cost models in dspark/cost_models/: constant, profiled (table, monotone surface, measuring and its
cache), roofline, online correction, and SGLang's SPS table format."""

import inspect
import json
import math
import random
from unittest import mock

import attrs
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark import fast_path as fast_path_module
from dspark.cost_models import (
    DEVICES,
    AutoProfiledCostModel,
    ConstantCostModel,
    CostTable,
    DeviceSpec,
    OnlineCorrectedCostModel,
    ProfiledCostModel,
    RooflineCostModel,
    from_sglang_sps,
    context_band,
    interpolate_monotone,
    load_sglang_sps,
    mean_context,
    measure_cpu_spec,
    monotone_envelope,
    profile_key,
    rows_grid,
    save_sglang_sps,
    to_sglang_sps,
)
from dspark.cost_models import online as online_module
from dspark.cost_models import profiled as profiled_module
from dspark.cost_models.profiling import REVISION as PROFILING_REVISION
from dspark.drafters import PromptLookupDrafter
from dspark.fast_path import REVISION, FastPath, OneRowChoice, TransposedChoice, linear_weights, row_bucket
from dspark.protocols import CostModel
from dspark.types import GenerationStart, SamplingConfig
from tests.conftest import build_model, tiny_semi_ar_drafter
from tests.strategies import cost_grids


def _steady(base, **options) -> OnlineCorrectedCostModel:
    """An online correction that assumes a steady machine (π = 1): for tests of the cells' own mechanics."""
    return OnlineCorrectedCostModel(base, pace_smoothing=None, **options)


def test_constant_cost_model_ignores_batch_shape():
    """ConstantCostModel charges the same for any rows and tokens and implements CostModel."""
    model = ConstantCostModel(step_seconds=0.07, draft_seconds=0.01)
    assert isinstance(model, CostModel)
    assert model.step_time(1, 1) == model.step_time(16, 8) == 0.07
    assert model.draft_time(4) == 0.01


def test_negative_times_are_refused():
    """Negative seconds are a ValueError naming the field."""
    with pytest.raises(ValueError, match="step_seconds"):
        ConstantCostModel(step_seconds=-1.0)


# -- shared helpers ----------------------------------------------------------------------------

PROPERTY = settings(max_examples=60, deadline=None, derandomize=True)
GRID = dict(rows=(1, 2, 4), tokens=(1, 2, 4))


def _table(function, rows=GRID["rows"], tokens=GRID["tokens"], **extra) -> CostTable:
    """A CostTable with t(R, T) = function(R, T) on the grid."""
    return CostTable(rows=rows, tokens=tokens, step_seconds=[[function(r, t) for t in tokens] for r in rows], **extra)


def _linear_in_batch(rows: float, tokens: float) -> float:
    """10 ms of overhead plus 2 ms per token of the batch: what a compute-bound engine looks like."""
    return 0.01 + 0.002 * rows * tokens


# -- profiled: the monotone surface ----------------------------------------------------------


@PROPERTY
@given(cost_grids())
def test_interpolation_is_exact_at_grid_points_of_a_monotone_table(grid):
    """At every grid point the surface equals the table once the table is monotone (its envelope)."""
    rows, tokens, seconds = grid
    envelope = monotone_envelope(seconds)
    for i, row_count in enumerate(rows):
        for j, token_count in enumerate(tokens):
            assert interpolate_monotone(rows, tokens, envelope, row_count, token_count) == pytest.approx(envelope[i][j], abs=1e-12)


@PROPERTY
@given(cost_grids(), st.lists(st.floats(0.0, 200.0), min_size=2, max_size=2), st.floats(0.0, 200.0))
def test_interpolation_is_monotone_in_rows_and_tokens(grid, pair, other):
    """Inside, below and beyond the grid, a larger rows or tokens value never gives fewer seconds."""
    rows, tokens, seconds = grid
    low, high = sorted(pair)

    def surface(row_count, token_count):
        return interpolate_monotone(rows, tokens, seconds, row_count, token_count)

    assert surface(low, other) <= surface(high, other) + 1e-12
    assert surface(other, low) <= surface(other, high) + 1e-12
    assert surface(low, low) <= surface(high, high) + 1e-12
    far = 1000.0  # far beyond the grid, where the extrapolated slopes decide
    assert surface(far, low) <= surface(far, high) + 1e-9 and surface(low, far) <= surface(high, far) + 1e-9


@PROPERTY
@given(cost_grids())
def test_envelope_is_the_smallest_monotone_table_above_the_measurements(grid):
    """monotone_envelope(t)[i][j] is the largest measurement at or below (i, j) along both axes."""
    _, _, seconds = grid
    envelope = monotone_envelope(seconds)
    for i, row in enumerate(envelope):
        for j, value in enumerate(row):
            assert value == max(seconds[a][b] for a in range(i + 1) for b in range(j + 1))


def test_a_noisy_table_never_makes_a_larger_batch_cheaper():
    """Measured dips in rows (2 rows cheaper than 1) are raised to the smaller batch's time; step times keep their dips
    in tokens (4 tokens cheaper than 2), which drafting times, monotone in depth, do not."""
    seconds = [[0.05, 0.09, 0.07], [0.04, 0.10, 0.12], [0.20, 0.15, 0.30]]
    table = CostTable(rows=(1, 2, 4), tokens=(1, 2, 4), step_seconds=seconds, draft_rows=(1, 2, 4), draft_depths=(1, 2, 4), draft_seconds=seconds)
    assert monotone_envelope(seconds) == [[0.05, 0.09, 0.09], [0.05, 0.10, 0.12], [0.20, 0.20, 0.30]]
    assert monotone_envelope(seconds, along_tokens=False) == [[0.05, 0.09, 0.07], [0.05, 0.10, 0.12], [0.20, 0.15, 0.30]]
    model = ProfiledCostModel(table)
    assert model.step_time(2, 1) == 0.05 and model.step_time(1, 4) == 0.07 and model.step_time(4, 2) == 0.15
    assert model.step_time(3, 1) == pytest.approx((0.05 + 0.20) / 2)  # bilinear between the raised points
    assert model.draft_time(2, 1) == 0.05 and model.draft_time(1, 4) == 0.09 and model.draft_time(4, 2) == 0.20


def test_an_envelope_along_tokens_must_be_asked_for_with_a_bool():
    """along_tokens other than a bool is a TypeError naming it, from the envelope and from the interpolation."""
    with pytest.raises(TypeError, match="along_tokens must be a bool, got 'no'"):
        monotone_envelope([[1.0, 2.0]], along_tokens="no")
    with pytest.raises(TypeError, match="along_tokens must be a bool, got 1"):
        interpolate_monotone((1,), (1, 2), [[1.0, 2.0]], 1, 1, along_tokens=1)


@PROPERTY
@given(cost_grids(), st.lists(st.integers(1, 300), min_size=2, max_size=2), st.integers(1, 300))
def test_profiled_step_times_are_monotone_in_rows_and_never_fall_beyond_the_token_grid(grid, pair, other):
    """A profiled model's step time never decreases in rows anywhere, and beyond the token grid never in tokens."""
    rows, tokens, seconds = grid
    model = ProfiledCostModel(CostTable(rows=rows, tokens=tokens, step_seconds=seconds))
    low, high = sorted(pair)
    assert model.step_time(low, other) <= model.step_time(high, other) + 1e-12
    beyond = max(tokens) + low, max(tokens) + high
    assert model.step_time(other, beyond[0]) <= model.step_time(other, beyond[1]) + 1e-9


def test_interpolation_is_bilinear_between_grid_points():
    """Halfway between grid points in both axes the surface is the mean of the cell's four corners."""
    table = CostTable(rows=(2, 4), tokens=(2, 6), step_seconds=[[1.0, 2.0], [3.0, 7.0]])
    assert interpolate_monotone(table.rows, table.tokens, table.step_seconds, 3, 4) == pytest.approx((1 + 2 + 3 + 7) / 4)
    assert interpolate_monotone(table.rows, table.tokens, table.step_seconds, 2, 3) == pytest.approx(1.25)


def test_extrapolation_is_linear_above_the_grid_and_constant_below():
    """Beyond the grid t = a + b·R·T is continued exactly (slopes and the cross term); below it, the smallest point's time."""
    model = ProfiledCostModel(_table(_linear_in_batch))
    for rows, tokens in [(16, 1), (1, 16), (16, 8), (64, 64), (3, 12)]:
        assert model.step_time(rows, tokens) == pytest.approx(_linear_in_batch(rows, tokens))
    table = _table(_linear_in_batch, rows=(2, 4), tokens=(2, 4))
    assert interpolate_monotone(table.rows, table.tokens, table.step_seconds, 1, 1) == pytest.approx(_linear_in_batch(2, 2))


def test_extrapolation_stays_monotone_where_the_last_slopes_shrink():
    """When the last rows segment rises less at more tokens, the slope used beyond the grid is raised to stay monotone."""
    # rows 1→2 adds 1.0 s at 1 token but 0.5 s at 2 tokens: unmodified, extrapolating far in rows would cross.
    model = ProfiledCostModel(CostTable(rows=(1, 2), tokens=(1, 2), step_seconds=[[1.0, 2.0], [2.0, 2.5]]))
    for rows in (3, 10, 100):
        assert model.step_time(rows, 1) <= model.step_time(rows, 2)


def test_draft_time_comes_from_the_table_or_is_zero():
    """draft_time interpolates draft_seconds over draft_rows (monotone, linear beyond); 0 without drafting times."""
    table = _table(_linear_in_batch, draft_rows=(1, 4), draft_depths=(1,), draft_seconds=((0.004,), (0.002,)))
    model = ProfiledCostModel(table)
    assert model.draft_time(1, 1) == 0.004 and model.draft_time(4, 1) == 0.004  # the dip at 4 rows is raised
    with_slope = ProfiledCostModel(_table(_linear_in_batch, draft_rows=(1, 3), draft_depths=(1,), draft_seconds=((0.002,), (0.004,))))
    assert with_slope.draft_time(2, 1) == pytest.approx(0.003) and with_slope.draft_time(5, 1) == pytest.approx(0.006)
    assert ProfiledCostModel(_table(_linear_in_batch)).draft_time(8, 3) == 0.0


def test_draft_time_prices_the_depth_of_the_pass_and_defaults_to_the_whole_block():
    """draft_time(R, k) interpolates over draft_depths too, never falls with depth, and without k answers the deepest profiled."""
    table = _table(_linear_in_batch, draft_rows=(1, 2), draft_depths=(1, 2, 4), draft_seconds=((0.004, 0.0045, 0.0055), (0.006, 0.0058, 0.008)))
    model = ProfiledCostModel(table)
    assert model.draft_time(1, 1) == 0.004 and model.draft_time(1, 3) == pytest.approx(0.005)
    assert model.draft_time(2, 2) == 0.006  # measured 0.0058 after 0.006 one token shallower: raised, never cheaper deeper
    assert model.draft_time(1) == model.draft_time(1, 4) == 0.0055 and model.draft_time(2) == 0.008
    with pytest.raises(ValueError, match="depth"):
        model.draft_time(1, 0)


def test_profiled_cost_model_implements_the_protocol_and_checks_arguments():
    """ProfiledCostModel is a CostModel; rows and tokens must be ints >= 1, named in the error."""
    model = ProfiledCostModel(_table(_linear_in_batch))
    assert isinstance(model, CostModel)
    with pytest.raises(ValueError, match="rows"):
        model.step_time(0, 1)
    with pytest.raises(TypeError, match="tokens"):
        model.step_time(1, 1.5)
    with pytest.raises(ValueError, match="rows"):
        model.draft_time(0)
    with pytest.raises(ValueError, match="tokens"):
        interpolate_monotone((1,), (1,), [[1.0]], 1, -1)


# -- profiled: the table and its JSON --------------------------------------------------------


def test_cost_table_json_round_trip(tmp_path):
    """to_dict/from_dict and save/load give back an equal table (key and drafting times included) through real JSON."""
    table = _table(_linear_in_batch, draft_rows=(1, 2), draft_depths=(1, 3), draft_seconds=((0.001, 0.0012), (0.002, 0.0025)),
                   key={"model": "tiny", "threads": 2})
    data = json.loads(json.dumps(table.to_dict()))
    assert data["format_version"] == 2
    assert CostTable.from_dict(data) == table and CostTable.from_dict(data).key == table.key
    ProfiledCostModel(table).save(tmp_path / "table.json")
    loaded = ProfiledCostModel.load(tmp_path / "table.json")
    assert loaded.table == table and loaded.step_time(3, 3) == ProfiledCostModel(table).step_time(3, 3)


@pytest.mark.parametrize(
    "change, error, message",
    [
        ({"format_version": 1}, ValueError, "format_version"),  # before drafting times per depth
        ({"format_version": None}, ValueError, "format_version"),
        ({"rows": None}, TypeError, "rows"),
    ],
)
def test_from_dict_refuses_other_versions_and_bad_fields(change, error, message):
    """from_dict refuses another format_version and bad fields, naming them."""
    data = {**_table(_linear_in_batch).to_dict(), **change}
    with pytest.raises(error, match=message):
        CostTable.from_dict(data)


def test_from_dict_names_missing_fields():
    """A dict without step_seconds is refused with the field's name."""
    data = _table(_linear_in_batch).to_dict()
    del data["step_seconds"]
    with pytest.raises(ValueError, match="step_seconds"):
        CostTable.from_dict(data)


@pytest.mark.parametrize(
    "arguments, error, message",
    [
        ({"rows": (2, 1)}, ValueError, "rows must be a non-empty sequence of strictly increasing"),
        ({"rows": ()}, ValueError, "rows"),
        ({"rows": (0, 1)}, ValueError, "rows"),
        ({"rows": (True, 2)}, TypeError, "rows"),
        ({"tokens": (1, 1)}, ValueError, "tokens"),
        ({"tokens": "12"}, TypeError, "tokens"),
        ({"step_seconds": [[0.1, 0.2]]}, ValueError, "step_seconds must have one entry per rows value"),
        ({"step_seconds": [[0.1], [0.2]]}, ValueError, r"step_seconds\[0\] must hold 2 seconds"),
        ({"step_seconds": [[0.1, -0.2], [0.2, 0.3]]}, ValueError, r"step_seconds\[0\]\[1\]"),
        ({"step_seconds": [[0.1, math.nan], [0.2, 0.3]]}, ValueError, r"step_seconds\[0\]\[1\]"),
        ({"step_seconds": [[0.1, "0.2"], [0.2, 0.3]]}, TypeError, r"step_seconds\[0\]\[1\]"),
        ({"draft_rows": (1, 2)}, ValueError, "draft_rows, draft_depths and draft_seconds must all be given"),
        ({"draft_rows": (1, 2), "draft_depths": (1,), "draft_seconds": ((0.1,),)}, ValueError, "draft_seconds must have one entry per rows value"),
        ({"draft_rows": (1, 2), "draft_depths": (1, 1), "draft_seconds": ((0.1,), (0.2,))}, ValueError, "draft_depths"),
        ({"draft_rows": (1, 2), "draft_depths": (1,), "draft_seconds": ((0.1,), (math.inf,))}, ValueError, r"draft_seconds\[1\]\[0\]"),
        ({"key": {"model": object()}}, TypeError, "key must hold only JSON values"),
        ({"key": {1: "a"}}, TypeError, "key must be a dict with str keys"),
    ],
)
def test_cost_table_refuses_bad_fields(arguments, error, message):
    """Unsorted or non-int grids, wrong shapes, negative or non-finite seconds, half-given drafting times and non-JSON keys are refused by name."""
    fields = {"rows": (1, 2), "tokens": (1, 2), "step_seconds": [[0.1, 0.2], [0.2, 0.3]], **arguments}
    with pytest.raises(error, match=message):
        CostTable(**fields)


# -- profiled: measuring and the cache -------------------------------------------------------


@pytest.fixture(scope="module")
def target():
    return build_model("llama")


def test_profile_measures_once_then_loads_the_cache(target, tmp_path, monkeypatch):
    """A first profile measures and writes <hash>.json under cache_dir; a second with the same key and grid measures nothing."""
    calls = {"cost_curve": 0, "draft_curve": 0}
    measured = {name: getattr(profiled_module, name) for name in calls}

    def counted(name):
        def measure(*args, **kwargs):
            calls[name] += 1
            return measured[name](*args, **kwargs)

        return measure

    for name in calls:
        monkeypatch.setattr(profiled_module, name, counted(name))
    settings_ = dict(drafter=PromptLookupDrafter(), rows=(1, 2), tokens=(1, 3), context=8, repeats=1, fast_path=False, cache_dir=tmp_path, progress=False)
    first = ProfiledCostModel.profile(target, **settings_)
    assert calls == {"cost_curve": 1, "draft_curve": 1}
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1 and CostTable.load(files[0]) == first.table
    assert first.table.key == profile_key(target, PromptLookupDrafter(), context=8, repeats=1, fast_path=False, max_draft_tokens=4)
    assert all(seconds > 0 for row in first.table.step_seconds for seconds in row)
    assert first.table.draft_rows == (1, 2) and first.table.draft_depths == (1, 2, 3, 4)
    assert all(seconds > 0 for row in first.table.draft_seconds for seconds in row)

    second = ProfiledCostModel.profile(target, **settings_)
    assert calls == {"cost_curve": 1, "draft_curve": 1}
    assert second.table == first.table

    ProfiledCostModel.profile(target, **{**settings_, "tokens": (1, 2)})  # another grid is another table
    assert calls["cost_curve"] == 2 and len(list(tmp_path.glob("*.json"))) == 2


def test_profile_measures_again_over_a_damaged_or_foreign_cache_file(target, tmp_path):
    """An unreadable cache file, or one measured with another key, is measured over rather than trusted."""
    settings_ = dict(rows=(1,), tokens=(1,), context=4, repeats=1, fast_path=False, cache_dir=tmp_path, progress=False)
    first = ProfiledCostModel.profile(target, **settings_)
    (path,) = tmp_path.glob("*.json")
    path.write_text("{not json")
    assert ProfiledCostModel.profile(target, **settings_).table.key == first.table.key
    foreign = CostTable(rows=(1,), tokens=(1,), step_seconds=[[123.0]], key={"model": "another"})
    foreign.save(path)
    assert ProfiledCostModel.profile(target, **settings_).table.step_seconds != ((123.0,),)


def test_profile_times_a_drafter_that_reads_target_features(target, tmp_path):
    """A drafter with target_layers (the semi-AR drafter) is started, fed the target's features and timed."""
    drafter = tiny_semi_ar_drafter(target, max_draft_tokens=3)
    model = ProfiledCostModel.profile(target, drafter, rows=(1, 3), tokens=(1, 4), context=6, repeats=2, fast_path=False,
                                      cache_dir=tmp_path, progress=False)
    assert model.table.key["drafter"].startswith("SemiARDrafter") and model.table.key["max_draft_tokens"] == 3
    assert model.table.draft_depths == (1, 2, 3) and all(seconds > 0 for row in model.table.draft_seconds for seconds in row)
    assert model.draft_time(2, 1) > 0


@pytest.mark.parametrize("copies", [True, False])
def test_the_key_records_whether_one_row_products_read_copies(target, tmp_path, monkeypatch, copies):
    """The table's key carries the fast path's one-row choice, so a table timed under the other one is measured
    again rather than read."""
    # Packed copies timed fastest, so that the target's weights hold copies whatever this machine's timings.
    monkeypatch.setattr(fast_path_module, "_seconds", lambda function, *_: 1.0 if inspect.getclosurevars(function).nonlocals["formulation"] == "packed" else 2.0)
    monkeypatch.setattr(FastPath, "_time_one_row", lambda self, model, weights, progress, forward: OneRowChoice(seconds_without=2.0, seconds_with=1.0 if copies else 2.0))
    path = FastPath.for_model(target, cache_dir=tmp_path, progress=False)
    assert path.one_row_copies(target) is copies
    model = ProfiledCostModel.profile(target, rows=(1,), tokens=(1,), context=4, repeats=1, fast_path=path, cache_dir=tmp_path, progress=False)
    assert model.table.key["one_row_copies"] is copies
    path._use_one_row(list(linear_weights(target)), not copies)  # as if measured again with the other outcome
    again = ProfiledCostModel.profile(target, rows=(1,), tokens=(1,), context=4, repeats=1, fast_path=path, cache_dir=tmp_path, progress=False)
    assert again.table.key["one_row_copies"] is not copies
    assert len([table for table in tmp_path.glob("*.json") if not table.name.startswith("linear_choices")]) == 2
    assert ProfiledCostModel.profile(target, rows=(1,), tokens=(1,), context=4, repeats=1, fast_path=False, cache_dir=tmp_path, progress=False).table.key["one_row_copies"] is None


def test_the_key_records_at_which_row_counts_products_run_transposed(target, tmp_path, monkeypatch):
    """The table's key carries the fast path's few-row choice (``FastPath.transposed_rows``), so a table timed under
    another one is measured again rather than read; without the fast path it is None."""
    faster = {2}
    monkeypatch.setattr(FastPath, "_time_transposed", lambda self, model, weights, counts, progress: {
        count: TransposedChoice(rows=count, seconds_ranked=2.0, seconds_transposed=1.0 if count in faster else 2.0) for count in counts
    })
    path = FastPath.for_model(target, cache_dir=tmp_path, progress=False)
    settings_ = dict(rows=(1,), tokens=(1,), context=4, repeats=1, cache_dir=tmp_path, progress=False)
    assert ProfiledCostModel.profile(target, fast_path=path, **settings_).table.key["transposed_rows"] == [2]
    faster.update({1, 3})  # measured again (another day), with another outcome
    path._transposed.clear()
    path.measure_transposed(target)
    assert ProfiledCostModel.profile(target, fast_path=path, **settings_).table.key["transposed_rows"] == [1, 2, 3]
    assert len([table for table in tmp_path.glob("*.json") if not table.name.startswith("linear_choices")]) == 2
    assert ProfiledCostModel.profile(target, fast_path=False, **settings_).table.key["transposed_rows"] is None


@pytest.mark.parametrize("copies", [True, False])
def test_the_key_records_whether_a_drafters_one_row_products_read_copies(target, tmp_path, monkeypatch, copies):
    """The key also carries the drafter's one-row choice (measured when the profile resolves its fast path): a table
    whose drafting passes were timed under the other one is measured again rather than read."""
    monkeypatch.setattr(fast_path_module, "_seconds", lambda function, *_: 1.0 if inspect.getclosurevars(function).nonlocals["formulation"] == "packed" else 2.0)
    outcome = {"copies": copies}
    monkeypatch.setattr(FastPath, "_time_one_row", lambda self, model, weights, progress, forward: OneRowChoice(seconds_without=2.0, seconds_with=1.0 if outcome["copies"] else 2.0))
    drafter = tiny_semi_ar_drafter(target, max_draft_tokens=2)
    path = FastPath.for_model(target, cache_dir=tmp_path, copy_budget=0, progress=False)
    settings_ = dict(rows=(1,), tokens=(1, 2), context=4, repeats=1, fast_path=path, cache_dir=tmp_path, progress=False)
    model = ProfiledCostModel.profile(target, drafter, **settings_)
    assert path.one_row_copies(drafter) is copies and model.table.key["drafter_one_row_copies"] is copies
    outcome["copies"] = not copies  # measured again (another day), with the other outcome
    path._one_row.clear()
    assert ProfiledCostModel.profile(target, drafter, **settings_).table.key["drafter_one_row_copies"] is not copies
    assert ProfiledCostModel.profile(target, **settings_).table.key["drafter_one_row_copies"] is None


def test_profile_runs_the_forwards_on_a_given_fast_path(target, tmp_path):
    """With a FastPath instance the timed forwards are routed through it (it has measured their shapes) and the key says so,
    with the fast path's revision (a table timed on an earlier fast path is measured again)."""
    path = FastPath()
    model = ProfiledCostModel.profile(target, rows=(2,), tokens=(3,), context=4, repeats=1, fast_path=path, cache_dir=tmp_path, progress=False)
    assert model.table.key["fast_path"] is True and model.table.key["fast_path_revision"] == REVISION
    assert model.table.key["profiling_revision"] == PROFILING_REVISION
    assert 6 in {choice.rows for choice in path.choices()}


@pytest.mark.parametrize(
    "arguments, error, message",
    [
        ({"rows": (4, 2)}, ValueError, "rows"),
        ({"tokens": ()}, ValueError, "tokens"),
        ({"context": 0}, ValueError, "context"),
        ({"repeats": 0}, ValueError, "repeats"),
        ({"fast_path": "yes"}, TypeError, "fast_path"),
        ({"drafter": PromptLookupDrafter(), "max_draft_tokens": 0}, ValueError, "max_draft_tokens"),
    ],
)
def test_profile_refuses_bad_arguments(target, tmp_path, arguments, error, message):
    """profile refuses bad grids, context, repeats, fast_path and draft width before measuring anything."""
    with pytest.raises(error, match=message):
        ProfiledCostModel.profile(target, cache_dir=tmp_path, progress=False, **arguments)
    assert not list(tmp_path.iterdir())


# -- roofline --------------------------------------------------------------------------------


SLOW_DEVICE = DeviceSpec("test", memory_bandwidth=1e9, peak_flops={"float32": 1e9}, overhead_seconds=0.01)


def test_roofline_is_the_slower_of_memory_and_compute_plus_overhead():
    """1e8 weight bytes at 1 GB/s take 0.1 s; 1e6 FLOPs per token at 1 GFLOP/s take 1 ms a token; overhead 10 ms."""
    model = RooflineCostModel(parameter_bytes=1e8, flops_per_token=1e6, device=SLOW_DEVICE, dtype="float32")
    assert isinstance(model, CostModel)
    assert model.step_time(1, 1) == pytest.approx(0.01 + 0.1)  # memory-bound: weights read once
    assert model.step_time(10, 10) == pytest.approx(0.01 + 0.1)  # 100 tokens: 0.1 s of compute, a tie
    assert model.step_time(20, 10) == pytest.approx(0.01 + 0.2)  # compute-bound beyond
    with_cache = RooflineCostModel(parameter_bytes=1e8, flops_per_token=1e6, device=SLOW_DEVICE, dtype="float32",
                                   kv_bytes_per_token=1e3, context=1000, draft_seconds=0.005)
    assert with_cache.step_time(50, 1) == pytest.approx(0.01 + (1e8 + 1e3 * 1000 * 50) / 1e9)  # every row reads its cache
    assert with_cache.draft_time(7) == 0.005


def test_roofline_for_a_model_counts_its_weights_products_and_cache():
    """for_model: P = 4 bytes per float32 parameter, F = 2 per parameter in a product, K from the config; bfloat16 halves the bytes."""
    model = build_model("llama")  # untied: the input embedding is a lookup
    count = sum(parameter.numel() for parameter in model.parameters())
    embedding = model.get_input_embeddings().weight.numel()
    roofline = RooflineCostModel.for_model(model, "h200", context=100)
    assert roofline.parameter_bytes == 4 * count and roofline.flops_per_token == 2 * (count - embedding)
    assert roofline.kv_bytes_per_token == 2 * 2 * 2 * 8 * 4  # keys and values × 2 layers × 2 KV heads × head width 8 × 4 bytes
    assert roofline.dtype == "float32" and roofline.device == DEVICES["h200"] and roofline.context == 100
    assert RooflineCostModel.for_model(model, "h200", dtype=torch.bfloat16).parameter_bytes == 2 * count
    tied = build_model("gpt2")  # GPT-2 ties its LM head to the input embedding: every weight is in a product
    tied_count = sum(parameter.numel() for parameter in tied.parameters())
    assert RooflineCostModel.for_model(tied, "h100-sxm").flops_per_token == 2 * tied_count


def test_shipped_devices_carry_the_data_sheet_numbers():
    """H100 SXM: 3.35 TB/s, H200: 4.8 TB/s, both 989 TFLOP/s dense BF16; this-cpu was measured (all positive)."""
    assert DEVICES["h100-sxm"].memory_bandwidth == 3.35e12 and DEVICES["h200"].memory_bandwidth == 4.8e12
    assert DEVICES["h100-sxm"].peak("bfloat16") == DEVICES["h200"].peak(torch.bfloat16) == 989e12
    cpu = DEVICES["this-cpu"]
    assert cpu.memory_bandwidth > 0 and cpu.peak("float32") > 0 and cpu.overhead_seconds > 0


def test_measure_cpu_spec_measures_bandwidth_flops_and_overhead():
    """A small measure_cpu_spec run gives positive bandwidth, float32 and bfloat16 peaks and overhead."""
    spec = measure_cpu_spec("mine", copy_megabytes=4, matrix_size=64, repeats=1)
    assert spec.name == "mine" and spec.memory_bandwidth > 0 and spec.overhead_seconds > 0
    assert set(spec.peak_flops) == {"float32", "bfloat16"} and all(value > 0 for value in spec.peak_flops.values())


@pytest.mark.parametrize(
    "build, error, message",
    [
        (lambda: DeviceSpec("x", memory_bandwidth=0, peak_flops={"float32": 1.0}), ValueError, "memory_bandwidth"),
        (lambda: DeviceSpec("x", memory_bandwidth=1.0, peak_flops={}), TypeError, "peak_flops"),
        (lambda: DeviceSpec("x", memory_bandwidth=1.0, peak_flops={"float32": -1.0}), ValueError, "peak_flops"),
        (lambda: DeviceSpec("x", memory_bandwidth=1.0, peak_flops={"float32": 1.0}, overhead_seconds=-1), ValueError, "overhead_seconds"),
        (lambda: RooflineCostModel(1.0, 1.0, "tpu-v9"), ValueError, "device must be a DeviceSpec or one of"),
        (lambda: RooflineCostModel(1.0, 1.0, SLOW_DEVICE, dtype="bfloat16"), ValueError, "dtype must be one of"),
        (lambda: RooflineCostModel(0, 1.0, SLOW_DEVICE, dtype="float32"), ValueError, "parameter_bytes"),
        (lambda: RooflineCostModel(1.0, 1.0, SLOW_DEVICE, dtype="float32", context=-1), ValueError, "context"),
        (lambda: RooflineCostModel(1.0, 1.0, SLOW_DEVICE, dtype="float32").step_time(1, 0), ValueError, "tokens"),
        (lambda: RooflineCostModel.for_model("model", "h200"), TypeError, "model"),
        (lambda: measure_cpu_spec(repeats=0), ValueError, "repeats"),
    ],
)
def test_roofline_refuses_bad_specs(build, error, message):
    """Non-positive bandwidth or peaks, negative overhead, unknown devices or dtypes and bad arguments are refused by name."""
    with pytest.raises(error, match=message):
        build()


# -- auto-profiled: a table per generation shape -----------------------------------------------


def _start(rows: int, prompt: int | None, max_length: int) -> GenerationStart:
    return GenerationStart(rows=rows, device=torch.device("cpu"), max_draft_tokens=3, max_length=max_length,
                           sampling=SamplingConfig(), prompt_length=prompt)


def test_context_band_rounds_to_the_nearest_half_octave_and_never_below_the_base():
    """context_band: the base at or below it, else the nearest of base·2^(k/2) by ratio (256, 362, 512, 724, ...)."""
    assert [context_band(value) for value in (0, 100, 256, 300, 310, 420, 500, 612, 834, 1024)] == [256, 256, 256, 256, 362, 362, 512, 724, 724, 1024]
    assert context_band(90, base=64) == 91
    with pytest.raises(ValueError, match="context"):
        context_band(-1)


def test_rows_grid_doubles_the_base_until_it_reaches_the_batch():
    """rows_grid keeps the base rows and adds doublings of the largest until one is >= rows."""
    assert rows_grid(3) == (1, 2, 4, 8) and rows_grid(8) == (1, 2, 4, 8)
    assert rows_grid(9) == (1, 2, 4, 8, 16) and rows_grid(32) == (1, 2, 4, 8, 16, 32) and rows_grid(20, (1, 3)) == (1, 3, 6, 12, 24)
    with pytest.raises(ValueError, match="base"):
        rows_grid(4, (2, 1))


def test_mean_context_is_the_prompt_plus_half_the_new_tokens():
    """mean_context: P + N/2 from the prompt length, or max_length where the prompt length is unknown."""
    assert mean_context(_start(2, 700, 764)) == 732 and mean_context(_start(2, None, 764)) == 764
    with pytest.raises(ValueError, match="prompt_length"):
        _start(2, 800, 764)


def test_profile_key_tells_processors_of_one_line_apart(target, tmp_path):
    """Two processors that a virtual machine names alike ("AMD EPYC") but of other families are other devices in a
    table's key: the key names the processor as fast_path.processor_name does, family and model included."""
    names = []
    for family, model in (("25", "17"), ("26", "2")):
        cpuinfo = tmp_path / f"cpuinfo_{family}"
        cpuinfo.write_text(f"processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: {family}\nmodel\t\t: {model}\nmodel name\t: AMD EPYC\nstepping\t: 1\n")
        names.append(fast_path_module.processor_name(cpuinfo))
    assert names[0].startswith("AMD EPYC (cpu family 25, model 17, stepping 1)") and names[1].startswith("AMD EPYC (cpu family 26, model 2, stepping 1)")
    assert profile_key(target)["device"] == f"cpu {fast_path_module.processor_name()}"


def test_profile_key_tells_cascades_apart_by_their_parts(target):
    """A cascade's table key counts its parts' parameters: cascades of other drafters never share a table."""
    from dspark.drafters import CascadeDrafter
    from dspark.verify import DraftProbability

    def cascade(drafter):
        return CascadeDrafter([(PromptLookupDrafter(), DraftProbability()), (drafter, DraftProbability())])

    markov, rnn = tiny_semi_ar_drafter(target), tiny_semi_ar_drafter(target, sequential="rnn")
    keys = [profile_key(target, drafter)["drafter"] for drafter in (cascade(markov), cascade(rnn), markov)]
    markov_parameters = sum(parameter.numel() for parameter in markov.parameters())
    assert keys[0] == f"CascadeDrafter {markov_parameters}" and keys[2] == f"SemiARDrafter {markov_parameters}"
    assert keys[0] != keys[1]
    assert profile_key(target, PromptLookupDrafter())["drafter"] == "PromptLookupDrafter None"


def test_auto_profiled_model_profiles_each_shape_once_and_answers_from_the_current_one(target, tmp_path, monkeypatch):
    """The base shape is profiled at once; start switches to a generation's (rows grid, context band), profiling a
    shape only the first time (memory, then the disk cache), and says whether the answering table changed."""
    shapes = []
    measure = profiled_module.ProfiledCostModel.profile.__func__

    def counted(cls, target_, drafter=None, **kwargs):
        shapes.append((kwargs["rows"], kwargs["context"]))
        return measure(cls, target_, drafter, **kwargs)

    monkeypatch.setattr(ProfiledCostModel, "profile", classmethod(counted))
    settings_ = dict(tokens=(1, 2), base_rows=(1, 2), base_context=8, repeats=1, fast_path=False, cache_dir=tmp_path, progress=False)
    model = AutoProfiledCostModel(target, PromptLookupDrafter(), **settings_)
    assert isinstance(model, CostModel) and shapes == [((1, 2), 8)] and model.current_shape == ((1, 2), 8)
    assert model.start(_start(2, 4, 10)) is False and len(shapes) == 1  # fits the base shape: same table
    assert model.start(_start(3, 20, 24)) is True and model.current_shape == ((1, 2, 4), 23)
    assert model.table.rows == (1, 2, 4) and model.table.key["context"] == 23
    assert model.step_time(3, 2) == model.current.step_time(3, 2) and model.draft_time(4) == model.current.draft_time(4)
    assert model.start(_start(2, 4, 10)) is True and model.start(_start(4, 20, 24)) is True
    assert shapes == [((1, 2), 8), ((1, 2, 4), 23)]  # each shape measured once
    again = AutoProfiledCostModel(target, PromptLookupDrafter(), **settings_)
    again.start(_start(3, 20, 24))
    assert again.table == model.table and len(list(tmp_path.glob("*.json"))) == 2  # read from the disk cache
    with pytest.raises(TypeError, match="generation"):
        model.start("32 rows")


def test_online_correction_keeps_its_corrections_per_table_of_its_base(target, tmp_path):
    """Behind an AutoProfiledCostModel, what OnlineCorrectedCostModel learnt on one table stays with that table: a
    generation on another table answers from that table's profile, one back on the first resumes the corrections learnt
    there, and the pace π is kept across tables."""
    base = AutoProfiledCostModel(target, tokens=(1, 2), base_rows=(1, 2), base_context=8, repeats=1, fast_path=False, cache_dir=tmp_path, progress=False)
    model = OnlineCorrectedCostModel(base, smoothing=0.5)
    for _ in range(10):
        model.observe_step(2, 2, 10.0)
    learnt, pace = model.step_correction(2, 2), model.report()["pace"]
    assert learnt > 1.5 and pace != 1.0
    assert model.start(_start(2, 4, 10)) is False and model.step_correction(2, 2) == learnt
    assert model.start(_start(4, 20, 24)) is True and model.step_correction(2, 2) == 1.0
    assert model.step_time(4, 2) == pytest.approx(base.current.step_time(4, 2) * pace) and model.report()["tables"] == 2
    model.observe_step(4, 2, 1.0)
    assert model.start(_start(2, 4, 10)) is True and model.step_correction(2, 2) == learnt
    assert model.report()["pace"] == pace  # the new table's first observation moved no π, and the switch kept it
    assert model.start(_start(4, 20, 24)) is True and model.step_correction(4, 2) != 1.0


class _UnnamedTables(ConstantCostModel):
    """A cost model whose start says its answers changed at every generation, without naming its table."""

    def start(self, generation: GenerationStart) -> bool:
        return True


class _OneNamedTable(_UnnamedTables):
    """Likewise, naming the same table every time."""

    table_key = "the table"


class _ListKeyed(ConstantCostModel):
    """A cost model that names its table with an unhashable list."""

    table_key = ["the table"]


@pytest.mark.parametrize("base_type", [_UnnamedTables, _OneNamedTable])
def test_online_correction_forgets_everything_when_its_base_changes_answers_without_naming_another_table(base_type):
    """A base whose start says its answers changed with no table_key, or the same one, makes OnlineCorrectedCostModel
    forget its corrections and the pace; a base whose start says nothing changed keeps them."""
    model = OnlineCorrectedCostModel(base_type(step_seconds=0.1), smoothing=0.5)
    for _ in range(10):
        model.observe_step(2, 2, 0.3)
    assert model.step_correction(2, 2) > 1.5 and model.report()["pace"] != 1.0
    assert model.start(_start(2, 4, 10)) is True
    assert model.step_correction(2, 2) == 1.0 and model.report()["pace"] == 1.0 and model.report()["tables"] == 1
    steady = OnlineCorrectedCostModel(ConstantCostModel(step_seconds=0.1), smoothing=0.5)
    for _ in range(10):
        steady.observe_step(2, 2, 0.3)
    assert steady.start(_start(1, 1, 2)) is False and steady.step_correction(2, 2) > 1.5


def test_online_correction_refuses_a_base_whose_table_key_is_unhashable():
    """A base's table_key that cannot key the corrections is a TypeError naming base.table_key and the value."""
    with pytest.raises(TypeError, match=r"base.table_key of _ListKeyed must be a hashable value .*got \['the table'\]"):
        OnlineCorrectedCostModel(_ListKeyed(step_seconds=0.1))


def test_auto_profiled_model_refuses_bad_arguments(target, tmp_path):
    """A target that is not a module, or a bad grid or context, is refused by name before anything is measured."""
    with pytest.raises(TypeError, match="target"):
        AutoProfiledCostModel("smollm2", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="base_rows"):
        AutoProfiledCostModel(target, base_rows=(4, 2), cache_dir=tmp_path)
    with pytest.raises(ValueError, match="base_context"):
        AutoProfiledCostModel(target, base_context=0, cache_dir=tmp_path)


# -- online correction ----------------------------------------------------------------------


def test_online_correction_converges_to_observed_times():
    """Steps observed at twice the base's time pull that cell's prediction to within 1% of the observation; an unobserved
    step cell follows a narrower observed one, else stays at the profile, and an unobserved drafting cell follows g."""
    model = OnlineCorrectedCostModel(ConstantCostModel(step_seconds=0.1), smoothing=0.1)
    assert isinstance(model, CostModel) and model.step_time(4, 3) == 0.1
    for _ in range(60):
        model.observe_step(4, 3, 0.2)
    assert model.step_time(4, 3) == pytest.approx(0.2, rel=0.01)
    assert model.step_correction(4, 3) * model.report()["pace"] == pytest.approx(2.0, rel=0.01)
    assert model.step_time(4, 5) == pytest.approx(0.2, rel=0.01)  # a wider unobserved cell follows its narrower one
    assert model.step_time(1, 1) == 0.1  # an unobserved cell with none narrower stays at the profile until observed
    drafting = OnlineCorrectedCostModel(ConstantCostModel(step_seconds=0.1, draft_seconds=0.004), smoothing=1.0)
    drafting.observe_draft(4, 0.008, 1)
    assert drafting.draft_time(1, 1) == pytest.approx(0.008)  # a drafting cell follows g: only drafting would observe it


def test_online_correction_learns_greedy_and_sampled_generations_apart():
    """Steps of sampled generations observed at twice the base's time correct sampled generations only: a greedy
    generation starts from the base, and the sampled correction is back when a sampled generation starts again."""
    model = _steady(ConstantCostModel(step_seconds=0.1), smoothing=0.5)
    greedy = GenerationStart(rows=1, device=torch.device("cpu"), max_draft_tokens=3, max_length=8, sampling=SamplingConfig())
    sampled = attrs.evolve(greedy, sampling=SamplingConfig(do_sample=True, temperature=1.0))
    model.start(sampled)
    for _ in range(30):
        model.observe_step(1, 2, 0.2)
    assert model.step_time(1, 2) == pytest.approx(0.2)
    model.start(greedy)
    assert model.step_time(1, 2) == 0.1 and model.step_correction(1, 2) == 1.0
    model.start(sampled)
    assert model.step_time(1, 2) == pytest.approx(0.2)
    with pytest.raises(TypeError, match="generation must be a GenerationStart"):
        model.start("greedy")


def test_online_correction_is_per_cell_and_stays_monotone():
    """A cell observed faster than the rest keeps its own correction, and no larger batch drops below it."""
    base = ProfiledCostModel(_table(_linear_in_batch))
    model = _steady(base, smoothing=0.5)
    for _ in range(30):
        model.observe_step(1, 1, 0.5 * base.step_time(1, 1))
        model.observe_step(4, 4, 3.0 * base.step_time(4, 4))
    assert model.step_time(1, 1) == pytest.approx(0.5 * base.step_time(1, 1), rel=1e-3)
    assert model.step_time(4, 4) == pytest.approx(3.0 * base.step_time(4, 4), rel=1e-3)
    # (5, 4) is an unobserved cell whose own correction (the global one, ≈1.75) would make it cheaper than (4, 4).
    assert model.step_time(5, 4) >= model.step_time(4, 4)


def test_an_unobserved_smaller_cell_never_prices_an_observed_larger_one_above_what_it_took():
    """A profile whose one-row entry was timed in a burst of noise (above its four-row one) does not raise the observed
    four-row step's price through the cumulative maximum: unobserved cells answer at most what observed cells above
    them took, while without observations the profile's envelope stands."""
    base = ProfiledCostModel(CostTable(rows=(1, 2, 4), tokens=(1, 2), step_seconds=((0.041, 0.043), (0.031, 0.047), (0.030, 0.037))))
    model = _steady(base, smoothing=0.1)
    assert model.step_time(4, 1) == pytest.approx(0.041)  # the envelope of the profile
    for _ in range(40):  # drafted steps took what the profile said; one-token steps less than its envelope
        model.observe_step(4, 2, 0.047)
        model.observe_step(4, 1, 0.029)
    assert model.step_time(4, 1) == pytest.approx(0.029, rel=1e-3)  # not 0.041 times the global correction
    assert model.step_time(1, 1) <= model.step_time(2, 1) <= model.step_time(4, 1)
    assert model.step_time(4, 2) >= model.step_time(4, 1)  # unobserved above: still monotone
    table = CostTable(rows=(1, 4), tokens=(1, 2), step_seconds=((0.03, 0.03), (0.03, 0.03)),
                      draft_rows=(1, 4), draft_depths=(1, 2), draft_seconds=((0.012, 0.013), (0.006, 0.007)))
    drafting = _steady(ProfiledCostModel(table), smoothing=0.1)
    assert drafting.draft_time(4, 1) == pytest.approx(0.012)
    for _ in range(20):
        drafting.observe_draft(4, 0.006, 1)
    assert drafting.draft_time(4, 1) == pytest.approx(0.006) and drafting.draft_time(4, 2) >= drafting.draft_time(4, 1)


def _spells(model, slow_one_token_steps=(8, 12, 16)):
    """Feed ``model`` 40 two-token steps at four rows in a fast spell, 20 in a spell 1.4x as slow during which three
    one-token steps are seen, then 40 fast ones again (profile: 30 ms one token, 35 ms two)."""
    for _ in range(40):
        model.observe_step(4, 2, 0.035)
    for step in range(20):
        model.observe_step(4, 2, 0.049)
        if step in slow_one_token_steps:
            model.observe_step(4, 1, 0.042)
    for _ in range(40):
        model.observe_step(4, 2, 0.035)


def test_a_cell_seen_only_in_a_slow_spell_keeps_the_price_of_a_second_token():
    """A one-token cell seen only while the machine ran 1.4x slower is learnt at the usual pace, so a second token
    keeps costing what the profile says; without the pace the one-token step is priced dearer than two tokens."""
    base = ProfiledCostModel(CostTable(rows=(4,), tokens=(1, 2), step_seconds=((0.030, 0.035),)))
    paced, steady = OnlineCorrectedCostModel(base), _steady(base)
    _spells(paced)
    _spells(steady)
    assert paced.step_time(4, 2) / paced.step_time(4, 1) > 1.1  # the profile's 1.17, less what the cells learnt before π caught up
    assert paced.step_time(4, 2) == pytest.approx(0.035, rel=0.01)
    assert steady.step_time(4, 1) == pytest.approx(0.042) and steady.step_time(4, 2) < steady.step_time(4, 1)


def test_an_observed_larger_batch_bounds_unobserved_cells_of_smaller_row_buckets():
    """Above 16 rows a bucket spans many counts: an observed 64-row step bounds a smaller unobserved cell at its least
    point (33 rows), so a 20-row step is priced at most what the 64-row step's correction gives 33 rows, not 64."""
    base = ProfiledCostModel(CostTable(rows=(1, 64), tokens=(1, 8), step_seconds=((0.01, 0.02), (0.064, 0.128))))
    model = _steady(base, smoothing=1.0)
    model.observe_step(64, 8, 0.256)  # a dearer wide step: g = 2
    model.observe_step(64, 1, 0.032)  # half the profile: k(64, 1) = 0.5, g = 0.5 ...
    model.observe_step(64, 8, 0.256)  # ... and 2 again: unobserved cells take the least of 1 and g, 1
    assert model.step_time(20, 1) == pytest.approx(0.5 * base.step_time(33, 1))  # not the profile's base.step_time(20, 1)
    assert base.step_time(20, 1) > 0.5 * base.step_time(33, 1) > 0.5 * base.step_time(1, 1)
    assert model.step_time(64, 1) == pytest.approx(0.032) and model.step_time(20, 8) == pytest.approx(base.step_time(20, 8))

def test_the_pace_prices_drafting_passes_too():
    """π, learnt from steps, multiplies drafting times as well (per depth and for a whole block), so a slow spell moves
    a step's price and its drafting's alike; steps that took no time, where the base knows no step times, leave π
    at 1 and divide by nothing."""
    model = OnlineCorrectedCostModel(ConstantCostModel(step_seconds=0.03, draft_seconds=0.005))
    for _ in range(20):
        model.observe_step(2, 2, 0.03)
    before = (model.draft_time(2, 3), model.draft_time(2))
    for _ in range(10):
        model.observe_step(2, 2, 0.045)
    pace = model.report()["pace"]
    assert pace > 1.3 and (model.draft_time(2, 3), model.draft_time(2)) == pytest.approx((before[0] * pace, before[1] * pace))
    seconds_only = OnlineCorrectedCostModel(ConstantCostModel(step_seconds=0.0, draft_seconds=0.0), smoothing=1.0)
    for _ in range(4):
        seconds_only.observe_step(1, 1, 0.0)
    assert seconds_only.step_time(1, 1) == 0.0 and seconds_only.report()["pace"] == 1.0


def test_the_pace_follows_a_spell_and_holds_a_lasting_change():
    """π follows a slower spell within a few steps and holds it while it lasts; the cell keeps its k; a forming median does not move π."""
    model = OnlineCorrectedCostModel(ConstantCostModel(step_seconds=0.03))
    for _ in range(3):
        model.observe_step(2, 1, 0.06)
    assert model.report()["pace"] == 1.0  # the cell's median is still forming: its error is its own
    for _ in range(30):
        model.observe_step(2, 1, 0.03)
    for _ in range(5):
        model.observe_step(2, 1, 0.045)
    assert model.report()["pace"] > 1.25 and model.step_time(2, 1) == pytest.approx(0.045, rel=0.1)
    for _ in range(2000):
        model.observe_step(2, 1, 0.045)
    assert model.report()["pace"] > 1.4 and model.step_time(2, 1) == pytest.approx(0.045, rel=0.01)
    assert model.step_correction(2, 1) < 1.1


def _one_row_stretch(model, noise: random.Random, steps: int, often: tuple, rarely: tuple, every: int, spread: float) -> None:
    """``steps`` one-row steps of (tokens, seconds) ``often``, the first of every ``every`` followed by one of ``rarely``,
    each time scaled by a uniform draw within ±``spread``."""
    for step in range(steps):
        model.observe_step(1, often[0], often[1] * noise.uniform(1 - spread, 1 + spread))
        if step % every == 0:
            model.observe_step(1, rarely[0], rarely[1] * noise.uniform(1 - spread, 1 + spread))


def test_a_cell_seen_rarely_after_a_lasting_change_keeps_its_price_against_one_seen_often():
    """A slow stretch with two-token steps seen often, then a fast one with them seen rarely: a second token keeps the profile's 1.1x."""
    # Were a lasting change to pass into each cell at its own rate, the one-token cell, seen on every step, would learn
    # the fast machine long before the two-token cell, and a second token would look 1.2x as dear (from a trace at c = 1,
    # where it read 1.4x and the fallback stopped drafting).
    base = ProfiledCostModel(CostTable(rows=(1,), tokens=(1, 2), step_seconds=((0.025, 0.0275),)))
    model = OnlineCorrectedCostModel(base)
    noise = random.Random(0)
    _one_row_stretch(model, noise, 300, often=(1, 0.040), rarely=(2, 0.044), every=2, spread=0.1)
    _one_row_stretch(model, noise, 2000, often=(1, 0.025), rarely=(2, 0.0275), every=50, spread=0.1)
    assert model.step_time(1, 2) / model.step_time(1, 1) == pytest.approx(1.1, rel=0.03)
    assert model.step_time(1, 1) == pytest.approx(0.025, rel=0.1)


@pytest.mark.parametrize("seed", range(3))
def test_skewed_steps_of_a_cell_seen_often_do_not_drift_the_price_of_one_seen_rarely(seed):
    """Log-normal step times (a shared CPU's spikes skew them) on a cell seen on every step keep a cell seen only at
    first within 10% of its true price against it, however many steps pass."""
    # π learnt against the cells' current answers, which learn s/π in turn, left π and the often-seen cell's k free to
    # trade a factor, and the skew traded it one way (E[1/x] > 1/E[x]): π rose and that k fell a little every step, and
    # after 3000 steps the one-token cell, seen only at first, was priced about 3x the two-token one it equals here.
    model = OnlineCorrectedCostModel(ConstantCostModel(step_seconds=0.1))
    noise = random.Random(seed)
    for _ in range(20):
        model.observe_step(1, 1, 0.1 * noise.lognormvariate(0, 0.15))
        model.observe_step(1, 2, 0.1 * noise.lognormvariate(0, 0.15))
    for step in range(3000):
        model.observe_step(1, 2, 0.1 * noise.lognormvariate(0, 0.15))
        if step % 500 == 499:
            assert model.step_time(1, 1) / model.step_time(1, 2) == pytest.approx(1.0, abs=0.1)


def _anchored_slow(seed: int) -> tuple[OnlineCorrectedCostModel, random.Random]:
    """A model (profile 0.1 s a step) whose two-token cell at one row settled at the profile and whose one-token cell
    formed its median while its steps ran 20% slow (each within ±5%), and the seeded noise that drew them."""
    model = OnlineCorrectedCostModel(ConstantCostModel(step_seconds=0.1))
    noise = random.Random(seed)
    for _ in range(30):
        model.observe_step(1, 2, 0.1 * noise.uniform(0.95, 1.05))
    for _ in range(12):
        model.observe_step(1, 1, 0.12 * noise.uniform(0.95, 1.05))
    return model, noise


@pytest.mark.parametrize("seed", range(3))
def test_a_cell_that_settled_in_a_slow_spell_and_is_seen_rarely_converges_to_its_price(seed):
    """A one-token cell whose median formed while its steps ran 20% slow, then seen on one step in ten beside a
    two-token cell that sets π, comes to within 2% of what its steps take."""
    # Divided by a π its own step had just pulled towards its anchor, it kept about 9% of that error for good.
    model, noise = _anchored_slow(seed)
    _one_row_stretch(model, noise, 3000, often=(2, 0.1), rarely=(1, 0.1), every=10, spread=0.05)
    assert model.step_time(1, 1) / model.step_time(1, 2) == pytest.approx(1.0, abs=0.02)


@pytest.mark.parametrize("seed", range(3))
def test_cells_seen_in_stretches_correct_an_anchor_that_settled_in_a_slow_spell(seed):
    """A one-token cell whose median formed while its steps ran 20% slow, then seen in stretches of ten steps that take
    turns with a two-token cell's, comes to within 3% of its price: consecutive steps of the two correct the anchors."""
    # With anchors fixed where the medians left them, π in each stretch read against that stretch's anchor, the cell
    # learnt that anchor back, and a one-token step stayed priced 11-17% above a two-token one that costs as much
    # (as in a trace at two rows, where DSpark took its steps in such stretches and priced a second token at 1.08x
    # the first, for steps that took 1.2x).
    model, noise = _anchored_slow(seed)
    for _ in range(300):
        for tokens in (2, 1):
            for _ in range(10):
                model.observe_step(1, tokens, 0.1 * noise.uniform(0.95, 1.05))
    assert model.step_time(1, 1) / model.step_time(1, 2) == pytest.approx(1.0, abs=0.03)


def test_a_contrast_moves_the_later_anchor_towards_its_reading_and_keeps_the_product_of_the_two():
    """A later step that read 1.5x what the earlier one did raises the later cell's anchor by 1.5^(α/2), lowers the
    earlier's by as much, and a contrast beyond the outlier bound counts as that bound."""
    later, earlier = online_module._Learnt(), online_module._Learnt()
    later.anchor, earlier.anchor = 0.8, 1.25
    factor = online_module._contrast(later, earlier, 1.5, 1.0, smoothing=0.1)
    assert factor == pytest.approx(1.5 ** 0.05)
    assert later.anchor == pytest.approx(0.8 * factor) and earlier.anchor == pytest.approx(1.25 / factor)
    assert later.anchor * earlier.anchor == pytest.approx(1.0)
    assert online_module._contrast(later, earlier, 1.0, 10.0, smoothing=0.1) == pytest.approx(0.5 ** 0.05)


def test_a_step_that_took_no_time_is_compared_with_no_other():
    """A settled cell's step of 0 s between steps of another settled cell moves no anchor and divides by nothing."""
    model = OnlineCorrectedCostModel(ConstantCostModel(step_seconds=0.1), smoothing=1.0)
    for _ in range(3):
        model.observe_step(1, 1, 0.1)
        model.observe_step(1, 2, 0.1)
    anchors = [model._steps.cells[(1, tokens)].ratio.anchor for tokens in (1, 2)]
    model.observe_step(1, 1, 0.0)
    model.observe_step(1, 2, 0.1)
    assert [model._steps.cells[(1, tokens)].ratio.anchor for tokens in (1, 2)] == anchors
    assert math.isfinite(model.step_time(1, 2)) and model.step_time(1, 2) > 0


def test_no_contrast_is_drawn_across_the_gap_between_two_generations():
    """A generation that starts in a slower spell than the last one ended in leaves the cells' prices against each
    other where they were, once π has caught up: only steps of one generation are compared."""
    model = OnlineCorrectedCostModel(ConstantCostModel(step_seconds=0.1))
    start = GenerationStart(rows=1, device=torch.device("cpu"), max_draft_tokens=3, max_length=8, sampling=SamplingConfig())
    model.start(start)
    for _ in range(20):
        model.observe_step(1, 1, 0.1)
        model.observe_step(1, 2, 0.12)
    before = model.step_time(1, 2) / model.step_time(1, 1)
    model.start(start)
    for _ in range(60):  # the cells' k follow π back to their anchors, which a contrast across the gap would have moved
        model.observe_step(1, 1, 0.15)
    assert model.step_time(1, 2) / model.step_time(1, 1) == pytest.approx(before, rel=1e-3)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    cost_grids(),
    st.lists(st.tuples(st.integers(1, 40), st.integers(1, 12), st.floats(0.0, 5.0)), max_size=12),
    st.sampled_from([0.1, 0.5, 1.0]),
)
def test_online_correction_stays_monotone_for_any_observations(grid, observations, smoothing):
    """After any stream of observations over any (possibly noisy) base, step_time never decreases in rows, and
    draft_time in rows or depth."""
    rows, tokens, seconds = grid
    table = CostTable(rows=rows, tokens=tokens, step_seconds=seconds, draft_rows=rows, draft_depths=tokens, draft_seconds=seconds)
    model = OnlineCorrectedCostModel(ProfiledCostModel(table), smoothing=smoothing)
    for row_count, token_count, observed in observations:
        model.observe_step(row_count, token_count, observed)
        model.observe_draft(row_count, observed / 4, token_count)
    points_rows, points_tokens = (1, 2, 3, 5, 8, 16, 17, 24, 40), (1, 2, 3, 5, 9, 12)
    steps = [[model.step_time(r, t) for t in points_tokens] for r in points_rows]
    drafts = [[model.draft_time(r, t) for t in points_tokens] for r in points_rows]
    for i in range(1, len(points_rows)):
        assert all(upper >= lower for upper, lower in zip(steps[i], steps[i - 1]))
        assert all(upper >= lower for upper, lower in zip(drafts[i], drafts[i - 1]))
    assert all(row == sorted(row) for row in drafts)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    cost_grids(),
    st.lists(st.tuples(st.sampled_from([1, 2, 3, 17, 40]), st.integers(1, 4), st.floats(0.0, 5.0)), min_size=1, max_size=30),
    st.sampled_from([0.1, 0.5, 1.0]),
)
def test_online_answers_kept_between_observations_equal_answers_computed_afresh(grid, observations, smoothing):
    """A model asked after every observation (its answers cached and dropped only where an observation reaches them)
    answers exactly as one fed the same observations and asked only at the end."""
    rows, tokens, seconds = grid
    table = CostTable(rows=rows, tokens=tokens, step_seconds=seconds, draft_rows=rows, draft_depths=tokens, draft_seconds=seconds)
    points = [(row_count, token_count) for row_count in (1, 2, 3, 5, 17, 40) for token_count in (1, 2, 3, 4, 6)]

    def answers(model):
        return [(model.step_time(*point), model.draft_time(*point)) for point in points]

    asked = OnlineCorrectedCostModel(ProfiledCostModel(table), smoothing=smoothing)
    for count, (row_count, token_count, observed) in enumerate(observations, start=1):
        asked.observe_step(row_count, token_count, observed)
        asked.observe_draft(row_count, observed / 4, token_count)
        fresh = OnlineCorrectedCostModel(ProfiledCostModel(table), smoothing=smoothing)
        for fresh_rows, fresh_tokens, fresh_observed in observations[:count]:
            fresh.observe_step(fresh_rows, fresh_tokens, fresh_observed)
            fresh.observe_draft(fresh_rows, fresh_observed / 4, fresh_tokens)
        assert answers(asked) == answers(fresh)


def _corner_maximum(surface, rows: int, tokens: int) -> float:
    """The documented answer of an online surface at (rows, tokens), without its cache: the maximum over one corner per
    cell at or below the query of the cell's h there, an unobserved cell's capped by its bound."""
    token_cells = online_module._buckets_up_to(tokens) if surface.monotone_in_tokens else [row_bucket(tokens)]
    values = [0.0]
    for row_cell in online_module._buckets_up_to(rows):
        for token_cell in token_cells:
            corner = ((row_cell, token_cell), min(row_cell, rows), min(token_cell, tokens))
            value = surface._usual(*corner)
            values.append(value if corner[0] in surface.cells else min(value, surface._bound(*corner)))
    return max(values) * surface.pace.value


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    cost_grids(),
    st.lists(st.tuples(st.sampled_from([1, 2, 3, 17]), st.integers(1, 20), st.floats(0.0, 5.0)), min_size=1, max_size=20),
    st.permutations([(row_count, depth) for row_count in (1, 2, 5, 17) for depth in (1, 2, 3, 4, 7, 9, 12, 16, 17, 20)]),
    st.sampled_from([3, 4096]),
    st.lists(st.floats(0.0, 5.0), min_size=17, max_size=17),
)
def test_online_answers_in_any_order_equal_the_corner_maximum(grid, observations, order, cache_limit, first_seen):
    """Asked in any order between observations (a deep pass's answer built on the one a token shallower), drafting and
    step answers equal the maximum over their cells' corners computed afresh, also where the answer cache fills and is
    emptied while a deep answer is being built. Every depth of one and two rows is seen first, so that most answers
    there read settled cells only and stay cached until an observation of one of them."""
    rows, tokens, seconds = grid
    table = CostTable(rows=rows, tokens=tokens, step_seconds=seconds, draft_rows=rows, draft_depths=tokens, draft_seconds=seconds)
    with mock.patch.object(online_module, "_CACHE_LIMIT", cache_limit):
        model = OnlineCorrectedCostModel(ProfiledCostModel(table), smoothing=0.5)
        for depth, observed in enumerate(first_seen, start=1):
            for row_count in (1, 2):
                model.observe_step(row_count, depth, observed)
                model.observe_draft(row_count, observed / 4, depth)
        for row_count, token_count, observed in observations:
            model.observe_step(row_count, token_count, observed)
            model.observe_draft(row_count, observed / 4, token_count)
            for point in order[: len(order) // 2]:
                assert model.draft_time(*point) == _corner_maximum(model._drafts, *point)
                assert model.step_time(*point) == _corner_maximum(model._steps, *point)
        for point in order:
            assert model.draft_time(*point) == _corner_maximum(model._drafts, *point)


def test_a_deep_drafting_answer_follows_an_observation_of_a_shallower_cell():
    """A drafting answer built on the one a token shallower is dropped with it: once every depth has settled, a
    shallower cell it read observed slower raises the deep answer, which reads the maximum over depths."""
    flat = ((1.0, 1.0), (1.0, 1.0))
    model = _steady(ProfiledCostModel(CostTable(rows=(1, 2), tokens=(1, 4), step_seconds=flat, draft_rows=(1, 2), draft_depths=(1, 4),
                                                draft_seconds=flat)), smoothing=0.5)
    for depth in range(1, 18):
        model.observe_draft(1, 1.0, depth)
    assert model.draft_time(1, 12) == 1.0
    model.observe_draft(1, 1.9, 5)
    assert model.draft_time(1, 12) == model.draft_time(1, 5) == pytest.approx(1.45)
    assert model.draft_time(1, 4) == 1.0


def test_a_wider_step_observed_cheaper_than_a_narrower_one_is_priced_cheaper():
    """Where two rows of one token took longer than two rows of three (a slow few-row product path), each observed
    cell answers what its steps took, not the narrower one's price carried up; rows stay monotone, and an unobserved
    two-token cell follows its narrower observed neighbour."""
    base = ProfiledCostModel(CostTable(rows=(1, 2), tokens=(1, 2, 3), step_seconds=((0.046, 0.050, 0.051), (0.055, 0.055, 0.055))))
    model = _steady(base, smoothing=0.5)
    for _ in range(30):
        model.observe_step(2, 1, 0.059)
        model.observe_step(2, 3, 0.051)
    assert model.step_time(2, 3) == pytest.approx(0.051, rel=1e-3) and model.step_time(2, 1) == pytest.approx(0.059, rel=1e-3)
    assert model.step_time(2, 2) == pytest.approx(0.059, rel=1e-3)  # k of (2, 1), the widest observed narrower cell
    assert model.step_time(3, 3) >= model.step_time(2, 3) and model.step_time(2, 1) >= model.step_time(1, 1)
    assert model.step_time(1, 3) <= base.step_time(1, 3)  # unobserved: the least of the profile and g


def test_online_draft_correction_learns_seconds_where_the_base_knows_none():
    """With a base drafting time of 0 the observed seconds themselves are smoothed, and more rows never cost less."""
    model = _steady(ConstantCostModel(step_seconds=0.1, draft_seconds=0.0), smoothing=0.2)
    assert model.draft_time(4, 3) == 0.0
    for _ in range(40):
        model.observe_draft(4, 0.03, 3)
        model.observe_draft(1, 0.01, 3)
    assert model.draft_time(4, 3) == pytest.approx(0.03, rel=1e-3) and model.draft_time(1, 3) == pytest.approx(0.01, rel=1e-3)
    assert model.draft_time(8, 3) >= model.draft_time(4, 3)
    scaled = _steady(ConstantCostModel(draft_seconds=0.01), smoothing=1.0)
    scaled.observe_draft(2, 0.015, 3)
    assert scaled.draft_time(2, 3) == pytest.approx(0.015) and scaled.report()["draft_correction"] == pytest.approx(1.5)


def test_one_outlier_leaves_a_correction_early_and_moves_it_by_at_most_one_plus_smoothing_later():
    """A step 40x the base (a pause of the process), as a cell's first observation, leaves its median at the prior, as
    it does once one step agrees with the prior; in a cell past its first ⌈1/α⌉ values, one moves it by 1 + α at
    most; a lasting change is still followed."""
    model = _steady(ConstantCostModel(step_seconds=0.03), smoothing=0.1)
    model.observe_step(1, 1, 1.2)
    assert model.step_time(1, 1) == pytest.approx(0.03)  # the median of the prior (the profile, 1) twice and the bounded 2
    model.observe_step(1, 1, 0.03)
    assert model.step_time(1, 1) == pytest.approx(0.03)  # the median of 1, 1, 2 and 1
    for _ in range(10):
        model.observe_step(1, 1, 0.03)
    model.observe_step(1, 1, 1.2)
    assert model.step_time(1, 1) == pytest.approx(0.03 * 1.1)
    model.observe_step(1, 1, 1e-6)  # bounded to half the current k, 1.1
    assert model.step_time(1, 1) == pytest.approx(0.03 * (1.1 + 0.1 * (0.55 - 1.1)))
    for _ in range(80):
        model.observe_step(1, 1, 0.09)
    assert model.step_time(1, 1) == pytest.approx(0.09, rel=0.01)
    drafting = _steady(ConstantCostModel(step_seconds=0.03, draft_seconds=0.005), smoothing=0.1)
    drafting.observe_draft(1, 0.2, 1)  # a pass reading a whole prompt: the prior is g, 1.1 after this pass
    assert drafting.draft_time(1, 1) == pytest.approx(0.005 * 1.1)  # the median of 1.1, 1.1 and the bounded 2


def test_a_cell_seen_a_few_times_answers_with_what_they_took():
    """Three observations of a cell at 1.3x the base set its correction to 1.3 (their median with the start), where
    smoothing alone would leave it at 1.08: a drafted step seen only in a warm-up is priced as it ran."""
    model = _steady(ConstantCostModel(step_seconds=0.1, draft_seconds=0.01), smoothing=0.1)
    for _ in range(3):
        model.observe_step(16, 2, 0.13)
        model.observe_draft(16, 0.013, 1)
    assert model.step_correction(16, 2) == pytest.approx(1.3) and model.step_time(16, 2) == pytest.approx(0.13)
    assert model.draft_time(16, 1) == pytest.approx(0.013)
    assert model.report()["step_correction"] == pytest.approx(1 + 0.3 * (1 - 0.9**3))  # g is smoothed from 1 on


def test_a_cell_seen_once_moves_with_the_cell_it_would_follow_unobserved():
    """A two-token cell seen once, before the one-token cell, answers with the median of its ratio and of what it would
    answer unobserved (counted twice), read afresh: once one-token steps teach a slower machine, it follows (1.2, where
    its own 1.3 alone does not move it)."""
    base = ProfiledCostModel(CostTable(rows=(1, 16), tokens=(1, 2), step_seconds=((0.030, 0.032), (0.100, 0.110))))
    model = _steady(base, smoothing=0.1)
    model.observe_step(16, 2, 0.110 * 1.3)
    assert model.step_correction(16, 2) == pytest.approx(1.0)  # the prior: the profile, 1
    for _ in range(30):
        model.observe_step(16, 1, 0.100 * 1.2)
    assert model.step_correction(16, 1) == pytest.approx(1.2)
    assert model.step_correction(16, 2) == pytest.approx(1.2)
    model.observe_step(16, 2, 0.110 * 1.3)
    assert model.step_correction(16, 2) == pytest.approx(1.25)  # two ratios that agree move it halfway


def test_online_draft_correction_is_learnt_per_depth():
    """A shallow pass's observed time corrects the shallow cells only; deeper ones keep the profile's shape and never cost less."""
    table = _table(_linear_in_batch, draft_rows=(1, 2), draft_depths=(1, 7), draft_seconds=((0.004, 0.006), (0.005, 0.008)))
    model = OnlineCorrectedCostModel(ProfiledCostModel(table), smoothing=1.0)
    model.observe_draft(1, 0.002, 1)  # one token deep: half the profile
    assert model.draft_time(1, 1) == pytest.approx(0.002)
    assert model.draft_time(1, 7) == pytest.approx(0.003)  # unobserved: the shallower cell's correction, the profile's shape
    model.observe_draft(1, 0.006, 7)  # as profiled
    assert model.draft_time(1, 7) == pytest.approx(0.006) and model.draft_time(1, 1) == pytest.approx(0.002)
    assert all(model.draft_time(1, depth) <= model.draft_time(1, depth + 1) for depth in range(1, 9))
    with pytest.raises(ValueError, match="depth"):
        model.observe_draft(1, 0.002, 0)


def test_unobserved_wider_cells_keep_the_profiles_shape():
    """A cell never observed takes the correction of the widest observed narrower cell of its row bucket, so extra tokens never look free."""
    base = ProfiledCostModel(CostTable(rows=(1, 2), tokens=(1, 2, 8), step_seconds=((0.030, 0.031, 0.038), (0.040, 0.042, 0.050))))
    model = OnlineCorrectedCostModel(base, smoothing=1.0)
    model.observe_step(1, 1, 0.027)  # g and k(1, 1) become 0.9
    model.observe_step(1, 2, 0.031)  # k(1, 2) = 1
    model.observe_step(2, 1, 0.036)  # row bucket 2, one token: 0.9
    assert model.step_correction(1, 5) == pytest.approx(1.0) and model.step_correction(1, 8) == pytest.approx(1.0)
    assert model.step_correction(2, 5) == pytest.approx(0.9)
    assert model.step_correction(3, 1) == pytest.approx(model.report()["step_correction"])  # no cell of its row bucket: g
    assert [model.step_time(1, tokens) for tokens in (2, 4, 8)] == pytest.approx([base.step_time(1, tokens) for tokens in (2, 4, 8)])


def test_an_unobserved_one_token_cell_is_priced_by_the_profile_not_by_dearer_wider_steps():
    """A batch size observed only at width 2 prices its one-token step by the least of 1, g and width 2's ratio: dearer
    wider steps cannot make drafting look cheap there, a faster machine still lowers it, and once observed the
    cell's own ratio is used."""
    base = ProfiledCostModel(CostTable(rows=(1, 16), tokens=(1, 2), step_seconds=((0.030, 0.032), (0.125, 0.139))))
    model = _steady(base, smoothing=1.0)  # with smoothing 1, g and a cell's k are the last ratio
    model.observe_step(16, 2, 0.139 * 1.2)
    model.observe_step(1, 1, 0.030 * 1.25)
    assert model.report()["step_correction"] == pytest.approx(1.25)
    assert model.step_correction(16, 1) == pytest.approx(1.0)
    assert model.step_time(16, 1) == pytest.approx(0.125)  # k = 1.2 or g would price it higher
    assert model.step_time(15, 1) == pytest.approx(0.030 + (0.125 - 0.030) * 14 / 15)  # no cell of 15 rows observed: the profile
    assert model.step_correction(16, 3) == pytest.approx(1.2)  # a wider one still follows its narrower cell
    model.observe_step(16, 2, 0.139 * 0.8)  # faster than profiled: g = k(16, 2) = 0.8
    assert model.step_correction(16, 1) == pytest.approx(0.8)
    model.observe_step(16, 1, 0.125 * 1.1)
    assert model.step_correction(16, 1) == pytest.approx(1.1) and model.step_time(16, 1) == pytest.approx(0.125 * 1.1)


def test_a_cells_first_observation_is_taken_with_the_correction_it_answered_with():
    """A one-token cell first observed at the profile's time keeps k = 1 (the median with what it answered with), not
    halfway to a g of 1.4 that wider steps set; a wider cell's first observation is taken with its narrower cell's k."""
    base = ProfiledCostModel(CostTable(rows=(1, 16), tokens=(1, 2, 4), step_seconds=((0.030, 0.032, 0.036), (0.125, 0.139, 0.170))))
    model = _steady(base, smoothing=0.5)
    for _ in range(40):
        model.observe_step(16, 2, 0.139 * 1.4)
    assert model.report()["step_correction"] == pytest.approx(1.4) and model.step_correction(16, 1) == pytest.approx(1.0)
    model.observe_step(16, 1, 0.125)
    assert model.step_correction(16, 1) == pytest.approx(1.0)
    model.observe_step(16, 4, 0.170 * 1.6)
    assert model.step_correction(16, 4) == pytest.approx(1.5)  # from k(16, 2) = 1.4, smoothed halfway: at α = 0.5 no median forms


def test_an_unobserved_one_token_cell_reads_a_wider_cells_own_ratios_while_it_has_few():
    """A one-token cell with no observation of its own, capped by a two-token cell seen once at 0.8 of the profile,
    answers 0.8 (that cell's own ratio), not the two-token cell's median with its prior."""
    base = ProfiledCostModel(CostTable(rows=(1, 16), tokens=(1, 2), step_seconds=((0.030, 0.032), (0.100, 0.110))))
    model = _steady(base, smoothing=0.1)
    model.observe_step(16, 2, 0.110 * 0.8)
    assert model.step_correction(16, 2) == pytest.approx(0.98)  # with its prior, the least of 1 and g = 0.98, counted twice
    assert model.step_correction(16, 1) == pytest.approx(0.8)


def test_seconds_where_the_base_knows_none_are_learnt_as_a_median_first():
    """Drafting seconds where the base predicts 0: a shallow cell's first passes are taken with a learnt deeper cell's seconds, counted twice."""
    model = _steady(ConstantCostModel(step_seconds=0.1, draft_seconds=0.0), smoothing=0.1)
    for seconds in (0.020, 0.021, 0.019):
        model.observe_draft(1, seconds, 3)
    assert model.draft_time(1, 3) == pytest.approx(0.020)
    assert model.draft_time(1, 1) == pytest.approx(0.020)  # unobserved: the narrowest deeper cell's seconds
    model.observe_draft(1, 0.010, 1)
    assert model.draft_time(1, 1) == pytest.approx(0.020)  # the median of that prior twice and the pass
    model.observe_draft(1, 0.010, 1)
    assert model.draft_time(1, 1) == pytest.approx(0.015)  # two passes that agree: halfway
    model.observe_draft(1, 0.030, 1)  # an outlier, within twice the current 0.015
    assert model.draft_time(1, 1) == pytest.approx(0.020)  # the median of 0.020 twice, 0.010, 0.010 and 0.030


def test_a_cells_median_is_taken_over_a_bounded_number_of_values():
    """With a tiny smoothing a cell's median still holds at most 16 values, then smooths."""
    model = _steady(ConstantCostModel(step_seconds=0.1), smoothing=0.001)
    for _ in range(40):
        model.observe_step(1, 2, 0.15)
    cell = model._steps.cells[(1, 2)].ratio
    assert cell.early == [] and cell.smoothed == pytest.approx(1.5)


def test_online_correction_memory_is_bounded():
    """Rows and tokens share power-of-two buckets above 16, so thousands of distinct batches fill few cells."""
    model = OnlineCorrectedCostModel(ConstantCostModel(step_seconds=0.1))
    for rows in range(1, 1025):
        model.observe_step(rows, 1 + rows % 40, 0.1)
    assert model.report()["step_cells"] <= (16 + 7) * (16 + 2)


class _OneArgumentDraftTime:
    """A cost model written to the protocol before drafting depth was priced."""

    def step_time(self, rows, tokens):
        return 0.01

    def draft_time(self, rows):
        return 0.001


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: OnlineCorrectedCostModel(object()), TypeError, "base must be a CostModel"),
        (lambda: OnlineCorrectedCostModel(ConstantCostModel(), smoothing=0), ValueError, "smoothing"),
        (lambda: OnlineCorrectedCostModel(ConstantCostModel(), smoothing=1.5), ValueError, "smoothing"),
        (lambda: OnlineCorrectedCostModel(ConstantCostModel(), pace_smoothing=0), ValueError, r"pace_smoothing must be a number in \(0, 1\], got 0"),
        (lambda: OnlineCorrectedCostModel(ConstantCostModel(), pace_smoothing=True), TypeError, "pace_smoothing"),
        (lambda: OnlineCorrectedCostModel(ConstantCostModel()).observe_step(0, 1, 0.1), ValueError, "rows"),
        (lambda: OnlineCorrectedCostModel(ConstantCostModel()).observe_step(1, 1, -0.1), ValueError, "seconds"),
        (lambda: OnlineCorrectedCostModel(ConstantCostModel()).observe_step(1, 1, "0.1"), TypeError, "seconds"),
        (lambda: OnlineCorrectedCostModel(ConstantCostModel()).observe_draft(1, math.nan, 1), ValueError, "seconds"),
        (lambda: OnlineCorrectedCostModel(_OneArgumentDraftTime()), TypeError, r"base.draft_time .* must take \(rows, depth\)"),
        (lambda: OnlineCorrectedCostModel(ConstantCostModel()).step_time(1, 0), ValueError, "tokens"),
    ],
)
def test_online_correction_refuses_bad_input(call, error, message):
    """A base that is not a cost model, smoothing outside (0, 1], bad rows/tokens and negative or non-numeric seconds are refused by name."""
    with pytest.raises(error, match=message):
        call()


# -- SGLang's SPS table ------------------------------------------------------------------------


def test_sglang_export_has_sglangs_schema():
    """The export holds exactly SGLang's three fields: strictly increasing B = rows·tokens, SPS non-increasing, the ceiling."""
    data = to_sglang_sps(_table(_linear_in_batch))
    assert set(data) == {"sample_batch_tokens", "sample_steps_per_sec", "max_batch_tokens"}
    assert data["sample_batch_tokens"] == [1, 2, 4, 8, 16]
    assert data["sample_steps_per_sec"] == pytest.approx([1 / _linear_in_batch(1, b) for b in (1, 2, 4, 8, 16)])
    assert data["max_batch_tokens"] == 16
    assert to_sglang_sps(_table(_linear_in_batch), max_batch_tokens=256)["max_batch_tokens"] == 256
    only_two_rows = to_sglang_sps(_table(_linear_in_batch), rows=2)
    assert only_two_rows["sample_batch_tokens"] == [2, 4, 8]


def test_sglang_export_keeps_the_slowest_split_of_a_batch_and_never_lets_sps_rise():
    """B = 4 measured as 4×1 (0.3 s) and 1×4 (0.2 s) exports 0.3 s; a later B measured quicker is raised to it."""
    table = CostTable(rows=(1, 4), tokens=(1, 4), step_seconds=[[0.1, 0.2], [0.3, 0.35]])
    data = to_sglang_sps(table)
    assert data["sample_batch_tokens"] == [1, 4, 16]
    assert data["sample_steps_per_sec"] == pytest.approx([10.0, 1 / 0.3, 1 / 0.35])
    quicker_later = CostTable(rows=(1, 2), tokens=(1, 3), step_seconds=[[0.1, 0.5], [0.6, 0.7]])  # B = 1, 3 | 2, 6
    assert to_sglang_sps(quicker_later)["sample_batch_tokens"] == [1, 2, 3, 6]
    assert to_sglang_sps(quicker_later)["sample_steps_per_sec"] == pytest.approx([10.0, 1 / 0.6, 1 / 0.6, 1 / 0.7])


def test_sglang_round_trip_is_exact_when_time_depends_on_batch_tokens_alone():
    """A table whose time grows with R·T alone comes back equal at every grid point, by SGLang's floor lookup."""
    table = _table(_linear_in_batch)
    back = from_sglang_sps(json.loads(json.dumps(to_sglang_sps(table))), rows=table.rows, tokens=table.tokens)
    assert back.rows == table.rows and back.tokens == table.tokens
    for got, want in zip(back.step_seconds, table.step_seconds):
        assert got == pytest.approx(want, rel=1e-12)
    assert back.draft_rows is None and back.key == {"source": "sglang SpsCostTable", "max_batch_tokens": 16}


@PROPERTY
@given(cost_grids())
def test_sglang_round_trip_is_never_quicker_than_the_envelope(grid):
    """Any table comes back from SGLang's format at least as slow as its monotone envelope at every grid point."""
    rows, tokens, seconds = grid
    table = CostTable(rows=rows, tokens=tokens, step_seconds=[[value + 0.01 for value in row] for row in seconds])
    back = from_sglang_sps(to_sglang_sps(table), rows=rows, tokens=tokens)
    for got_row, envelope_row in zip(back.step_seconds, monotone_envelope(table.step_seconds)):
        assert all(got >= want * (1 - 1e-12) for got, want in zip(got_row, envelope_row))


def test_sglang_import_floors_to_the_largest_probe_and_clamps():
    """t(R, T) = 1 / SPS at the largest probe ≤ R·T, the first probe below it and the last above it, as SGLang looks up."""
    data = {"sample_batch_tokens": [2, 4, 16], "sample_steps_per_sec": [100, 50.0, 10.0], "max_batch_tokens": 64}
    table = from_sglang_sps(data, rows=(1, 2, 8), tokens=(1, 3))
    assert table.step_seconds == ((0.01, 0.01), (0.01, 0.02), (0.02, 0.1))  # B = 1, 3 | 2, 6 | 8, 24


def test_sglang_import_reads_the_additive_form():
    """A file with bias_seconds is SGLang's additive table: t(R, T) = bias + α(R) + θ(R·T), linear between probes and clamped."""
    data = {"bias_seconds": 0.01, "bs_probes": [1, 4], "alpha_seconds": [0.0, 0.003], "m_probes": [1, 9], "theta_seconds": [0.0, 0.008]}
    table = from_sglang_sps(data, rows=(1, 2, 8), tokens=(1, 3))
    assert table.step_seconds[0] == pytest.approx((0.01, 0.01 + 0.002))
    assert table.step_seconds[1] == pytest.approx((0.01 + 0.001 + 0.001, 0.01 + 0.001 + 0.005))
    assert table.step_seconds[2] == pytest.approx((0.01 + 0.003 + 0.007, 0.01 + 0.003 + 0.008))


def test_sglang_files_round_trip(tmp_path):
    """save_sglang_sps writes the JSON SGLang reads; load_sglang_sps reads it back into the same table."""
    table = _table(_linear_in_batch)
    save_sglang_sps(table, tmp_path / "sps.json")
    assert json.loads((tmp_path / "sps.json").read_text()) == to_sglang_sps(table)
    loaded = load_sglang_sps(tmp_path / "sps.json", rows=table.rows, tokens=table.tokens)
    for got, want in zip(loaded.step_seconds, table.step_seconds):
        assert got == pytest.approx(want, rel=1e-12)


GOOD_SPS = {"sample_batch_tokens": [1, 4], "sample_steps_per_sec": [10.0, 5.0], "max_batch_tokens": 8}


@pytest.mark.parametrize(
    "data, error, message",
    [
        ([1, 2], TypeError, "data must be a mapping"),
        ({**GOOD_SPS, "sample_batch_tokens": [4, 1]}, ValueError, "sample_batch_tokens must be strictly increasing"),
        ({**GOOD_SPS, "sample_batch_tokens": []}, ValueError, "sample_batch_tokens"),
        ({**GOOD_SPS, "sample_batch_tokens": [0, 4]}, ValueError, "sample_batch_tokens"),
        ({**GOOD_SPS, "sample_steps_per_sec": [10.0]}, ValueError, "sample_steps_per_sec must be a list of 2"),
        ({**GOOD_SPS, "sample_steps_per_sec": [10.0, 0.0]}, ValueError, "sample_steps_per_sec"),
        ({**GOOD_SPS, "max_batch_tokens": 2}, ValueError, "max_batch_tokens"),
        ({"sample_batch_tokens": [1], "sample_steps_per_sec": [1.0]}, ValueError, r"missing the field\(s\) \['max_batch_tokens'\]"),
        ({"bias_seconds": 0.0, "bs_probes": [1], "alpha_seconds": [0.0], "m_probes": [1], "theta_seconds": [0.0]}, ValueError, "bias_seconds"),
        ({"bias_seconds": 0.1, "bs_probes": [1]}, ValueError, "SpsAdditiveCostTable"),
    ],
)
def test_sglang_import_refuses_what_sglang_would(data, error, message):
    """Unsorted, empty or mismatched probes, non-positive SPS, a ceiling below the last probe and missing fields are refused by name."""
    with pytest.raises(error, match=message):
        from_sglang_sps(data)


def test_sglang_export_refuses_rows_outside_the_table_and_zero_times():
    """Exporting rows the table does not hold, or a step time of 0 (infinite SPS), is refused by name."""
    with pytest.raises(ValueError, match="rows must be among the table's rows"):
        to_sglang_sps(_table(_linear_in_batch), rows=3)
    with pytest.raises(ValueError, match="step times > 0"):
        to_sglang_sps(_table(lambda rows, tokens: 0.0))
    with pytest.raises(ValueError, match="max_batch_tokens"):
        to_sglang_sps(_table(_linear_in_batch), max_batch_tokens=4)
