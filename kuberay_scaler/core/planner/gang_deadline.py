"""The gang deadline: a partial gang past its group's provisioning deadline hands
its slices back, and the whole gang is planned again.

A gang is a pending placement group (`RayState.gangs`) whose bundles need k slices of one
group. Ray creates a placement group all or nothing (every strategy), so while it is pending
its slices that are up hold none of it: they sit idle, waiting for the rest. Its slices in a
group are the group's coming slices (pending, partial, queued) and its idle complete ones, up
to k; a gang with a slice queued in Kueue waits for the queue and is never released.
When the oldest of them has existed longer than the group's provisioning deadline
(`max-provision-time-s`, else the cluster default) and the group cannot finish the gang now
(it is unavailable: the availability stage marks it `provisioning-deadline` when a slice misses
that same deadline), its idle up slices — and coming ones some hosts of which joined Ray, all
idle — are released: drained like idle slices, through the deletion gate (a busy one is never
chosen); the coming ones whose pods never ran are cancelled undrained by `cancel.py` (the group
being unavailable). The released slices are left out of
this plan's capacity, so the gang is fitted whole again: all k in another group that can host
them (the fallback order), or it waits.

Elastic demand keeps its slices: a `request_resources` floor the group can serve (Ray Train's
autoscaling coordinator; a floor takes what fits, and would ask for released slices again at
once). Pure: one frozen result, folded in by the planner.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from kuberay_scaler.core.model.availability import GroupAvailability
from kuberay_scaler.core.model.gangs import GangLine
from kuberay_scaler.core.model.hosts import HostClock, HostPhase
from kuberay_scaler.core.model.plan import DeleteKind, SliceDeletion
from kuberay_scaler.core.model.ray import Bundle, GangDemand, GangStrategy, TaskDemand
from kuberay_scaler.core.model.reasons import Keep, KeepKind, ScaleDown, ScaleDownKind, SliceFault
from kuberay_scaler.core.model.slices import GroupSlices, Slice, SliceMap, SliceState
from kuberay_scaler.core.planner.availability import group_deadline_s
from kuberay_scaler.core.planner.bins import (
    Bin,
    bins_for_new_slice,
    bundle_key,
    bundle_size,
    copies_that_fit,
    gang_units,
    needs_accelerator,
    take,
)
from kuberay_scaler.core.planner.scale_down import deletion
from kuberay_scaler.core.planner.scale_up import gang_key, merge_tasks
from kuberay_scaler.core.planner.shapes import SliceShape

# A slice that never came up in time (broken for it): still one of the gang's coming slices.
_NOT_UP = (SliceFault.NOT_UP_IN_TIME, SliceFault.HOSTS_MISSING)
_EMPTY: Mapping[str, tuple[SliceDeletion, ...]] = MappingProxyType({})


@dataclass(frozen=True)
class GangDeadlines:
    """Per group, the slices released for a gang past its deadline; every gang's line."""

    released: Mapping[str, tuple[SliceDeletion, ...]] = field(default_factory=lambda: _EMPTY)
    lines: tuple[GangLine, ...] = ()
    kept: tuple[tuple[str, Keep], ...] = ()  # (group, why): idle slices kept for waiting gangs
    wake_s: float | None = None  # seconds until the first incomplete gang's deadline

    def kept_in(self, group: str) -> tuple[Keep, ...]:
        return tuple(why for name, why in self.kept if name == group)

    def keys(self, group: str) -> frozenset[str]:
        return frozenset(x.slice_key for x in self.released.get(group, ()))

    @property
    def all_keys(self) -> frozenset[str]:
        return frozenset(x.slice_key for xs in self.released.values() for x in xs)


