"""Drafters: propose draft tokens, then learn from the target's decision."""

from dspark.drafters.cascade import CascadeDrafter
from dspark.drafters.draft_model import DraftModelDrafter
from dspark.drafters.prompt_lookup import PromptLookupDrafter, lookup_continuation
from dspark.drafters.semi_ar import SemiARConfig, SemiARDrafter, TargetSignature, default_target_layers

__all__ = [
    "CascadeDrafter",
    "DraftModelDrafter",
    "PromptLookupDrafter",
    "SemiARConfig",
    "SemiARDrafter",
    "TargetSignature",
    "default_target_layers",
    "lookup_continuation",
]
