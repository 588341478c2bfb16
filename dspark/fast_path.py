"""Cheap verification on CPUs: every linear product of a forward takes the formulation measured
fastest for its shape and row count on the running machine.

Checking ℓ draft tokens should cost about one plain step: at batch 1 a step is bound by reading
the weights once, whatever the row count. On CPU builds of PyTorch it often is not, because
``F.linear`` with 2–16 rows takes a GEMM path several times slower than its one-row GEMV. For
``y = x Wᵀ (+ b)`` with x [M, in] and W [out, in], this module times these exact formulations:

* ``linear``: ``F.linear(x, W, b)``, PyTorch's own choice;
* ``transposed``: ``(W xᵀ)ᵀ``, which BLAS runs as a wide, short product (one row is padded to two:
  with one column MKL takes its matrix-vector path, with two its small-N product, which on a 2-core
  EPYC streamed the weights far faster);
* ``pretransposed``: ``x (Wᵀ)`` against a contiguous copy of Wᵀ;
* ``packed``: oneDNN's linear against a copy of W packed into its blocked layout.

A :class:`FastPath` times them per (out, in, row bucket, dtype, device), keeps those that agree
with ``F.linear`` to float rounding, caches the ranking on disk (one file per PyTorch build,
processor and thread count), uses another formulation than ``F.linear`` only where it was timed
clearly faster (``FastPath._ranking``), lets a model's one-row products read its weight copies only where
whole one-token forwards of that model ran faster so (``FastPath.measure_one_row``: timed alone, the weight
sits in cache, which misleads at one row), runs every product of a few-row forward ``transposed`` where whole
forwards of the model over that many rows ran faster so (``FastPath.measure_transposed``), and routes calls through it only inside :meth:`FastPath.active`:
the model is never modified and outside that block ``model.generate`` runs as before. The two copying formulations hold a copy of the weight; the copies live in the
``FastPath``, never on the model, go only to weights granted by ``reserve`` (by measured gain per
byte), and their total stays within ``copy_budget`` bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import platform
import statistics
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import attrs
import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary

from dspark.checks import check_int, check_seconds, int_at_least

__all__ = [
    "FORMULATIONS",
    "REFERENCE_ROWS",
    "REVISION",
    "TRANSPOSED_ROWS",
    "TUNED_ROWS",
    "FastPath",
    "LinearChoice",
    "OneRowChoice",
    "TransposedChoice",
    "default_cache_dir",
    "default_copy_budget",
    "linear_weights",
    "on_cpu",
    "processor_name",
    "row_bucket",
]

logger = logging.getLogger(__name__)

#: Every formulation of ``x Wᵀ + b`` the fast path knows, in order of preference on a tie.
FORMULATIONS = ("linear", "transposed", "pretransposed", "packed")
_COPYING = frozenset({"pretransposed", "packed"})
_COPYING_ORDER = tuple(name for name in FORMULATIONS if name in _COPYING)
# Products with more rows than this are compute-bound; F.linear's GEMM is right for them.
_MAX_TUNED_ROWS = 512
#: Row counts whose savings decide which weights get copies: an 8-token verify step (whether one-row
#: products use them is measured on whole forwards, ``FastPath.measure_one_row``).
REFERENCE_ROWS = (8,)
# Another formulation replaces F.linear only where it was timed this many times faster (FastPath._ranking).
_MARGIN = 1.25
# 2: ``transposed`` pads one row to two, so its one-row timings measured another product.
# 3: whole-forward choices whose ways came out close are timed for more rounds (``_more_rounds_needed``), so a choice
# cached from three noisy rounds is measured again.
_CACHE_VERSION = 3
#: Raised whenever a change to the fast path changes how long forwards take, so that timings measured
#: on an earlier one (``ProfiledCostModel`` tables) are measured again. 2: F.linear routed alone.
#: 3: F.linear unless another formulation was timed 1.25x faster, and no copy for one row.
#: 4: a model's one-row products read its copies where whole one-token forwards ran faster so.
#: 5: so do a drafter's (``dspark.wrap``), where its one-row drafting passes ran faster so.
#: 6: a model's few-row products run transposed where its whole forwards ran faster so, one row padded to two.
#: 7: whole-forward choices whose two ways came out within ``_FORWARD_UNSURE`` are timed for more rounds.
REVISION = 7
# A whole-forward rule (one-row copies, transposed products) changes a model's products only where its forwards ran
# this many times faster so: below that the medians of a few forwards cannot tell the two apart on a loaded machine,
# and the rule's extra operations would then be paid on every such step for a gain that may not be there.
_FORWARD_MARGIN = 1.05
# Rounds of a whole-forward measurement (each times both ways, in alternating order) and forwards per way and round.
_FORWARD_ROUNDS = 3
_FORWARD_REPEATS = 5
# Where the two ways' medians after _FORWARD_ROUNDS rounds lie within this factor of each other, both are timed for
# _FORWARD_MORE_ROUNDS more and all the rounds decide: on a 2-core EPYC in a noisy stretch three rounds put a one-token
# forward at 44.5 ms as ranked against 44.0 ms transposed (kept as ranked, and cached), where twelve rounds later read
# 53.4 against 40.5 ms, transposed faster in 11 of 12 (docs/fast_path.rst, "Few rows, measured again where unsure").
_FORWARD_UNSURE = 1.25
_FORWARD_MORE_ROUNDS = 6
#: Product row counts (rows × new tokens of a forward) at which whole forwards decide whether every product of a
#: model runs ``transposed`` (``FastPath.measure_transposed``): where BLAS kernels for few rows differ most.
TRANSPOSED_ROWS = tuple(range(1, 9))
# The kernel itself, kept before any routing: inside active() ``F.linear`` is the router.
_F_LINEAR = F.linear


def row_bucket(rows: int) -> int:
    """The row count a product is tuned at: ``rows`` itself up to 16 (BLAS kernels change at odd
    places there), else the smallest power of two ≥ ``rows``."""
    return rows if rows <= 16 else 1 << (rows - 1).bit_length()


#: Row counts ``FastPath.tune`` measures up front: every bucket up to ``_MAX_TUNED_ROWS``.
TUNED_ROWS = tuple(sorted({row_bucket(rows) for rows in range(1, _MAX_TUNED_ROWS + 1)}))


def _available_memory() -> int | None:
    """Bytes of memory the system can still give (Linux ``MemAvailable``), None where unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def default_copy_budget(module: torch.nn.Module) -> int:
    """Nine tenths of the bytes ``module`` holds (parameters and buffers, such as a drafter's derived
    LM head), and never more than half the memory the system has available now: copies never cost
    as much memory as the model itself."""
    tensors = [*module.parameters(), *module.buffers()]
    budget = sum(tensor.numel() * tensor.element_size() for tensor in tensors) * 9 // 10
    available = _available_memory()
    return budget if available is None else min(budget, available // 2)


def linear_weights(module: torch.nn.Module) -> list[torch.Tensor]:
    """The weights of ``module``'s ``nn.Linear`` layers that keep ``nn.Linear``'s own forward (so reach
    ``F.linear``; Falcon's, which multiply by ``weight.T`` themselves, do not), plus its output
    embedding when it has one."""
    weights = [layer.weight for layer in module.modules() if isinstance(layer, torch.nn.Linear) and type(layer).forward is torch.nn.Linear.forward]
    output_embeddings = getattr(module, "get_output_embeddings", lambda: None)()
    if output_embeddings is not None and getattr(output_embeddings, "weight", None) is not None:
        weights.append(output_embeddings.weight)
    return weights


def _check_formulations(instance, attribute, value) -> None:
    if not value or any(name not in FORMULATIONS for name in value):
        raise ValueError(f"{attribute.name} must be a non-empty tuple of names from {FORMULATIONS}, got {value!r}")


@attrs.frozen
class LinearChoice:
    """The measured ranking of formulations for one product shape, fastest first, with their seconds."""

    out_features: int = attrs.field(validator=attrs.validators.instance_of(int))
    in_features: int = attrs.field(validator=attrs.validators.instance_of(int))
    rows: int = attrs.field(validator=attrs.validators.instance_of(int))
    dtype: str = attrs.field(validator=attrs.validators.instance_of(str))
    ranking: tuple[str, ...] = attrs.field(converter=tuple, validator=_check_formulations)
    seconds: tuple[float, ...] = attrs.field(converter=tuple)

    def __attrs_post_init__(self):
        if len(self.seconds) != len(self.ranking):
            raise ValueError(f"seconds must give one time per ranked formulation {self.ranking}, got {self.seconds!r}")

    @property
    def best(self) -> str:
        return self.ranking[0]


def _positive_seconds(instance, attribute, value) -> None:
    if check_seconds(attribute.name, value) == 0:
        raise ValueError(f"{attribute.name} must be a finite number of seconds > 0, got {value!r}")


@attrs.frozen
class OneRowChoice:
    """Whether a model's one-row products read its weight copies, from whole one-token forwards of that
    model timed both ways (``FastPath.measure_one_row``): ``seconds_without``, every one-row product on
    the original weights; ``seconds_with``, each weight that holds a copy reading the copy, as wider
    products do. ``copies``: the copies made the forward at least ``_FORWARD_MARGIN`` times faster."""

    seconds_without: float = attrs.field(validator=_positive_seconds)
    seconds_with: float = attrs.field(validator=_positive_seconds)

    @property
    def copies(self) -> bool:
        return self.seconds_with * _FORWARD_MARGIN <= self.seconds_without


@attrs.frozen
class TransposedChoice:
    """Whether every product of ``rows`` rows in a model runs ``transposed``, from whole forwards of that model over
    ``rows`` new tokens timed both ways (``FastPath.measure_transposed``): ``seconds_ranked``, each product as its own
    ranking (timed alone) and, at one row, ``measure_one_row`` chose; ``seconds_transposed``, every product
    transposed. ``transposed``: that made the forward at least ``_FORWARD_MARGIN`` times faster."""

    rows: int = attrs.field(validator=int_at_least(1))
    seconds_ranked: float = attrs.field(validator=_positive_seconds)
    seconds_transposed: float = attrs.field(validator=_positive_seconds)

    @property
    def transposed(self) -> bool:
        return self.seconds_transposed * _FORWARD_MARGIN <= self.seconds_ranked


def _alternating(rounds: int) -> list[bool]:
    """Both ways of a whole-forward measurement for each of ``rounds`` rounds, the first way alternating (False, True,
    True, False, ...), so that a drift in the machine's pace hits both alike."""
    return [way for index in range(rounds) for way in ((False, True) if index % 2 == 0 else (True, False))]


def _more_rounds_needed(first: list[float], second: list[float]) -> bool:
    """Whether the two ways' median seconds so far lie within ``_FORWARD_UNSURE`` of each other, where a few rounds on a
    noisy machine cannot tell them apart (and a wrong choice is cached for good), so both are timed for more rounds."""
    ratio = statistics.median(first) / statistics.median(second)
    return 1 / _FORWARD_UNSURE < ratio < _FORWARD_UNSURE


def _model_key(model: torch.nn.Module, copied: list[tuple[int, str]]) -> str:
    """What a model's one-row choice depends on besides the machine: its class, its linear weights' shapes,
    dtypes and device, and which of them hold a copy of which formulation (``copied``: index among
    ``linear_weights(model)``, formulation; the copy budget, which depends on free memory, decides them)."""
    weights = [(tuple(weight.shape), str(weight.dtype), weight.device.type) for weight in linear_weights(model)]
    return hashlib.sha1(f"{type(model).__name__} {weights} {copied}".encode()).hexdigest()[:16]


def _seconds_of(choice: LinearChoice, formulation: str) -> float:
    """The measured seconds of ``formulation`` in ``choice``; infinite where it was not measured or failed."""
    return dict(zip(choice.ranking, choice.seconds)).get(formulation, math.inf)


def _apply(formulation: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, copy: torch.Tensor | None) -> torch.Tensor:
    """y = x Wᵀ + b for 2-D ``x`` by ``formulation``; ``copy`` is the copied weight the formulation needs."""
    if formulation == "linear":
        return _F_LINEAR(x, weight, bias)
    if formulation == "transposed":
        # One row padded to two: MKL multiplies by one column on its matrix-vector path, by two on its small-N
        # product, which streamed the weights of whole forwards far faster on a 2-core EPYC (docs/fast_path.rst).
        # Contiguous like F.linear's result: a transposed view would push later kernels (SDPA's
        # flash kernel among them) onto slow strided paths.
        columns = F.pad(x, (0, 0, 0, 1)) if x.shape[0] == 1 else x
        out = (weight @ columns.T).T[: x.shape[0]].contiguous()
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
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 8)
    return None


