"""Cheap verification on CPUs: every linear product of a forward takes the formulation measured
fastest for its shape and row count on the running machine.

Checking ℓ draft tokens should cost about one plain step: at batch 1 a step is bound by reading
the weights once, whatever the row count. On CPU builds of PyTorch it often is not, because
``F.linear`` with 2–16 rows takes a GEMM path several times slower than its one-row GEMV. For
``y = x Wᵀ (+ b)`` with x [M, in] and W [out, in], this module times these exact formulations:

* ``linear``: ``F.linear(x, W, b)``, PyTorch's own choice;
* ``transposed``: ``(W xᵀ)ᵀ``, which BLAS runs as a wide, short product;
* ``pretransposed``: ``x (Wᵀ)`` against a contiguous copy of Wᵀ;
* ``packed``: oneDNN's linear against a copy of W packed into its blocked layout.

A :class:`FastPath` picks per (out, in, M bucket, dtype, device, threads) the fastest one that
agrees with ``F.linear`` to float rounding, caches the choice on disk, and routes calls through
it only inside :meth:`FastPath.active`, a ``TorchFunctionMode``: the model is never modified and
outside that block ``model.generate`` runs as before. The two copying formulations hold a copy of
the weight; the copies live in the ``FastPath``, never on the model, and their total stays within
``copy_budget`` bytes (by default the largest weights first, so a budget that fits only one copy
spends it on the LM head).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import platform
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from dspark.checks import check_int

__all__ = ["FORMULATIONS", "REFERENCE_ROWS", "TUNED_ROWS", "FastPath", "LinearChoice", "default_copy_budget", "linear_weights", "row_bucket"]

logger = logging.getLogger(__name__)

#: Every formulation of ``x Wᵀ + b`` the fast path knows, in order of preference on a tie.
FORMULATIONS = ("linear", "transposed", "pretransposed", "packed")
_COPYING = frozenset({"pretransposed", "packed"})
_COPYING_ORDER = tuple(name for name in FORMULATIONS if name in _COPYING)
# Products with more rows than this are compute-bound; F.linear's GEMM is right for them.
_MAX_TUNED_ROWS = 512
#: Row counts whose savings decide which weights get copies: a plain step and an 8-token verify step.
REFERENCE_ROWS = (1, 8)
#: Row counts ``FastPath.for_model`` measures up front: every bucket up to ``_MAX_TUNED_ROWS``.
TUNED_ROWS = (*range(1, 17), 32, 64, 128, 256, 512)
_CACHE_VERSION = 1


def _choice_key(out_features: int, in_features: int, bucket: int, dtype: torch.dtype, device: torch.device) -> str:
    return f"{out_features}x{in_features}|{bucket}|{str(dtype).removeprefix('torch.')}|{device.type}"


def row_bucket(rows: int) -> int:
    """The row count a product is tuned at: ``rows`` itself up to 16 (BLAS kernels change at odd
    places there), else the smallest power of two ≥ ``rows``."""
    return rows if rows <= 16 else 1 << (rows - 1).bit_length()


def default_copy_budget(model: torch.nn.Module) -> int:
    """Nine tenths of the bytes of ``model``'s parameters: the ceiling on weight copies by default, so
    copies never cost as much memory as the model itself."""
    return sum(parameter.numel() * parameter.element_size() for parameter in model.parameters()) * 9 // 10


def linear_weights(module: torch.nn.Module) -> list[torch.Tensor]:
    """The weights of ``module``'s ``nn.Linear`` layers, plus its output embedding when it has one."""
    weights = [layer.weight for layer in module.modules() if isinstance(layer, torch.nn.Linear)]
    output_embeddings = getattr(module, "get_output_embeddings", lambda: None)()
    if output_embeddings is not None and getattr(output_embeddings, "weight", None) is not None:
        weights.append(output_embeddings.weight)
    return weights


@attrs.frozen
class LinearChoice:
    """The measured ranking of formulations for one product shape, fastest first, with their seconds."""

    out_features: int
    in_features: int
    rows: int
    dtype: str
    ranking: tuple[str, ...]
    seconds: tuple[float, ...]

    @property
    def best(self) -> str:
        return self.ranking[0]


def _seconds_of(choice: LinearChoice, formulation: str) -> float:
    """The measured seconds of ``formulation`` in ``choice``; infinite where it was not measured or failed."""
    return dict(zip(choice.ranking, choice.seconds)).get(formulation, math.inf)


def _packed_weight(weight: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight, rows)


