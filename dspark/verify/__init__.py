"""Acceptance rules, warping, confidence estimators, their calibration, and verify policies and schedulers."""

from dspark.verify.acceptance import greedy_accept, leading_true, rejection_sample, residual_distribution
from dspark.verify.calibration import BANDS, Calibration, CalibrationFile, CalibrationLog, CalibrationSet, band_of
from dspark.verify.confidence import DraftProbability, DrafterConfidence, survival_products
from dspark.verify.estimators import (
    BandedConfidence, CalibratedConfidence, DriftCorrectedConfidence, LogisticConfidence, OnlineLogisticConfidence, calibrated_estimator, draft_signals,
    online_estimator,
)
from dspark.verify.fallback import GoodputFallback, best_drafted_rows, drafting_goodput, reach_depth
from dspark.verify.policies import FixedLength, Threshold
from dspark.verify.schedulers import HardwareAwareScheduler, MinimumGainRule, VllmArgmaxRule, prefix_schedule
from dspark.verify.warping import warp_logits, warped_probs

__all__ = [
    "BANDS",
    "BandedConfidence",
    "CalibratedConfidence",
    "Calibration",
    "CalibrationFile",
    "CalibrationLog",
    "CalibrationSet",
    "DraftProbability",
    "DrafterConfidence",
    "DriftCorrectedConfidence",
    "FixedLength",
    "GoodputFallback",
    "HardwareAwareScheduler",
    "LogisticConfidence",
    "MinimumGainRule",
    "OnlineLogisticConfidence",
    "Threshold",
    "VllmArgmaxRule",
    "band_of",
    "best_drafted_rows",
    "calibrated_estimator",
    "draft_signals",
    "drafting_goodput",
    "greedy_accept",
    "leading_true",
    "online_estimator",
    "prefix_schedule",
    "reach_depth",
    "rejection_sample",
    "residual_distribution",
    "survival_products",
    "warp_logits",
    "warped_probs",
]
