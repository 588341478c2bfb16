"""Cost models in dspark/cost_models/."""

import pytest

from dspark.cost_models import ConstantCostModel
from dspark.protocols import CostModel


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