def _apply(formulation: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, copy: torch.Tensor | None) -> torch.Tensor:
    """y = x Wᵀ + b for 2-D ``x`` by ``formulation``; ``copy`` is the copied weight the formulation needs."""
    if formulation == "linear":
        return F.linear(x, weight, bias)
    if formulation == "transposed":
        # Contiguous like F.linear's result: a transposed view would push later kernels (SDPA's
        # flash kernel among them) onto slow strided paths.
        out = (weight @ x.T).T.contiguous()
    elif formulation == "pretransposed":
        out = x @ copy
    else:  # packed
        return torch.ops.mkldnn._linear_pointwise(x, copy, bias, "none", [], "")
    return out if bias is None else out + bias


def _make_copy(formulation: str, weight: torch.Tensor) -> torch.Tensor | None:
    if formulation == "pretransposed":
        return weight.detach().t().contiguous()
    if formulation == "packed":
        # The hint is the row count oneDNN blocks for; the packed weight serves any row count.
        return _packed_weight(weight.detach(), 8)
    return None


def _seconds(function: Callable[[], object], budget: float = 0.03) -> float:
    """Fastest of a few timed calls after a warm-up: the minimum shrugs off other processes' noise."""
    function()
    started = time.perf_counter()
    function()
    first = time.perf_counter() - started
    best = first
    for _ in range(max(3, min(25, int(budget / max(first, 1e-6))))):
        started = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - started)
    return best


def _machine_fingerprint() -> str:
    """What a choice depends on besides the shape and device: PyTorch build, processor and threads."""
    processor = platform.processor()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")]
        processor = names[0] if names else processor
    return f"torch {torch.__version__} | {processor} | {torch.get_num_threads()} threads"


@attrs.frozen
class _Copy:
    """A weight copy and what it was made from; a changed version or data pointer makes it stale."""

    reference: weakref.ref
    version: int
    pointer: int
    formulation: str
    copy: torch.Tensor
    size: int


# transformers reads this variable at every SDPA call; while set, a masked multi-query attention over
# grouped key/value heads passes ``enable_gqa=True`` instead of ``repeat_kv`` copying the whole
# context per head group (on this CPU: 1.8 ms against 22 ms a layer at 16 rows, context 1,000;
# same result bit for bit). It changes speed only, never values, so other threads may see it.
_GQA_VARIABLE = "TRANSFORMERS_SDPA_FORCE_GQA"
_gqa_lock = threading.Lock()
_gqa_users = 0
_gqa_previous: str | None = None


@contextlib.contextmanager
def _native_gqa() -> Iterator[None]:
    global _gqa_users, _gqa_previous
    with _gqa_lock:
        if _gqa_users == 0:
            _gqa_previous = os.environ.get(_GQA_VARIABLE)
            os.environ[_GQA_VARIABLE] = "1"
        _gqa_users += 1
    try:
        yield
    finally:
        with _gqa_lock:
            _gqa_users -= 1
            if _gqa_users == 0:
                if _gqa_previous is None:
                    os.environ.pop(_GQA_VARIABLE, None)
                else:
                    os.environ[_GQA_VARIABLE] = _gqa_previous


class _LinearRouter(TorchFunctionMode):
    """Sends every ``F.linear`` call to its ``FastPath``; everything else runs unchanged."""

    def __init__(self, fast_path: "FastPath"):
        super().__init__()
        self.fast_path = fast_path

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear or func is torch._C._nn.linear:
            return self.fast_path.linear(*args, **kwargs)
        return func(*args, **kwargs)


