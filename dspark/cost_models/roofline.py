"""An analytic cost model: a target forward is bound by memory traffic or by arithmetic, whichever is slower.

Notation: a forward runs R rows of T new tokens each. P is the bytes of the target's weights, read
once per forward whatever R and T; K the bytes of keys and values one cached token holds (all
layers), read for every row's C cached tokens; F the FLOPs per new token (≈ 2 per weight of the
matrix products); W the device's memory bandwidth (bytes/s), Φ its peak FLOP/s in the forward's
dtype and o its fixed per-forward overhead. Then

    t(R, T) = o + max((P + K·C·R) / W, F·R·T / Φ).

Attention's own FLOPs (≈ 4·layers·width·C per token) and activations' traffic are left out: small
beside the weights' at the contexts and batch sizes speculative decoding verifies, and the model is
a first guess to be replaced by a profiled table (``ProfiledCostModel``) or corrected online
(``OnlineCorrectedCostModel``).
"""

from __future__ import annotations

import math
import numbers
import time

import attrs
import torch

from dspark.checks import check_int, int_at_least

__all__ = ["DEVICES", "DeviceSpec", "RooflineCostModel", "measure_cpu_spec"]


def _positive(instance, attribute, value) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{attribute.name} must be a finite number > 0, got {value!r}")


def _non_negative(instance, attribute, value) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{attribute.name} must be a finite number >= 0, got {value!r}")


def _check_peaks(instance, attribute, value) -> None:
    if not isinstance(value, dict) or not value:
        raise TypeError(f"peak_flops must be a non-empty dict from dtype name to FLOP/s, got {value!r}")
    for dtype, flops in value.items():
        if not isinstance(dtype, str):
            raise TypeError(f"peak_flops keys must be dtype names such as 'bfloat16', got {dtype!r}")
        if isinstance(flops, bool) or not isinstance(flops, numbers.Real) or not math.isfinite(flops) or flops <= 0:
            raise ValueError(f"peak_flops[{dtype!r}] must be a finite number of FLOP/s > 0, got {flops!r}")


def _dtype_name(dtype: torch.dtype | str) -> str:
    return dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")


@attrs.frozen
class DeviceSpec:
    """What the roofline needs of a device: memory bandwidth (bytes/s), peak FLOP/s per dtype name
    ("float32", "bfloat16", ...), and the fixed host overhead of one forward (seconds)."""

    name: str = attrs.field(validator=attrs.validators.instance_of(str))
    memory_bandwidth: float = attrs.field(validator=_positive)
    peak_flops: dict = attrs.field(converter=lambda value: dict(value) if isinstance(value, dict) else value, validator=_check_peaks, hash=False)
    overhead_seconds: float = attrs.field(default=0.0, validator=_non_negative)

    def peak(self, dtype: torch.dtype | str) -> float:
        """Peak FLOP/s in ``dtype``; a dtype the spec does not list is a ValueError naming those it does."""
        name = _dtype_name(dtype)
        if name not in self.peak_flops:
            raise ValueError(f"dtype must be one of {sorted(self.peak_flops)} for device {self.name!r}, got {name!r}")
        return float(self.peak_flops[name])


# NVIDIA's data sheets give tensor-core figures "with sparsity"; the dense figures below are half of
# those. FP32 is the non-tensor-core figure: PyTorch runs float32 matmuls without TF32 by default.
# No data sheet gives a per-forward overhead: an eager transformers forward adds host launch time
# (milliseconds for a deep model), so these entries carry 0; measure it for real use and put it in
# with attrs.evolve(DEVICES["h100-sxm"], overhead_seconds=...).
_HOPPER_COMPUTE = {
    "float32": 67e12,  # 67 TFLOP/s FP32
    "tfloat32": 494.5e12,  # 989 TFLOP/s TF32 with sparsity
    "bfloat16": 989e12,  # 1,979 TFLOP/s BF16 with sparsity
    "float16": 989e12,  # 1,979 TFLOP/s FP16 with sparsity
    "float8_e4m3fn": 1979e12,  # 3,958 TFLOP/s FP8 with sparsity
}

