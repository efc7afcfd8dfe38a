"""Every timer the planner carries between frames has one form: seconds on the monotonic clock.

A `datetime` anywhere in `Memory` (or in the values it holds) would be a second kind of timer,
one a wall-clock step could move; wall time is only what a plan shows (`shown`)."""

from __future__ import annotations

import dataclasses
import typing
from datetime import datetime, timedelta

from kuberay_scaler.core.model.plan import At, Memory, mono_of, seconds_until, shown
from tests.factories import NOW


def _annotations(cls: type, seen: set[type]) -> list[tuple[str, object]]:
    """Every field annotation of `cls` and of the dataclasses its fields hold, by path."""
    seen.add(cls)
    found: list[tuple[str, object]] = []
    for name, hint in typing.get_type_hints(cls).items():
        found.append((f"{cls.__name__}.{name}", hint))
        for arg in _flattened(hint):
            if _walked(arg) and arg not in seen:
                found += _annotations(arg, seen)
    return found


def _walked(arg: object) -> bool:
    # Reasons (a Hold the loop keeps in `awaiting_write`) are what people read: wall time.
    return (
        dataclasses.is_dataclass(arg)
        and isinstance(arg, type)
        and arg.__module__ != "kuberay_scaler.core.model.reasons"
    )


def _flattened(hint: object) -> list[object]:
    args = typing.get_args(hint)
    return [hint, *(a for arg in args for a in _flattened(arg))]


def test_no_timer_in_memory_is_a_datetime() -> None:
    fields = _annotations(Memory, set())
    walls = [path for path, hint in fields if datetime in _flattened(hint)]
    assert len(fields) > 20  # the walk reached the nested values (backoffs, availability...)
    assert walls == []


def test_a_timer_is_shown_on_the_wall_clock_as_far_from_now_as_from_the_reading() -> None:
    at = At(NOW, 5_000.0)  # a monotonic clock far from the wall's number
    assert at.shown(5_030.0) == NOW + timedelta(seconds=30)
    assert shown(4_999.5, 5_000.0, NOW) == NOW - timedelta(seconds=0.5)
    assert seconds_until(5_030.25, at.mono_s) == 30.25


def test_without_a_monotonic_reading_the_wall_clock_stands_in() -> None:
    assert mono_of(None, NOW) == NOW.timestamp()
    assert mono_of(None, NOW.replace(tzinfo=None)) == NOW.timestamp()  # naive: read as UTC
    assert mono_of(12.5, NOW) == 12.5
    assert At(NOW, mono_of(None, NOW)).shown(NOW.timestamp() + 30) == NOW + timedelta(seconds=30)