def gang_deadlines(
    slice_map: SliceMap,
    gangs: Sequence[GangDemand],
    constraint: Sequence[TaskDemand],
    shapes: Mapping[str, SliceShape],
    availability: Mapping[str, GroupAvailability],
    clock: HostClock,
    default_deadline_s: float,
    eligible: frozenset[str],
) -> GangDeadlines:
    """What the pending `gangs` hold in each group and what they release (`eligible`: groups
    that may scale down in this plan)."""
    free = {name: _spare(gs) for name, gs in slice_map.groups.items()}
    released: dict[str, list[SliceDeletion]] = {}
    lines: list[GangLine] = []
    waits: list[float] = []
    # Placement groups largest first, then by what they ask (never the reply's order: same
    # input, same plan); then the request_resources floor's accelerator bundle sets, elastic.
    placement_groups = sorted(gangs, key=lambda g: (-len(g.bundles), str(gang_key(g))))
    wanted = (*(_of_placement_group(g) for g in placement_groups), *_of_floor(constraint))
    for gang in wanted:
        floor = gang.floor
        found = _home(gang, slice_map, shapes, free)
        if found is None:
            continue
        gs, shape, k = found
        coming, up = free[gs.group.name]
        members = (coming[:k], up[: max(0, k - len(coming))])
        free[gs.group.name] = (coming[k:], up[len(members[1]) :])
        line = _line(gs, shape, k, members, clock, default_deadline_s, constraint)
        if not members[0] and not members[1]:
            continue
        if floor:  # Ray Train's whole gang through request_resources: shown, never released
            lines.append(replace(line, elastic=True))
            continue
        avail = availability.get(gs.group.name)
        blocked = avail is not None and avail.blocks_launch
        incomplete = line.up < k
        # A slice queued in Kueue waits for its admission, not for capacity: never judged.
        waits_for_capacity = line.up and not line.queued and not line.elastic
        if incomplete and waits_for_capacity and gs.group.name in eligible:
            if line.age_s > line.deadline_s and blocked:
                budget = _budget(gs) - len(released.get(gs.group.name, ()))
                chosen = (*members[1], *(s for s in members[0] if _ran_idle(s)))[: max(0, budget)]
                released.setdefault(gs.group.name, []).extend(_release(chosen, line))
                line = replace(line, released=bool(chosen))
            elif line.age_s <= line.deadline_s:
                waits.append(line.deadline_s - line.age_s + 1.0)  # just past it
        lines.append(line)
    waiting = [x for x in lines if x.up and not x.released and x.up < x.slices]
    return GangDeadlines(
        MappingProxyType({n: tuple(xs) for n, xs in released.items()}),
        tuple(lines),
        tuple((x.group, Keep(KeepKind.GANG_WAITING, count=x.up, detail=str(x))) for x in waiting),
        min(waits) if waits else None,
    )


@dataclass(frozen=True)
class _Gang:
    """What one gang asks for: each distinct unit (a bundle a host must fit) with its count."""

    units: tuple[tuple[Bundle, int], ...]
    distinct: bool  # STRICT_SPREAD: a host each
    floor: bool = False  # the request_resources floor's (elastic)


def _of_placement_group(gang: GangDemand) -> _Gang:
    first: dict[object, Bundle] = {}
    counts: Counter[object] = Counter()
    for unit in gang_units(gang):
        key = bundle_key(unit)
        first.setdefault(key, unit)
        counts[key] += 1
    units = tuple((first[k], n) for k, n in counts.items())
    return _Gang(units, gang.strategy is GangStrategy.STRICT_SPREAD)


def _of_floor(constraint: Sequence[TaskDemand]) -> list[_Gang]:
    """The request_resources floor's accelerator bundles, each shape as one elastic gang (Ray
    Train v2's autoscaling coordinator asks for its whole worker group this way)."""
    return [
        _Gang(((d.bundle, d.count),), distinct=False, floor=True)
        for d in merge_tasks(constraint)
        if needs_accelerator(d.bundle)
    ]


def _spare(gs: GroupSlices) -> tuple[tuple[Slice, ...], tuple[Slice, ...]]:
    """The group's slices a pending gang may be waiting on: coming ones (queued ones last),
    and complete ones whose every host is idle (busy slices run something else)."""
    late = tuple(s for s in gs.by_state(SliceState.BROKEN) if s.fault in _NOT_UP)
    arriving = (*gs.coming_up, *late, *gs.by_state(SliceState.QUEUED))
    coming = tuple(s for s in arriving if not s.marked_for_deletion)
    up = tuple(
        s
        for s in gs.by_state(SliceState.COMPLETE)
        if not s.marked_for_deletion and s.idle_since_ms() is not None
    )
    return coming, up


def _home(
    gang: _Gang,
    slice_map: SliceMap,
    shapes: Mapping[str, SliceShape],
    free: Mapping[str, tuple[tuple[Slice, ...], tuple[Slice, ...]]],
) -> tuple[GroupSlices, SliceShape, int] | None:
    """The group whose fresh slices host the gang's accelerator units and that has the most
    slices it may be waiting on (ties: spec order), and how many slices it needs there."""
    best: tuple[int, GroupSlices, SliceShape, int] | None = None
    for name, gs in slice_map.groups.items():
        shape = shapes.get(name)
        if shape is None or not shape.accelerators:
            continue
        spare = sum(len(x) for x in free.get(name, ((), ())))
        if not spare or (best is not None and spare <= best[0]):
            continue  # checked first: cheap once every group's slices are attributed
        mine = units_needing(gang.units, shape)
        if mine:
            best = (spare, gs, shape, slices_needed(mine, shape, gang.distinct))
    return None if best is None else best[1:]