#: Shipped device specs. "h100-sxm": NVIDIA H100 Tensor Core GPU data sheet, SXM form factor:
#: 3.35 TB/s HBM3, FP32 67 TFLOP/s, BF16/FP16 1,979 TFLOP/s with sparsity (989 dense), FP8 3,958
#: (1,979 dense). "h200": NVIDIA H200 Tensor Core GPU data sheet, SXM: 4.8 TB/s HBM3e and the same
#: compute figures as the H100 SXM. "this-cpu": the 2-core CPU of dspark's development machine,
#: measured with ``measure_cpu_spec()`` (see the entry for the command and conditions).
DEVICES: dict[str, DeviceSpec] = {
    "h100-sxm": DeviceSpec("h100-sxm", memory_bandwidth=3.35e12, peak_flops=_HOPPER_COMPUTE),
    "h200": DeviceSpec("h200", memory_bandwidth=4.8e12, peak_flops=_HOPPER_COMPUTE),
    # One run of `python -c "from dspark.cost_models.roofline import measure_cpu_spec; print(measure_cpu_spec())"`
    # on the 2-core AMD EPYC development machine (torch 2.13.0+cpu, 2 threads), rounded, while another job
    # kept about 1.4 of the 2 cores busy. Bandwidth and FLOP/s are best-of figures and barely moved between
    # runs (28-35 GB/s, 45-68 GFLOP/s float32); the overhead did not: two OpenMP threads on a shared core wait
    # for each other at every small op, so a 1-layer forward took 7.8 ms here against 0.27 ms with
    # torch.set_num_threads(1) and 0.38 ms with 2 threads in a quiet moment. Measure your own for real use.
    "this-cpu": DeviceSpec("this-cpu", memory_bandwidth=34.9e9, peak_flops={"float32": 67.5e9, "bfloat16": 269.2e9}, overhead_seconds=7.78e-3),
}


def _best_seconds(function, repeats: int) -> float:
    """The fastest of ``repeats`` timed calls after one warm-up: a peak is what the machine can do,
    and other work on it only ever slows a run down."""
    function()
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        seconds.append(time.perf_counter() - started)
    return min(seconds)


def _copy_bandwidth(megabytes: int, repeats: int) -> float:
    source = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32)
    destination = torch.empty_like(source)
    # A copy reads and writes every byte once.
    return 2 * source.numel() * source.element_size() / _best_seconds(lambda: destination.copy_(source), repeats)


def _gemm_flops(size: int, dtype: torch.dtype, repeats: int) -> float:
    generator = torch.Generator().manual_seed(0)
    left = torch.randn((size, size), generator=generator).to(dtype)
    right = torch.randn((size, size), generator=generator).to(dtype)
    return 2 * size**3 / _best_seconds(lambda: torch.mm(left, right), repeats)


def _forward_overhead(repeats: int) -> float:
    """Fastest one-token forward of a 1-layer, 16-wide Llama: all host overhead, no work."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, max_position_embeddings=64)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    inputs = torch.zeros((1, 1), dtype=torch.long)
    with torch.inference_mode():
        return _best_seconds(lambda: model(input_ids=inputs), repeats)


def measure_cpu_spec(name: str = "this-cpu", copy_megabytes: int = 256, matrix_size: int = 1024, repeats: int = 5) -> DeviceSpec:
    """A ``DeviceSpec`` of this machine's CPU, measured in a few seconds with torch's current thread count.

    Bandwidth: the best of ``repeats`` copies of a ``copy_megabytes`` float32 tensor (read + write).
    Peak FLOP/s for float32 and bfloat16: the best of ``repeats`` ``matrix_size``² matrix products.
    Overhead: the fastest of 4 × ``repeats`` one-token forwards of a 1-layer, 16-wide transformers
    Llama (a deeper model pays more: the overhead is per layer as much as per forward). Best-of
    figures, because other work on the machine only ever slows a run down.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {name!r}")
    check_int("copy_megabytes", copy_megabytes, 1)
    check_int("matrix_size", matrix_size, 1)
    check_int("repeats", repeats, 1)
    return DeviceSpec(
        name,
        memory_bandwidth=_copy_bandwidth(copy_megabytes, repeats),
        peak_flops={_dtype_name(dtype): _gemm_flops(matrix_size, dtype, repeats) for dtype in (torch.float32, torch.bfloat16)},
        overhead_seconds=_forward_overhead(4 * repeats),
    )


