"""plan(snapshot, ray, memory, policy, now) -> Plan: the one place scaling is decided."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any

from kuberay_scaler.core.defaults import (
    BROKEN_BUSY_MAX_S,
    JOIN_SETTLE_S,
    MAX_REPLACE_BACKOFF_S,
    PREEMPT_DEADLINE_S,
    REPLACE_BACKOFF_S,
    RESERVATION_GRACE_S,
)
from kuberay_scaler.core.model.cluster import (
    MAX_GROUP_HOSTS,
    ClusterSpec,
    Problem,
    UpscalingMode,
    WorkerGroup,
)
from kuberay_scaler.core.model.plan import (
    DeleteKind,
    GroupDecision,
    Infeasible,
    Memory,
    Plan,
    ReplaceBackoff,
    ReservationMark,
    SliceDeletion,
    Snapshot,
)
from kuberay_scaler.core.model.ray import RayState, epoch_ms
from kuberay_scaler.core.model.reasons import (
    ClearWorkersToDelete,
    DemandKind,
    Hold,
    HoldKind,
    PlanProblem,
    ProblemKind,
    Reason,
    RunsMinReplicas,
    ScaleDown,
    ScaleDownKind,
    ScaleUp,
    Waiting,
)
from kuberay_scaler.core.model.slices import GroupSlices, SliceMap
from kuberay_scaler.core.planner.bins import bins_for_new_slice
from kuberay_scaler.core.planner.capacity import Capacity, build_capacity
from kuberay_scaler.core.planner.explain import why_unchanged
from kuberay_scaler.core.planner.gate import Evidence, evidence_for
from kuberay_scaler.core.planner.pool import Pool
from kuberay_scaler.core.planner.queued import QueuedCancels, queued_cancellations
from kuberay_scaler.core.planner.replace import BrokenBusy, backing_off, live_backoff, replacements
from kuberay_scaler.core.planner.reservations import GraceKept, grace_kept, reservation_marks
from kuberay_scaler.core.planner.scale_down import (
    Surplus,
    finish_recorded_drains,
    idle_deletions,
    idle_timeout,
    surplus_removals,
)
from kuberay_scaler.core.planner.scale_up import DemandFit, GroupRoom, fit_gangs, fit_tasks
from kuberay_scaler.core.planner.shapes import ShapeError, SliceShape, slice_shape
from kuberay_scaler.core.planner.stuck_gangs import gang_stuck_slices
from kuberay_scaler.core.slicemap import FRAME_MEMO, SliceTimeouts, build_slice_map


@dataclass(frozen=True)
class Policy:
    """Knobs from settings that shape decisions."""

    idle_timeout_override_s: float | None = None
    timeouts: SliceTimeouts = field(default_factory=SliceTimeouts)
    replace_backoff_s: float = REPLACE_BACKOFF_S
    max_backoff_s: float = MAX_REPLACE_BACKOFF_S
    # How long a busy slice above maxReplicas is drained (reason preemption) before deletion.
    preempt_deadline_s: float = PREEMPT_DEADLINE_S
    # How long a broken slice with a busy host is kept before it is drained for preemption and
    # replaced (KUBERAY_SCALER_BROKEN_BUSY_MAX_S).
    broken_busy_max_s: float = BROKEN_BUSY_MAX_S
    # How long after its Ray container started a worker host's used resources may still be
    # work reported pending (see JOIN_SETTLE_S); 0 turns the settle off.
    join_settle_s: float = JOIN_SETTLE_S
    # Unneeded slices of a group that served slice reservations are kept this long after the
    # last one was pending (KUBERAY_SCALER_RESERVATION_GRACE_S, planner/reservations.py).
    reservation_grace_s: float = RESERVATION_GRACE_S


@dataclass
class _Group:
    """Working notes about one group while planning."""

    slices: GroupSlices
    shape: SliceShape | None
    hold_all: Hold | None = None  # nothing at all is decided for this group
    hold_down: Hold | None = None  # no deletions (scale-up still allowed)
    clear_wtd: bool = False
    reasons: list[Reason] = field(default_factory=list)


def plan(
    snapshot: Snapshot,
    ray: RayState | None,
    memory: Memory,
    policy: Policy,
    now: datetime,
    evidence: Evidence | None = None,
    *,
    mono_s: float | None = None,
) -> Plan:
    """The plan for every group; a group whose planning raises is held with a named problem
    and the others are planned without it (one bad group never stops the others).

    `evidence`: the deletion gate's evidence for exactly these inputs, when the caller already
    built it (`decide()` does, so it is built once per frame); otherwise built here.
    `mono_s`: the monotonic clock (seconds) for the timers it keeps in memory (None: `now`)."""
    mono = mono_s if mono_s is not None else now.timestamp()
    try:
        result = _plan(snapshot, ray, memory, policy, now, evidence, mono_s=mono)
    except Exception:  # a planner bug reached by one group's numbers: find the group
        failed = _failing_groups(snapshot, ray, memory, policy, now, mono)
        if not failed:
            raise  # not one group's doing: the loop counts it (and /healthz says so)
        result = _without_groups(snapshot, ray, memory, policy, now, failed, mono)
    return replace(result, now_ms=epoch_ms(now))


def _failing_groups(
    snapshot: Snapshot,
    ray: RayState | None,
    memory: Memory,
    policy: Policy,
    now: datetime,
    mono_s: float,
) -> dict[str, str]:
    """Each group planned alone; the ones that raise, with what they raised."""
    failed: dict[str, str] = {}
    for group in snapshot.spec.groups:
        others = tuple(g.name for g in snapshot.spec.groups if g is not group)
        alone = _skip_groups(snapshot, others, [])
        try:
            _plan(alone, ray, memory, policy, now, mono_s=mono_s)
        except Exception as err:
            failed[group.name] = f"{type(err).__name__}: {err}"
    return failed


def _without_groups(
    snapshot: Snapshot,
    ray: RayState | None,
    memory: Memory,
    policy: Policy,
    now: datetime,
    failed: Mapping[str, str],
    mono_s: float,
) -> Plan:
    problems = [
        Problem(f"planning failed ({why}); group skipped, the others planned", name)
        for name, why in failed.items()
    ]
    skipped = _skip_groups(snapshot, tuple(failed), problems)
    result = _plan(skipped, ray, memory, policy, now, mono_s=mono_s)
    held = [
        GroupDecision(
            group=g.name,
            index=g.index,
            num_of_hosts=g.num_of_hosts,
            current=g.replicas,
            target=g.replicas,
            held=Hold(HoldKind.PLAN_FAILED, g.name, detail=failed[g.name]),
            reasons=(Hold(HoldKind.PLAN_FAILED, g.name, detail=failed[g.name]),),
        )
        for g in snapshot.spec.groups
        if g.name in failed
    ]
    tagged = tuple(
        replace(p, kind=ProblemKind.PLAN_FAILED)
        if p.message in {q.message for q in problems}
        else p
        for p in result.problems
    )
    groups = tuple(sorted((*result.groups, *held), key=lambda d: d.index))
    return replace(result, groups=groups, problems=tagged)


def _skip_groups(snapshot: Snapshot, names: tuple[str, ...], problems: list[Problem]) -> Snapshot:
    spec = snapshot.spec
    kept = tuple(g for g in spec.groups if g.name not in names)
    skipped = replace(
        spec,
        groups=kept,
        skipped_groups=(*spec.skipped_groups, *names),
        problems=(*spec.problems, *problems),
    )
    return replace(snapshot, spec=skipped)


def _plan(
    snapshot: Snapshot,
    ray: RayState | None,
    memory: Memory,
    policy: Policy,
    now: datetime,
    evidence: Evidence | None = None,
    *,
    mono_s: float,
) -> Plan:
    spec = snapshot.spec
    problems = _problems(ProblemKind.SPEC, spec.problems) + _problems(
        ProblemKind.POD, snapshot.problems
    )
    if not snapshot.synced:
        return _held_plan(spec, None, memory, problems, Hold(HoldKind.NOT_SYNCED))
    slice_map = build_slice_map(
        spec, snapshot.hosts, ray, now, policy.timeouts, snapshot.clock, FRAME_MEMO
    )
    problems += _problems(ProblemKind.SLICE_MAP, slice_map.problems)
    groups = _analyse(slice_map, memory, problems)
    if spec.suspended:
        why = Hold(HoldKind.CLUSTER_SUSPENDED)
        return _held_plan(spec, slice_map, memory, problems, why, groups)
    if ray is None:
        why = Hold(HoldKind.DEMAND_UNKNOWN)
        return _held_plan(spec, slice_map, memory, problems, why, groups)
    shapes = {n: g.shape for n, g in groups.items() if g.shape}
    replacing = _replacing(groups, memory, now)
    demand = bool(ray.tasks or ray.gangs or ray.constraint)
    capacity = build_capacity(
        slice_map,
        ray,
        shapes,
        replacing,
        with_total=bool(ray.constraint),
        bins=demand,
        now=now,
        settle_s=policy.join_settle_s,
    )
    mode = spec.autoscaler.upscaling_mode
    rooms = {n: _room(g, capacity, ray, memory, mode, now) for n, g in groups.items()}
    fit = _fit_demand(ray, capacity, rooms)
    needed = _needed(capacity)
    backoff = dict(memory.backoff)
    preempting: dict[str, datetime] = {}
    ev = evidence or evidence_for(
        snapshot.hosts,
        ray,
        snapshot.clock,
        policy.timeouts.missing_node_grace_s,
        now,
        memory.preempting,
    )
    busy = BrokenBusy(
        max_s=policy.broken_busy_max_s,
        deadline_s=policy.preempt_deadline_s,
        since=memory.broken_busy_since,
        preempting=memory.preempting,
        stuck=gang_stuck_slices(slice_map, ray),
    )
    queues = _queues(slice_map, groups, rooms, needed, spec, policy, memory, ray, ev, now, mono_s)
    decisions = [
        _decide(
            g,
            rooms[n],
            needed,
            capacity.virtual.get(n, 0),
            spec,
            policy,
            backoff,
            now,
            (memory.preempting, preempting),
            _Judged(ev, busy, memory),
            queues.groups.get(n),
        )
        for n, g in groups.items()
    ]
    preempting.update(busy.preempting_out)
    # Deadlines set after the drains (a partly drained slice) outlive the plans between.
    alive = _slice_keys(slice_map) if memory.preempting else set()
    for key, deadline in memory.preempting.items():
        if key in alive and key not in _surplus_keys(decisions):
            preempting.setdefault(key, deadline)
    decisions.sort(key=lambda d: d.index)
    decisions, settle_s = _settling(decisions, capacity, policy)
    problems += [
        PlanProblem(
            ProblemKind.WAITS_ON_EXISTING_NODE,
            f"{n}× {demand} waits for an existing node (never launched for)",
            demand=demand,
            count=n,
        )
        for demand, n in fit.waiting_on_existing.items()
    ]
    result = Plan(
        cluster=spec.name,
        uid=spec.uid,
        resource_version=spec.resource_version,
        groups=tuple(decisions),
        infeasible=tuple(_merge_infeasible(fit.infeasible)),
        problems=tuple(problems),
        slice_map=slice_map,
        memory=replace(
            memory,
            backoff=MappingProxyType(live_backoff(backoff, now)),
            preempting=MappingProxyType(preempting),
            broken_busy_since=MappingProxyType(busy.since_out),
            refused=MappingProxyType(_live_refused(memory, slice_map, now)),
            queued_unneeded_since=queues.unneeded_since,
            reservations=queues.marks,
        ),
        settle_s=settle_s,
        queue_wake_s=queues.wake_s,
    )
    return finish_recorded_drains(result, memory.draining, ev, now)


def _settling(
    decisions: list[GroupDecision], cap: Capacity, policy: Policy
) -> tuple[list[GroupDecision], float | None]:
    """Name the demand that hosts just joined held (`Hold(JOIN_SETTLING)` in their group's
    reasons), and the seconds until the first of them stops settling (the loop plans again
    then: the same reply may need a slice by that time)."""
    used = [(b, left) for b, left in cap.settling if b.used]
    if not used:
        return decisions, None
    hosts = Counter(b.group for b, _ in used)
    detail = f"{policy.join_settle_s:g}s"
    out = [
        replace(
            d, reasons=(*d.reasons, Hold(HoldKind.JOIN_SETTLING, d.group, detail, hosts[d.group]))
        )
        if d.group in hosts
        else d
        for d in decisions
    ]
    return out, min(left for _, left in used)


def _surplus_keys(decisions: list[GroupDecision]) -> set[str]:
    """Slices the surplus path judged (it alone decides whether their deadline stays)."""
    return {
        r.slice
        for d in decisions
        for r in d.reasons
        if isinstance(r, ScaleDown) and r.kind in _SURPLUS_KINDS
    }


_SURPLUS_KINDS = (ScaleDownKind.ABOVE_MAX, ScaleDownKind.PREEMPT, ScaleDownKind.PREEMPTED)


@dataclass(frozen=True)
class _Judged:
    """What the deletion paths judge by besides the slices: the gate's evidence, the broken-
    but-busy bound, and the memory of refused drains."""

    ev: Evidence
    busy: BrokenBusy
    memory: Memory


def _slice_keys(slice_map: SliceMap) -> set[str]:
    return {s.key for gs in slice_map.groups.values() for s in gs.slices}


def _live_refused(memory: Memory, slice_map: SliceMap, now: datetime) -> dict[str, Any]:
    """Refused-drain backoffs of slices that still exist (forgotten a while after they end)."""
    if not memory.refused:
        return {}
    keys = _slice_keys(slice_map)
    return {
        k: v for k, v in memory.refused.items() if k in keys and v.until + timedelta(hours=1) > now
    }


def _problems(kind: ProblemKind, found: tuple[Problem, ...]) -> list[PlanProblem]:
    """Problems of the input, tagged with where they were found."""
    return [PlanProblem(kind, p.message, p.group) for p in found]


def _analyse(slice_map: SliceMap, memory: Memory, problems: list[PlanProblem]) -> dict[str, _Group]:
    out: dict[str, _Group] = {}
    for name, gs in slice_map.groups.items():
        note = _Group(slices=gs, shape=None)
        try:
            note.shape = slice_shape(gs.group)
        except ShapeError as err:
            problems.append(PlanProblem(ProblemKind.SHAPE, f"{err}; not scaled", name))
            note.hold_all = Hold(HoldKind.SHAPE_UNKNOWN, name, detail=str(err))
        if name in memory.awaiting_write:
            held = memory.awaiting_write[name]
            note.hold_all = (
                held if isinstance(held, Hold) else Hold(HoldKind.AWAITING_WRITE, name, detail=held)
            )
        _workers_to_delete_state(note)
        out[name] = note
    return out


def _replacing(groups: Mapping[str, _Group], memory: Memory, now: datetime) -> set[str]:
    """Groups whose broken slices this plan replaces (see `_replacements`)."""
    return {
        name
        for name, g in groups.items()
        if not g.hold_all and not g.hold_down and not backing_off(memory.backoff, name, now)
    }


def _workers_to_delete_state(note: _Group) -> None:
    group = note.slices.group
    if not group.workers_to_delete:
        return
    present = {p for s in note.slices.slices for p in s.pod_names}
    remaining = [p for p in group.workers_to_delete if p in present]
    if remaining:
        note.hold_down = Hold(HoldKind.WORKERS_TO_DELETE_PENDING, group.name, count=len(remaining))
    else:
        note.clear_wtd = True
        note.reasons.append(ClearWorkersToDelete(len(group.workers_to_delete)))


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
        room.blocked = Hold(HoldKind.GROUP_SUSPENDED, group.name)
    elif back is not None and back.until > now:
        room.blocked = Hold(
            HoldKind.BACKING_OFF, group.name, until=back.until, failures=back.failures
        )
    elif group.effective_replicas >= group.max_replicas:
        room.blocked = Hold(HoldKind.AT_MAX_REPLICAS, group.name, limit=group.max_replicas)
    elif group.effective_replicas >= _host_bound(group):
        room.blocked = _host_bound_hold(group)
    else:
        room.room = group.max_replicas - group.effective_replicas
        room.exhausted = Hold(HoldKind.AT_MAX_REPLICAS, group.name, limit=group.max_replicas)
        if _host_bound(group) < group.max_replicas:
            # Planning cost and memory grow with the slices added: bounded by hosts per group.
            room.room = _host_bound(group) - group.effective_replicas
            room.exhausted = _host_bound_hold(group)
        if mode is UpscalingMode.CONSERVATIVE and _conservative_limit(g, cap, ray) < room.room:
            room.room = _conservative_limit(g, cap, ray)
            room.exhausted = Hold(HoldKind.CONSERVATIVE_UPSCALING, group.name)
        if room.room <= 0:
            room.blocked = Hold(HoldKind.CONSERVATIVE_UPSCALING, group.name)
            room.holds_demand = True
    return room


def _host_bound(group: WorkerGroup) -> int:
    return MAX_GROUP_HOSTS // group.num_of_hosts


def _host_bound_hold(group: WorkerGroup) -> Hold:
    detail = f"{MAX_GROUP_HOSTS} hosts per group"
    return Hold(HoldKind.AT_HOST_BOUND, group.name, limit=_host_bound(group), detail=detail)


def _conservative_limit(g: _Group, cap: Capacity, ray: RayState) -> int:
    """Launching hosts stay within the size of the Ray cluster, but one slice may always start."""
    hosts = g.slices.group.num_of_hosts
    alive = len(ray.alive_nodes())
    launching = cap.virtual.get(g.slices.group.name, 0) + len(g.slices.arriving)
    return max(1, math.ceil(alive / hosts)) - launching


def _fit_demand(ray: RayState, cap: Capacity, rooms: Mapping[str, GroupRoom]) -> DemandFit:
    fit = DemandFit()
    alive = list(ray.alive_nodes())
    # The request_resources floor counts whole hosts; slices it adds also serve pending demand.
    total = Pool(cap.total)
    available = Pool(cap.available)
    before = {n: r.added for n, r in rooms.items()}
    fit_tasks(ray.constraint, total, rooms, alive, fit, what=DemandKind.REQUEST_RESOURCES)
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
    backoff: dict[str, ReplaceBackoff],
    now: datetime,
    preempting: tuple[Mapping[str, datetime], dict[str, datetime]] = ({}, {}),
    judged: _Judged | None = None,
    queue: _GroupQueue | None = None,
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
        return replace(base, held=g.hold_all, reasons=(*reasons, g.hold_all))
    reasons += [ScaleUp(demand, n) for demand, n in room.reasons.items()]
    reasons += [Waiting(demand, n, hold) for (demand, hold), n in room.waiting.items()]
    deletions: list[SliceDeletion] = []
    if g.hold_down:
        reasons.append(g.hold_down)
    elif (surplus := _above_max(g, preempting, policy, now, reasons, judged)) is not None:
        # Above maxReplicas: whole surplus slices leave and the target is maxReplicas. KubeRay
        # already clamps replicas to maxReplicas, so writing it changes nothing for slices that
        # stay (busy ones being drained); a plan that only drains writes nothing.
        target = group.max_replicas if surplus.deletions else group.replicas
        return replace(
            base,
            target=target,
            deletions=tuple(surplus.deletions),
            preempt=tuple(surplus.preempt),
            clear_workers_to_delete=g.clear_wtd and not surplus.deletions,
            reasons=tuple(reasons),
            launching_hosts=_launching_hosts(g, virtual),
        )
    else:
        busy, ev = (judged.busy, judged.ev) if judged else (None, None)
        deletions += replacements(
            g.slices,
            backoff,
            policy.replace_backoff_s,
            policy.max_backoff_s,
            now,
            reasons,
            busy,
            ev,
        )
        # Replicas asked for but without pods are never cancelled: the operator may be rebuilding
        # them right now (e.g. after a host pod was deleted). If demand is really gone they come
        # up, turn idle and leave through the idle path, drained like any other slice.
        timeout_s = idle_timeout(group, spec, policy.idle_timeout_override_s)
        keep = group.effective_replicas + room.added - group.min_replicas
        refused = judged.memory.refused if judged else None
        # Queued slices no demand wants are cancelled first (they never ran); slices the
        # reservation grace keeps count as needed (issue 32).
        queue = queue or _GroupQueue()
        deletions += queue.cancels.deletions
        reasons += queue.cancels.reasons
        keep -= len(queue.cancels.deletions)
        shielded = needed | queue.grace.refs if queue.grace.refs else needed
        deletions += idle_deletions(g.slices, keep, shielded, timeout_s, reasons, refused, now)
        reasons += queue.grace.reasons
    idle_deleted = sum(1 for d in deletions if d.kind in _TARGET_LOWERED)
    below_min = not (group.suspend or g.hold_down) and group.replicas < group.min_replicas
    if below_min:
        # KubeRay runs minReplicas when replicas is lower: plan (and write) what runs.
        reasons.append(RunsMinReplicas(group.replicas, group.min_replicas))
    scaled = room.added or idle_deleted or below_min
    target = group.effective_replicas + room.added - idle_deleted if scaled else group.replicas
    decision = replace(
        base,
        target=target,
        deletions=tuple(deletions),
        clear_workers_to_delete=g.clear_wtd and not deletions,
        held=g.hold_down,
        reasons=tuple(reasons),
        launching_hosts=_launching_hosts(g, virtual + room.added),
        new_hosts=room.added * group.num_of_hosts,
        preempt=tuple(
            x for x in (judged.busy.preempt if judged else ()) if x.slice_key in _keys(g)
        ),
    )
    if decision.changes or g.hold_down:
        return decision
    # Nothing changes: say why, slice kind by slice kind (busy, idle below the timeout, ...).
    timeout_s = idle_timeout(group, spec, policy.idle_timeout_override_s)
    steady = why_unchanged(g.slices, needed, timeout_s, epoch_ms(now))
    return replace(decision, reasons=(*decision.reasons, *steady))


_TARGET_LOWERED = (DeleteKind.IDLE, DeleteKind.CANCEL)


@dataclass(frozen=True)
class _GroupQueue:
    """One group's issue-32 stages: its queued slices to cancel, the reservation grace."""

    cancels: QueuedCancels = field(default_factory=QueuedCancels)
    grace: GraceKept = field(default_factory=GraceKept)


