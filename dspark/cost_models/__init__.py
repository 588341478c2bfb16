"""Cost models: seconds per target forward and per drafting pass."""

from dspark.cost_models.auto import AutoProfiledCostModel, context_band, mean_context, rows_grid
from dspark.cost_models.constant import ConstantCostModel
from dspark.cost_models.online import OnlineCorrectedCostModel
from dspark.cost_models.profiled import CostTable, ProfiledCostModel, interpolate_monotone, monotone_envelope, profile_key
from dspark.cost_models.roofline import DEVICES, DeviceSpec, RooflineCostModel, measure_cpu_spec
from dspark.cost_models.sglang import from_sglang_sps, load_sglang_sps, save_sglang_sps, to_sglang_sps

__all__ = [
    "AutoProfiledCostModel",
    "ConstantCostModel",
    "CostTable",
    "DEVICES",
    "DeviceSpec",
    "OnlineCorrectedCostModel",
    "ProfiledCostModel",
    "RooflineCostModel",
    "context_band",
    "from_sglang_sps",
    "interpolate_monotone",
    "load_sglang_sps",
    "mean_context",
    "measure_cpu_spec",
    "monotone_envelope",
    "profile_key",
    "rows_grid",
    "save_sglang_sps",
    "to_sglang_sps",
]