class FastPath:
    """Routes linear products through the fastest exact formulation for their shape on this machine.

    ``copy_budget`` bounds the bytes of weight copies (pre-transposed or packed); 0 allows none.
    ``cache_file`` keeps measured choices across processes (None: in memory only). ``candidates``
    restricts the formulations tried. ``native_gqa`` lets SDPA run grouped-query attention itself
    (right for CPU kernels; ``for_model`` sets it for CPU models only). Use ``with fast_path.active(): model(...)``; ``choices()``
    shows what was picked and ``copy_bytes`` what the copies cost.
    """

    def __init__(
        self,
        copy_budget: int = 0,
        cache_file: str | os.PathLike | None = None,
        candidates: tuple[str, ...] = FORMULATIONS,
        native_gqa: bool = True,
    ):
        check_int("copy_budget", copy_budget, 0)
        unknown = [name for name in candidates if name not in FORMULATIONS]
        if unknown or not candidates:
            raise ValueError(f"candidates must be a non-empty subset of {FORMULATIONS}, got {candidates!r}")
        if not isinstance(native_gqa, bool):
            raise TypeError(f"native_gqa must be a bool, got {native_gqa!r}")
        self.copy_budget = copy_budget
        self.native_gqa = native_gqa
        self.cache_file = None if cache_file is None else Path(cache_file)
        self.candidates = tuple(name for name in FORMULATIONS if name in candidates)
        self._choices: dict[str, LinearChoice] = {}
        self._by_shape: dict[tuple, LinearChoice] = {}
        self._copies: dict[int, _Copy] = {}
        self._reserved: dict[int, tuple[weakref.ref, int, str]] = {}  # id(weight) -> (weight, bytes, copying formulation)
        self._lock = threading.Lock()
        self._load_cache()

    @classmethod
    def for_model(
        cls,
        model: torch.nn.Module,
        *others: torch.nn.Module,
        copy_budget: int | None = None,
        cache_dir: str | os.PathLike | None = None,
        progress: bool = True,
    ) -> "FastPath":
        """A fast path for the forwards of ``model`` and ``others`` (a drafter, say), its copies
        reserved (``reserve``) for the ``linear_weights`` of ``others`` first (small, and run at
        every step), then of ``model``.

        ``copy_budget`` defaults to ``default_copy_budget(model)``. Every weight shape is timed at
        every row bucket of ``TUNED_ROWS`` up front (``tune``, with a progress bar when ``progress``),
        once per machine: choices are cached in ``cache_dir`` (default: the ``fast_path`` folder of
        the dspark cache directory), one file per machine.
        """
        if cache_dir is None:
            from dspark.pretrained import default_cache_dir

            cache_dir = default_cache_dir() / "fast_path"
        budget = default_copy_budget(model) if copy_budget is None else copy_budget
        name = hashlib.sha1(_machine_fingerprint().encode()).hexdigest()[:16]
        on_cpu = all(parameter.device.type == "cpu" for parameter in model.parameters())
        fast_path = cls(copy_budget=budget, cache_file=Path(cache_dir) / f"linear_choices_{name}.json", native_gqa=on_cpu)
        other_weights = [weight for module in others for weight in linear_weights(module)]
        model_weights = linear_weights(model)
        fast_path.tune(other_weights + model_weights, progress=progress)
        fast_path.reserve(other_weights)
        fast_path.reserve(model_weights)
        return fast_path

    def reserve(self, weights) -> None:
        """Grant weight copies to those of ``weights`` they help most, as far as the budget left reaches.

        Each weight gets one copying formulation, the fastest summed over ``REFERENCE_ROWS``; its gain is
        the time that copy saves over the best non-copying formulation, summed over the same rows, and
        weights are taken by gain per byte. Only reserved weights are ever
        copied, and only on first use, so a weight seen under another identity (an offloaded layer
        materialised per call, say) never costs memory.
        """
        gains = []
        for weight in {id(weight): weight for weight in weights}.values():
            if self._is_reserved(weight) or weight.dim() != 2 or not weight.is_floating_point() or weight.device.type == "meta":
                continue
            if weight.is_inference():
                continue  # no version counter, so an in-place change could not be told from a stale copy
            choices = [self.choice(*weight.shape, rows, weight.dtype, weight.device) for rows in REFERENCE_ROWS]
            # One copying formulation per weight, fastest over REFERENCE_ROWS: row counts that favour
            # different ones would otherwise rebuild the copy at every switch.
            formulation = min(_COPYING_ORDER, key=lambda name: sum(_seconds_of(choice, name) for choice in choices))
            gain = sum(self._copy_gain(choice, formulation) for choice in choices)
            if gain > 0:
                gains.append((gain / (weight.numel() * weight.element_size()), weight, formulation))
        remaining = self.copy_budget - self.reserved_bytes
        for _, weight, formulation in sorted(gains, key=lambda entry: entry[0], reverse=True):
            size = weight.numel() * weight.element_size()
            if size <= remaining:
                self._reserved[id(weight)] = (weakref.ref(weight), size, formulation)
                remaining -= size

    @property
    def reserved_bytes(self) -> int:
        """Bytes granted to weight copies (made on first use): never more than ``copy_budget``."""
        return sum(size for reference, size, _ in self._reserved.values() if reference() is not None)

    def _is_reserved(self, weight: torch.Tensor) -> bool:
        entry = self._reserved.get(id(weight))
        return entry is not None and entry[0]() is weight

    @staticmethod
    def _copy_gain(choice: LinearChoice, formulation: str) -> float:
        """Seconds the copying ``formulation`` saves over the best non-copying one (0 if none)."""
        plain = [_seconds_of(choice, name) for name in FORMULATIONS if name not in _COPYING]
        return max(0.0, min(plain) - _seconds_of(choice, formulation))

    # -- what the router calls --------------------------------------------------------------------

    @contextlib.contextmanager
    def active(self) -> Iterator["FastPath"]:
        """Within this block every ``F.linear`` (so every ``nn.Linear``) runs on the fast path, and,
        when ``native_gqa`` is set, transformers' SDPA attention hands grouped-query attention to
        the kernel instead of copying keys and values per head group."""
        with torch.inference_mode(), _LinearRouter(self), (_native_gqa() if self.native_gqa else contextlib.nullcontext()):
            yield self

    def linear(self, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``F.linear(input, weight, bias)`` by the formulation chosen for this shape and row count."""
        if weight.dim() != 2 or input.dim() == 0 or input.shape[-1] != weight.shape[1] or input.requires_grad:
            return F.linear(input, weight, bias)
        rows = input.numel() // max(input.shape[-1], 1)
        if rows == 0 or rows > _MAX_TUNED_ROWS or input.dtype != weight.dtype:
            return F.linear(input, weight, bias)
        # A tuple lookup first: this runs for every linear of every forward.
        shape = (weight.shape[0], weight.shape[1], rows, input.dtype, input.device)
        choice = self._by_shape.get(shape)
        if choice is None:
            choice = self._by_shape[shape] = self.choice(*shape)
        flat = input.reshape(rows, input.shape[-1])
        for formulation in choice.ranking:
            copy = self._copy_for(formulation, weight) if formulation in _COPYING else None
            if formulation not in _COPYING or copy is not None:
                return _apply(formulation, flat, weight, bias, copy).reshape(*input.shape[:-1], weight.shape[0])
        return F.linear(input, weight, bias)

    # -- measuring ----------------------------------------------------------------------------------

    def choice(self, out_features: int, in_features: int, rows: int, dtype: torch.dtype, device: torch.device, save: bool = True) -> LinearChoice:
        """The measured ranking for this shape at ``row_bucket(rows)``, measuring it on first use
        (and writing the disk cache unless ``save`` is False)."""
        key = _choice_key(out_features, in_features, row_bucket(rows), dtype, device)
        found = self._choices.get(key)
        if found is None:
            found = self._measure(out_features, in_features, row_bucket(rows), dtype, device)
            with self._lock:
                self._choices[key] = found
                if save:
                    self._save_cache()
        return found

    def tune(self, weights, rows: tuple[int, ...] = TUNED_ROWS, progress: bool = True) -> None:
        """Measure every shape of ``weights`` at every bucket of ``rows`` not measured yet, once,
        so that no forward pays for a measurement; shows a progress bar when there is work."""
        # Offloaded weights live on "meta" until a forward materialises them: measured then, on first use.
        shapes = {(w.shape[0], w.shape[1], w.dtype, w.device) for w in weights if w.dim() == 2 and w.is_floating_point() and w.device.type != "meta"}
        missing = [
            (out_features, in_features, bucket, dtype, device)
            for out_features, in_features, dtype, device in sorted(shapes, key=str)
            for bucket in sorted({row_bucket(count) for count in rows})
            if _choice_key(out_features, in_features, bucket, dtype, device) not in self._choices
        ]
        if not missing:
            return
        if progress:
            from tqdm.auto import tqdm

            missing = tqdm(missing, desc="dspark fast path: timing linear formulations (once per machine)", unit="shape")
        for out_features, in_features, bucket, dtype, device in missing:
            self.choice(out_features, in_features, bucket, dtype, device, save=False)
        with self._lock:
            self._save_cache()

    def _measure(self, out_features: int, in_features: int, rows: int, dtype: torch.dtype, device: torch.device) -> LinearChoice:
        generator = torch.Generator(device="cpu").manual_seed(0)
        weight = (torch.randn(out_features, in_features, generator=generator) / in_features**0.5).to(device, dtype)
        x = torch.randn(rows, in_features, generator=generator).to(device, dtype)
        with torch.inference_mode():
            reference = F.linear(x, weight).float()
            tolerance = 1e-3 if dtype == torch.float32 else 5e-2
            timed = []
            for formulation in self.candidates:
                try:
                    copy = _make_copy(formulation, weight)
                    result = _apply(formulation, x, weight, None, copy)
                except (RuntimeError, NotImplementedError, AttributeError):
                    continue  # this build or dtype lacks the kernel
                if result.shape != reference.shape or not torch.allclose(result.float(), reference, rtol=tolerance, atol=tolerance):
                    continue
                timed.append((_seconds(lambda: _apply(formulation, x, weight, None, copy)), formulation))
        timed.sort(key=lambda pair: (pair[0], FORMULATIONS.index(pair[1])))
        logger.info("fast path %dx%d at %d rows (%s): %s", out_features, in_features, rows, dtype, timed)
        return LinearChoice(
            out_features=out_features, in_features=in_features, rows=rows, dtype=str(dtype).removeprefix("torch."),
            ranking=tuple(name for _, name in timed) or ("linear",), seconds=tuple(seconds for seconds, _ in timed) or (float("nan"),),
        )

    # -- weight copies ------------------------------------------------------------------------------

    @property
    def copy_bytes(self) -> int:
        """Bytes held in weight copies now (each counted at its weight's size)."""
        return sum(entry.size for entry in self._copies.values())

    def _copy_for(self, formulation: str, weight: torch.Tensor) -> torch.Tensor | None:
        """The weight's copy for ``formulation``, made on first use if the budget allows, else None."""
        key = id(weight)
        entry = self._copies.get(key)
        if entry is not None and entry.formulation == formulation and entry.version == weight._version and entry.pointer == weight.data_ptr():
            return entry.copy
        if not self._is_reserved(weight) or self._reserved[key][2] != formulation:
            return None
        copies = self._copies
        # The copy goes when the weight does: nothing outlives the model it was made for.
        reference = weakref.ref(weight, lambda _: copies.pop(key, None))
        copy = _make_copy(formulation, weight)
        self._copies[key] = _Copy(reference, weight._version, weight.data_ptr(), formulation, copy, self._reserved[key][1])
        return self._copies[key].copy

    # -- reporting and the disk cache ------------------------------------------------------------------

    def choices(self) -> list[LinearChoice]:
        """Every measured choice so far (from this process or the disk cache), sorted by shape and rows."""
        return sorted(self._choices.values(), key=lambda c: (c.out_features, c.in_features, c.dtype, c.rows))

    def describe(self) -> str:
        """A table of the choices: shape, rows, fastest formulation and its speed-up over ``F.linear``."""
        lines = [f"{'shape (out x in)':>18} {'rows':>5} {'dtype':>9}  {'chosen':<14} {'vs F.linear':>11}"]
        for choice in self.choices():
            timings = dict(zip(choice.ranking, choice.seconds))
            speedup = timings.get("linear", float("nan")) / choice.seconds[0]
            lines.append(f"{choice.out_features:>8} x {choice.in_features:<7} {choice.rows:>5} {choice.dtype:>9}  {choice.best:<14} {speedup:>10.2f}x")
        lines.append(f"weight copies: {self.copy_bytes / 2**20:.1f} MiB of a {self.copy_budget / 2**20:.1f} MiB budget")
        return "\n".join(lines)

    def _load_cache(self) -> None:
        if self.cache_file is None or not self.cache_file.is_file():
            return
        try:
            stored = json.loads(self.cache_file.read_text())  # ValueError covers bad JSON and bad UTF-8
            if stored.get("version") != _CACHE_VERSION or tuple(stored.get("candidates", ())) != self.candidates:
                return  # another layout or another candidate set: measure again and overwrite
            choices = {
                key: LinearChoice(**{**values, "ranking": tuple(values["ranking"]), "seconds": tuple(values["seconds"])})
                for key, values in stored.get("choices", {}).items()
            }
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as error:
            logger.warning("ignoring unreadable fast-path cache %s: %s", self.cache_file, error)
            return
        self._choices.update(choices)

    def _save_cache(self) -> None:
        if self.cache_file is None:
            return
        payload = {
            "version": _CACHE_VERSION,
            "machine": _machine_fingerprint(),
            "candidates": list(self.candidates),
            "choices": {key: attrs.asdict(choice) for key, choice in self._choices.items()},
        }
        partial = self.cache_file.with_name(f"{self.cache_file.name}.{os.getpid()}.tmp")
        try:
            self.cache_file.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps(payload, indent=1))
            os.replace(partial, self.cache_file)
        except OSError as error:  # a read-only or full disk costs re-measuring next time, never the forward
            logger.warning("could not write the fast-path cache %s: %s", self.cache_file, error)