@dataclass(frozen=True)
class _Queues:
    groups: Mapping[str, _GroupQueue]
    unneeded_since: Mapping[str, float]  # Memory.queued_unneeded_since
    marks: Mapping[str, ReservationMark]  # Memory.reservations
    wake_s: float | None  # the first cancel or grace end due


def _queues(
    slice_map: SliceMap,
    groups: Mapping[str, _Group],
    rooms: Mapping[str, GroupRoom],
    needed: set[tuple[str | None, str | None]],
    spec: ClusterSpec,
    policy: Policy,
    memory: Memory,
    ray: RayState,
    ev: Evidence,
    now: datetime,
    mono_s: float,
) -> _Queues:
    """The reservation marks after this reply, and per group what the grace keeps and which
    queued slices no demand wants (pure; folded into each group's decision by `_decide`)."""
    grace_s = policy.reservation_grace_s
    shapes = {n: g.shape for n, g in groups.items() if g.shape}
    marks = reservation_marks(slice_map, ray, shapes, memory.reservations, mono_s, grace_s)
    now_ms = epoch_ms(now)
    out: dict[str, _GroupQueue] = {}
    since: dict[str, float] = {}
    waits: list[float] = []
    for name, g in groups.items():
        group = g.slices.group
        timeout_s = idle_timeout(group, spec, policy.idle_timeout_override_s)
        grace = grace_kept(g.slices, marks.get(name), needed, mono_s, grace_s, now_ms, timeout_s)
        keep = group.effective_replicas + rooms[name].added - group.min_replicas
        cancels = queued_cancellations(
            g.slices,
            needed | grace.refs,
            keep,
            timeout_s,
            memory.queued_unneeded_since,
            mono_s,
            ev,
        )
        out[name] = _GroupQueue(cancels, grace)
        since.update(cancels.unneeded_since)
        waits += [w for w in (cancels.wake_s, grace.wake_s) if w is not None]
    return _Queues(
        MappingProxyType(out),
        MappingProxyType(since),
        marks,
        min(waits) if waits else None,
    )


