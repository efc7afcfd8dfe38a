"""runtime/heap: frozen objects leave the collector's passes, nothing leaks; freed large blocks
leave resident memory."""

from __future__ import annotations

import gc
import platform
import subprocess
import sys
import weakref

import pytest

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


# Run in a fresh interpreter: the mmap threshold is process-wide and slides with what was freed.
_LARGE_BLOCKS = """
import os, sys
from kuberay_scaler.runtime import heap
if sys.argv[1] == "fixed":
    assert heap.tune_malloc()
def rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
big = b"x" * (16 << 20)
del big  # a mapped block freed: glibc's own threshold slides up to its size
blocks = [b"y" * (4 << 20) for _ in range(5)]  # a poll's replies, say
held = rss()
del blocks[:4]  # freed; the last block stays in use
print(held - rss())
"""


def _returned_after_freeing_16_mb(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", _LARGE_BLOCKS, mode], capture_output=True, text=True, check=True
    )
    return int(done.stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_freed_large_blocks_leave_resident_memory_at_the_fixed_threshold() -> None:
    mb = 1 << 20
    assert _returned_after_freeing_16_mb("fixed") >= 15 * mb
    # The control: glibc's sliding threshold keeps them (what tune_malloc is there to stop).
    assert _returned_after_freeing_16_mb("glibc") < 4 * mb
