"""Deprecated: the distillation code moved to ``dspark.training``.

``dspark.drafters.distill.X`` still resolves to ``dspark.training.X`` (``default_target_layers`` to
``dspark.drafters.default_target_layers``) with a DeprecationWarning, and will be removed in 0.3.
"""

from __future__ import annotations

import importlib
import warnings

__all__: list[str] = []

_MOVED_TO_DRAFTERS = ("default_target_layers",)


def __getattr__(name: str):
    """Forward ``name`` to its new home with a DeprecationWarning."""
    module = importlib.import_module("dspark.drafters" if name in _MOVED_TO_DRAFTERS else "dspark.training")
    if not hasattr(module, name):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"dspark.drafters.distill.{name} moved to {module.__name__}.{name}", DeprecationWarning, stacklevel=2)
    return getattr(module, name)
