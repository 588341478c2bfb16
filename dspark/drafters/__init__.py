"""Drafters: propose draft tokens, then learn from the target's decision."""

from dspark.drafters.draft_model import DraftModelDrafter
from dspark.drafters.prompt_lookup import PromptLookupDrafter, lookup_continuation

__all__ = ["DraftModelDrafter", "PromptLookupDrafter", "lookup_continuation"]
