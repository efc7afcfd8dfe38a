"""Per-group analysis: what each group is (its slices, its shape, its holds) before any
decision, as frozen notes; and the stages that add to the notes (availability, gang
deadlines), each returning new notes instead of writing into them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from types import MappingProxyType

from kuberay_scaler.core.liveness import HostClock
from kuberay_scaler.core.model.availability import GroupAvailability
from kuberay_scaler.core.model.plan import At, Memory, SliceDeletion, Snapshot
from kuberay_scaler.core.model.ray import RayState
from kuberay_scaler.core.model.reasons import (
    ClearWorkersToDelete,
    Hold,
    HoldKind,
    PlanProblem,
    ProblemKind,
    Reason,
)
from kuberay_scaler.core.model.slices import GroupSlices, SliceMap, SliceState
from kuberay_scaler.core.planner.availability import AvailabilityResult, judge_availability
from kuberay_scaler.core.planner.frame import News
from kuberay_scaler.core.planner.gang_deadline import GangDeadlines, gang_deadlines
from kuberay_scaler.core.planner.policy import Policy
from kuberay_scaler.core.planner.replace import backing_off
from kuberay_scaler.core.planner.shapes import ShapeError, SliceShape, slice_shape


@dataclass(frozen=True)
class GroupNotes:
    """What is known about one group before its decision."""

    slices: GroupSlices
    shape: SliceShape | None
    hold_all: Hold | None = None  # nothing at all is decided for this group
    hold_down: Hold | None = None  # no deletions (scale-up still allowed)
    clear_wtd: bool = False
    reasons: tuple[Reason, ...] = ()
    availability: GroupAvailability | None = None
    # Idle slices of a gang past its deadline, released (planner/gang_deadline.py).
    released: tuple[SliceDeletion, ...] = ()


Notes = Mapping[str, GroupNotes]


@dataclass(frozen=True)
class Analysed:
    groups: Notes
    problems: tuple[PlanProblem, ...]


def analyse_groups(slice_map: SliceMap, memory: Memory) -> Analysed:
    """Each group's shape, holds and workersToDelete state; the shapes that cannot be read."""
    notes = {name: _analyse(gs, memory) for name, gs in slice_map.groups.items()}
    problems = tuple(p for _, p in notes.values() if p is not None)
    return Analysed(MappingProxyType({n: g for n, (g, _) in notes.items()}), problems)


def _analyse(gs: GroupSlices, memory: Memory) -> tuple[GroupNotes, PlanProblem | None]:
    name = gs.group.name
    shape, hold_all, problem = None, None, None
    try:
        shape = slice_shape(gs.group)
    except ShapeError as err:
        problem = PlanProblem(ProblemKind.SHAPE, f"{err}; not scaled", name)
        hold_all = Hold(HoldKind.SHAPE_UNKNOWN, name, detail=str(err))
    if name in memory.awaiting_write:
        held = memory.awaiting_write[name]
        hold_all = (
            held if isinstance(held, Hold) else Hold(HoldKind.AWAITING_WRITE, name, detail=held)
        )
    return _workers_to_delete_state(GroupNotes(gs, shape, hold_all)), problem


def _workers_to_delete_state(note: GroupNotes) -> GroupNotes:
    group = note.slices.group
    if not group.workers_to_delete:
        return note
    present = {p for s in note.slices.slices for p in s.pod_names}
    remaining = [p for p in group.workers_to_delete if p in present]
    if remaining:
        hold = Hold(HoldKind.WORKERS_TO_DELETE_PENDING, group.name, count=len(remaining))
        return replace(note, hold_down=hold)
    cleared = ClearWorkersToDelete(len(group.workers_to_delete))
    return replace(note, clear_wtd=True, reasons=(*note.reasons, cleared))


def shapes_of(groups: Notes) -> dict[str, SliceShape]:
    return {n: g.shape for n, g in groups.items() if g.shape}


