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
    DISRUPTION_BUDGET,
    JOIN_SETTLE_S,
    MAX_REPLACE_BACKOFF_S,
    PREEMPT_DEADLINE_S,
    REPLACE_BACKOFF_S,
    RESERVATION_GRACE_S,
    SCALE_DOWN_DELAY_AFTER_ADD_S,
    UNAVAILABLE_BACKOFF_S,
    UNAVAILABLE_MAX_BACKOFF_S,
)
from kuberay_scaler.core.liveness import HostClock
from kuberay_scaler.core.model.availability import GroupAvailability
from kuberay_scaler.core.model.cluster import (
    MAX_GROUP_HOSTS,
    Budget,
    ClusterSpec,
    Problem,
    UpscalingMode,
    WorkerGroup,
    parse_budget,
)
from kuberay_scaler.core.model.plan import (
    DeleteKind,
    Fallback,
    GroupDecision,
    Infeasible,
    Memory,
    Plan,
    ReplaceBackoff,
    ReservationMark,
    SliceDeletion,
    Snapshot,
    shown,
    tick_of,
)
from kuberay_scaler.core.model.ray import RayState, epoch_ms
from kuberay_scaler.core.model.reasons import (
    ClearWorkersToDelete,
    DemandKind,
    FellBack,
    Hold,
    HoldKind,
    Keep,
    KeepKind,
    PlanProblem,
    ProblemKind,
    Reason,
    RunsMaxReplicas,
    RunsMinReplicas,
    ScaleDown,
    ScaleDownKind,
    ScaleUp,
    Waiting,
)
from kuberay_scaler.core.model.signals import CapacityEvent, NodeMaintenance
from kuberay_scaler.core.model.slices import GroupSlices, SliceMap, SliceState
from kuberay_scaler.core.planner.availability import (
    AvailabilityPolicy,
    AvailabilityResult,
    judge_availability,
)
from kuberay_scaler.core.planner.bins import bins_for_new_slice
from kuberay_scaler.core.planner.cancel import Cancelled, cancellations
from kuberay_scaler.core.planner.capacity import Capacity, build_capacity
from kuberay_scaler.core.planner.disruption import (
    DisruptionRules,
    disruption_stage,
    in_flight_of,
    shown_rules,
)
from kuberay_scaler.core.planner.explain import why_unchanged
from kuberay_scaler.core.planner.gang_deadline import GangDeadlines, gang_deadlines
from kuberay_scaler.core.planner.gate import Evidence, evidence_for
from kuberay_scaler.core.planner.memo import FrameMemo
from kuberay_scaler.core.planner.pool import Pool
from kuberay_scaler.core.planner.queued import QueuedCancels, queued_cancellations
from kuberay_scaler.core.planner.replace import BrokenBusy, backing_off, live_backoff, replacements
from kuberay_scaler.core.planner.reservations import GraceKept, grace_kept, reservation_marks
from kuberay_scaler.core.planner.scale_down import (
    Surplus,
    finish_recorded_drains,
    idle_deletions,
    idle_timeout,
    outdated_kept,
    surplus_removals,
)
from kuberay_scaler.core.planner.scale_up import DemandFit, GroupRoom, fit_gangs, fit_tasks
from kuberay_scaler.core.planner.shapes import ShapeError, SliceShape, slice_shape
from kuberay_scaler.core.planner.stuck_gangs import gang_stuck_slices
from kuberay_scaler.core.slicemap import SliceTimeouts, build_slice_map


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
    # Group availability: the backoff before an unavailable group is probed
    # (KUBERAY_SCALER_UNAVAILABLE_BACKOFF_S), doubling up to ..._UNAVAILABLE_MAX_BACKOFF_S.
    unavailable_backoff_s: float = UNAVAILABLE_BACKOFF_S
    unavailable_max_backoff_s: float = UNAVAILABLE_MAX_BACKOFF_S

    def availability(self) -> AvailabilityPolicy:
        return AvailabilityPolicy(
            initial_s=self.unavailable_backoff_s,
            cap_s=self.unavailable_max_backoff_s,
            deadline_s=self.timeouts.max_provision_s,
        )

    # Disruption defaults (a group's template annotations override them; docs/planner.md).
    disruption_budget: Budget = field(default_factory=lambda: parse_budget(DISRUPTION_BUDGET))
    scale_down_delay_after_add_s: float = SCALE_DOWN_DELAY_AFTER_ADD_S

    def disruption_rules(self, group: WorkerGroup) -> DisruptionRules:
        """The group's own budget and delay, else these defaults."""
        budget = group.disruption_budget or self.disruption_budget
        delay = group.scale_down_delay_s
        delay_s = self.scale_down_delay_after_add_s if delay is None else delay
        return DisruptionRules(
            budget,
            delay_s,
            self.preempt_deadline_s,
            budget_from_group=group.disruption_budget is not None,
            delay_from_group=delay is not None,
        )

    # Unneeded slices of a group that served slice reservations are kept this long after the
    # last one was pending (KUBERAY_SCALER_RESERVATION_GRACE_S, planner/reservations.py).
    reservation_grace_s: float = RESERVATION_GRACE_S


