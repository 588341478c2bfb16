"""Cost models: seconds per target forward and per drafting pass."""

from dspark.cost_models.constant import ConstantCostModel

__all__ = ["ConstantCostModel"]
