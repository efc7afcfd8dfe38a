"""Kubernetes resource quantities ("500m", "40Gi", "200G", "1e3") as floats."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from decimal import Decimal

from kuberay_scaler.core.model.cluster import MAX_RESOURCE

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}


def parse_quantity(raw: object) -> float:
    """Parse a quantity; raises ValueError naming the bad text."""
    if isinstance(raw, bool):
        raise ValueError(f"not a quantity: {raw!r}")
    if isinstance(raw, int | float):
        value = Decimal(raw)
    elif isinstance(raw, str) and raw.strip():
        number, factor = _split_suffix(raw.strip())
        try:
            value = Decimal(number) * factor
        except ArithmeticError:  # InvalidOperation, and Overflow for exponents like 1e99999999999
            raise ValueError(f"not a quantity: {raw!r}") from None
    else:
        raise ValueError(f"not a quantity: {raw!r}")
    # Same rule for YAML numbers and strings: a quantity is finite and not negative.
    if not value.is_finite() or value < 0 or math.isinf(float(value)):
        raise ValueError(f"not a quantity: {raw!r}")
    return float(value)


def parse_amount(raw: object) -> float:
    """A quantity used as a Ray resource amount: also at most what Ray can hold."""
    return check_amount(parse_quantity(raw), repr(raw))


def check_amount(value: float, what: str) -> float:
    """A resource amount Ray can hold: finite, not negative, at most MAX_RESOURCE."""
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"not a finite, non-negative amount: {what}")
    if value > MAX_RESOURCE:
        raise ValueError(f"{what} is more than Ray can hold ({MAX_RESOURCE:.3g})")
    return value


def resources_json(raw: str) -> dict[str, float]:
    """rayStartParams `resources`: a JSON object, often wrapped in an extra pair of quotes."""
    text = raw.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        text = text[1:-1].replace('\\"', '"')
    try:
        parsed = json.loads(text)  # accepts NaN, Infinity and 1e400 (inf): checked below
    except ValueError:
        raise ValueError(f"{raw!r} is not JSON") from None
    if not isinstance(parsed, Mapping):
        raise ValueError(f"{raw!r} is not a JSON object")
    out: dict[str, float] = {}
    for key, value in parsed.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{raw!r} has a non-numeric value for {key!r}")
        try:
            amount = float(value)
        except OverflowError:  # a JSON integer with hundreds of digits
            raise ValueError(f"{raw!r}: {key} is more than Ray can hold") from None
        out[str(key)] = check_amount(amount, f"{key}={value!r}")
    return out


def _split_suffix(text: str) -> tuple[str, Decimal]:
    for suffix, binary in _BINARY.items():
        if text.endswith(suffix):
            return text[: -len(suffix)], Decimal(binary)
    last = text[-1]
    # A trailing letter is a suffix ("1E" is exa); "1e3" ends in a digit and is an exponent.
    if last.isalpha() and last in _DECIMAL:
        return text[:-1], _DECIMAL[last]
    return text, Decimal(1)