_NONE = Cancelled()


@dataclass(frozen=True)
class _Capacity:
    """This frame's capacity news: the Events and the daemon's monotonic reading."""

    events: tuple[CapacityEvent, ...] = ()
    mono_s: float = 0.0
    # GKE maintenance on nodes, node name → announcement (empty without the nodes permission).
    maintenance: Mapping[str, NodeMaintenance] = field(default_factory=lambda: MappingProxyType({}))


_NO_NEWS = _Capacity()


@dataclass
class _Group:
    """Working notes about one group while planning."""

    slices: GroupSlices
    shape: SliceShape | None
    hold_all: Hold | None = None  # nothing at all is decided for this group
    hold_down: Hold | None = None  # no deletions (scale-up still allowed)
    clear_wtd: bool = False
    reasons: list[Reason] = field(default_factory=list)
    availability: GroupAvailability | None = None
    # Idle slices of a gang past its deadline, released (planner/gang_deadline.py).
    released: tuple[SliceDeletion, ...] = ()


def plan(
    snapshot: Snapshot,
    ray: RayState | None,
    memory: Memory,
    policy: Policy,
    now: datetime,
    evidence: Evidence | None = None,
    *,
    mono_s: float | None = None,
    events: tuple[CapacityEvent, ...] = (),
    maintenance: Mapping[str, NodeMaintenance] | None = None,
    memo: FrameMemo | None = None,
) -> Plan:
    """The plan for every group; a group whose planning raises is held with a named problem
    and the others are planned without it (one bad group never stops the others).

    `now`: the wall clock, for what Ray and Kubernetes read and people see. `mono_s`: the
    monotonic clock, for every duration that licenses a deletion (`tick_of`; None: `now`).
    `evidence`: the deletion gate's evidence for exactly these inputs, when the caller already
    built it (`decide()` does, so it is built once per frame); otherwise built here.
    `events`: capacity Events, oldest first (availability backoffs run on `mono_s` too).
    `maintenance`: GKE maintenance announced on nodes (node name → window), where readable.
    `memo`: the caller's frame memo (FrameMemo, carried across its frames); None: a cold one.
    The plan is the same either way."""
    at = _At(now, tick_of(mono_s, now))
    mono = now.timestamp() if mono_s is None else mono_s
    news = _Capacity(events, mono, MappingProxyType(dict(maintenance or {})))
    try:
        result = _plan(snapshot, ray, memory, policy, at, evidence, news, memo=memo)
    except Exception:  # a planner bug reached by one group's numbers: find the group
        failed = _failing_groups(snapshot, ray, memory, policy, at, news)
        if not failed:
            raise  # not one group's doing: the loop counts it (and /healthz says so)
        result = _without_groups(snapshot, ray, memory, policy, at, failed, news)
    return replace(result, now_ms=epoch_ms(at.tick), wall_ms=epoch_ms(at.now))


