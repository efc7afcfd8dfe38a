"""The queue stage (Kueue-gated slices, slice reservations): the reservation marks after this
reply, and per group what the reservation grace keeps and which queued slices no demand wants.
Pure, one frozen result."""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from types import MappingProxyType

from kuberay_scaler.core.model.cluster import ClusterSpec
from kuberay_scaler.core.model.plan import At, Memory, ReservationMark
from kuberay_scaler.core.model.ray import RayState
from kuberay_scaler.core.model.slices import SliceMap
from kuberay_scaler.core.planner.gate import Evidence
from kuberay_scaler.core.planner.groups import Notes, shapes_of
from kuberay_scaler.core.planner.policy import Policy
from kuberay_scaler.core.planner.queued import QueuedCancels, queued_cancellations
from kuberay_scaler.core.planner.reservations import GraceKept, grace_kept, reservation_marks
from kuberay_scaler.core.planner.rooms import GroupFit, SliceRef
from kuberay_scaler.core.planner.scale_down import idle_timeout


@dataclass(frozen=True)
class GroupQueue:
    """One group's queue stage: its queued slices to cancel, the reservation grace."""

    cancels: QueuedCancels = field(default_factory=QueuedCancels)
    grace: GraceKept = field(default_factory=GraceKept)


@dataclass(frozen=True)
class Queues:
    groups: Mapping[str, GroupQueue]
    unneeded_since: Mapping[str, float]  # Memory.queued_unneeded_since
    marks: Mapping[str, ReservationMark]  # Memory.reservations
    wake_s: float | None  # the first cancel or grace end due


def queue_stage(
    slice_map: SliceMap,
    groups: Notes,
    fits: Mapping[str, GroupFit],
    needed: Set[SliceRef],
    spec: ClusterSpec,
    policy: Policy,
    memory: Memory,
    ray: RayState,
    ev: Evidence,
    at: At,
) -> Queues:
    """Folded into each group's decision by `decide_group`. Every timer and idle age is read
    on the monotonic clock (`at.mono_s`), the clock the idle clocks are stamped on (never the
    wall)."""
    mono_s = at.mono_s
    grace_s = policy.deadlines.reservation_grace_s
    marks = reservation_marks(
        slice_map, ray, shapes_of(groups), memory.reservations, mono_s, grace_s
    )
    now_ms = at.mono_ms
    out: dict[str, GroupQueue] = {}
    since: dict[str, float] = {}
    waits: list[float] = []
    for name, g in groups.items():
        group = g.slices.group
        timeout_s = idle_timeout(group, spec, policy.deadlines.idle_timeout_override_s)
        grace = grace_kept(g.slices, marks.get(name), needed, mono_s, grace_s, now_ms, timeout_s)
        keep = group.effective_replicas + fits[name].added - group.min_replicas
        cancels = queued_cancellations(
            g.slices,
            needed | grace.refs,
            keep,
            timeout_s,
            memory.queued_unneeded_since,
            mono_s,
            ev,
        )
        out[name] = GroupQueue(cancels, grace)
        since.update(cancels.unneeded_since)
        waits += [w for w in (cancels.wake_s, grace.wake_s) if w is not None]
    return Queues(
        MappingProxyType(out),
        MappingProxyType(since),
        marks,
        min(waits) if waits else None,
    )
