"""Checks every part uses: integers (TypeError for a non-int, ValueError below the minimum) and
probabilities in [0, 1]; and read-only aliases that keep a renamed attribute working for a while."""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Mapping

__all__ = ["check_format", "check_fraction", "check_int", "check_non_negative", "check_seconds", "deprecated_alias", "int_at_least", "unit_interval"]


def deprecated_alias(new_name: str, old_name: str, removed_in: str = "0.3") -> property:
    """A read-only property ``old_name`` that returns ``self.<new_name>`` with a DeprecationWarning."""

    def read(self):
        warnings.warn(
            f"{type(self).__name__}.{old_name} is deprecated and will be removed in {removed_in}; use {new_name}",
            DeprecationWarning, stacklevel=2,
        )
        return getattr(self, new_name)

    return property(read, doc=f"Deprecated alias of ``{new_name}``.")


def check_int(name: str, value, minimum: int, optional: bool = False) -> int | None:
    """Return ``value`` if it is an int (not a bool) >= ``minimum`` (or None when ``optional``)."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be {_int_allowed(minimum, optional)}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be {_int_allowed(minimum, optional)}, got {value!r}")
    return value


def _int_allowed(minimum: int, optional: bool) -> str:
    """What ``check_int`` allows, in words; built only for an error, since the check runs many times a step."""
    return f"an int >= {minimum}" + (" or None" if optional else "")


def check_seconds(name: str, value) -> float:
    """``value`` as a float if it is a finite real number >= 0 (seconds)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


def check_non_negative(name: str, value) -> float:
    """``value`` as a float if it is a finite real number >= 0 (a count of tokens, a grid coordinate), else ValueError
    naming the argument and the value."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def check_fraction(name: str, value, include_one: bool = True) -> float:
    """``value`` as a float if it is a real number in (0, 1] (a smoothing weight, a share), or in (0, 1) without
    ``include_one`` (a confidence level, an interval's relative half-width)."""
    allowed = "(0, 1]" if include_one else "(0, 1)"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number in {allowed}, got {value!r}")
    if not (0 < value <= 1 if include_one else 0 < value < 1):
        raise ValueError(f"{name} must be a number in {allowed}, got {value!r}")
    return float(value)


def check_format(data, owner: str, version: int):
    """``data`` if it is a mapping written by ``owner``'s ``to_dict`` with ``format_version`` ``version``:
    TypeError for a non-mapping, ValueError for another version."""
    if not isinstance(data, Mapping):
        raise TypeError(f"data must be a mapping from {owner}.to_dict, got {type(data).__name__}")
    if data.get("format_version") != version:
        raise ValueError(f"data['format_version'] of a {owner} must be {version}, got {data.get('format_version')!r}")
    return data


def int_at_least(minimum: int, optional: bool = False):
    """An attrs validator running ``check_int`` on the field."""

    def validate(instance, attribute, value):
        check_int(attribute.name, value, minimum, optional)

    return validate


def unit_interval(optional: bool = False):
    """An attrs validator: the field is a float in [0, 1] (or None when ``optional``)."""

    def validate(instance, attribute, value):
        if value is None and optional:
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
            raise ValueError(f"{attribute.name} must be a float in [0, 1]{' or None' if optional else ''}, got {value!r}")

    return validate
