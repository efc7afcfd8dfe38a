"""Keep the daemon's resident memory close to what it holds (glibc only; elsewhere a no-op).

- `tune_malloc()`: call before any thread starts. Two arenas: glibc gives every thread that
  mallocs its own arena (64 MB reserved each, partly touched); grpc's and asyncio's worker
  threads would each get one, and two are plenty for a daemon whose work runs on one event loop.
  A fixed mmap threshold: glibc's slides up to the largest mapped block freed so far
  (up to 32 MiB), after which the 4 MB GCS replies of a 10k-node cluster, decoded every poll,
  come from the heap, and their freed space stays resident (10k nodes, real-size pods: 9 MB
  more on average, 210 MB peaks; docs/benchmarks.md). At a fixed threshold each large block
  is mapped alone and unmapped when freed.
- `trim()`: hand freed heap pages back to the OS. Listing 10k pods decodes tens of MB of JSON that
  the informer then drops (it keeps slim pods); without a trim that memory stays resident.
- `freeze()`: once the caches are filled, move every object alive into the collector's permanent
  generation. At 10k pods the daemon holds ~300k tracked objects for good (slim pods, parsed
  hosts, modules); every full collection walked all of them, 100+ ms that landed in whichever
  reconcile allocated past the threshold. Frozen objects are still freed by reference counting
  when dropped (slim pods and parsed values hold no reference cycles); cycles among them wait
  for the next `freeze()`, which thaws, collects everything once, then freezes again.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc

_M_ARENA_MAX = -8
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 128 * 1024  # glibc's own starting value, held fixed


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


def tune_malloc(arenas: int = 2) -> bool:
    """Two arenas and a fixed mmap threshold, each set on its own; True when glibc took both."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mallopt"):
        return False
    took = []
    for option, value in ((_M_ARENA_MAX, arenas), (_M_MMAP_THRESHOLD, MMAP_THRESHOLD)):
        with contextlib.suppress(Exception):
            took.append(bool(libc.mallopt(option, value)))
    return took == [True, True]


def trim() -> bool:
    libc = _libc()
    if libc is None or not hasattr(libc, "malloc_trim"):
        return False
    with contextlib.suppress(Exception):
        return bool(libc.malloc_trim(0))
    return False


def freeze() -> int:
    """Collect everything (the last freeze included), then exempt what is alive from later
    collections; returns how many objects are frozen now."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
