"""dspark/fast_path.py: every formulation equals F.linear, routing only inside active(), copies within budget, the disk cache."""

import gc
import inspect
import json
import logging
import os
import re
import threading
import weakref

import attrs
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import dspark
from dspark import fast_path
from dspark.drafters import DraftModelDrafter, PromptLookupDrafter
from dspark.fast_path import FORMULATIONS, FastPath, OneRowChoice, TransposedChoice, linear_weights, row_bucket
from tests.conftest import build_model, left_padded_batch, tiny_semi_ar_drafter
from tests.strategies import linear_problems

COPYING = ("pretransposed", "packed")
GQA = "TRANSFORMERS_SDPA_FORCE_GQA"


def _ranked_first(formulation: str):
    """A stand-in for ``fast_path._seconds`` under which ``formulation`` measures fastest, then the
    others in FORMULATIONS order, without timing anything."""

    def seconds(function, budget=0.03):
        timed = inspect.getclosurevars(function).nonlocals["formulation"]
        return 1.0 if timed == formulation else 2.0 + FORMULATIONS.index(timed)

    return seconds


_TIME_TRANSPOSED = FastPath._time_transposed


@pytest.fixture(autouse=True)
def _transposed_never_faster(monkeypatch):
    """Whole forwards measure the same both ways unless a test says otherwise (``_transposed_timed``), so that a test
    of another rule sees the formulations it set up, not those a timing of the tiny model happened to pick."""
    _transposed_timed(monkeypatch)


def _transposed_timed(monkeypatch, *faster: int) -> list:
    """Make the few-row measurement find every product transposed faster at the ``faster`` row counts only, without
    timing forwards; returns the list of row counts each measurement was asked for."""
    asked = []

    def timed(self, model, weights, counts, progress):
        asked.append(list(counts))
        return {count: TransposedChoice(rows=count, seconds_ranked=2.0, seconds_transposed=1.0 if count in faster else 2.0) for count in counts}

    monkeypatch.setattr(FastPath, "_time_transposed", timed)
    return asked


def _one_row_timed(monkeypatch, *results: OneRowChoice) -> None:
    """Make the one-row measurement return ``results`` in turn (the last one from then on) without timing forwards."""
    pending = list(results)
    monkeypatch.setattr(FastPath, "_time_one_row", lambda self, model, weights, progress, forward: pending.pop(0) if len(pending) > 1 else pending[0])


def _one_row_never_timed(monkeypatch, why: str) -> None:
    """Make any one-row measurement fail the test with ``why``: nothing should be timed."""

    def fail(self, model, weights, progress, forward):
        raise AssertionError(why)

    monkeypatch.setattr(FastPath, "_time_one_row", fail)


def _formulations_used(monkeypatch) -> list:
    """A list that gathers the name of every formulation ``_apply`` runs from now on (measurements made earlier are not in it)."""
    used = []
    apply = fast_path._apply
    monkeypatch.setattr(fast_path, "_apply", lambda name, *arguments: used.append(name) or apply(name, *arguments))
    return used


def _tight(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    return torch.allclose(actual, expected, rtol=1e-5, atol=1e-5)


def _snapshot(model) -> dict:
    """Everything about ``model`` that using a fast path must not change."""
    return {
        "state": {name: tensor.clone() for name, tensor in model.state_dict().items()},
        "attributes": {name: sorted(module.__dict__) for name, module in model.named_modules()},
        "hooks": {name: (len(module._forward_hooks), len(module._forward_pre_hooks)) for name, module in model.named_modules()},
        "config": model.config.to_dict(),
    }


def _same(before: dict, after: dict) -> bool:
    return (
        before["state"].keys() == after["state"].keys()
        and all(torch.equal(tensor, after["state"][name]) for name, tensor in before["state"].items())
        and {key: before[key] for key in ("attributes", "hooks", "config")} == {key: after[key] for key in ("attributes", "hooks", "config")}
    )


@pytest.fixture(autouse=True)
def _no_stray_gqa_variable(monkeypatch):
    monkeypatch.delenv(GQA, raising=False)


# -- every formulation is F.linear ------------------------------------------------------------------


@pytest.mark.parametrize("formulation", FORMULATIONS)
@given(problem=linear_problems())
@settings(max_examples=40, deadline=None)
def test_each_formulation_equals_f_linear(formulation, problem):
    """_apply with _make_copy's copy gives F.linear's result to float rounding, with and without bias."""
    x, weight, bias = problem
    flat = x.reshape(-1, x.shape[-1])
    result = fast_path._apply(formulation, flat, weight, bias, fast_path._make_copy(formulation, weight))
    expected = F.linear(flat, weight, bias)
    assert result.shape == expected.shape and result.is_contiguous()
    assert _tight(result, expected)


@pytest.mark.parametrize("formulation", FORMULATIONS)
@given(problem=linear_problems())
@settings(max_examples=40, deadline=None)
def test_fast_path_linear_equals_f_linear(formulation, problem):
    """FastPath.linear on a 1-D, 2-D or 3-D input gives F.linear's shape and values, contiguous, by the chosen
    formulation (a copying one only for more than one row)."""
    x, weight, bias = problem
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fast_path, "_seconds", _ranked_first(formulation))
        path = FastPath(copy_budget=weight.numel() * weight.element_size())
        path.reserve([weight])
        result = path.linear(x, weight, bias)
    expected = F.linear(x, weight, bias)
    assert result.shape == expected.shape and result.is_contiguous()
    assert _tight(result, expected)
    rows = x.numel() // x.shape[-1]
    assert path.choice(*weight.shape, rows, weight.dtype, weight.device).best == formulation
    assert path.copy_bytes == (weight.numel() * weight.element_size() if formulation in COPYING and rows > 1 else 0)


