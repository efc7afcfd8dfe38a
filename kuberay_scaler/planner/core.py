"""plan(snapshot, ray, memory, policy, now) -> Plan: the one place scaling is decided."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from types import MappingProxyType

from kuberay_scaler.model.cluster import DEFAULT_IDLE_TIMEOUT_S, ClusterSpec, UpscalingMode
from kuberay_scaler.model.plan import (
    Backoff,
    DeleteKind,
    GroupDecision,
    Infeasible,
    Memory,
    Plan,
    SliceDeletion,
    Snapshot,
)
from kuberay_scaler.model.ray import RayState
from kuberay_scaler.model.slices import GroupSlices, Slice, SliceMap, SliceState
from kuberay_scaler.planner.capacity import bins_for_new_slice
from kuberay_scaler.planner.first_fit import Pool
from kuberay_scaler.planner.intent import finish_recorded_drains
from kuberay_scaler.planner.pool import Capacity, build_capacity
from kuberay_scaler.planner.scale_up import CONSTRAINT, DemandFit, GroupRoom, fit_gangs, fit_tasks
from kuberay_scaler.planner.shapes import ShapeError, SliceShape, slice_shape
from kuberay_scaler.slicemap import SliceTimeouts, build_slice_map


@dataclass(frozen=True)
class Policy:
    """Knobs from settings that shape decisions."""

    idle_timeout_override_s: float | None = None
    timeouts: SliceTimeouts = field(default_factory=SliceTimeouts)
    replace_backoff_s: float = 300.0
    max_backoff_s: float = 1800.0


@dataclass
class _Group:
    """Working notes about one group while planning."""

    slices: GroupSlices
    shape: SliceShape | None
    hold_all: str | None = None  # nothing at all is decided for this group
    hold_down: str | None = None  # no deletions (scale-up still allowed)
    clear_wtd: bool = False
    reasons: list[str] = field(default_factory=list)


def plan(
    snapshot: Snapshot, ray: RayState | None, memory: Memory, policy: Policy, now: datetime
) -> Plan:
    spec = snapshot.spec
    problems = [str(p) for p in spec.problems] + list(snapshot.problems)
    if not snapshot.synced:
        return _held_plan(spec, None, memory, problems, "cluster view not synced yet: holding")
    slice_map = build_slice_map(spec, snapshot.hosts, ray, now, policy.timeouts)
    problems += [str(p) for p in slice_map.problems]
    groups = _analyse(spec, slice_map, memory, now, problems)
    if spec.suspended:
        return _held_plan(spec, slice_map, memory, problems, "RayCluster is suspended", groups)
    if ray is None:
        why = "Ray demand unknown (GCS unreachable, restarted or stale): holding"
        return _held_plan(spec, slice_map, memory, problems, why, groups)
    shapes = {n: g.shape for n, g in groups.items() if g.shape}
    capacity = build_capacity(slice_map, ray, shapes, _replacing(groups, memory, now))
    mode = spec.autoscaler.upscaling_mode
    rooms = {n: _room(g, capacity, ray, memory, mode, now) for n, g in groups.items()}
    fit = _fit_demand(ray, capacity, rooms)
    needed = _needed(capacity)
    backoff = dict(memory.backoff)
    decisions = [
        _decide(g, rooms[n], needed, capacity.virtual.get(n, 0), spec, policy, backoff, now)
        for n, g in groups.items()
    ]
    decisions.sort(key=lambda d: d.index)
    if fit.waiting_on_existing:
        problems += [
            f"{n}× {text} waits for an existing node (never launched for)"
            for text, n in fit.waiting_on_existing.items()
        ]
    result = Plan(
        cluster=spec.name,
        uid=spec.uid,
        resource_version=spec.resource_version,
        groups=tuple(decisions),
        infeasible=tuple(_merge_infeasible(fit.infeasible)),
        problems=tuple(problems),
        slice_map=slice_map,
        memory=replace(memory, backoff=MappingProxyType(_live_backoff(backoff, now))),
    )
    return finish_recorded_drains(result, memory.draining)


def _analyse(
    spec: ClusterSpec, slice_map: SliceMap, memory: Memory, now: datetime, problems: list[str]
) -> dict[str, _Group]:
    out: dict[str, _Group] = {}
    for name, gs in slice_map.groups.items():
        note = _Group(slices=gs, shape=None)
        try:
            note.shape = slice_shape(gs.group)
        except ShapeError as err:
            problems.append(f"group {name!r}: {err}; not scaled")
            note.hold_all = f"resources unknown: {err}"
        if name in memory.awaiting_write:
            note.hold_all = memory.awaiting_write[name]
        _workers_to_delete_state(note)
        out[name] = note
    return out


def _replacing(groups: Mapping[str, _Group], memory: Memory, now: datetime) -> set[str]:
    """Groups whose broken slices this plan replaces (see `_replacements`)."""
    return {
        name
        for name, g in groups.items()
        if not g.hold_all and not g.hold_down and not _backing_off(memory.backoff, name, now)
    }


def _backing_off(backoff: Mapping[str, Backoff], name: str, now: datetime) -> bool:
    current = backoff.get(name)
    return current is not None and current.until > now


def _workers_to_delete_state(note: _Group) -> None:
    group = note.slices.group
    if not group.workers_to_delete:
        return
    present = {p for s in note.slices.slices for p in s.pod_names}
    remaining = [p for p in group.workers_to_delete if p in present]
    if remaining:
        note.hold_down = (
            f"waiting for KubeRay to delete {len(remaining)} pod(s) named in workersToDelete"
        )
    else:
        note.clear_wtd = True
        note.reasons.append(
            f"clear workersToDelete: all {len(group.workers_to_delete)} named pod(s) are gone"
        )


def _room(
    g: _Group,
    cap: Capacity,
    ray: RayState,
    memory: Memory,
    mode: UpscalingMode,
    now: datetime,
) -> GroupRoom:
    group = g.slices.group
    room = GroupRoom(group=group, shape=g.shape, room=0)
    back = memory.backoff.get(group.name)
    if g.hold_all:
        room.blocked, room.holds_demand = g.hold_all, True
    elif group.suspend:
        room.blocked = "group is suspended"
    elif back is not None and back.until > now:
        room.blocked = f"backing off until {back.until.isoformat()} ({back.reason})"
    elif group.effective_replicas >= group.max_replicas:
        room.blocked = f"at maxReplicas {group.max_replicas}"
    else:
        room.room = group.max_replicas - group.effective_replicas
        if mode is UpscalingMode.CONSERVATIVE:
            room.room = min(room.room, _conservative_limit(g, cap, ray))
        if room.room <= 0:
            room.blocked = "Conservative upscaling: waiting for launching slices"
            room.holds_demand = True
    return room


def _conservative_limit(g: _Group, cap: Capacity, ray: RayState) -> int:
    """Launching hosts stay within the size of the Ray cluster, but one slice may always start."""
    hosts = g.slices.group.num_of_hosts
    alive = sum(1 for n in ray.nodes if n.alive)
    launching = cap.virtual.get(g.slices.group.name, 0) + len(
        g.slices.by_state(SliceState.PENDING) + g.slices.by_state(SliceState.PARTIAL)
    )
    return max(1, math.ceil(alive / hosts)) - launching


def _fit_demand(ray: RayState, cap: Capacity, rooms: Mapping[str, GroupRoom]) -> DemandFit:
    fit = DemandFit()
    alive = [n for n in ray.nodes if n.alive]
    # The request_resources floor counts whole hosts; slices it adds also serve pending demand.
    total = Pool(cap.total)
    available = Pool(cap.available)
    before = {n: r.added for n, r in rooms.items()}
    fit_tasks(ray.constraint, total, rooms, alive, fit, what=CONSTRAINT)
    for name, room in rooms.items():
        if room.added > before[name]:
            assert room.shape is not None
            for i in range(before[name], room.added):
                available.add(bins_for_new_slice(name, f"new:{name}:{i}", room.shape.hosts))
    fit_gangs(ray.gangs, available, rooms, alive, fit)
    fit_tasks(ray.tasks, available, rooms, alive, fit)
    cap.available, cap.total = available.bins, total.bins
    return fit


def _needed(cap: Capacity) -> set[tuple[str | None, str | None]]:
    return {(b.group, b.slice_key) for b in (*cap.available, *cap.total) if b.used and b.slice_key}


def _decide(
    g: _Group,
    room: GroupRoom,
    needed: set[tuple[str | None, str | None]],
    virtual: int,
    spec: ClusterSpec,
    policy: Policy,
    backoff: dict[str, Backoff],
    now: datetime,
) -> GroupDecision:
    group = g.slices.group
    base = GroupDecision(
        group=group.name,
        index=group.index,
        num_of_hosts=group.num_of_hosts,
        current=group.replicas,
        target=group.replicas,
    )
    reasons = list(g.reasons)
    if g.hold_all:
        return replace(base, held=g.hold_all, reasons=(*reasons, f"hold: {g.hold_all}"))
    reasons += [f"add slice(s) for {n}× {text}" for text, n in room.reasons.items()]
    reasons += [f"{n}× {text}: waiting" for text, n in room.waiting.items()]
    deletions: list[SliceDeletion] = []
    if g.hold_down:
        reasons.append(f"no scale-down: {g.hold_down}")
    else:
        replaced = _replacements(g, backoff, policy, now, reasons)
        deletions += replaced
        # Replicas asked for but without pods are never cancelled: the operator may be rebuilding
        # them right now (e.g. after a host pod was deleted). If demand is really gone they come
        # up, turn idle and leave through the idle path, drained like any other slice.
        deletions += _idle_deletions(g, room, needed, spec, policy, reasons)
    idle_deleted = sum(1 for d in deletions if d.kind is DeleteKind.IDLE)
    scaled = room.added or idle_deleted
    target = group.effective_replicas + room.added - idle_deleted if scaled else group.replicas
    return replace(
        base,
        target=target,
        deletions=tuple(deletions),
        clear_workers_to_delete=g.clear_wtd and not deletions,
        held=g.hold_down,
        reasons=tuple(reasons),
        launching_hosts=_launching_hosts(g, virtual + room.added),
        new_hosts=room.added * group.num_of_hosts,
    )


def _replacements(
    g: _Group, backoff: dict[str, Backoff], policy: Policy, now: datetime, reasons: list[str]
) -> list[SliceDeletion]:
    broken = g.slices.by_state(SliceState.BROKEN)
    if not broken:
        return []
    name = g.slices.group.name
    current = backoff.get(name)
    if current is not None and _backing_off(backoff, name, now):
        reasons.append(
            f"{len(broken)} broken slice(s) left for now: backing off ({current.reason})"
        )
        return []
    failures = (current.failures if current else 0) + 1
    delay = min(policy.replace_backoff_s * 2 ** (failures - 1), policy.max_backoff_s)
    backoff[name] = Backoff(
        until=now + timedelta(seconds=delay),
        failures=failures,
        reason=f"replaced {len(broken)} broken slice(s)",
    )
    out = []
    for sl in broken:
        reasons.append(f"replace slice {sl.key}: {sl.reason}")
        out.append(_deletion(sl, DeleteKind.REPLACE, sl.reason))
    return out


def _idle_deletions(
    g: _Group,
    room: GroupRoom,
    needed: set[tuple[str | None, str | None]],
    spec: ClusterSpec,
    policy: Policy,
    reasons: list[str],
) -> list[SliceDeletion]:
    group = g.slices.group
    timeout_s = _idle_timeout(group.idle_timeout_s, spec, policy)
    idle: list[tuple[int, Slice]] = []
    for sl in g.slices.by_state(SliceState.COMPLETE):
        idle_ms = sl.idle_ms()
        if idle_ms is None or idle_ms < timeout_s * 1000 or (group.name, sl.key) in needed:
            continue
        idle.append((idle_ms, sl))
    idle.sort(key=lambda pair: (-pair[0], pair[1].key))  # longest idle first
    keep = group.effective_replicas + room.added - group.min_replicas
    chosen = idle[: max(0, keep)]
    if len(chosen) < len(idle):
        reasons.append(
            f"{len(idle) - len(chosen)} idle slice(s) kept: minReplicas {group.min_replicas}"
        )
    out = []
    for idle_ms, sl in chosen:
        why = f"all {len(sl.hosts)} hosts idle for {idle_ms / 1000:.0f} s ≥ {timeout_s:.0f} s"
        reasons.append(f"remove slice {sl.key}: {why}")
        out.append(_deletion(sl, DeleteKind.IDLE, why))
    return out


def _idle_timeout(group_timeout: float | None, spec: ClusterSpec, policy: Policy) -> float:
    for candidate in (
        policy.idle_timeout_override_s,
        group_timeout,
        spec.autoscaler.idle_timeout_s,
    ):
        if candidate is not None:
            return candidate
    return DEFAULT_IDLE_TIMEOUT_S


def _deletion(sl: Slice, kind: DeleteKind, why: str) -> SliceDeletion:
    return SliceDeletion(
        slice_key=sl.key, pods=sl.pod_names, node_ids=sl.node_ids, kind=kind, reason=why
    )


def _launching_hosts(g: _Group, launching_slices: int) -> int:
    pending = [
        h
        for s in g.slices.slices
        if s.state in (SliceState.PENDING, SliceState.PARTIAL)
        for h in s.hosts
        if h.pod_name not in s.nodes
    ]
    return len(pending) + max(0, launching_slices) * g.slices.group.num_of_hosts


def _held_plan(
    spec: ClusterSpec,
    slice_map: SliceMap | None,
    memory: Memory,
    problems: list[str],
    why: str,
    groups: Mapping[str, _Group] | None = None,
) -> Plan:
    decisions = []
    for group in spec.groups:
        note = groups.get(group.name) if groups else None
        clear = bool(note and note.clear_wtd and not note.hold_all)
        decisions.append(
            GroupDecision(
                group=group.name,
                index=group.index,
                num_of_hosts=group.num_of_hosts,
                current=group.replicas,
                target=group.replicas,
                clear_workers_to_delete=clear,
                held=why,
                reasons=(*(note.reasons if clear and note else []), f"hold: {why}"),
            )
        )
    return Plan(
        cluster=spec.name,
        uid=spec.uid,
        resource_version=spec.resource_version,
        groups=tuple(decisions),
        infeasible=(),
        problems=tuple(problems),
        slice_map=slice_map,
        memory=memory,
        held=why,
    )


def _merge_infeasible(items: list[Infeasible]) -> list[Infeasible]:
    merged: Counter[tuple[str, str, bool, bool]] = Counter()
    first: dict[tuple[str, str, bool, bool], Infeasible] = {}
    for item in items:
        key = (item.demand, item.reason, item.certain, item.constraint)
        merged[key] += item.count
        first.setdefault(key, item)
    return [replace(first[key], count=n) for key, n in merged.items()]


def _live_backoff(backoff: dict[str, Backoff], now: datetime) -> dict[str, Backoff]:
    # Keep expired entries for a while: the failure count decides the next delay.
    return {k: v for k, v in backoff.items() if v.until + timedelta(hours=1) > now}
