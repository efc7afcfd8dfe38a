"""Scale-up: how many slices each group may still add (its room), and the demand fitted onto
what exists and onto new slices of the best groups. Each stage returns a frozen value."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from types import MappingProxyType

from kuberay_scaler.core.model.availability import GroupAvailability
from kuberay_scaler.core.model.cluster import MAX_GROUP_HOSTS, UpscalingMode, WorkerGroup
from kuberay_scaler.core.model.plan import At, Fallback, Infeasible, Memory
from kuberay_scaler.core.model.ray import RayState
from kuberay_scaler.core.model.reasons import (
    Demand,
    DemandKind,
    FellBack,
    Hold,
    HoldKind,
    Reason,
    ScaleUp,
    Waiting,
)
from kuberay_scaler.core.planner.bins import Bin, bins_for_new_slice
from kuberay_scaler.core.planner.capacity import Capacity
from kuberay_scaler.core.planner.groups import GroupNotes, Notes
from kuberay_scaler.core.planner.needs import NeedBook, offer_of
from kuberay_scaler.core.planner.pool import Pool
from kuberay_scaler.core.planner.scale_up import DemandFit, GroupRoom, fit_gangs, fit_tasks

SliceRef = tuple[str | None, str | None]  # (group, slice key) of a bin demand uses


@dataclass(frozen=True)
class RoomLimit:
    """How many slices a group may still add in this plan, and what stops it adding more."""

    room: int = 0
    blocked: Hold | None = None  # why room is 0, for "waiting" reasons
    exhausted: Hold = field(default_factory=lambda: Hold(HoldKind.NO_ROOM))  # what limits room
    holds_demand: bool = False  # blocked for now: the demand waits for it (scale_up.GroupRoom)
    availability_rank: int = 0
    unavailable_cause: str | None = None


def room_limit(
    g: GroupNotes,
    cap: Capacity,
    ray: RayState,
    memory: Memory,
    mode: UpscalingMode,
    at: At,
) -> RoomLimit:
    """The group's room: blocked (and why), else its limits, the tightest last."""
    avail = g.availability
    base = RoomLimit()
    if avail is not None and avail.unavailable:
        cause = avail.cause.value if avail.cause else "unavailable"
        base = RoomLimit(availability_rank=0 if avail.probing else 1, unavailable_cause=cause)
    blocked = _blocked(g, memory, at)
    if blocked is not None:
        return replace(base, blocked=blocked[0], holds_demand=blocked[1])
    limit = _open_room(g, cap, ray, mode, base)
    if avail is not None and avail.probing:
        limit = _probe_room(limit, g, cap, avail)
    if limit.room <= 0 and limit.blocked is None:
        return replace(
            limit,
            blocked=Hold(HoldKind.CONSERVATIVE_UPSCALING, g.slices.group.name),
            holds_demand=True,
        )
    return limit


def _blocked(g: GroupNotes, memory: Memory, at: At) -> tuple[Hold, bool] | None:
    """Why the group adds nothing at all, and whether demand waits for it; None: it may."""
    group = g.slices.group
    back = memory.backoff.get(group.name)
    avail = g.availability
    if avail is not None and avail.blocks_launch:
        # Before the holds: a write of ours in flight can only cancel here, never add, so the
        # demand goes on to the next group instead of waiting for it.
        return _unavailable_hold(group.name, avail, at.now, at.mono_s), False
    if g.hold_all:
        return g.hold_all, True
    if group.suspend:
        return Hold(HoldKind.GROUP_SUSPENDED, group.name), False
    if back is not None and back.until > at.mono_s:
        until = at.shown(back.until)
        return Hold(HoldKind.BACKING_OFF, group.name, until=until, failures=back.failures), False
    if group.effective_replicas >= group.max_replicas:
        return Hold(HoldKind.AT_MAX_REPLICAS, group.name, limit=group.max_replicas), False
    if group.effective_replicas >= _host_bound(group):
        return _host_bound_hold(group), False
    return None


def _open_room(
    g: GroupNotes, cap: Capacity, ray: RayState, mode: UpscalingMode, base: RoomLimit
) -> RoomLimit:
    group = g.slices.group
    room = group.max_replicas - group.effective_replicas
    exhausted = Hold(HoldKind.AT_MAX_REPLICAS, group.name, limit=group.max_replicas)
    if _host_bound(group) < group.max_replicas:
        # Planning cost and memory grow with the slices added: bounded by hosts per group.
        room = _host_bound(group) - group.effective_replicas
        exhausted = _host_bound_hold(group)
    if mode is UpscalingMode.CONSERVATIVE and _conservative_limit(g, cap, ray) < room:
        room = _conservative_limit(g, cap, ray)
        exhausted = Hold(HoldKind.CONSERVATIVE_UPSCALING, group.name)
    return replace(base, room=room, exhausted=exhausted)


def _probe_room(
    limit: RoomLimit, g: GroupNotes, cap: Capacity, avail: GroupAvailability
) -> RoomLimit:
    """A probing group adds one slice at a time until one comes up; the rest goes elsewhere."""
    name = g.slices.group.name
    launching = len(g.slices.coming_up) + cap.virtual.get(name, 0)
    probe = Hold(HoldKind.GROUP_PROBING, name, detail=str(avail))
    if launching >= 1:
        return replace(limit, room=0, blocked=probe)
    if limit.room > 1:
        return replace(limit, room=1, exhausted=probe)
    return limit