@pytest.mark.parametrize("formulation", FORMULATIONS)
def test_half_precision_formulations_match_f_linear(formulation, monkeypatch):
    """In bfloat16 each formulation the fast path accepts agrees with F.linear to bfloat16 rounding."""
    monkeypatch.setattr(fast_path, "_seconds", _ranked_first(formulation))
    generator = torch.Generator().manual_seed(0)
    weight = (torch.randn((48, 40), generator=generator) / 40**0.5).bfloat16()
    x = torch.randn((2, 5, 40), generator=generator).bfloat16()
    path = FastPath(copy_budget=weight.numel() * weight.element_size())
    path.reserve([weight])
    result, expected = path.linear(x, weight), F.linear(x, weight)
    assert result.shape == expected.shape and result.dtype == torch.bfloat16
    assert torch.allclose(result.float(), expected.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("formulation", COPYING)
def test_one_row_products_never_use_a_copy(formulation, monkeypatch):
    """Unless its model's forwards measured otherwise, a one-row product runs on the original weight even where a reserved copy was timed fastest; two rows use the copy."""
    monkeypatch.setattr(fast_path, "_seconds", _ranked_first(formulation))
    layer = torch.nn.Linear(16, 8)
    path = FastPath(copy_budget=10**6)
    path.reserve([layer.weight])
    with path.active():
        layer(torch.randn(1, 16))
    assert path.copy_bytes == 0
    with path.active():
        layer(torch.randn(2, 16))
    assert path.copy_bytes == layer.weight.numel() * layer.weight.element_size()


@pytest.mark.parametrize(("without", "with_copies", "copies"), [(1.05, 1.0, True), (2.0, 1.0, True), (1.0, 0.97, False), (1.0, 1.2, False)])
def test_one_row_copies_need_forwards_five_percent_faster(without, with_copies, copies):
    """OneRowChoice.copies: the copies made the one-token forward at least 5% faster (1.05 against 1.0 is enough)."""
    assert OneRowChoice(seconds_without=without, seconds_with=with_copies).copies is copies


@pytest.mark.parametrize(("seconds", "error"), [(0.0, ValueError), (-1.0, ValueError), (float("nan"), ValueError), (float("inf"), ValueError), (True, TypeError), ("1", TypeError)])
def test_a_one_row_choice_refuses_bad_seconds_by_name(seconds, error):
    """OneRowChoice takes finite seconds > 0 only (TypeError for a non-number), and the error names the field and the value."""
    with pytest.raises(error, match=f"seconds_with must be .*{seconds!r}"):
        OneRowChoice(seconds_without=1.0, seconds_with=seconds)


@pytest.mark.parametrize("faster", [True, False], ids=["copies faster", "weights faster"])
@pytest.mark.parametrize("formulation", COPYING)
def test_a_models_one_row_products_read_its_copies_where_its_forwards_ran_faster_so(formulation, faster, tmp_path, monkeypatch):
    """for_model measures the one-row choice on the model's forwards; where copies won, a one-row product reads the
    weight's copy (and stays exact), else the weight; a module measured on no forwards (a layer) keeps the weight."""
    monkeypatch.setattr(fast_path, "_seconds", _ranked_first(formulation))
    timed = OneRowChoice(seconds_without=2.0, seconds_with=1.0 if faster else 2.0)
    _one_row_timed(monkeypatch, timed)
    model = build_model("llama")
    path = FastPath.for_model(model, cache_dir=tmp_path)
    assert path.measure_one_row(model) == timed
    outsider = torch.nn.Linear(32, 48)
    path.tune([outsider.weight], rows=(1, 8), progress=False)
    path.reserve([outsider.weight], budget=10**6)
    used = _formulations_used(monkeypatch)  # the measurements are done: from here on, the formulations the forward uses
    weight = model.model.layers[0].self_attn.q_proj.weight
    x = torch.randn(1, weight.shape[1])
    with path.active():
        routed, routed_outsider = F.linear(x, weight), outsider(x[:, :32])
    assert used == [formulation if faster else "linear", "linear"]
    assert _tight(routed, x @ weight.T) and _tight(routed_outsider, x[:, :32] @ outsider.weight.T + outsider.bias)


def test_the_one_row_choice_is_measured_on_real_forwards_once_and_cached(tmp_path, monkeypatch):
    """for_model times the tiny model's one-token forward both ways (seconds > 0, cached on disk with the choices);
    a later for_model on the same cache applies the same choice without timing, and greedy output stays exact."""
    monkeypatch.setattr(fast_path, "_seconds", _ranked_first("packed"))
    model = build_model("llama")
    first = FastPath.for_model(model, cache_dir=tmp_path)
    choice = first.measure_one_row(model)
    assert choice is not None and choice.seconds_without > 0 and choice.seconds_with > 0
    stored = json.loads(next(tmp_path.glob("linear_choices_*.json")).read_text())["one_row"]
    assert list(stored.values()) == [{"seconds_without": choice.seconds_without, "seconds_with": choice.seconds_with}]
    _one_row_never_timed(monkeypatch, "timed although the one-row choice was cached")
    second = FastPath.for_model(model, cache_dir=tmp_path)
    assert second.measure_one_row(model) == choice
    assert "one-row products read the" in second.describe()
    _greedy_matches(model, second)


def test_a_model_with_no_copies_is_not_timed_at_one_row(tmp_path, monkeypatch):
    """With no copy budget no weight holds a copy: measure_one_row returns None and times nothing."""
    _one_row_never_timed(monkeypatch, "timed a model that holds no copies")
    model = build_model("llama")
    assert FastPath.for_model(model, cache_dir=tmp_path, copy_budget=0).measure_one_row(model) is None


def test_a_new_set_of_copies_is_measured_again_and_its_choice_replaces_the_one_row_plans(tmp_path, monkeypatch):
    """A weight reserved after the measurement makes another copied set: measure_one_row times it again, and its
    result (here the weights) replaces the one-row plans made under the first (the copies)."""
    monkeypatch.setattr(fast_path, "_seconds", _ranked_first("packed"))
    _one_row_timed(monkeypatch, OneRowChoice(seconds_without=2.0, seconds_with=1.0), OneRowChoice(seconds_without=1.0, seconds_with=1.0))
    model = build_model("llama")
    path = FastPath.for_model(model, cache_dir=tmp_path, copy_budget=0)
    assert path.measure_one_row(model) is None  # nothing copied: nothing to measure
    weight, later = model.model.layers[0].self_attn.q_proj.weight, model.model.layers[0].self_attn.k_proj.weight
    path.reserve([weight], budget=weight.numel() * weight.element_size())
    assert path.measure_one_row(model).copies is True
    used = _formulations_used(monkeypatch)
    x = torch.randn(1, weight.shape[1])
    with path.active():
        F.linear(x, weight)
    assert used == ["packed"]
    path.reserve([later], budget=later.numel() * later.element_size())
    assert path.measure_one_row(model).copies is False
    with path.active():
        routed = F.linear(x, weight)
    assert used == ["packed", "linear"] and _tight(routed, x @ weight.T)


def test_a_copy_that_failed_the_one_row_check_is_not_read_at_one_row(tmp_path, monkeypatch):
    """Copies whose formulation was left out of the one-row ranking (it did not agree with F.linear there) are not
    measured at one row nor read there, whatever a timing would say; wider products still read them."""

    def measure(self, out_features, in_features, rows, dtype, device):
        ranking = ("linear", "transposed") if rows == 1 else ("packed", "linear", "transposed")
        return fast_path.LinearChoice(out_features=out_features, in_features=in_features, rows=rows, dtype=str(dtype).removeprefix("torch."),
                                      ranking=ranking, seconds=tuple(1.0 + index for index in range(len(ranking))))

    monkeypatch.setattr(FastPath, "_measure", measure)
    _one_row_timed(monkeypatch, OneRowChoice(seconds_without=2.0, seconds_with=1.0))
    model = build_model("llama")
    path = FastPath.for_model(model, cache_dir=tmp_path)
    weight = model.model.layers[0].self_attn.q_proj.weight
    assert path.is_reserved(weight) and path.measure_one_row(model) is None and not path.one_row_copies(model)
    used = _formulations_used(monkeypatch)
    with path.active():
        F.linear(torch.randn(1, weight.shape[1]), weight)
        F.linear(torch.randn(2, weight.shape[1]), weight)
    assert used == ["linear", "packed"]


@pytest.mark.parametrize(("ranked", "transposed", "chosen"), [(1.05, 1.0, True), (1.04, 1.0, False), (1.0, 2.0, False)])
def test_transposed_products_need_forwards_five_percent_faster(ranked, transposed, chosen):
    """TransposedChoice.transposed: every product transposed made the forward at least 5% faster."""
    assert TransposedChoice(rows=2, seconds_ranked=ranked, seconds_transposed=transposed).transposed is chosen


@pytest.mark.parametrize(("field", "value", "error"), [("rows", 0, ValueError), ("rows", 1.5, TypeError), ("seconds_transposed", 0.0, ValueError), ("seconds_ranked", "1", TypeError)])
def test_a_transposed_choice_refuses_bad_values_by_name(field, value, error):
    """TransposedChoice takes a row count >= 1 and finite seconds > 0, and the error names the field and the value."""
    with pytest.raises(error, match=re.escape(field)):
        TransposedChoice(**{"rows": 2, "seconds_ranked": 1.0, "seconds_transposed": 1.0, field: value})


@pytest.mark.parametrize("bias", [False, True])
def test_a_one_row_transposed_product_is_padded_to_two_rows_and_exact(bias):
    """``transposed`` multiplies one row as two (the matrix product BLAS runs with two columns) and returns the one
    row, contiguous, equal to F.linear's."""
    weight, x = torch.randn(48, 32), torch.randn(1, 32)
    offset = torch.randn(48) if bias else None
    result = fast_path._apply("transposed", x, weight, offset, None)
    assert result.shape == (1, 48) and result.is_contiguous() and _tight(result, F.linear(x, weight, offset))


def test_products_run_transposed_at_the_row_counts_whose_forwards_ran_faster_so(tmp_path, monkeypatch):
    """for_model measures the few-row choice on the model's forwards; at a row count where transposed won, every product
    of the model runs transposed (and stays exact) whatever its own ranking; at the others, its ranking decides."""
    monkeypatch.setattr(fast_path, "_seconds", _ranked_first("packed"))
    asked = _transposed_timed(monkeypatch, 2)
    model = build_model("llama")
    path = FastPath.for_model(model, cache_dir=tmp_path)
    assert asked == [list(fast_path.TRANSPOSED_ROWS)] and path.transposed_rows(model) == (2,)
    used = _formulations_used(monkeypatch)
    weight = model.model.layers[0].mlp.up_proj.weight
    x = torch.randn(3, weight.shape[1])
    with path.active():
        two, three = F.linear(x[:2], weight), F.linear(x, weight)
    assert used == ["transposed", "packed"]
    assert _tight(two, x[:2] @ weight.T) and _tight(three, x @ weight.T)
    assert "2 product rows: 2000.00 ms as ranked, 1000.00 ms transposed; products run transposed" in path.describe()


def test_the_transposed_choice_is_measured_on_real_forwards_once_and_cached(tmp_path, monkeypatch):
    """The tiny model's forwards are timed both ways at every row count asked (seconds > 0, cached on disk with the
    choices); a later fast path on the same cache applies the same choices without timing, and only a row count not
    measured yet is timed; greedy output stays exact."""
    monkeypatch.setattr(FastPath, "_time_transposed", _TIME_TRANSPOSED)
    model = build_model("llama")
    first = FastPath.for_model(model, cache_dir=tmp_path, progress=False)
    choices = first.measure_transposed(model, rows=(1, 2))
    assert sorted(choices) == [1, 2] and all(choice.seconds_ranked > 0 and choice.seconds_transposed > 0 for choice in choices.values())
    stored = json.loads(next(tmp_path.glob("linear_choices_*.json")).read_text())["transposed"]
    assert [entry for entry in next(iter(stored.values())) if entry["rows"] in (1, 2)] == [attrs.asdict(choices[1]), attrs.asdict(choices[2])]
    asked = _transposed_timed(monkeypatch, 9)
    second = FastPath.for_model(model, cache_dir=tmp_path, progress=False)
    assert second.measure_transposed(model, rows=(1, 2)) == choices and asked == []
    assert second.measure_transposed(model, rows=(2, 9))[9].transposed and asked == [[9]]
    _greedy_matches(model, second)


def test_a_forward_that_cannot_be_timed_leaves_every_product_as_ranked(tmp_path, monkeypatch, caplog):
    """A failure half way through the few-row measurement is a warning: measure_transposed returns {}, nothing is cached,
    and products keep their rankings although the failed pass had switched them to transposed."""
    monkeypatch.setattr(FastPath, "_time_transposed", _TIME_TRANSPOSED)
    monkeypatch.setattr(fast_path, "_seconds", _ranked_first("linear"))
    model = build_model("llama")
    path = FastPath.for_model(model, cache_dir=tmp_path, copy_budget=0, progress=False)
    calls = _raising_at_the_second_forward_timing(monkeypatch, RuntimeError("no forward today"))
    with caplog.at_level(logging.WARNING, logger="dspark.fast_path"):
        assert path.measure_transposed(model, rows=(12,)) == {}
    assert "no forward today" in caplog.text and len(calls) == 2 and 12 not in path.transposed_rows(model)
    assert all(entry["rows"] != 12 for listed in json.loads(next(tmp_path.glob("linear_choices_*.json")).read_text())["transposed"].values() for entry in listed)
    used = _formulations_used(monkeypatch)
    weight = model.model.layers[0].mlp.up_proj.weight
    with path.active():
        F.linear(torch.randn(12, weight.shape[1]), weight)
    assert used == ["linear"]


def _raising_at_the_second_forward_timing(monkeypatch, error: BaseException) -> list:
    """Make ``measure_step_time`` raise ``error`` at its second call (the one-row measurement's pass on the copies);
    returns the list its calls are counted in."""
    from dspark.cost_models import profiling

    calls = []
    measure = profiling.measure_step_time

    def raising_second_time(*arguments, **keywords):
        calls.append(1)
        if len(calls) == 2:
            raise error
        return measure(*arguments, **keywords)

    monkeypatch.setattr(profiling, "measure_step_time", raising_second_time)
    return calls


def test_a_forward_that_cannot_be_timed_leaves_one_row_products_on_their_weights(tmp_path, monkeypatch, caplog):
    """A failure half way through the one-row measurement is a warning: measure_one_row returns None, nothing is
    cached, and one-row products keep their weights although the failed pass had switched them to the copies."""
    monkeypatch.setattr(fast_path, "_seconds", _ranked_first("packed"))
    calls = _raising_at_the_second_forward_timing(monkeypatch, RuntimeError("no forward today"))
    model = build_model("llama")
    with caplog.at_level(logging.WARNING, logger="dspark.fast_path"):
        path = FastPath.for_model(model, cache_dir=tmp_path)
    assert "no forward today" in caplog.text and len(calls) == 2
    assert not json.loads(next(tmp_path.glob("linear_choices_*.json")).read_text()).get("one_row")
    used = _formulations_used(monkeypatch)
    weight = next(weight for weight in linear_weights(model) if path.is_reserved(weight))
    with path.active():
        F.linear(torch.randn(1, weight.shape[1]), weight)
    assert used == ["linear"]


def test_an_interrupted_one_row_measurement_leaves_one_row_products_on_their_weights(tmp_path, monkeypatch):
    """An exception the measurement does not catch (an interrupt during the pass on the copies) propagates, and the
    one-row products are back on their weights: the finally restores them."""
    monkeypatch.setattr(fast_path, "_seconds", _ranked_first("packed"))
    model = build_model("llama")
    path = FastPath.for_model(model, cache_dir=tmp_path, copy_budget=0)
    path.reserve(linear_weights(model), budget=10**9)
    calls = _raising_at_the_second_forward_timing(monkeypatch, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        path.measure_one_row(model)
    assert len(calls) == 2 and not path.one_row_copies(model)


def test_a_cache_without_one_row_choices_still_gives_its_linear_choices(tmp_path):
    """A choices file from before revision 4 (no "one_row") or with "one_row": null loads its choices."""
    _measure_a_few(FastPath(cache_file=tmp_path / "choices.json"))
    stored = json.loads((tmp_path / "choices.json").read_text())
    for one_row in ("missing", None):
        if one_row == "missing":
            stored.pop("one_row", None)
        else:
            stored["one_row"] = one_row
        (tmp_path / "choices.json").write_text(json.dumps(stored))
        assert len(FastPath(cache_file=tmp_path / "choices.json").choices()) == 3


def test_the_machine_fingerprint_names_the_build_the_processor_and_the_threads():
    """The fingerprint a cache file is named by carries torch's version and the thread count; the last-level cache,
    where Linux tells it, reads "L<level> <size>"."""
    fingerprint = fast_path._machine_fingerprint()
    assert fingerprint.startswith(f"torch {torch.__version__} | ") and fingerprint.endswith(f" | {torch.get_num_threads()} threads")
    cache = fast_path._last_level_cache()
    assert cache is None or (re.fullmatch(r"L\d+ \S+", cache) and cache in fingerprint)


@pytest.mark.parametrize("formulation", ["transposed", *COPYING])
@pytest.mark.parametrize("speedup", [1.2, 1.3])
def test_another_formulation_replaces_f_linear_only_where_it_was_timed_clearly_faster(formulation, speedup, monkeypatch):
    """A formulation timed less than _MARGIN times faster than F.linear is not used (F.linear is); one timed faster is."""

    def seconds(function, budget=0.03):
        return 1.0 / speedup if inspect.getclosurevars(function).nonlocals["formulation"] == formulation else 1.0

    monkeypatch.setattr(fast_path, "_seconds", seconds)
    layer = torch.nn.Linear(16, 8)
    path = FastPath(copy_budget=10**6)
    path.tune([layer.weight], rows=(4, 8), progress=False)
    path.reserve([layer.weight])
    used = _formulations_used(monkeypatch)  # the measurements are done: from here on, the formulations the forward uses
    x = torch.randn(4, 16)
    with path.active():
        routed = layer(x)
    assert torch.allclose(routed, F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
    assert used == ([formulation] if speedup >= fast_path._MARGIN else ["linear"])


def test_inputs_the_fast_path_does_not_tune_go_to_f_linear():
    """More than 512 rows and inputs that need gradients are left to F.linear: no choice is measured, gradients flow."""
    path = FastPath()
    weight = torch.randn(6, 5)
    many = torch.randn(600, 5)
    assert torch.equal(path.linear(many, weight), F.linear(many, weight))
    x = torch.randn(3, 5, requires_grad=True)
    path.linear(x, weight).sum().backward()
    assert _tight(x.grad, weight.sum(0).expand(3, 5))
    assert path.choices() == []


@given(rows=st.integers(1, 4096))
def test_row_bucket_covers_the_rows(rows):
    """A product is tuned at no fewer rows than it has, and a bucket is its own bucket."""
    assert row_bucket(rows) >= rows and row_bucket(row_bucket(rows)) == row_bucket(rows)


# -- routing only inside active() ---------------------------------------------------------------------


def test_linear_layer_inside_active_is_routed_and_agrees():
    """An nn.Linear called inside active() is measured and recorded, and gives the plain result."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(24, 40)
    x = torch.randn(3, 7, 24)
    path = FastPath()
    with path.active():
        routed = layer(x)
    assert _tight(routed, layer(x))
    assert [(choice.out_features, choice.in_features, choice.rows) for choice in path.choices()] == [(40, 24, row_bucket(21))]


def test_llama_forward_inside_active_agrees_and_leaves_the_model_alone(tmp_path):
    """A padded tiny-Llama forward on the fast path matches the plain one; every linear shape is recorded;
    the model's weights, attributes, hooks and config are unchanged, and outside active() nothing is routed."""
    model = build_model("llama")
    before = _snapshot(model)
    input_ids, attention_mask = left_padded_batch([7, 3, 5])
    path = FastPath(cache_file=tmp_path / "choices.json")  # measures lazily: what is recorded was routed
    with torch.inference_mode():
        plain = model(input_ids=input_ids, attention_mask=attention_mask).logits
        with path.active():
            fast = model(input_ids=input_ids, attention_mask=attention_mask).logits
        assert (fast - plain).abs().max() < 1e-5
        recorded = path.choices()
        assert {(c.out_features, c.in_features) for c in recorded} == {tuple(weight.shape) for weight in linear_weights(model)}
        assert {c.rows for c in recorded} == {row_bucket(input_ids.numel())}
        model(input_ids=input_ids[:, -1:], attention_mask=attention_mask[:, -1:])  # 3 rows: a bucket not measured before
    assert path.choices() == recorded
    assert _same(before, _snapshot(model))


def test_f_linear_is_routed_only_inside_the_block():
    """torch.nn.functional.linear is the router inside active() only, also for nested blocks and on error."""
    kernel = F.linear
    path, other = FastPath(), FastPath()
    with path.active():
        assert F.linear is not kernel
        with other.active():
            assert F.linear is not kernel
        assert F.linear is not kernel
    assert F.linear is kernel
    with pytest.raises(KeyError), path.active():
        raise KeyError("inside")
    assert F.linear is kernel


def test_the_innermost_block_routes():
    """In nested blocks of two fast paths, a linear goes to the inner one, and after it closes to the outer."""
    layer = torch.nn.Linear(12, 20)
    outer, inner = FastPath(), FastPath()
    with outer.active():
        with inner.active():
            layer(torch.randn(2, 12))
        assert outer.choices() == [] and len(inner.choices()) == 1
        layer(torch.randn(5, 12))
    assert [choice.rows for choice in outer.choices()] == [5]


def test_another_threads_linears_are_not_routed():
    """While one thread is inside active(), a linear in another thread runs the kernel: nothing is measured for it."""
    layer = torch.nn.Linear(12, 20)
    x = torch.randn(3, 12)
    path = FastPath()
    results = []
    with path.active():
        worker = threading.Thread(target=lambda: results.append(layer(x)))
        worker.start()
        worker.join()
    assert path.choices() == [] and torch.equal(results[0], F.linear(x, layer.weight, layer.bias))


def test_native_gqa_variable_is_set_only_inside_the_block():
    """TRANSFORMERS_SDPA_FORCE_GQA is 1 inside active() only, also for nested blocks and on error; without native_gqa it is never set."""
    path, other = FastPath(native_gqa=True), FastPath(native_gqa=True)
    with path.active():
        assert os.environ[GQA] == "1"
        with other.active():
            assert os.environ[GQA] == "1"
        assert os.environ[GQA] == "1"
    assert GQA not in os.environ
    with pytest.raises(KeyError), path.active():
        raise KeyError("inside")
    assert GQA not in os.environ
    with FastPath(native_gqa=False).active():
        assert GQA not in os.environ


def test_native_gqa_restores_a_value_set_before(monkeypatch):
    """A TRANSFORMERS_SDPA_FORCE_GQA set before the block is overridden inside it and restored after."""
    monkeypatch.setenv(GQA, "0")
    with FastPath(native_gqa=True).active():
        assert os.environ[GQA] == "1"
    assert os.environ[GQA] == "0"


# -- weight copies -------------------------------------------------------------------------------------


def test_zero_budget_makes_no_copies_and_stays_exact(tmp_path, monkeypatch):
    """copy_budget=0 reserves and copies nothing even when a copying formulation is fastest; outputs stay right."""
    monkeypatch.setattr(fast_path, "_seconds", _ranked_first("packed"))
    model = build_model("llama")
    input_ids, attention_mask = left_padded_batch([6, 4])
    path = FastPath.for_model(model, copy_budget=0, cache_dir=tmp_path)
    with torch.inference_mode():
        with path.active():
            fast = model(input_ids=input_ids, attention_mask=attention_mask).logits
        plain = model(input_ids=input_ids, attention_mask=attention_mask).logits
    assert path.reserved_bytes == 0 and path.copy_bytes == 0
    assert _tight(fast, plain)


@pytest.mark.parametrize("formulation", COPYING)
def test_copies_stay_within_the_budget(tmp_path, monkeypatch, formulation):
    """With room for one small weight, exactly one copy is made; reserved ≤ budget, copies ≤ reserved; outputs right."""
    monkeypatch.setattr(fast_path, "_seconds", _ranked_first(formulation))
    model = build_model("llama")
    smallest = min(weight.numel() * weight.element_size() for weight in linear_weights(model))
    input_ids, attention_mask = left_padded_batch([6, 4])
    path = FastPath.for_model(model, copy_budget=smallest + 100, cache_dir=tmp_path)
    assert path.reserved_bytes == smallest
    with torch.inference_mode():
        with path.active():
            fast = model(input_ids=input_ids, attention_mask=attention_mask).logits
        plain = model(input_ids=input_ids, attention_mask=attention_mask).logits
    assert path.copy_bytes == smallest <= path.reserved_bytes <= path.copy_budget
    assert _tight(fast, plain)


def test_only_reserved_weights_are_copied(monkeypatch):
    """A layer whose weight was not reserved runs without a copy, however large the budget."""
    monkeypatch.setattr(fast_path, "_seconds", _ranked_first("packed"))
    reserved, other = torch.nn.Linear(16, 8), torch.nn.Linear(16, 8)
    path = FastPath(copy_budget=10**9)
    path.reserve([reserved.weight])
    x = torch.randn(4, 16)
    with path.active():
        result = other(x)
    assert path.copy_bytes == 0 and _tight(result, other(x))
    with path.active():
        reserved(x)
    assert path.copy_bytes == reserved.weight.numel() * reserved.weight.element_size()


@pytest.mark.parametrize("formulation", COPYING)
@pytest.mark.parametrize("change", ["add_", "new data"])
def test_a_changed_weight_gets_a_fresh_copy(monkeypatch, formulation, change):
    """After an in-place change to a reserved weight (or new data under it) the fast path gives the new F.linear result."""
    monkeypatch.setattr(fast_path, "_seconds", _ranked_first(formulation))
    torch.manual_seed(0)
    layer = torch.nn.Linear(16, 8)
    x = torch.randn(3, 16)
    path = FastPath(copy_budget=10**9)
    path.reserve([layer.weight])
    with path.active():
        layer(x)
    assert path.copy_bytes > 0
    with torch.no_grad():
        if change == "add_":
            layer.weight.add_(1.0)
        else:
            layer.weight.data = torch.randn(8, 16)
    with path.active():
        result = layer(x)
    assert _tight(result, F.linear(x, layer.weight, layer.bias))


def test_a_weight_keeps_one_copy_across_row_counts(monkeypatch):
    """When four rows favour the pre-transposed copy and eight rows the packed one, the weight still gets a
    single copy, made once, and every row count stays exact."""

    def seconds(function, budget=0.03):
        closure = inspect.getclosurevars(function).nonlocals
        favourite = "pretransposed" if closure["x"].shape[0] == 4 else "packed"
        return 1.0 if closure["formulation"] == favourite else 2.0 + FORMULATIONS.index(closure["formulation"])

    monkeypatch.setattr(fast_path, "_seconds", seconds)
    made = []
    make_copy = fast_path._make_copy
    monkeypatch.setattr(fast_path, "_make_copy", lambda formulation, weight: made.append(formulation) or make_copy(formulation, weight))
    layer = torch.nn.Linear(16, 8)
    path = FastPath(copy_budget=10**9)
    path.tune([layer.weight], rows=(1, 4, 8), progress=False)
    path.reserve([layer.weight])
    made.clear()  # the copies the measurements made
    with path.active():
        for rows in (4, 8, 4, 8, 1):
            x = torch.randn(rows, 16)
            assert _tight(layer(x), F.linear(x, layer.weight, layer.bias))
    assert len(made) == 1 and path.copy_bytes == layer.weight.numel() * layer.weight.element_size()


def test_a_copy_goes_with_its_weight(monkeypatch):
    """Once a reserved weight is garbage collected its copy and its reservation are gone, and the copy is freed."""
    monkeypatch.setattr(fast_path, "_seconds", _ranked_first("packed"))
    made = []
    make_copy = fast_path._make_copy

    def remembered(formulation, weight):
        copy = make_copy(formulation, weight)
        made.append(weakref.ref(copy))
        return copy

    layer = torch.nn.Linear(16, 8)
    path = FastPath(copy_budget=10**9)
    path.reserve([layer.weight])
    path.tune([layer.weight], rows=(2,), progress=False)  # measuring makes copies of its own
    monkeypatch.setattr(fast_path, "_make_copy", remembered)
    with path.active():
        layer(torch.randn(2, 16))
        layer(torch.randn(2, 16))  # the second call runs on the remembered plan
    assert path.copy_bytes > 0 and path.reserved_bytes > 0 and len(made) == 1
    del layer
    gc.collect()
    assert path.copy_bytes == 0 and path.reserved_bytes == 0
    assert made[0]() is None  # nothing else, such as the remembered plan, holds the copy


def test_inference_mode_weights_run_on_the_fast_path(monkeypatch):
    """A model built under torch.inference_mode (weights without version counters) gets no copies and stays exact."""
    monkeypatch.setattr(fast_path, "_seconds", _ranked_first("packed"))
    with torch.inference_mode():
        layer = torch.nn.Linear(16, 8)
    path = FastPath(copy_budget=10**9)
    path.reserve([layer.weight])
    x = torch.randn(3, 16)
    with path.active():
        result = layer(x)
    assert path.copy_bytes == 0 and _tight(result, F.linear(x, layer.weight, layer.bias))


# -- the disk cache ---------------------------------------------------------------------------------------


def _measure_a_few(path: FastPath) -> None:
    for rows in (1, 3, 8):
        path.linear(torch.randn(rows, 12), torch.randn(20, 12))


def test_cached_choices_load_without_measuring(tmp_path, monkeypatch):
    """A second FastPath (or for_model) on the same cache file has the first one's choices and measures nothing."""
    first = FastPath(cache_file=tmp_path / "choices.json")
    _measure_a_few(first)
    model = build_model("llama")
    FastPath.for_model(model, cache_dir=tmp_path)

    def no_timing(function, budget=0.03):
        raise AssertionError("measured although the choice was cached")

    monkeypatch.setattr(fast_path, "_seconds", no_timing)
    second = FastPath(cache_file=tmp_path / "choices.json")
    assert second.choices() == first.choices() and len(second.choices()) == 3
    _measure_a_few(second)
    FastPath.for_model(model, cache_dir=tmp_path)


def test_a_cache_for_other_candidates_is_ignored(tmp_path):
    """Choices cached for another candidate set are not used, and the file is rewritten for the new set."""
    _measure_a_few(FastPath(cache_file=tmp_path / "choices.json"))
    narrow = FastPath(cache_file=tmp_path / "choices.json", candidates=("linear", "transposed"))
    assert narrow.choices() == []
    _measure_a_few(narrow)
    assert json.loads((tmp_path / "choices.json").read_text())["candidates"] == ["linear", "transposed"]
    assert all(set(choice.ranking) <= {"linear", "transposed"} for choice in narrow.choices())


@pytest.mark.parametrize(
    "contents",
    [b"{not json", b"\xff\xfe\x00 binary", b"[1, 2]", json.dumps({"version": fast_path._CACHE_VERSION, "candidates": list(FORMULATIONS), "choices": {"8x4|1|float32|cpu": {"rows": 1}}}).encode()],
    ids=["truncated", "not-utf8", "not-a-dict", "malformed-choice"],
)
def test_an_unreadable_cache_is_ignored_with_a_warning(tmp_path, caplog, contents):
    """A corrupt cache file logs a warning and the fast path measures afresh instead of failing."""
    cache_file = tmp_path / "choices.json"
    cache_file.write_bytes(contents)
    with caplog.at_level(logging.WARNING, logger="dspark.fast_path"):
        path = FastPath(cache_file=cache_file)
    assert path.choices() == []
    assert any("fast-path cache" in record.getMessage() for record in caplog.records)
    x, weight = torch.randn(2, 4), torch.randn(8, 4)
    assert _tight(path.linear(x, weight), F.linear(x, weight))


def test_an_unwritable_cache_is_a_warning_not_an_error(tmp_path, caplog):
    """When the cache file cannot be written the product still runs, with a warning."""
    (tmp_path / "a-file").write_text("")
    path = FastPath(cache_file=tmp_path / "a-file" / "choices.json")
    x, weight = torch.randn(2, 4), torch.randn(8, 4)
    with caplog.at_level(logging.WARNING, logger="dspark.fast_path"):
        assert _tight(path.linear(x, weight), F.linear(x, weight))
    assert any("fast-path cache" in record.getMessage() for record in caplog.records)


# -- bad input ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arguments, error, name",
    [
        ({"copy_budget": -1}, ValueError, "copy_budget"),
        ({"copy_budget": True}, TypeError, "copy_budget"),
        ({"copy_budget": 1.5}, TypeError, "copy_budget"),
        ({"candidates": ("linear", "fastest")}, ValueError, "candidates"),
        ({"candidates": ()}, ValueError, "candidates"),
        ({"native_gqa": "yes"}, TypeError, "native_gqa"),
    ],
)
def test_bad_arguments_are_refused_by_name(arguments, error, name):
    """FastPath refuses a bad copy_budget, candidates or native_gqa with an error naming it."""
    with pytest.raises(error, match=name):
        FastPath(**arguments)


def test_wrap_refuses_a_bad_fast_path(llama):
    """wrap's fast_path must be None, a bool or a FastPath."""
    with pytest.raises(TypeError, match="fast_path"):
        dspark.wrap(llama, PromptLookupDrafter(), fast_path="yes")


# -- inside dspark ---------------------------------------------------------------------------------------------


def test_wrap_turns_the_fast_path_on_for_cpu_targets(tmp_path, monkeypatch):
    """On a CPU target the default is the model's shared FastPath (cached under DSPARK_FAST_PATH_CACHE),
    True gives the same one, False gives None, and an instance is used as given."""
    monkeypatch.setenv("DSPARK_FAST_PATH_CACHE", str(tmp_path))
    model = build_model("llama", seed=5)
    shared = dspark.wrap(model, PromptLookupDrafter()).fast_path
    assert isinstance(shared, FastPath) and shared is FastPath.shared(model)
    assert list(tmp_path.glob("linear_choices_*.json"))
    assert dspark.wrap(model, PromptLookupDrafter(), fast_path=True).fast_path is shared
    assert dspark.wrap(model, PromptLookupDrafter(), fast_path=False).fast_path is None
    given_path = FastPath.for_model(model, cache_dir=tmp_path)
    assert dspark.wrap(model, PromptLookupDrafter(), fast_path=given_path).fast_path is given_path


def test_a_draft_models_weights_are_included(tmp_path, monkeypatch):
    """wrap with a DraftModelDrafter includes the small model: its shapes are timed and copies go to its
    weights within its own budget, none to a target given no budget."""
    monkeypatch.setattr(fast_path, "_seconds", _ranked_first("packed"))
    target, small = build_model("llama"), build_model("qwen2", seed=3, hidden_size=48, intermediate_size=80)
    path = FastPath.for_model(target, cache_dir=tmp_path, copy_budget=0)
    dspark.wrap(target, DraftModelDrafter(small), fast_path=path)
    shapes = {(choice.out_features, choice.in_features) for choice in path.choices()}
    assert {tuple(weight.shape) for weight in linear_weights(small)} <= shapes
    assert 0 < path.reserved_bytes <= path.copy_budget
    assert any(path.is_reserved(weight) for weight in linear_weights(small))
    assert not any(path.is_reserved(weight) for weight in linear_weights(target))


@pytest.mark.parametrize("faster", [True, False], ids=["copies faster", "weights faster"])
def test_a_drafters_one_row_products_read_its_copies_where_its_drafting_passes_ran_faster_so(faster, tmp_path, monkeypatch):
    """wrap times the drafter's one-row drafting passes both ways (three rounds, alternating: the two ways are a factor 2
    apart) and its one-row products read its copies only where those passes ran faster so; describe() reports it."""
    monkeypatch.setattr(fast_path, "_seconds", _ranked_first("packed"))
    target = build_model("llama")
    drafter = tiny_semi_ar_drafter(target)
    path = FastPath.for_model(target, cache_dir=tmp_path, copy_budget=0)
    ways = []

    def timed_pass(target_, drafter_, fast_path_, max_draft_tokens):
        assert max_draft_tokens == drafter_.max_draft_tokens  # the whole block the drafter drafts
        ways.append(fast_path_.one_row_copies(drafter_))
        return 1.0 if ways[-1] is faster else 2.0

    monkeypatch.setattr(dspark.speculative, "one_row_draft_seconds", timed_pass)
    dspark.wrap(target, drafter, fast_path=path)
    assert ways == [False, True, True, False, False, True]
    assert path.one_row_copies(drafter) is faster and not path.one_row_copies(target)
    on_weights, on_copies = (2000.0, 1000.0) if faster else (1000.0, 2000.0)
    assert f"SemiARDrafter, one row: {on_weights:.2f} ms on the weights, {on_copies:.2f} ms on the copies" in path.describe()
    used = _formulations_used(monkeypatch)
    weight = next(weight for weight in linear_weights(drafter) if path.is_reserved(weight))
    x = torch.randn(1, weight.shape[1])
    with path.active():
        routed = F.linear(x, weight)
    assert used == ["packed" if faster else "linear"] and _tight(routed, x @ weight.T)


def test_a_drafters_one_row_choice_is_timed_on_real_passes_once(tmp_path, monkeypatch):
    """wrap times a tiny semi-AR drafter's real one-row passes (seconds > 0); wrapping again on the same fast path
    times nothing."""
    monkeypatch.setattr(fast_path, "_seconds", _ranked_first("packed"))
    target = build_model("llama")
    drafter = tiny_semi_ar_drafter(target)
    path = FastPath.for_model(target, cache_dir=tmp_path, copy_budget=0)
    dspark.wrap(target, drafter, fast_path=path)
    choice = path.measure_one_row(drafter)
    assert choice is not None and choice.seconds_without > 0 and choice.seconds_with > 0
    _one_row_never_timed(monkeypatch, "timed although the drafter's one-row choice was measured")
    dspark.wrap(target, drafter, fast_path=path)


def test_clear_copies_drops_every_copy(tmp_path, monkeypatch):
    """clear_copies() empties the copies (e.g. after a change through weight.data); the next call makes them again, right."""
    monkeypatch.setattr(fast_path, "_seconds", _ranked_first("pretransposed"))
    layer = torch.nn.Linear(16, 8, bias=False)
    path = FastPath(copy_budget=10**9)
    path.reserve([layer.weight])
    x = torch.randn(2, 16)
    with path.active():
        layer(x)
        assert path.copy_bytes > 0
        with torch.no_grad():
            layer.weight.data.mul_(2.0)  # invisible to the version counter
        path.clear_copies()
        assert path.copy_bytes == 0
        assert _tight(layer(x), F.linear(x, layer.weight))


def _greedy_matches(target, path) -> None:
    input_ids, attention_mask = left_padded_batch([7, 12, 3, 9])
    expected = target.generate(input_ids, attention_mask=attention_mask, max_new_tokens=20, do_sample=False)
    routed = []
    if path is not False:
        linear = path.linear

        def counting(*args, **kwargs):
            routed[:] = [(routed[0] if routed else 0) + 1]
            return linear(*args, **kwargs)

        path.linear = counting
    speculative = dspark.wrap(target, PromptLookupDrafter(), max_draft_tokens=4, fast_path=path)
    assert torch.equal(speculative.generate(input_ids, attention_mask=attention_mask, max_new_tokens=20).sequences, expected)
    if path is not False:  # the forwards ran on it
        assert routed and routed[0] > 0


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "plain"])
@pytest.mark.parametrize("architecture", ["llama", "qwen2", "gpt2", "opt", "falcon", "bloom"])
def test_greedy_equals_hf_generate(architecture, fast, tmp_path):
    """Prompt lookup on a mixed-length left-padded batch gives model.generate's greedy tokens with and without the fast path."""
    target = build_model(architecture)
    _greedy_matches(target, FastPath.for_model(target, cache_dir=tmp_path) if fast else False)


