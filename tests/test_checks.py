"""The shared integer check in dspark/checks.py."""

import pytest

from dspark.checks import check_format, check_int, deprecated_alias


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