def availability_stage(
    snapshot: Snapshot,
    slice_map: SliceMap,
    ray: RayState | None,
    memory: Memory,
    policy: Policy,
    at: At,
    news: News,
) -> AvailabilityResult:
    """Each group's availability this frame, from the capacity Events (planner/availability.py)."""
    return judge_availability(
        slice_map,
        news.events,
        memory.availability,
        policy.availability(),
        at.mono_s,
        host_clock(snapshot, ray, at.now),
        held=tuple(memory.awaiting_write),
    )


def with_availability(groups: Notes, judged: AvailabilityResult) -> Notes:
    """The notes with each group's availability."""
    marked = {name: replace(groups[name], availability=a) for name, a in judged.groups.items()}
    return MappingProxyType({**groups, **marked})


def with_reasons(groups: Notes, found: Mapping[str, tuple[Reason, ...]]) -> Notes:
    """The notes with more reasons for some groups (in `found`'s order, after theirs)."""
    more = {
        name: replace(groups[name], reasons=(*groups[name].reasons, *r))
        for name, r in found.items()
        if r
    }
    return MappingProxyType({**groups, **more})


def changes_by_group(judged: AvailabilityResult) -> dict[str, tuple[Reason, ...]]:
    """The availability changes of this frame, per group, oldest first."""
    out: dict[str, tuple[Reason, ...]] = {}
    for change in judged.changes:
        out[change.group] = (*out.get(change.group, ()), change)
    return out


def gang_stage(
    snapshot: Snapshot,
    slice_map: SliceMap,
    ray: RayState,
    groups: Notes,
    judged: AvailabilityResult,
    policy: Policy,
    now: datetime,
) -> GangDeadlines:
    """The gang deadline stage (planner/gang_deadline.py); `with_gangs` folds it in."""
    if not (ray.gangs or ray.constraint):
        return GangDeadlines()
    eligible = frozenset(n for n, g in groups.items() if not (g.hold_all or g.hold_down))
    return gang_deadlines(
        slice_map,
        ray.gangs,
        ray.constraint,
        shapes_of(groups),
        judged.groups,
        host_clock(snapshot, ray, now),
        policy.deadlines.max_provision_s,
        eligible,
    )


def with_gangs(groups: Notes, gangs: GangDeadlines) -> Notes:
    """The notes with the slices released for a gang, and why kept ones stay."""
    released = {n: replace(groups[n], released=r) for n, r in gangs.released.items()}
    marked = MappingProxyType({**groups, **released})
    return with_reasons(marked, {n: tuple(gangs.kept_in(n)) for n in marked})


def replacing(groups: Notes, memory: Memory, mono_s: float) -> set[str]:
    """Groups whose broken slices this plan replaces (see `replacements`)."""
    return {
        name
        for name, g in groups.items()
        if not g.hold_all and not g.hold_down and not backing_off(memory.backoff, name, mono_s)
    }


def without_released(slice_map: SliceMap, gangs: GangDeadlines) -> SliceMap:
    """The slice map for capacity, the slices released for a gang in it as leaving (a broken
    slice of a group that replaces nothing: no capacity, yet still a replica with pods), so
    the gang is fitted whole again."""
    if not gangs.released:
        return slice_map
    gone = gangs.all_keys
    kept = {
        name: GroupSlices(
            gs.group,
            tuple(replace(s, state=SliceState.BROKEN) if s.key in gone else s for s in gs.slices),
        )
        if name in gangs.released
        else gs
        for name, gs in slice_map.groups.items()
    }
    return replace(slice_map, groups=MappingProxyType(kept))


def host_clock(snapshot: Snapshot, ray: RayState | None, now: datetime) -> HostClock:
    if snapshot.clock is not None:
        return snapshot.clock
    # One-shot use: the pods' own timestamps, as the slice map used.
    return HostClock.from_timestamps(snapshot.hosts, ray.node_by_instance() if ray else {}, now)