def _keys(g: _Group) -> set[str]:
    return {s.key for s in g.slices.slices}


def _above_max(
    g: _Group,
    preempting: tuple[Mapping[str, datetime], dict[str, datetime]],
    policy: Policy,
    now: datetime,
    reasons: list[Reason],
    judged: _Judged | None = None,
) -> Surplus | None:
    """The surplus removals of a group running more slices than maxReplicas, else None."""
    known, kept = preempting
    found: list[Reason] = []
    ev = judged.ev if judged else None
    surplus = surplus_removals(g.slices, known, policy.preempt_deadline_s, now, found, ev)
    if surplus.running <= g.slices.group.max_replicas:
        return None
    reasons.extend(found)
    kept.update(surplus.preempting)
    return surplus


def _launching_hosts(g: _Group, launching_slices: int) -> int:
    pending = [h for s in g.slices.arriving for h in s.hosts if h.pod_name not in s.nodes]
    return len(pending) + max(0, launching_slices) * g.slices.group.num_of_hosts


def _held_plan(
    spec: ClusterSpec,
    slice_map: SliceMap | None,
    memory: Memory,
    problems: list[PlanProblem],
    why: Hold,
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
                reasons=(*(note.reasons if clear and note else []), why),
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
    # Keyed without `request` (its mappings do not hash); the first request stands for all.
    merged: Counter[tuple[object, ...]] = Counter()
    first: dict[tuple[object, ...], Infeasible] = {}
    for item in items:
        key = (item.demand, item.kind, item.missing, item.certain)
        merged[key] += item.count
        first.setdefault(key, item)
    return [replace(first[key], count=n) for key, n in merged.items()]