@dataclass(frozen=True)
class _At:
    """One planning moment on both clocks: `now` (wall: pods' timestamps, what Ray reads,
    what people see) and `tick` (monotonic, `tick_of`: every timer in Memory, idle age)."""

    now: datetime
    tick: datetime

    def shown(self, instant: datetime) -> datetime:
        return shown(instant, self.tick, self.now)


def _failing_groups(
    snapshot: Snapshot,
    ray: RayState | None,
    memory: Memory,
    policy: Policy,
    now: _At,
    news: _Capacity = _NO_NEWS,
) -> dict[str, str]:
    """Each group planned alone; the ones that raise, with what they raised."""
    failed: dict[str, str] = {}
    for group in snapshot.spec.groups:
        others = tuple(g.name for g in snapshot.spec.groups if g is not group)
        alone = _skip_groups(snapshot, others, [])
        try:
            _plan(alone, ray, memory, policy, now, None, news)
        except Exception as err:
            failed[group.name] = f"{type(err).__name__}: {err}"
    return failed


def _without_groups(
    snapshot: Snapshot,
    ray: RayState | None,
    memory: Memory,
    policy: Policy,
    now: _At,
    failed: Mapping[str, str],
    news: _Capacity = _NO_NEWS,
) -> Plan:
    problems = [
        Problem(f"planning failed ({why}); group skipped, the others planned", name)
        for name, why in failed.items()
    ]
    skipped = _skip_groups(snapshot, tuple(failed), problems)
    result = _plan(skipped, ray, memory, policy, now, None, news)
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
    at: _At,
    evidence: Evidence | None = None,
    news: _Capacity = _NO_NEWS,
    *,
    memo: FrameMemo | None = None,
) -> Plan:
    now, tick = at.now, at.tick
    spec = snapshot.spec
    problems = _problems(ProblemKind.SPEC, spec.problems) + _problems(
        ProblemKind.POD, snapshot.problems
    )
    if not snapshot.synced:
        why = Hold(HoldKind.NOT_SYNCED)
        return _held_plan(spec, None, memory, problems, why, policy=policy)
    memo = memo or FrameMemo()  # None: a cold memo, this frame's alone
    slice_map = build_slice_map(
        spec, snapshot.hosts, ray, now, policy.timeouts, snapshot.clock, memo.slices
    )
    problems += _problems(ProblemKind.SLICE_MAP, slice_map.problems)
    groups = _analyse(slice_map, memory, problems)
    if spec.suspended:
        why = Hold(HoldKind.CLUSTER_SUSPENDED)
        return _held_plan(spec, slice_map, memory, problems, why, groups, policy)
    if ray is None:
        why = Hold(HoldKind.DEMAND_UNKNOWN)
        return _held_plan(spec, slice_map, memory, problems, why, groups, policy)
    judged = _judge_availability(snapshot, slice_map, ray, memory, policy, now, news)
    for name, a in judged.groups.items():
        groups[name].availability = a
    unavailable = {n for n, a in judged.groups.items() if a.blocks_launch}
    shapes = {n: g.shape for n, g in groups.items() if g.shape}
    replacing = _replacing(groups, memory, tick) - unavailable
    demand = bool(ray.tasks or ray.gangs or ray.constraint)
    gangs = _gang_deadlines(snapshot, slice_map, ray, groups, judged, policy, now)
    capacity = build_capacity(
        _without_released(slice_map, gangs),
        ray,
        shapes,
        replacing,
        with_total=bool(ray.constraint),
        bins=demand,
        now=now,
        settle_s=policy.join_settle_s,
        unavailable=unavailable,
        memo=memo.capacity,
    )
    mode = spec.autoscaler.upscaling_mode
    rooms = {n: _room(g, capacity, ray, memory, mode, at, news) for n, g in groups.items()}
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
    for change in judged.changes:
        groups[change.group].reasons.append(change)
    queues = _queues(
        slice_map, groups, rooms, needed, spec, policy, memory, ray, ev, tick, news.mono_s
    )
    decisions = [
        _decide(
            g,
            rooms[n],
            needed,
            capacity.virtual.get(n, 0),
            spec,
            policy,
            backoff,
            at,
            (memory.preempting, preempting),
            _Judged(ev, busy, memory),
            queues.groups.get(n),
        )
        for n, g in groups.items()
    ]
    disrupted = [
        disruption_stage(
            d,
            groups[d.group].slices,
            policy.disruption_rules(groups[d.group].slices.group),
            memory,
            needed,
            tick,  # its deadlines join Memory.preempting: the monotonic tick
            news.mono_s,
            wall_shift=now - tick,  # what its reasons show: the wall clock
            maintenance=news.maintenance,
            wall=now,  # maintenance windows are wall times
        )
        for d in decisions
    ]
    decisions = [x.decision for x in disrupted]
    preempting.update(busy.preempting_out)
    for x in disrupted:
        preempting.update(x.preempting)
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
            backoff=MappingProxyType(live_backoff(backoff, tick)),
            preempting=MappingProxyType(preempting),
            broken_busy_since=MappingProxyType(busy.since_out),
            refused=MappingProxyType(_live_refused(memory, slice_map, tick)),
            availability=_kept_availability(judged, memory, spec),
            scaled_up_at=MappingProxyType(
                {x.decision.group: x.scaled_up_at for x in disrupted if x.scaled_up_at is not None}
            ),
            queued_unneeded_since=queues.unneeded_since,
            reservations=queues.marks,
            replaced_ahead=MappingProxyType(
                {key: x.decision.group for x in disrupted for key in x.replaced_ahead}
            ),
            disrupted=MappingProxyType(
                {key: x.decision.group for x in disrupted for key in x.disrupted}
            ),
        ),
        settle_s=settle_s,
        availability_changes=judged.changes,
        fallbacks=_fallbacks(rooms),
        next_probe_s=MappingProxyType(_next_probes(judged.groups, news.mono_s)),
        queue_wake_s=_first(queues.wake_s, gangs.wake_s),
        gangs=gangs.lines,
    )
    timers = (next_deadline_s(result.memory, policy, tick), judged.next_deadline_s)
    result = replace(result, deadline_s=min((t for t in timers if t is not None), default=None))
    return finish_recorded_drains(result, memory.draining, ev, tick, wall_shift=now - tick)