@pytest.mark.parametrize("formulation", ["transposed", *COPYING])
@pytest.mark.parametrize("one_row_copies", [True, False], ids=["one row on copies", "one row on weights"])
def test_greedy_equals_hf_generate_with_each_formulation_forced(formulation, one_row_copies, tmp_path, monkeypatch):
    """With every product forced onto one formulation (copies within the default budget), one-row products on the
    copies or on the weights, greedy output is still model.generate's."""
    monkeypatch.setattr(fast_path, "_seconds", _ranked_first(formulation))
    timed = OneRowChoice(seconds_without=2.0, seconds_with=1.0 if one_row_copies else 2.0)
    _one_row_timed(monkeypatch, timed)
    target = build_model("llama")
    path = FastPath.for_model(target, cache_dir=tmp_path)
    _greedy_matches(target, path)
    assert all(choice.best == formulation for choice in path.choices())
    assert path.copy_bytes == path.reserved_bytes
    assert (path.copy_bytes > 0) == (formulation in COPYING)


@pytest.mark.parametrize("formulation", FORMULATIONS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_products_stay_close_to_f_linear(dtype, formulation, tmp_path, monkeypatch):
    """In bf16 and fp16 each formulation, forced (copies made where it copies), stays within
    half-precision rounding of F.linear, or is skipped as unsupported and F.linear is used."""
    monkeypatch.setattr(fast_path, "_seconds", _ranked_first(formulation))
    torch.manual_seed(0)
    layer = torch.nn.Linear(48, 96).to(dtype)
    path = FastPath(copy_budget=10**9, cache_file=tmp_path / "choices.json")
    path.reserve([layer.weight])
    supported = path.choice(96, 48, 1, dtype, torch.device("cpu")).best == formulation
    for rows in (1, 3, 8, 40):
        x = torch.randn(rows, 48).to(dtype)
        with path.active():
            routed = layer(x)
        assert routed.dtype == dtype and routed.shape == (rows, 96)
        assert torch.allclose(routed.float(), F.linear(x, layer.weight, layer.bias).float(), rtol=2e-2, atol=2e-2)
    assert (path.copy_bytes > 0) == (supported and formulation in COPYING)


def test_whole_forward_ways_that_come_out_close_are_timed_for_more_rounds():
    """Two ways within 1.25× of each other after three rounds are timed for six more and all nine decide; ways further
    apart are decided on the three (the noisy-stretch numbers of a 2-core EPYC: 44.5 against 44.0 ms, then 53.4
    against 40.5)."""
    assert fast_path._more_rounds_needed([44.5], [44.0]) and fast_path._more_rounds_needed([40.0], [49.0])
    assert not fast_path._more_rounds_needed([53.4], [40.5]) and not fast_path._more_rounds_needed([40.0], [51.0])


def test_a_few_row_count_whose_ways_came_out_close_is_timed_again_and_decided_on_every_round(tmp_path, monkeypatch):
    """At one product row the first three rounds read the two ways within 2% (ranked would stay), the six more rounds
    read transposed far faster: all nine rounds decide, transposed. At two rows the ways were clearly apart from the
    start: three rounds each, no more."""
    from dspark.cost_models import profiling

    model = build_model("llama")
    path = FastPath.for_model(model, cache_dir=tmp_path, copy_budget=0, progress=False)
    timed = {(count, way): [] for count in (1, 2) for way in (False, True)}
    early = {(1, False): 44.5e-3, (1, True): 44.0e-3, (2, False): 51.4e-3, (2, True): 39.9e-3}
    later = {(1, False): 53.4e-3, (1, True): 40.5e-3, (2, False): 51.4e-3, (2, True): 39.9e-3}

    def forward(model, rows, tokens, context, fast, repeats):
        way = (tokens, tokens in fast.transposed_rows(model))
        timed[way].append(1)
        seconds = (early if len(timed[way]) <= fast_path._FORWARD_ROUNDS else later)[way]
        return profiling.StepTiming(rows=rows, tokens=tokens, context=context, path="fast", seconds=seconds, repeats=repeats)

    monkeypatch.setattr(profiling, "measure_step_time", forward)
    choices = _TIME_TRANSPOSED(path, model, linear_weights(model), [1, 2], progress=False)
    rounds = fast_path._FORWARD_ROUNDS + fast_path._FORWARD_MORE_ROUNDS
    assert {way: len(calls) for way, calls in timed.items()} == {(1, False): rounds, (1, True): rounds, (2, False): 3, (2, True): 3}
    assert choices[1] == TransposedChoice(rows=1, seconds_ranked=53.4e-3, seconds_transposed=40.5e-3) and choices[1].transposed
    assert choices[2].transposed and path.transposed_rows(model) == ()


def test_a_one_row_choice_whose_ways_came_out_close_is_timed_for_more_rounds(tmp_path):
    """The one-row measurement times both ways for six more rounds where three read them within 1.25×, and decides on
    all nine; with the ways apart it stops at three."""
    model = build_model("llama")
    path = FastPath.for_model(model, cache_dir=tmp_path, copy_budget=0, progress=False)
    weights = linear_weights(model)
    for first, later, rounds in (((44.5e-3, 44.0e-3), (53.4e-3, 40.5e-3), 9), ((60.0e-3, 45.0e-3), (60.0e-3, 45.0e-3), 3)):
        calls = []

        def forward():
            copies = path.one_row_copies(model)
            calls.append(copies)
            return (first if calls.count(copies) <= fast_path._FORWARD_ROUNDS else later)[int(copies)]

        choice = path._time_one_row(model, weights, False, forward)
        assert len(calls) == 2 * rounds and calls.count(True) == rounds
        assert choice == OneRowChoice(seconds_without=later[0], seconds_with=later[1]) and choice.copies
