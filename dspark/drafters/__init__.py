"""Drafters: propose draft tokens, then learn from the target's decision."""

from dspark.drafters import distill
from dspark.drafters.draft_model import DraftModelDrafter
from dspark.drafters.prompt_lookup import PromptLookupDrafter, lookup_continuation
from dspark.drafters.semi_ar import SemiARConfig, SemiARDrafter, TargetSignature

__all__ = ["DraftModelDrafter", "distill", "PromptLookupDrafter", "SemiARConfig", "SemiARDrafter", "TargetSignature", "lookup_continuation"]