def next_deadline_s(memory: Memory, policy: Policy, tick: datetime) -> float | None:
    """Seconds from `tick` until the first timer in `memory` runs out (preemption notices, the
    broken-busy bound, replace and refused-drain backoffs); None when none is ahead. Each is a
    decision time alone brings, so the loop wakes for it (`Plan.next_wake_s`)."""
    ends = [
        *memory.preempting.values(),
        *(
            since + timedelta(seconds=policy.broken_busy_max_s)
            for since in memory.broken_busy_since.values()
        ),
        *(b.until for b in memory.backoff.values()),
        *(r.until for r in memory.refused.values()),
    ]
    ahead = [(end - tick).total_seconds() for end in ends if end > tick]
    return min(ahead) if ahead else None


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
    at: _At,
    news: _Capacity = _NO_NEWS,
) -> GroupRoom:
    group = g.slices.group
    room = GroupRoom(group=group, shape=g.shape, room=0)
    back = memory.backoff.get(group.name)
    avail = g.availability
    if avail is not None and avail.unavailable:
        room.unavailable_cause = avail.cause.value if avail.cause else "unavailable"
        room.availability_rank = 0 if avail.probing else 1
    if avail is not None and avail.blocks_launch:
        # Before the holds: a write of ours in flight can only cancel here, never add, so the
        # demand goes on to the next group instead of waiting for it.
        room.blocked = _unavailable_hold(group.name, avail, at.now, news.mono_s)
    elif g.hold_all:
        room.blocked, room.holds_demand = g.hold_all, True
    elif group.suspend:
        room.blocked = Hold(HoldKind.GROUP_SUSPENDED, group.name)
    elif back is not None and back.until > at.tick:
        room.blocked = Hold(
            HoldKind.BACKING_OFF, group.name, until=at.shown(back.until), failures=back.failures
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
        if avail is not None and avail.probing:
            _probe_room(room, g, cap, avail)
        if room.room <= 0 and room.blocked is None:
            room.blocked = Hold(HoldKind.CONSERVATIVE_UPSCALING, group.name)
            room.holds_demand = True
    return room


def _probe_room(room: GroupRoom, g: _Group, cap: Capacity, avail: GroupAvailability) -> None:
    """A probing group adds one slice at a time until one comes up; the rest goes elsewhere."""
    name = g.slices.group.name
    launching = len(g.slices.coming_up) + cap.virtual.get(name, 0)
    probe = Hold(HoldKind.GROUP_PROBING, name, detail=str(avail))
    if launching >= 1:
        room.room, room.blocked = 0, probe
    elif room.room > 1:
        room.room, room.exhausted = 1, probe


def _unavailable_hold(name: str, avail: GroupAvailability, now: datetime, mono_s: float) -> Hold:
    """Why an unavailable group adds nothing, with the wall time of its next probe."""
    left = (avail.until_mono - mono_s) if avail.until_mono is not None else None
    until = now + timedelta(seconds=max(0.0, left)) if left is not None else None
    return Hold(HoldKind.GROUP_UNAVAILABLE, name, detail=str(avail), until=until)


def _gang_deadlines(
    snapshot: Snapshot,
    slice_map: SliceMap,
    ray: RayState,
    groups: Mapping[str, _Group],
    judged: AvailabilityResult,
    policy: Policy,
    now: datetime,
) -> GangDeadlines:
    """The gang deadline stage, its released slices noted on their groups."""
    if not (ray.gangs or ray.constraint):
        return GangDeadlines()
    shapes = {n: g.shape for n, g in groups.items() if g.shape}
    eligible = frozenset(n for n, g in groups.items() if not (g.hold_all or g.hold_down))
    found = gang_deadlines(
        slice_map,
        ray.gangs,
        ray.constraint,
        shapes,
        judged.groups,
        _host_clock(snapshot, ray, now),
        policy.timeouts.max_provision_s,
        eligible,
    )
    for name, released in found.released.items():
        groups[name].released = released
    for name, g in groups.items():
        g.reasons += found.kept_in(name)
    return found


def _without_released(slice_map: SliceMap, gangs: GangDeadlines) -> SliceMap:
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


def _first(*waits: float | None) -> float | None:
    ahead = [w for w in waits if w is not None]
    return min(ahead) if ahead else None


def _host_clock(snapshot: Snapshot, ray: RayState | None, now: datetime) -> HostClock:
    if snapshot.clock is not None:
        return snapshot.clock
    # One-shot use: the pods' own timestamps, as the slice map used.
    return HostClock.from_timestamps(snapshot.hosts, ray.node_by_instance() if ray else {}, now)


def _judge_availability(
    snapshot: Snapshot,
    slice_map: SliceMap,
    ray: RayState | None,
    memory: Memory,
    policy: Policy,
    now: datetime,
    news: _Capacity,
) -> AvailabilityResult:
    clock = _host_clock(snapshot, ray, now)
    return judge_availability(
        slice_map,
        news.events,
        memory.availability,
        policy.availability(),
        news.mono_s,
        clock,
        held=tuple(memory.awaiting_write),
    )


def _kept_availability(
    judged: AvailabilityResult, memory: Memory, spec: ClusterSpec
) -> Mapping[str, GroupAvailability]:
    """This frame's availability, and last frame's of groups skipped this frame (a group whose
    planning raised keeps its backoff)."""
    skipped = [n for n in spec.skipped_groups if n in memory.availability]
    if not skipped:
        return judged.groups
    kept = {n: memory.availability[n] for n in skipped}
    return MappingProxyType({**kept, **judged.groups})


def _fallbacks(rooms: Mapping[str, GroupRoom]) -> tuple[Fallback, ...]:
    merged: Counter[tuple[str, str, str]] = Counter()
    for name, room in rooms.items():
        for (source, cause, _demand), n in room.fell_back.items():
            merged[(source, name, cause)] += n
    return tuple(Fallback(f, t, c, n) for (f, t, c), n in sorted(merged.items()))


def _next_probes(groups: Mapping[str, GroupAvailability], mono_s: float) -> dict[str, float]:
    return {
        name: max(0.0, a.until_mono - mono_s)
        for name, a in groups.items()
        if a.blocks_launch and a.until_mono is not None
    }


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
    at: _At,
    preempting: tuple[Mapping[str, datetime], dict[str, datetime]] = ({}, {}),
    judged: _Judged | None = None,
    queue: _GroupQueue | None = None,
) -> GroupDecision:
    tick, shift = at.tick, at.now - at.tick
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
    reasons += [FellBack(d, n, src, cause) for (src, cause, d), n in room.fell_back.items()]
    reasons += [Waiting(demand, n, hold) for (demand, hold), n in room.waiting.items()]
    deletions: list[SliceDeletion] = []
    cancelled = Cancelled()
    queued_gone = 0  # queued slices cancelled (the target drops by them)
    if g.hold_down:
        reasons.append(g.hold_down)
    elif (surplus := _above_max(g, preempting, policy, at, reasons, judged)) is not None:
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
        if g.availability is not None and ev is not None:
            cancelled = cancellations(g.slices, g.availability, ev, virtual)
            deletions += cancelled.deletions
            reasons += cancelled.reasons
        # A gang past its deadline hands its idle slices back (drained, like idle ones).
        deletions += g.released
        reasons += [x.reason for x in g.released]
        released = frozenset(x.slice_key for x in g.released)
        deletions += replacements(
            _without_slices(g.slices, cancelled.keys | released),
            backoff,
            policy.replace_backoff_s,
            policy.max_backoff_s,
            tick,
            reasons,
            busy,
            ev,
            wall_shift=shift,
        )
        # Replicas asked for but without pods are never cancelled: the operator may be rebuilding
        # them right now (e.g. after a host pod was deleted). If demand is really gone they come
        # up, turn idle and leave through the idle path, drained like any other slice.
        timeout_s = idle_timeout(group, spec, policy.idle_timeout_override_s)
        keep = group.effective_replicas + room.added - group.min_replicas - cancelled.replicas
        keep -= len(g.released)
        refused = judged.memory.refused if judged else None
        # Queued slices no demand wants are cancelled first (they never ran); slices the
        # reservation grace keeps count as needed.
        queue = queue or _GroupQueue()
        queued = _within_min(queue.cancels, keep, group.min_replicas)
        deletions += queued.deletions
        reasons += queued.reasons
        keep -= len(queued.deletions)
        queued_gone = len(queued.deletions)
        shielded = needed | queue.grace.refs if queue.grace.refs else needed
        deletions += idle_deletions(
            _without_slices(g.slices, released),
            keep,
            shielded,
            timeout_s,
            reasons,
            refused,
            tick,
            wall_shift=shift,
        )
        reasons += queue.grace.reasons
    reasons += outdated_kept(g.slices, deletions)
    # The target drops by the idle slices and the cancelled queued ones (an unavailable group's
    # cancels are counted apart: `cancelled.replicas`).
    idle_deleted = sum(1 for d in deletions if d.kind is DeleteKind.IDLE) + queued_gone
    below_min = not (group.suspend or g.hold_down) and group.replicas < group.min_replicas
    if below_min:
        # KubeRay runs minReplicas when replicas is lower: plan (and write) what runs.
        reasons.append(RunsMinReplicas(group.replicas, group.min_replicas))
    scaled = room.added or idle_deleted or below_min or cancelled.replicas
    gone = idle_deleted + cancelled.replicas
    target = group.effective_replicas + room.added - gone if scaled else group.replicas
    if not g.hold_down and group.min_replicas <= group.max_replicas < target:
        # No more slices than maxReplicas run (else the surplus path above): the rest will
        # never run, KubeRay clamps; write what runs (sidecar mode: KubeRay deleted them).
        reasons.append(RunsMaxReplicas(target, group.max_replicas))
        target = group.max_replicas
    decision = replace(
        base,
        target=target,
        deletions=tuple(deletions),
        clear_workers_to_delete=g.clear_wtd and not deletions,
        held=g.hold_down,
        reasons=tuple(reasons),
        launching_hosts=_launching_hosts(g, virtual + room.added, cancelled),
        new_hosts=room.added * group.num_of_hosts,
        preempt=tuple(
            x for x in (judged.busy.preempt if judged else ()) if x.slice_key in _keys(g)
        ),
    )
    if decision.changes or g.hold_down:
        return decision
    # Nothing changes: say why, slice kind by slice kind (busy, idle below the timeout, ...).
    timeout_s = idle_timeout(group, spec, policy.idle_timeout_override_s)
    steady = why_unchanged(g.slices, needed, timeout_s, epoch_ms(tick))
    return replace(decision, reasons=(*decision.reasons, *steady))


