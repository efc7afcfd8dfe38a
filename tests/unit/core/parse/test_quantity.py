"""Kubernetes resource quantities as the API server writes them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kuberay_scaler.core.parse.quantity import parse_quantity


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("500m", 0.5),
        ("1", 1.0),
        ("24", 24.0),
        ("1Gi", 2.0**30),
        ("512Mi", 512 * 2.0**20),
        ("40G", 40e9),
        ("200G", 200e9),
        ("1k", 1e3),
        ("1e3", 1e3),  # exponent, not a suffix
        ("1E", 1e18),  # exa
        ("100n", 100e-9),
        (" 2 ", 2.0),
        (4, 4.0),
        (0.25, 0.25),
    ],
)
def test_parses_what_kubernetes_writes(text: object, expected: float) -> None:
    assert parse_quantity(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    "bad",
    [
        *("", "  ", "abc", "1x", "-1", "Gi", "1..2", "NaN", "Infinity", "1e400", "1e99999999999"),
        *(None, True, [], {}, -1, float("nan"), float("inf"), 10**400),
    ],
)
def test_rejects_junk_with_a_value_error_naming_it(bad: object) -> None:
    with pytest.raises(ValueError, match="not a quantity"):
        parse_quantity(bad)


@given(st.one_of(st.text(max_size=12), st.integers(), st.floats(), st.none(), st.booleans()))
def test_never_raises_anything_but_value_error(raw: object) -> None:
    try:
        value = parse_quantity(raw)
    except ValueError:
        return
    assert isinstance(value, float)
    assert 0 <= value < float("inf")
