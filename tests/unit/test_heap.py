"""runtime/heap.freeze: long-lived objects leave the collector's passes, nothing leaks."""

from __future__ import annotations

import gc
import weakref

from kuberay_scaler.runtime import heap


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycle() -> weakref.ref[_Node]:
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_a_cycle_frozen_while_alive_is_collected_by_the_next_freeze() -> None:
    try:
        a, b = _Node(), _Node()
        a.other, b.other = b, a
        alive = weakref.ref(a)
        assert heap.freeze() > 0
        del a, b  # garbage now, but frozen: a plain collection never looks at it
        gc.collect()
        assert alive() is not None
        heap.freeze()  # thaws, collects, freezes what is alive
        assert alive() is None
        later = _cycle()  # garbage created after a freeze is collected as ever
        gc.collect()
        assert later() is None
    finally:
        gc.unfreeze()