def _seconds(function: Callable[[], object], device: torch.device, budget: float = 0.03) -> float:
    """Fastest of a few timed calls after a warm-up: the minimum shrugs off other processes' noise.
    On an accelerator every call is synchronised, so what is timed is the kernel, not its launch."""
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def timed() -> float:
        synchronize()
        started = time.perf_counter()
        function()
        synchronize()
        return time.perf_counter() - started

    timed()
    best = first = timed()
    # Cheap products get many repeats; one that alone exceeds the budget (a large model's head at
    # hundreds of rows) gets one more, so measuring a big model once stays a matter of minutes.
    for _ in range(max(1, min(25, int(budget / max(first, 1e-6))))):
        best = min(best, timed())
    return best


def _version(tensor: torch.Tensor) -> int | None:
    """The tensor's in-place version counter; None for inference tensors, which have none."""
    return None if tensor.is_inference() else tensor._version


def _cache_key(out_features: int, in_features: int, bucket: int, dtype: torch.dtype, device_type: str) -> str:
    return f"{out_features}x{in_features}|{bucket}|{str(dtype).removeprefix('torch.')}|{device_type}"


def processor_name(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The host processor: its name, with family, model, stepping and last-level cache where Linux tells them
    (``cpuinfo``; "AMD EPYC (cpu family 25, model 17, stepping 1), L3 32768K"). Virtual machines often name only the
    vendor's line ("AMD EPYC"), which covers processors whose products rank differently and whose forwards take times
    2.5x apart, so whatever caches timings keys them by this."""
    processor = platform.processor()
    if cpuinfo.is_file():
        fields: dict[str, str] = {}
        for line in cpuinfo.read_text().splitlines():
            name, _, value = line.partition(":")
            fields.setdefault(name.strip(), value.strip())  # the first processor's
        processor = fields.get("model name", processor)
        details = ", ".join(f"{name} {fields[name]}" for name in ("cpu family", "model", "stepping") if name in fields)
        processor = f"{processor} ({details})" if details else processor
    cache = _last_level_cache()
    return f"{processor}{'' if cache is None else f', {cache}'}"


def _machine_fingerprint() -> str:
    """What a choice depends on besides the shape and device: PyTorch build, processor (``processor_name``) and
    threads."""
    return f"torch {torch.__version__} | {processor_name()} | {torch.get_num_threads()} threads"


def _last_level_cache() -> str | None:
    """The first processor's last-level cache as Linux names it ("L3 32768K"); None where it does not say."""
    try:
        caches = [(int((index / "level").read_text()), (index / "size").read_text().strip()) for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")]
    except (OSError, ValueError):
        return None
    return None if not caches else "L{} {}".format(*max(caches))


@attrs.frozen
class _Copy:
    """A weight copy and what it was made from; a changed version or data pointer makes it stale."""

    version: int
    pointer: int
    formulation: str
    copy: torch.Tensor
    size: int


# transformers reads this variable at every SDPA call; while set, a masked multi-query attention over
# grouped key/value heads passes ``enable_gqa=True`` instead of ``repeat_kv`` copying the whole
# context per head group (on a 2-core CPU: 1.8 ms against 22 ms a layer at 16 rows, context 1,000;
# the same result bit for bit there). The variable is process-wide, so a forward in another thread
# sees it too; on CPUs that changes its speed only. ``for_model`` sets ``native_gqa`` for CPU models.
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


# Routing swaps ``torch.nn.functional.linear`` (which ``nn.Linear.forward`` looks up at every call) for
# ``_routed_linear`` while any thread is inside an active() block, and each thread keeps its own stack
# of active fast paths. A TorchFunctionMode would catch F.linear as well, but it also intercepts every
# other torch call of the forward: about 2,000 per SmolLM2 step, 3 ms of a 40 ms step on a 2-core CPU.
_routing_lock = threading.Lock()
_routing_users = 0
_routing_previous: Callable | None = None
_routing_local = threading.local()


def _routed_linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` while routing is installed: this thread's innermost active fast path, else the kernel."""
    stack = getattr(_routing_local, "stack", None)
    if not stack:
        return _F_LINEAR(input, weight, bias)
    return stack[-1].linear(input, weight, bias)


@contextlib.contextmanager
def _routing(fast_path: "FastPath") -> Iterator[None]:
    global _routing_users, _routing_previous
    stack = _routing_local.__dict__.setdefault("stack", [])
    with _routing_lock:
        if _routing_users == 0:
            _routing_previous = F.linear
            F.linear = _routed_linear
        _routing_users += 1
    stack.append(fast_path)
    try:
        yield
    finally:
        stack.pop()
        with _routing_lock:
            _routing_users -= 1
            if _routing_users == 0:
                F.linear = _routing_previous


def default_cache_dir() -> Path:
    """Where measured choices are kept: ``$DSPARK_FAST_PATH_CACHE`` if set, else the ``fast_path``
    folder of the dspark cache directory (``$DSPARK_CACHE`` or ``~/.cache/dspark``)."""
    from dspark.pretrained import default_cache_dir as dspark_cache_dir

    return Path(os.environ.get("DSPARK_FAST_PATH_CACHE") or dspark_cache_dir() / "fast_path")


def on_cpu(module: torch.nn.Module) -> bool:
    """Whether ``module`` computes on the CPU: every parameter there, or offloaded ("meta") and
    materialised there per call."""
    return all(parameter.device.type in ("cpu", "meta") for parameter in module.parameters())


# One fast path per target, so that every ``wrap`` of a model shares its measurements and copies.
_SHARED: WeakIdKeyDictionary = WeakIdKeyDictionary()
_SHARED_LOCK = threading.Lock()


class FastPath:
    """Routes linear products through the fastest exact formulation for their shape on this machine.

    ``copy_budget`` bounds the bytes of weight copies (pre-transposed or packed); 0 allows none, and
    ``reserve``/``include`` may add to it. ``cache_file`` keeps measured choices across processes
    (None: in memory only). ``candidates`` restricts the formulations tried. ``native_gqa`` lets
    transformers' SDPA run grouped-query attention itself under a mask (right for CPU kernels;
    ``for_model`` sets it for CPU models). Use ``with fast_path.active(): model(...)``;
    ``describe()`` shows what was picked and ``copy_bytes`` what the copies cost.

    Copies follow in-place changes of a weight (its version counter) and replacements of its data;
    an in-place change through ``weight.data`` bypasses the version counter, so after one call
    ``clear_copies()``.
    """

    def __init__(
        self,
        copy_budget: int = 0,
        cache_file: str | os.PathLike | None = None,
        candidates: tuple[str, ...] = FORMULATIONS,
        native_gqa: bool = False,
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
        # (out, in, row bucket, dtype, device type) -> ranking; looked up on every routed call.
        self._choices: dict[tuple, LinearChoice] = {}
        self._reserved = WeakIdKeyDictionary()  # weight -> (bytes, copying formulation)
        self._copies = WeakIdKeyDictionary()  # weight -> _Copy
        # id(weight) -> (weak reference, {(rows, dtype): (copy check, formulation, copy)}): linear's shortcut.
        self._plans: dict[int, tuple[weakref.ref, dict]] = {}
        self._included = WeakIdKeyDictionary()  # module -> True
        self._one_row: dict[str, OneRowChoice] = {}  # model key -> its measured one-row choice (disk cache)
        self._one_row_applied = WeakIdKeyDictionary()  # model -> the one-row choice applied to it, for describe()
        self._one_row_copies = WeakIdKeyDictionary()  # weight -> True: its one-row products read its copy
        self._transposed: dict[str, dict[int, TransposedChoice]] = {}  # model key -> rows -> its measured choice (disk cache)
        self._transposed_applied = WeakIdKeyDictionary()  # model -> the transposed choices applied to it, for describe()
        self._transposed_rows = WeakIdKeyDictionary()  # weight -> row counts at which its products run transposed
        self._lock = threading.Lock()
        # Held while a whole-forward measurement flips a rule (not _lock: the timed forwards take it in choice()).
        self._forward_rule_lock = threading.Lock()
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
        """A fast path for the forwards of ``model`` and ``others`` (a drafter's modules, say).

        Every linear shape of them is timed at every bucket of ``TUNED_ROWS`` up front (``tune``,
        with a progress bar when ``progress``), once per machine: choices are cached in
        ``cache_dir`` (default ``default_cache_dir()``). Copies are
        granted to ``others`` first (``include``: small, and run at every step), then to ``model``'s
        ``linear_weights`` within ``copy_budget`` (default ``default_copy_budget(model)``). Whether
        ``model``'s one-row products read its copies is then measured on its own forwards
        (``measure_one_row``), then at which few-row counts its products all run transposed
        (``measure_transposed``), once per machine and model, and cached alike.
        """
        cache_dir = default_cache_dir() if cache_dir is None else cache_dir
        name = hashlib.sha1(_machine_fingerprint().encode()).hexdigest()[:16]
        fast_path = cls(cache_file=Path(cache_dir) / f"linear_choices_{name}.json", native_gqa=on_cpu(model))
        for module in others:
            fast_path.include(module, progress=progress)
        weights = linear_weights(model)
        fast_path.tune(weights, progress=progress)
        fast_path.reserve(weights, budget=default_copy_budget(model) if copy_budget is None else copy_budget)
        fast_path.measure_one_row(model, progress=progress)
        fast_path.measure_transposed(model, progress=progress)
        fast_path._included[model] = True
        return fast_path

    @classmethod
    def shared(cls, model: torch.nn.Module) -> "FastPath":
        """The fast path of ``model`` that every ``dspark.wrap`` of it uses: ``for_model(model)``, made
        on first use and kept (weakly) for as long as the model lives."""
        with _SHARED_LOCK:
            fast_path = _SHARED.get(model)
            if fast_path is None:
                fast_path = _SHARED[model] = cls.for_model(model)
        return fast_path

    def include(self, module: torch.nn.Module, copy_budget: int | None = None, progress: bool = True) -> None:
        """Also serve ``module`` (a drafter, say): time its linear shapes and grant copies among its
        ``linear_weights`` within ``copy_budget`` more bytes (default ``default_copy_budget(module)``).
        Including a module twice changes nothing. Its one-row products keep their weights until
        ``measure_one_row(module, forward=...)`` finds its copies faster at one row (``dspark.wrap`` measures a
        drafter's modules so, on one-row drafting passes)."""
        if module in self._included:
            return
        weights = linear_weights(module)
        self.tune(weights, progress=progress)
        self.reserve(weights, budget=default_copy_budget(module) if copy_budget is None else copy_budget)
        self._included[module] = True

    def reserve(self, weights: Iterable[torch.Tensor], budget: int | None = None) -> None:
        """Grant weight copies to those of ``weights`` they help most: within ``budget`` more bytes
        (added to ``copy_budget``), or with None within what is left of ``copy_budget``.

        Each weight gets one copying formulation, the fastest summed over ``REFERENCE_ROWS``; its
        gain is the time that copy saves over the best non-copying formulation, summed over the same
        rows, and weights are taken by gain per byte. Only reserved weights are ever copied, and only
        on first use, so a weight seen under another identity (an offloaded layer materialised per
        call, say) never costs memory.
        """
        if budget is not None:
            check_int("budget", budget, 0, optional=True)
            self.copy_budget += budget
        gains = []
        unique = {id(weight): weight for weight in weights}.values()
        for weight in unique:
            if weight in self._reserved or weight.dim() != 2 or not weight.is_floating_point() or weight.device.type == "meta":
                continue
            if _version(weight) is None or type(weight) not in (torch.Tensor, torch.nn.Parameter):
                continue  # no version counter to tell a stale copy, or a tensor subclass the kernels may not take
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
                self._reserved[weight] = (size, formulation)
                remaining -= size

    @property
    def reserved_bytes(self) -> int:
        """Bytes granted to weight copies (made on first use): never more than ``copy_budget``."""
        return sum(size for size, _ in list(self._reserved.values()))

    def is_reserved(self, weight: torch.Tensor) -> bool:
        """Whether ``weight`` was granted a copy (made on its first use)."""
        return weight in self._reserved

    def measure_one_row(
        self, model: torch.nn.Module, progress: bool = True, forward: Callable[[], float] | None = None
    ) -> OneRowChoice | None:
        """Whether ``model``'s one-row products read its weight copies, measured on its own forwards, and
        applied: the ``OneRowChoice``, or None (one-row products keep their weights) where none of its
        weights holds a copy or its forward cannot be timed alone.

        A product timed alone has its weight in cache; in a forward the weights come from memory, and
        what that does to a one-row product differs by machine: on one, copies timed up to 40% faster
        alone left the one-token forward slower; on another, the one-token forward took 43.0 ms with its
        one-row products on the weights and 27.5 ms on the copies (docs/fast_path.rst, "One row,
        measured on whole forwards"). So whole one-token forwards of ``model`` (one row, 256 cached
        tokens; or, for a module that is not a model, such as a drafter, ``forward``: a call that runs it once
        as it runs in use, one row on this fast path, and returns the seconds that took) are timed both ways,
        ``_FORWARD_ROUNDS`` rounds in alternating order (with a progress
        bar when ``progress``), ``_FORWARD_MORE_ROUNDS`` more where the two came out close (``_more_rounds_needed``), and
        the medians decide (``OneRowChoice.copies``). Once per machine, model
        and set of copied weights: the result is cached with the choices. Call it before generating on
        this fast path, not while another thread does: the measurement switches the rule back and forth.
        Copies granted to ``model``'s weights after it (a later ``reserve``) keep their weights at one
        row until it is called again; a weight that another module shares with ``model`` follows
        ``model``'s result."""
        # Only copies whose formulation agreed with F.linear at one row may serve one-row products.
        readable = [(index, weight) for index, weight in enumerate(linear_weights(model)) if self._reads_copy_at_one_row(weight)]
        if not readable:
            return None
        weights = [weight for _, weight in readable]
        key = _model_key(model, [(index, self._reserved[weight][1]) for index, weight in readable])
        with self._forward_rule_lock:
            self._one_row_applied.pop(model, None)
            choice = self._one_row.get(key)
            if choice is None:
                choice = self._time_one_row(model, weights, progress, forward)
                if choice is None:
                    return None
                with self._lock:
                    self._one_row[key] = choice
                    self._save_cache()
            self._use_one_row(weights, choice.copies)
            self._one_row_applied[model] = choice
        return choice

    def _reads_copy_at_one_row(self, weight: torch.Tensor) -> bool:
        """Whether ``weight`` holds a copy whose formulation agreed with ``F.linear`` at one row (it is ranked there)."""
        reserved = self._reserved.get(weight)
        return reserved is not None and reserved[1] in self.choice(weight.shape[0], weight.shape[1], 1, weight.dtype, weight.device).ranking

    def one_row_copies(self, model: torch.nn.Module) -> bool:
        """Whether ``model``'s one-row products read its weight copies now (``measure_one_row``)."""
        return any(weight in self._one_row_copies for weight in linear_weights(model))

    def _time_one_row(
        self, model: torch.nn.Module, weights: list[torch.Tensor], progress: bool, forward: Callable[[], float] | None
    ) -> OneRowChoice | None:
        """Median seconds of ``model``'s one-token forward (or of ``forward()``) with ``weights``' one-row products on
        the weights and on their copies, in alternating order (``measure_one_row``); None, with a warning, where the
        forward cannot be timed alone. Leaves the products on the weights, whatever happens."""
        from dspark.cost_models.profiling import measure_step_time  # it times forwards on a FastPath

        if forward is None:
            def forward() -> float:
                return measure_step_time(model, 1, 1, 256, self, repeats=_FORWARD_REPEATS).seconds

        seconds: dict[bool, list[float]] = {False: [], True: []}
        try:
            for more_rounds, rounds in ((False, _FORWARD_ROUNDS), (True, _FORWARD_MORE_ROUNDS)):
                if more_rounds and not _more_rounds_needed(seconds[False], seconds[True]):
                    break
                order = _alternating(rounds)
                if progress:
                    from tqdm.auto import tqdm

                    more = " (more rounds: the two ways came out close)" if more_rounds else ""
                    order = tqdm(order, desc=f"dspark fast path: timing one-row passes of {type(model).__name__} (once per machine and model){more}", unit="way")
                for copies in order:
                    self._use_one_row(weights, copies)
                    seconds[copies].append(forward())
        except (AttributeError, TypeError, ValueError, RuntimeError) as error:  # a model that cannot step alone
            logger.warning("fast path: could not time %s's one-row pass (%s); its one-row products keep their weights", type(model).__name__, error)
            return None
        finally:
            self._use_one_row(weights, False)
        return OneRowChoice(seconds_without=statistics.median(seconds[False]), seconds_with=statistics.median(seconds[True]))

    def _use_one_row(self, weights: list[torch.Tensor], copies: bool) -> None:
        """Make ``weights``' one-row products read their copies (``copies``) or the weights themselves."""
        for weight in weights:
            if copies:
                self._one_row_copies[weight] = True
            else:
                self._one_row_copies.pop(weight, None)
            self._drop_plans(weight, {1})

    def measure_transposed(
        self, model: torch.nn.Module, rows: Iterable[int] = TRANSPOSED_ROWS, progress: bool = True
    ) -> dict[int, TransposedChoice]:
        """At which of ``rows`` product row counts every product of ``model`` runs ``transposed``, measured on its own
        forwards, and applied: row count -> ``TransposedChoice`` (empty where ``transposed`` is not a candidate or the
        forward cannot be timed alone).

        Timed alone, a product has its weight in cache, and there the transposed product of two rows ran no faster
        than oneDNN's packed one; in a forward, with the weights streamed from memory, a 2-core EPYC's one-token
        step over two rows took 31.8 ms with every product transposed against 49.4 ms as ranked, and over one row,
        padded to two, 31.4 against 40.5 ms (docs/fast_path.rst, "Few rows, measured on whole forwards"). So for
        each row count M, whole forwards of one row and M new tokens after 256 cached tokens are timed both ways,
        ``_FORWARD_ROUNDS`` rounds in alternating order (with a progress bar when ``progress``), ``_FORWARD_MORE_ROUNDS``
        more for each row count whose two ways came out close (``_more_rounds_needed``), and the medians decide
        (``TransposedChoice.transposed``). Call it after ``measure_one_row`` (the ranked way at one row is
        what that chose), before generating on this fast path, not while another thread does. Once per machine,
        model and set of copied weights: the result is cached with the choices, and a row count measured before is
        not timed again."""
        counts = sorted({check_int("rows", count, 1) for count in rows})
        weights = linear_weights(model)
        if "transposed" not in self.candidates or not weights or not counts:
            return {}
        key = _model_key(model, [(index, self._reserved[weight][1]) for index, weight in enumerate(weights) if weight in self._reserved])
        with self._forward_rule_lock:
            self._transposed_applied.pop(model, None)
            known = self._transposed.get(key, {})
            missing = [count for count in counts if count not in known]
            if missing:
                timed = self._time_transposed(model, weights, missing, progress)
                if timed is None:
                    return {}
                with self._lock:
                    known = self._transposed[key] = {**known, **timed}
                    self._save_cache()
            self._use_transposed(weights, {count for count, choice in known.items() if choice.transposed})
            self._transposed_applied[model] = known
        return {count: known[count] for count in counts}

    def transposed_rows(self, model: torch.nn.Module) -> tuple[int, ...]:
        """The product row counts at which ``model``'s products all run transposed now (``measure_transposed``)."""
        return tuple(sorted({count for weight in linear_weights(model) for count in self._transposed_rows.get(weight, ())}))

    def _time_transposed(
        self, model: torch.nn.Module, weights: list[torch.Tensor], counts: list[int], progress: bool
    ) -> dict[int, TransposedChoice] | None:
        """Median seconds of ``model``'s forwards over each of ``counts`` new tokens with its products as ranked and all
        transposed, in alternating order (``measure_transposed``); None, with a warning, where the forward cannot be
        timed alone. Leaves no product transposed, whatever happens."""
        from dspark.cost_models.profiling import measure_step_time  # it times forwards on a FastPath

        seconds: dict[tuple[int, bool], list[float]] = {(count, transposed): [] for count in counts for transposed in (False, True)}
        try:
            timed = counts
            for more_rounds, rounds in ((False, _FORWARD_ROUNDS), (True, _FORWARD_MORE_ROUNDS)):
                if more_rounds:
                    timed = [count for count in counts if _more_rounds_needed(seconds[(count, False)], seconds[(count, True)])]
                order = [(count, transposed) for count in timed for transposed in _alternating(rounds)]
                if progress and order:
                    from tqdm.auto import tqdm

                    more = " (more rounds where the two ways came out close)" if more_rounds else ""
                    order = tqdm(order, desc=f"dspark fast path: timing few-row passes of {type(model).__name__} (once per machine and model){more}", unit="way")
                for count, transposed in order:
                    self._use_transposed(weights, {count} if transposed else set())
                    seconds[(count, transposed)].append(measure_step_time(model, 1, count, 256, self, repeats=_FORWARD_REPEATS).seconds)
        except (AttributeError, TypeError, ValueError, RuntimeError) as error:  # a model that cannot step alone
            logger.warning("fast path: could not time %s's few-row passes (%s); its products keep their rankings", type(model).__name__, error)
            return None
        finally:
            self._use_transposed(weights, set())
        return {
            count: TransposedChoice(
                rows=count, seconds_ranked=statistics.median(seconds[(count, False)]), seconds_transposed=statistics.median(seconds[(count, True)])
            )
            for count in counts
        }

    def _use_transposed(self, weights: list[torch.Tensor], counts: set[int]) -> None:
        """Make ``weights``' products of each of ``counts`` rows run transposed, and no others."""
        for weight in weights:
            changed = set(self._transposed_rows.get(weight, ())) ^ counts
            if counts:
                self._transposed_rows[weight] = frozenset(counts)
            else:
                self._transposed_rows.pop(weight, None)
            self._drop_plans(weight, changed)

    def _drop_plans(self, weight: torch.Tensor, counts: set[int]) -> None:
        """Forget ``weight``'s plans at each of ``counts`` rows: made under a rule that has just changed."""
        entry = self._plans.get(id(weight))
        if entry is not None:
            for rows_and_dtype in list(entry[1]):
                if rows_and_dtype[0] in counts:
                    entry[1].pop(rows_and_dtype, None)

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
        the kernel instead of copying keys and values per head group. The block runs under
        ``torch.inference_mode()``: the copies carry no gradient, so the fast path is for inference only."""
        with torch.inference_mode(), _routing(self), (_native_gqa() if self.native_gqa else contextlib.nullcontext()):
            yield self

    def linear(self, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``F.linear(input, weight, bias)`` by the formulation chosen for this shape and row count."""
        shape = input.shape
        if not shape or weight.dim() != 2 or shape[-1] != weight.shape[1] or input.requires_grad:
            return _F_LINEAR(input, weight, bias)
        rows = input.numel() // max(shape[-1], 1)
        # This runs for every linear of every forward: a weight's plan for this row count is one
        # lookup, checked against the weight's version and storage when it uses a copy.
        entry = self._plans.get(id(weight))
        if entry is not None and entry[0]() is weight:
            plan = entry[1].get((rows, input.dtype))
            if plan is not None and plan[1] == "linear":
                return _F_LINEAR(input, weight, bias)  # the kernel itself: no reshaping on the way
            if plan is not None and (plan[0] is None or plan[0] == (weight._version, weight.data_ptr())):
                return _apply(plan[1], input.reshape(rows, shape[-1]), weight, bias, plan[2]).reshape(*shape[:-1], weight.shape[0])
        if rows == 0 or rows > _MAX_TUNED_ROWS or input.dtype != weight.dtype:
            return _F_LINEAR(input, weight, bias)
        choice = self.choice(weight.shape[0], weight.shape[1], rows, input.dtype, input.device)
        for formulation in self._ranking(choice, weight):
            copy = self._copy_for(formulation, weight) if formulation in _COPYING else None
            if formulation not in _COPYING or copy is not None:
                self._remember_plan(weight, rows, input.dtype, formulation, copy)
                return _apply(formulation, input.reshape(rows, shape[-1]), weight, bias, copy).reshape(*shape[:-1], weight.shape[0])
        return _F_LINEAR(input, weight, bias)

    def _ranking(self, choice: LinearChoice, weight: torch.Tensor) -> list[str]:
        """The formulations ``linear`` may use for ``weight`` at ``choice``'s row count, best first: at one
        row, the weight's copy where its model's forwards measured faster so (``measure_one_row``), else
        never a copy; otherwise ``F.linear`` itself unless another was timed at least ``_MARGIN`` times faster.

        Each product is timed alone with its weight in cache. In a forward the weights come from
        memory, where a formulation's timed edge shrinks or vanishes while its extra operations (a
        transpose, a contiguous copy) still cost their overhead; and a copy used at some row counts
        makes forwards of different widths read different bytes, so each switch of width finds its
        weights cold (docs/fast_path.rst, "Timed alone, used in a forward"). Where one-row products
        read the copies, every width reads the same bytes. Where whole forwards over this many rows ran faster with
        every product transposed (``measure_transposed``), the product runs transposed wherever that agreed with
        ``F.linear``."""
        if choice.rows in self._transposed_rows.get(weight, ()) and "transposed" in choice.ranking:
            return ["transposed", "linear"]
        reserved = self._reserved.get(weight) if choice.rows == 1 and weight in self._one_row_copies else None
        if reserved is not None:  # measure_one_row only lets copies ranked at one row (agreeing with F.linear) in
            return [reserved[1], "linear"]
        kernel = _seconds_of(choice, "linear")
        allowed = [
            name for name in choice.ranking
            if name == "linear" or (_seconds_of(choice, name) * _MARGIN <= kernel and not (choice.rows == 1 and name in _COPYING))
        ]
        return allowed if "linear" in allowed else allowed + ["linear"]

    def _remember_plan(self, weight: torch.Tensor, rows: int, dtype: torch.dtype, formulation: str, copy: torch.Tensor | None) -> None:
        """Keep what ``linear`` chose for ``weight`` at ``rows``; the plans go with the weight (a weak
        reference's callback drops them), so a copy never outlives its weight."""
        entry = self._plans.get(id(weight))
        if entry is None or entry[0]() is not weight:
            plans = self._plans
            entry = self._plans[id(weight)] = (weakref.ref(weight, lambda _, key=id(weight): plans.pop(key, None)), {})
        check = None if copy is None else (weight._version, weight.data_ptr())
        entry[1][(rows, dtype)] = (check, formulation, copy)

    # -- measuring ----------------------------------------------------------------------------------

    def choice(self, out_features: int, in_features: int, rows: int, dtype: torch.dtype, device: torch.device, save: bool = True) -> LinearChoice:
        """The measured ranking for this shape at ``row_bucket(rows)``, measuring it on first use
        (and writing the disk cache unless ``save`` is False)."""
        key = (out_features, in_features, row_bucket(rows), dtype, device.type)
        found = self._choices.get(key)
        if found is None:
            found = self._measure(out_features, in_features, row_bucket(rows), dtype, device)
            with self._lock:
                self._choices[key] = found
                if save:
                    self._save_cache()
        return found

    def tune(self, weights: Iterable[torch.Tensor], rows: tuple[int, ...] = TUNED_ROWS, progress: bool = True) -> None:
        """Measure every shape of ``weights`` at every bucket of ``rows`` not measured yet, once,
        so that no forward pays for a measurement; shows a progress bar when there is work."""
        # Offloaded weights live on "meta" until a forward materialises them: measured then, on first use.
        shapes = {(w.shape[0], w.shape[1], w.dtype, w.device) for w in weights if w.dim() == 2 and w.is_floating_point() and w.device.type != "meta"}
        missing = [
            (out_features, in_features, bucket, dtype, device)
            for out_features, in_features, dtype, device in sorted(shapes, key=str)
            for bucket in sorted({row_bucket(count) for count in rows})
            if (out_features, in_features, bucket, dtype, device.type) not in self._choices
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
        # Drawn in the weight's own dtype: a float32 stand-in for a large half-precision head would double its memory.
        weight = (torch.randn(out_features, in_features, generator=generator, dtype=dtype) / in_features**0.5).to(device)
        x = torch.randn(rows, in_features, generator=generator, dtype=dtype).to(device)
        with torch.inference_mode():
            reference = _F_LINEAR(x, weight).float()
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
                timed.append((_seconds(lambda: _apply(formulation, x, weight, None, copy), device), formulation))
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
        return sum(entry.size for entry in list(self._copies.values()))

    def clear_copies(self) -> None:
        """Drop every weight copy (they are made again on next use), e.g. after changing weights
        through ``weight.data``, which their version counters cannot see."""
        self._copies.clear()
        self._plans.clear()

    def _copy_for(self, formulation: str, weight: torch.Tensor) -> torch.Tensor | None:
        """The weight's copy for ``formulation``, made on first use if it was reserved for it, else None."""
        entry = self._copies.get(weight)
        if entry is not None and entry.formulation == formulation and entry.version == _version(weight) and entry.pointer == weight.data_ptr():
            return entry.copy
        reserved = self._reserved.get(weight)
        if reserved is None or reserved[1] != formulation:
            return None
        try:
            copy = _make_copy(formulation, weight)
        except (RuntimeError, NotImplementedError) as error:  # a layout the kernels refuse: plain products from now on
            logger.warning("fast path: no %s copy of a %s weight (%s); using F.linear for it", formulation, tuple(weight.shape), error)
            self._reserved.pop(weight, None)
            return None
        self._copies[weight] = _Copy(_version(weight), weight.data_ptr(), formulation, copy, reserved[0])
        return copy

    # -- reporting and the disk cache ------------------------------------------------------------------

    def choices(self) -> list[LinearChoice]:
        """Every measured choice so far (from this process or the disk cache), sorted by shape and rows."""
        return sorted(self._choices.values(), key=lambda c: (c.out_features, c.in_features, c.dtype, c.rows))

    def describe(self, weights: Iterable[torch.Tensor] | None = None) -> str:
        """A table of the choices: shape, rows, fastest formulation and its speed-up over ``F.linear``;
        only the shapes of ``weights`` when given (the cache file holds every model measured here)."""
        shapes = None if weights is None else {(weight.shape[0], weight.shape[1]) for weight in weights if weight.dim() == 2}
        lines = [f"{'shape (out x in)':>18} {'rows':>5} {'dtype':>9}  {'chosen':<14} {'vs F.linear':>11}"]
        for choice in self.choices():
            if shapes is not None and (choice.out_features, choice.in_features) not in shapes:
                continue
            speedup = _seconds_of(choice, "linear") / choice.seconds[0]
            lines.append(f"{choice.out_features:>8} x {choice.in_features:<7} {choice.rows:>5} {choice.dtype:>9}  {choice.best:<14} {speedup:>10.2f}x")
        for model, choice in list(self._one_row_applied.items()):
            lines.append(
                f"{type(model).__name__}, one row: {choice.seconds_without * 1e3:.2f} ms on the weights, {choice.seconds_with * 1e3:.2f} ms on the copies;"
                f" one-row products read the {'copies' if choice.copies else 'weights'}"
            )
        for model, choices in list(self._transposed_applied.items()):
            lines.extend(
                f"{type(model).__name__}, {count} product rows: {choice.seconds_ranked * 1e3:.2f} ms as ranked, {choice.seconds_transposed * 1e3:.2f} ms"
                f" transposed; products run {'transposed' if choice.transposed else 'as ranked'}"
                for count, choice in sorted(choices.items())
            )
        lines.append(f"weight copies: {self.copy_bytes / 2**20:.1f} MiB of a {self.copy_budget / 2**20:.1f} MiB budget")
        return "\n".join(lines)

    def _load_cache(self) -> None:
        if self.cache_file is None or not self.cache_file.is_file():
            return
        try:
            stored = json.loads(self.cache_file.read_text())  # ValueError covers bad JSON and bad UTF-8
            if stored.get("version") != _CACHE_VERSION or tuple(stored.get("candidates", ())) != self.candidates:
                return  # another layout or another candidate set: measure again and overwrite
            choices = {}
            for key, values in stored.get("choices", {}).items():
                shape, bucket, dtype, device = key.split("|")
                out_features, in_features = (int(size) for size in shape.split("x"))
                choices[(out_features, in_features, int(bucket), getattr(torch, dtype), device)] = LinearChoice(**values)
            one_row = {key: OneRowChoice(**values) for key, values in (stored.get("one_row") or {}).items()}
            transposed = {
                key: {values["rows"]: TransposedChoice(**values) for values in listed} for key, listed in (stored.get("transposed") or {}).items()
            }
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as error:
            logger.warning("ignoring unreadable fast-path cache %s: %s", self.cache_file, error)
            return
        self._choices.update(choices)
        self._one_row.update(one_row)
        self._transposed.update(transposed)

    def _save_cache(self) -> None:
        if self.cache_file is None:
            return
        payload = {
            "version": _CACHE_VERSION,
            "machine": _machine_fingerprint(),
            "candidates": list(self.candidates),
            "choices": {_cache_key(*key): attrs.asdict(choice) for key, choice in self._choices.items()},
            "one_row": {key: attrs.asdict(choice) for key, choice in self._one_row.items()},
            "transposed": {key: [attrs.asdict(choice) for _, choice in sorted(choices.items())] for key, choices in self._transposed.items()},
        }
        partial = self.cache_file.with_name(f"{self.cache_file.name}.{os.getpid()}.tmp")
        try:
            self.cache_file.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps(payload, indent=1))
            os.replace(partial, self.cache_file)
        except OSError as error:  # a read-only or full disk costs re-measuring next time, never the forward
            logger.warning("could not write the fast-path cache %s: %s", self.cache_file, error)