def units_needing(
    units: Sequence[tuple[Bundle, int]], shape: SliceShape
) -> list[tuple[Bundle, int]]:
    """The gang's units a fresh slice of `shape` hosts, when any of them asks for its
    accelerators (else none: a CPU-only gang holds no slice)."""
    mine = [(u, n) for u, n in units if _hosts(shape, u)]
    if any(shape.accelerators.intersection(u.resources) for u, _ in mine):
        return mine
    return []


def _hosts(shape: SliceShape, unit: Bundle) -> bool:
    return any(copies_that_fit(unit, h.resources, h.labels) for h in shape.hosts)


def slices_needed(units: Sequence[tuple[Bundle, int]], shape: SliceShape, distinct: bool) -> int:
    """Fresh slices of `shape` the units (bundle, count) fill, largest first, first fit (a
    distinct host each under STRICT_SPREAD), as the scale-up path opens them."""
    if len(units) == 1:
        return _slices_for_copies(*units[0], shape, distinct)
    bins: list[Bin] = []
    used: set[int] = set()
    opened = 0
    expanded = [u for u, n in units for _ in range(n)]
    for unit in sorted(expanded, key=bundle_size, reverse=True):
        target = _first_fit(unit, bins, used if distinct else set())
        if target is None:
            fresh = bins_for_new_slice(shape.group, f"gang:{opened}", shape.hosts)
            opened += 1
            bins += fresh
            target = _first_fit(unit, fresh, set())
        if target is not None:
            take(target, unit)
            used.add(id(target))
    return opened


def _slices_for_copies(unit: Bundle, count: int, shape: SliceShape, distinct: bool) -> int:
    """`count` copies of one bundle: what a fresh slice takes, in one step (a floor of 10^4
    bundles costs no more than one of 16)."""
    fits = [min(copies_that_fit(unit, h.resources, h.labels), count) for h in shape.hosts]
    per_slice = sum(min(1, n) if distinct else n for n in fits)
    return -(-count // per_slice) if per_slice else 0


def _first_fit(unit: Bundle, bins: Sequence[Bin], used: set[int]) -> Bin | None:
    return next(
        (b for b in bins if id(b) not in used and copies_that_fit(unit, b.free, b.labels)), None
    )


def _line(
    gs: GroupSlices,
    shape: SliceShape,
    k: int,
    members: tuple[tuple[Slice, ...], tuple[Slice, ...]],
    clock: HostClock,
    default_deadline_s: float,
    constraint: Sequence[TaskDemand],
) -> GangLine:
    arriving, up = members
    coming = [s for s in arriving if s.state is not SliceState.QUEUED]
    return GangLine(
        group=gs.group.name,
        pod_type=shape.tpu_pod_type or gs.group.name,
        slices=k,
        up=len(up),
        pending=len(coming),
        queued=len(arriving) - len(coming),
        pending_s=max((_age(s, clock) for s in coming), default=0.0),
        age_s=max((_age(s, clock) for s in (*arriving, *up)), default=0.0),
        deadline_s=group_deadline_s(gs, default_deadline_s),
        elastic=any(_hosts(shape, d.bundle) for d in constraint),
    )


def _age(sl: Slice, clock: HostClock) -> float:
    return max((clock.age_s.get(h.pod_name, 0.0) for h in sl.hosts), default=0.0)


def _ran_idle(sl: Slice) -> bool:
    """A coming slice some hosts of which ran and joined Ray, all idle, the others Pending: its
    joined hosts are drained and it is released whole (the never-ran ones are cancel.py's)."""
    if not sl.nodes or sl.working_hosts:
        return False
    return all(h.pod_name in sl.nodes or h.phase is HostPhase.PENDING for h in sl.hosts)


def _budget(gs: GroupSlices) -> int:
    """Slices the group may lose: never below minReplicas, counting every coming slice that
    never ran as one the unavailable group cancels first."""
    group = gs.group
    never_ran = sum(1 for s in _spare(gs)[0] if not s.nodes)  # queued ones too (queued.py)
    return group.effective_replicas - group.min_replicas - never_ran


def _release(chosen: Sequence[Slice], line: GangLine) -> list[SliceDeletion]:
    detail = str(line)
    out = []
    for sl in chosen:
        why = ScaleDown(
            ScaleDownKind.GANG_DEADLINE,
            sl.key,
            len(sl.hosts),
            timeout_s=line.deadline_s,
            detail=detail,
        )
        out.append(deletion(sl, DeleteKind.IDLE, why))
    return out
