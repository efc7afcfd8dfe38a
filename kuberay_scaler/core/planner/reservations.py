"""Reservation grace: slices launched for slice reservations outlive their timeout.

`ray.util.tpu.SlicePlacementGroup` reserves each slice with a head placement group, one bundle
`{"TPU-<podtype>-head": 1}` selecting `ray.io/tpu-worker-id=0, ray.io/tpu-pod-type=<podtype>`
(`reserve_tpu_slice` in Ray 2.60's `_private/accelerators/tpu.py`), waits for it at most
`DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S` (100 s), then removes it and raises; the whole
SlicePlacementGroup then removes every head it held. A real slice takes minutes, so the slice
launched for it arrives after the reservation is gone, turns idle, and would leave at the idle
timeout before the caller's next attempt asks again: launch, time out, idle out, relaunch.

So a group whose reservations were pending within the last `grace_s` keeps up to as many
slices as they held or waited for (placed heads + pending reservations, the most seen): its
unneeded idle or queued slices are shielded from the idle and cancel paths until `grace_s`
after the last pending reservation. Slices busy, coming up or needed count first. Pure: the
marks (Memory.reservations) are on the planner's monotonic reading `mono_s`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Set
from dataclasses import dataclass
from types import MappingProxyType

from kuberay_scaler.core.model.plan import ReservationMark
from kuberay_scaler.core.model.ray import Bundle, GangDemand, RayState
from kuberay_scaler.core.model.reasons import Keep, KeepKind
from kuberay_scaler.core.model.slices import GroupSlices, Slice, SliceMap, SliceState
from kuberay_scaler.core.planner.bins import copies_that_fit
from kuberay_scaler.core.planner.shapes import SliceShape

SliceRef = tuple[str | None, str | None]
_HEAD = re.compile(r"TPU-.+-head")


def reservation_head(gang: GangDemand) -> Bundle | None:
    """The head bundle of a slice reservation (one bundle asking only `TPU-<podtype>-head`)."""
    if len(gang.bundles) != 1:
        return None
    only = gang.bundles[0]
    asked = [k for k, v in only.resources.items() if v > 0]
    return only if len(asked) == 1 and _HEAD.fullmatch(asked[0]) else None


def reservation_marks(
    slice_map: SliceMap,
    ray: RayState,
    shapes: Mapping[str, SliceShape],
    known: Mapping[str, ReservationMark],
    mono_s: float,
    grace_s: float,
) -> Mapping[str, ReservationMark]:
    """Each group's mark after this reply: refreshed where a reservation it can host is
    pending (slices = placed heads + pending reservations, or the mark's count if higher);
    others kept until `grace_s` after they were last seen."""
    pending = _pending_reservations(ray, shapes)
    held = _held_heads(slice_map, ray) if pending else Counter[str]()
    marks = {name: mark for name, mark in known.items() if mono_s - mark.seen_s < grace_s}
    for name, count in pending.items():
        before = marks.get(name)
        slices = max(count + held[name], before.slices if before else 0)
        marks[name] = ReservationMark(seen_s=mono_s, slices=slices)
    return MappingProxyType(marks)


def _pending_reservations(ray: RayState, shapes: Mapping[str, SliceShape]) -> Counter[str]:
    """Pending reservations per group whose fresh slice's host could take the head bundle."""
    out: Counter[str] = Counter()
    for gang in ray.gangs:
        head = reservation_head(gang)
        if head is None:
            continue
        for name, shape in shapes.items():
            if any(copies_that_fit(head, h.resources, h.labels) for h in shape.hosts):
                out[name] += 1
    return out


def _held_heads(slice_map: SliceMap, ray: RayState) -> Counter[str]:
    """Complete slices per group whose head resource is taken (a placed reservation)."""
    out: Counter[str] = Counter()
    for name, gs in slice_map.groups.items():
        for sl in gs.by_state(SliceState.COMPLETE):
            if any(_head_taken(sl, n) for n in sl.nodes):
                out[name] += 1
    return out


def _head_taken(sl: Slice, pod: str) -> bool:
    node = sl.nodes[pod]
    return any(_HEAD.fullmatch(k) and node.available.get(k, 0.0) < v for k, v in node.total.items())


@dataclass(frozen=True)
class GraceKept:
    """Slices of one group the reservation grace shields from the idle and cancel paths."""

    refs: frozenset[tuple[str, str]] = frozenset()
    reasons: tuple[Keep, ...] = ()
    wake_s: float | None = None  # seconds until the grace ends (the slices may go then)


def grace_kept(
    gs: GroupSlices,
    mark: ReservationMark | None,
    needed: Set[SliceRef],
    mono_s: float,
    grace_s: float,
    now_ms: int,
    timeout_s: float,
) -> GraceKept:
    """Up to `mark.slices` of the group's slices are kept while its grace lasts: those that
    stay anyway (busy, coming up, needed, idle below `timeout_s`) count first; then idle ones
    past it, least idle first, then queued ones."""
    if mark is None or mono_s - mark.seen_s >= grace_s:
        return GraceKept()
    name = gs.group.name
    at_risk: list[Slice] = []
    staying = 0
    for sl in gs.slices:
        if sl.state is SliceState.TERMINATING or sl.state is SliceState.BROKEN:
            continue
        if (name, sl.key) in needed:
            staying += 1
        elif sl.state is SliceState.COMPLETE and (sl.idle_ms(now_ms) or 0) >= timeout_s * 1000:
            at_risk.append(sl)  # idle past the timeout (a busy one's idle_ms is None)
        elif sl.state is SliceState.QUEUED:
            at_risk.append(sl)
        else:
            staying += 1  # busy, pending or partial: never deleted as unneeded
    at_risk.sort(key=lambda s: _risk_order(s, now_ms))
    kept = at_risk[: max(0, mark.slices - staying)]
    left_s = grace_s - (mono_s - mark.seen_s)
    detail = (
        f"{mark.slices} slice(s) reserved, the last reservation {mono_s - mark.seen_s:.0f} s"
        f" ago; kept {left_s:.0f} s more"
    )
    return GraceKept(
        refs=frozenset((name, s.key) for s in kept),
        reasons=tuple(Keep(KeepKind.RESERVATION_GRACE, slice=s.key, detail=detail) for s in kept),
        wake_s=left_s if kept else None,
    )


def _risk_order(sl: Slice, now_ms: int) -> tuple[int, int, str]:
    if sl.state is SliceState.QUEUED:
        return (1, 0, sl.key)
    return (0, sl.idle_ms(now_ms) or 0, sl.key)  # running capacity first, least idle first