_TARGET_LOWERED = (DeleteKind.IDLE, DeleteKind.CANCEL)


def _within_min(cancels: QueuedCancels, keep: int, min_replicas: int) -> QueuedCancels:
    """The queued cancels that fit what the group may still lose after this plan's other
    cancels and releases (`keep`): each path alone stops at minReplicas, together too."""
    if len(cancels.deletions) <= max(0, keep):
        return cancels
    kept = cancels.deletions[: max(0, keep)]
    keys = {x.slice_key for x in kept}
    reasons: list[Reason] = [
        r for r in cancels.reasons if not isinstance(r, ScaleDown) or r.slice in keys
    ]
    spared = len(cancels.deletions) - len(kept)
    reasons.append(Keep(KeepKind.MIN_REPLICAS, spared, min_replicas=min_replicas))
    return replace(cancels, deletions=kept, reasons=tuple(reasons))


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
    tick: datetime,
    mono_s: float,
) -> _Queues:
    """The reservation marks after this reply, and per group what the grace keeps and which
    queued slices no demand wants (pure; folded into each group's decision by `_decide`).
    Idle age is read at `tick`, the clock the idle clocks are stamped on (never the wall)."""
    grace_s = policy.reservation_grace_s
    shapes = {n: g.shape for n, g in groups.items() if g.shape}
    marks = reservation_marks(slice_map, ray, shapes, memory.reservations, mono_s, grace_s)
    now_ms = epoch_ms(tick)
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
    at: _At,
    reasons: list[Reason],
    judged: _Judged | None = None,
) -> Surplus | None:
    """The surplus removals of a group running more slices than maxReplicas, else None."""
    known, kept = preempting
    found: list[Reason] = []
    ev = judged.ev if judged else None
    surplus = surplus_removals(
        g.slices, known, policy.preempt_deadline_s, at.tick, found, ev, wall_shift=at.now - at.tick
    )
    if surplus.running <= g.slices.group.max_replicas:
        return None
    reasons.extend(found)
    kept.update(surplus.preempting)
    return surplus


