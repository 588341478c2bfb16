"""The shared checks in dspark/checks.py."""

import pytest

from dspark.checks import check_format, check_fraction, check_int, check_non_negative, deprecated_alias


@pytest.mark.parametrize("value, error", [(2.0, TypeError), (True, TypeError), ("3", TypeError), (-1, ValueError)])
def test_check_int_refuses_non_ints_and_small_values(value, error):
    """Wrong types raise TypeError, values below the minimum ValueError, both naming the argument and value."""
    with pytest.raises(error, match=rf"count must be an int >= 0, got {value!r}"):
        check_int("count", value, 0)


def test_check_int_returns_valid_values_and_optional_none():
    """Valid ints come back unchanged; None passes only when optional."""
    assert check_int("count", 3, 1) == 3
    assert check_int("count", None, 1, optional=True) is None
    with pytest.raises(TypeError, match="or None"):
        check_int("count", 1.5, 1, optional=True)


@pytest.mark.parametrize("value, error", [(0, ValueError), (1.5, ValueError), (float("nan"), ValueError), (True, TypeError), ("0.5", TypeError)])
def test_check_fraction_refuses_values_outside_zero_to_one_and_non_numbers(value, error):
    """A number outside (0, 1] raises ValueError and a non-number TypeError, naming the argument and the value; 1 and
    a small share come back as floats."""
    with pytest.raises(error, match=rf"share must be a number in \(0, 1\], got {value!r}"):
        check_fraction("share", value)
    assert check_fraction("share", 1) == 1.0 and isinstance(check_fraction("share", 1), float) and check_fraction("share", 0.01) == 0.01


@pytest.mark.parametrize("value, error", [(0, ValueError), (1, ValueError), (1.0, ValueError), (True, TypeError), ("0.5", TypeError)])
def test_check_fraction_without_one_refuses_one_too(value, error):
    """With include_one=False, 1 is refused as well, and the message says (0, 1); values inside come back as floats."""
    with pytest.raises(error, match=rf"level must be a number in \(0, 1\), got {value!r}"):
        check_fraction("level", value, include_one=False)
    assert check_fraction("level", 0.95, include_one=False) == 0.95


def test_deprecated_alias_reads_the_new_name_and_warns():
    """A deprecated alias returns the renamed attribute's value with a DeprecationWarning naming both names."""

    class Part:
        max_draft_tokens = 5
        k = deprecated_alias("max_draft_tokens", "k")

    with pytest.warns(DeprecationWarning, match="Part.k is deprecated and will be removed in 0.3; use max_draft_tokens"):
        assert Part().k == 5


def test_check_format_names_the_owner_and_the_version():
    """check_format passes a mapping of the right version through and names the owner on anything else."""
    assert check_format({"format_version": 1, "x": 2}, "Thing", 1) == {"format_version": 1, "x": 2}
    with pytest.raises(TypeError, match="data must be a mapping from Thing.to_dict, got list"):
        check_format([], "Thing", 1)
    with pytest.raises(ValueError, match=r"data\['format_version'\] of a Thing must be 1, got 2"):
        check_format({"format_version": 2}, "Thing", 1)


@pytest.mark.parametrize("value", [-0.5, float("inf"), float("nan"), True, "3"])
def test_check_non_negative_refuses_negatives_non_finite_values_and_non_numbers(value):
    """Anything but a finite real number >= 0 raises ValueError naming the argument and the value; 0 and 2 come back
    as floats."""
    with pytest.raises(ValueError, match=f"tokens must be a finite number >= 0, got {value!r}"):
        check_non_negative("tokens", value)
    assert check_non_negative("tokens", 0) == 0.0 and isinstance(check_non_negative("tokens", 2), float)