def _unavailable_hold(name: str, avail: GroupAvailability, now: datetime, mono_s: float) -> Hold:
    """Why an unavailable group adds nothing, with the wall time of its next probe."""
    left = (avail.until_mono - mono_s) if avail.until_mono is not None else None
    until = now + timedelta(seconds=max(0.0, left)) if left is not None else None
    return Hold(HoldKind.GROUP_UNAVAILABLE, name, detail=str(avail), until=until)


def _host_bound(group: WorkerGroup) -> int:
    return MAX_GROUP_HOSTS // group.num_of_hosts


def _host_bound_hold(group: WorkerGroup) -> Hold:
    detail = f"{MAX_GROUP_HOSTS} hosts per group"
    return Hold(HoldKind.AT_HOST_BOUND, group.name, limit=_host_bound(group), detail=detail)


def _conservative_limit(g: GroupNotes, cap: Capacity, ray: RayState) -> int:
    """Launching hosts stay within the size of the Ray cluster, but one slice may always start."""
    hosts = g.slices.group.num_of_hosts
    alive = len(ray.alive_nodes())
    launching = cap.virtual.get(g.slices.group.name, 0) + len(g.slices.arriving)
    return max(1, math.ceil(alive / hosts)) - launching


@dataclass(frozen=True)
class GroupFit:
    """What one group added for demand, and why (ScaleUp, FellBack, Waiting, in that order)."""

    added: int = 0
    reasons: tuple[Reason, ...] = ()
    fell_back: tuple[tuple[tuple[str, str, Demand], int], ...] = ()  # (from, cause, demand) → n


@dataclass(frozen=True)
class Fitted:
    """The demand fitted: per group what it adds, what cannot be served, the slices used."""

    groups: Mapping[str, GroupFit]
    infeasible: tuple[Infeasible, ...]
    waiting_on_existing: tuple[tuple[Demand, int], ...]
    needed: frozenset[SliceRef]  # slices demand uses (never scaled down)


def fit_demand(
    ray: RayState, cap: Capacity, groups: Notes, limits: Mapping[str, RoomLimit]
) -> Fitted:
    """Pending demand onto what exists, then onto new slices. The bin-packing works on state
    private to this call (the groups' rooms, the pools over this frame's capacity bins, which
    `build_capacity` made for this frame alone); the Capacity itself is not reassigned."""
    rooms = {n: _room_of(groups[n], limit) for n, limit in limits.items()}
    book = NeedBook([room.offer for room in rooms.values()])  # each bundle's facts, once
    fit = DemandFit()
    alive = list(ray.alive_nodes())
    # The request_resources floor counts whole hosts; slices it adds also serve pending demand.
    total = Pool(cap.total)
    available = Pool(cap.available)
    fit_tasks(ray.constraint, total, rooms, book, alive, fit, what=DemandKind.REQUEST_RESOURCES)
    for name, room in rooms.items():
        for i in range(room.added):
            assert room.shape is not None
            available.add(bins_for_new_slice(name, f"new:{name}:{i}", room.shape.hosts))
    fit_gangs(ray.gangs, available, rooms, book, alive, fit)
    fit_tasks(ray.tasks, available, rooms, book, alive, fit)
    return Fitted(
        MappingProxyType({n: _group_fit(r) for n, r in rooms.items()}),
        tuple(fit.infeasible),
        tuple(fit.waiting_on_existing.items()),
        _needed(available.bins, total.bins),
    )


def _room_of(g: GroupNotes, limit: RoomLimit) -> GroupRoom:
    return GroupRoom(
        group=g.slices.group,
        shape=g.shape,
        room=limit.room,
        offer=offer_of(g.slices.group, g.shape, limit.availability_rank),
        blocked=limit.blocked,
        exhausted=limit.exhausted,
        holds_demand=limit.holds_demand,
        unavailable_cause=limit.unavailable_cause,
    )


def _group_fit(room: GroupRoom) -> GroupFit:
    reasons: list[Reason] = [ScaleUp(demand, n) for demand, n in room.reasons.items()]
    reasons += [FellBack(d, n, src, cause) for (src, cause, d), n in room.fell_back.items()]
    reasons += [Waiting(demand, n, hold) for (demand, hold), n in room.waiting.items()]
    return GroupFit(room.added, tuple(reasons), tuple(room.fell_back.items()))


def _needed(available: list[Bin], total: list[Bin]) -> frozenset[SliceRef]:
    return frozenset((b.group, b.slice_key) for b in (*available, *total) if b.used and b.slice_key)


def fallbacks(fits: Mapping[str, GroupFit]) -> tuple[Fallback, ...]:
    merged: Counter[tuple[str, str, str]] = Counter()
    for name, fit in fits.items():
        for (source, cause, _demand), n in fit.fell_back:
            merged[(source, name, cause)] += n
    return tuple(Fallback(f, t, c, n) for (f, t, c), n in sorted(merged.items()))