def _launching_hosts(g: _Group, launching_slices: int, cancelled: Cancelled = _NONE) -> int:
    gone = cancelled.keys
    pending = [
        h
        for s in g.slices.arriving  # coming up or queued
        if s.key not in gone
        for h in s.hosts
        if h.pod_name not in s.nodes
    ]
    slices = max(0, launching_slices - cancelled.without_pods)
    return len(pending) + slices * g.slices.group.num_of_hosts


def _without_slices(gs: GroupSlices, keys: frozenset[str]) -> GroupSlices:
    """The group's slices less those already decided (cancelled)."""
    if not keys:
        return gs
    return GroupSlices(gs.group, tuple(s for s in gs.slices if s.key not in keys))


def _held_plan(
    spec: ClusterSpec,
    slice_map: SliceMap | None,
    memory: Memory,
    problems: list[PlanProblem],
    why: Hold,
    groups: Mapping[str, _Group] | None = None,
    policy: Policy | None = None,
) -> Plan:
    decisions = []
    for group in spec.groups:
        gs = slice_map.groups.get(group.name) if slice_map else None
        rules = (  # configuration: shown even when nothing is planned
            shown_rules(policy.disruption_rules(group), in_flight_of(gs, memory) if gs else 0)
            if policy
            else None
        )
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
                rules=rules,
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