# -- the cost model ---------------------------------------------------------------------------


def _device_spec(device: DeviceSpec | str) -> DeviceSpec:
    if isinstance(device, DeviceSpec):
        return device
    if isinstance(device, str) and device in DEVICES:
        return DEVICES[device]
    raise ValueError(f"device must be a DeviceSpec or one of {sorted(DEVICES)}, got {device!r}")


def _check_dtype(instance, attribute, value) -> None:
    instance.device.peak(value)


@attrs.frozen
class RooflineCostModel:
    """t(R, T) = o + max((P + K·C·R) / W, F·R·T / Φ) (module docstring) with P = ``parameter_bytes``,
    F = ``flops_per_token``, K = ``kv_bytes_per_token``, C = ``context``, and o, W, Φ from ``device``
    (a ``DeviceSpec`` or a name in ``DEVICES``) at ``dtype``. Drafting costs ``draft_seconds`` whatever the rows and depth."""

    parameter_bytes: float = attrs.field(validator=_positive)
    flops_per_token: float = attrs.field(validator=_positive)
    device: DeviceSpec = attrs.field(converter=_device_spec)
    kv_bytes_per_token: float = attrs.field(default=0, validator=_non_negative)
    context: int = attrs.field(default=0, validator=int_at_least(0))
    draft_seconds: float = attrs.field(default=0.0, validator=_non_negative)
    dtype: str = attrs.field(default="bfloat16", converter=_dtype_name, validator=_check_dtype)

    def step_time(self, rows: int, tokens: int) -> float:
        """Seconds of one forward over ``rows`` rows of ``tokens`` new tokens each."""
        check_int("rows", rows, 1)
        check_int("tokens", tokens, 1)
        memory = (self.parameter_bytes + self.kv_bytes_per_token * self.context * rows) / self.device.memory_bandwidth
        compute = self.flops_per_token * rows * tokens / self.device.peak(self.dtype)
        return self.device.overhead_seconds + max(memory, compute)

    def draft_time(self, rows: int, depth: int | None = None) -> float:
        """``draft_seconds``, whatever ``rows`` and ``depth``."""
        check_int("rows", rows, 1)
        return self.draft_seconds

    @classmethod
    def for_model(
        cls, model: torch.nn.Module, device: DeviceSpec | str, dtype: torch.dtype | None = None, context: int = 0, draft_seconds: float = 0.0
    ) -> "RooflineCostModel":
        """The roofline of a transformers causal LM run in ``dtype`` (default: its weights' dtype).

        P: every parameter (tied ones once) at ``dtype``'s size. F: 2 FLOPs per parameter that takes
        part in a matrix product, which is all of them but an input embedding not shared with the
        LM head (a lookup, not a product). K: 2 (keys and values) × layers × key/value heads × head
        width at ``dtype``'s size, from the model's config (0 when the config does not say).
        """
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        parameters = list(model.parameters())
        dtype = parameters[0].dtype if dtype is None else dtype
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating torch.dtype or None, got {dtype!r}")
        element_bytes = torch.finfo(dtype).bits // 8
        count = sum(parameter.numel() for parameter in parameters)
        embedding = model.get_input_embeddings().weight
        output = model.get_output_embeddings()
        in_products = count if output is not None and output.weight is embedding else count - embedding.numel()
        return cls(
            parameter_bytes=count * element_bytes, flops_per_token=2 * in_products, device=device,
            kv_bytes_per_token=_kv_elements_per_token(getattr(model, "config", None)) * element_bytes,
            context=context, draft_seconds=draft_seconds, dtype=dtype,
        )


def _kv_elements_per_token(config) -> int:
    """2 × layers × key/value heads × head width from a transformers config, 0 when it lacks them."""
    layers = getattr(config, "num_hidden_layers", None)
    heads = getattr(config, "num_attention_heads", None)
    hidden = getattr(config, "hidden_size", None)
    if not all(isinstance(value, int) and value > 0 for value in (layers, heads, hidden)):
        return 0
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    return 2 * layers * kv_heads * head_dim
