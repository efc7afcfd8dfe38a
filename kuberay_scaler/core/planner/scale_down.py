"""Scale-down: idle slices leave (longest idle first, never below minReplicas), and drains a
previous run recorded are finished."""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from types import MappingProxyType

from kuberay_scaler.core.model.cluster import DEFAULT_IDLE_TIMEOUT_S, ClusterSpec, WorkerGroup
from kuberay_scaler.core.model.labels import LABEL_LEGACY_REPLICA, LABEL_REPLICA_NAME
from kuberay_scaler.core.model.plan import (
    DeleteKind,
    GroupDecision,
    Plan,
    RefusedDrain,
    SliceDeletion,
)
from kuberay_scaler.core.model.ray import NodeStatus, RayNode, epoch_ms
from kuberay_scaler.core.model.reasons import (
    Keep,
    KeepKind,
    Reason,
    Replace,
    ScaleDown,
    ScaleDownKind,
)
from kuberay_scaler.core.model.slices import GroupSlices, Slice, SliceState
from kuberay_scaler.core.planner.gate import Evidence, gone_from_ray, quiet

SliceRef = tuple[str | None, str | None]  # (group, slice key) of a bin demand uses


@dataclass(frozen=True)
class IdleDeletions:
    """One group's idle stage: the idle slices that leave, and why (kept ones too)."""

    deletions: tuple[SliceDeletion, ...] = ()
    reasons: tuple[Reason, ...] = ()


def idle_deletions(
    slices: GroupSlices,
    keep_at_least: int,
    needed: Set[SliceRef],
    timeout_s: float,
    refused: Mapping[str, RefusedDrain] | None = None,
    now: datetime | None = None,
    *,
    wall_shift: timedelta = timedelta(0),
) -> IdleDeletions:
    """Idle slices past `timeout_s` that demand does not use, while more than `keep_at_least`
    replicas (after this plan's additions) stay. A slice whose drain was refused lately waits
    (`drain_backing_off`).

    `now` is the monotonic clock (`tick_of`), the clock the daemon stamps GCS replies on: idle
    age is Ray's own idle duration plus the monotonic time since the reply, so no wall-clock
    step makes a slice idle-expired early."""
    if now is None:
        return IdleDeletions()
    idle = _expired(slices, needed, timeout_s, epoch_ms(now))
    reasons: list[Reason] = []
    if refused and idle:  # in slice order, as their reasons are said
        order = {s.key: i for i, s in enumerate(slices.slices)}
        idle.sort(key=lambda pair: order[pair[1].key])
        waits = [
            (ms, sl, drain_backing_off(sl, refused, now, wall_shift=wall_shift)) for ms, sl in idle
        ]
        reasons += [w for _, _, w in waits if w is not None]
        idle = [(ms, sl) for ms, sl, w in waits if w is None]
    # Outdated slices first (built to an older spec), then longest idle; ties (clamped at 0)
    # by key.
    idle.sort(key=lambda pair: (pair[1].state is not SliceState.OUTDATED, -pair[0], pair[1].key))
    chosen = idle[: max(0, keep_at_least)]
    if len(chosen) < len(idle):
        floor = slices.group.min_replicas
        reasons.append(Keep(KeepKind.MIN_REPLICAS, len(idle) - len(chosen), min_replicas=floor))
    whys = [
        ScaleDown(ScaleDownKind.IDLE, sl.key, len(sl.hosts), idle_ms / 1000, timeout_s)
        for idle_ms, sl in chosen
    ]
    out = tuple(
        deletion(sl, DeleteKind.IDLE, why) for (_, sl), why in zip(chosen, whys, strict=True)
    )
    return IdleDeletions(out, (*reasons, *whys))


def _expired(
    slices: GroupSlices, needed: Set[SliceRef], timeout_s: float, now_ms: int
) -> list[tuple[int, Slice]]:
    """Idle slices past the timeout that demand does not use, with their idle age."""
    idle: list[tuple[int, Slice]] = []
    # Longest idle first; past the first one below the timeout, all the others are too.
    for since, key, sl in slices.idle_by_since:
        idle_ms = max(0, now_ms - since)
        if idle_ms < timeout_s * 1000:
            break
        if (slices.group.name, key) not in needed:
            idle.append((idle_ms, sl))
    return idle


def outdated_kept(slices: GroupSlices, leaving: list[SliceDeletion]) -> tuple[Keep, ...]:
    """One Keep(OUTDATED) per slice built to an older spec that stays: the edit named in the
    plan's reasons at once, not only when the slice leaves."""
    gone = {x.slice_key for x in leaving}
    return tuple(
        Keep(
            KeepKind.OUTDATED,
            slice=sl.key,
            detail=f"{len(sl.hosts)} hosts, numOfHosts {sl.expected_hosts} now",
        )
        for sl in slices.by_state(SliceState.OUTDATED)
        if sl.key not in gone
    )


def drain_backing_off(
    sl: Slice,
    refused: Mapping[str, RefusedDrain],
    now: datetime,
    *,
    wall_shift: timedelta = timedelta(0),
) -> Keep | None:
    """The slice's drain was refused lately and nothing about its idleness changed since: wait
    (this Keep(DRAIN_BACKING_OFF)) instead of draining it again every round; None: drain."""
    entry = refused.get(sl.key)
    if entry is None or entry.until <= now:
        return None
    since = {n.node_id: n.idle_since_ms if n.idle else None for n in sl.nodes.values()}
    if set(since) != set(entry.idle_since_ms):
        return None  # other raylets now: a new situation
    if any(s is None or s > entry.idle_since_ms[n] for n, s in since.items()):
        return None  # idle since later (or busy now): the host was busy since
    detail = (
        f"{entry.failures} refused round(s); next try by {(entry.until + wall_shift).isoformat()}"
    )
    return Keep(KeepKind.DRAIN_BACKING_OFF, slice=sl.key, detail=detail)


def idle_timeout(group: WorkerGroup, spec: ClusterSpec, override_s: float | None) -> float:
    """The daemon's override, else the group's, else the cluster's, else KubeRay's default."""
    for candidate in (override_s, group.idle_timeout_s, spec.autoscaler.idle_timeout_s):
        if candidate is not None:
            return candidate
    return DEFAULT_IDLE_TIMEOUT_S


def deletion(sl: Slice, kind: DeleteKind, why: ScaleDown | Replace) -> SliceDeletion:
    return SliceDeletion(
        slice_key=sl.key, pods=sl.pod_names, node_ids=sl.node_ids, kind=kind, reason=why
    )


def finish_recorded_drains(
    result: Plan,
    draining: Mapping[str, tuple[str, ...]],
    ev: Evidence | None = None,
    now: datetime | None = None,
    *,
    wall_shift: timedelta = timedelta(0),
) -> Plan:
    """Add a deletion for every recorded slice that still exists, is not yet being deleted and
    whose every host is idle in Ray or gone from it (`gone_from_ray`): a host that turned busy,
    or that is merely absent from a reply (a GCS restart, a partial reply), keeps the slice."""
    if not draining or result.slice_map is None or result.held:
        return result
    groups = tuple(
        _finish(d, result, draining.get(d.group, ()), ev, now, wall_shift) for d in result.groups
    )
    return replace(result, groups=groups)


def _finish(
    d: GroupDecision,
    result: Plan,
    keys: tuple[str, ...],
    ev: Evidence | None,
    now: datetime | None,
    wall_shift: timedelta = timedelta(0),
) -> GroupDecision:
    assert result.slice_map is not None
    gs = result.slice_map.groups.get(d.group)
    if not keys or gs is None or d.held:
        return d
    d = _replaced_as_recorded(d, keys, gs.group.min_replicas)
    planned = {x.slice_key for x in (*d.deletions, *d.preempt)}
    extra = [
        deletion(sl, DeleteKind.IDLE, ScaleDown(ScaleDownKind.RECORDED_DRAIN, sl.key))
        for sl in gs.slices
        if sl.key in keys
        and sl.key not in planned
        and sl.state is not SliceState.TERMINATING
        and _idle_or_gone(sl, ev)
        and not (
            now
            and drain_backing_off(sl, result.memory.refused, now, wall_shift=wall_shift) is not None
        )
    ]
    if not extra:
        return d
    floor = gs.group.min_replicas
    base = d.target if d.target != d.current or d.deletions else gs.group.effective_replicas
    return replace(
        d,
        deletions=(*d.deletions, *extra),
        target=max(floor, base - len(extra)),
        reasons=(*d.reasons, *(x.reason for x in extra)),
    )


def _replaced_as_recorded(d: GroupDecision, keys: tuple[str, ...], floor: int) -> GroupDecision:
    """A recorded slice that turned broken is finished as the scale-down it was (replicas go
    down), not replaced (which would have KubeRay create it again)."""
    turned = [x for x in d.deletions if x.kind is DeleteKind.REPLACE and x.slice_key in keys]
    if not turned:
        return d
    finished = tuple(
        replace(
            x, kind=DeleteKind.IDLE, reason=ScaleDown(ScaleDownKind.RECORDED_DRAIN, x.slice_key)
        )
        if x in turned
        else x
        for x in d.deletions
    )
    base = d.target if d.target != d.current or d.deletions else d.current
    return replace(
        d,
        deletions=finished,
        target=max(floor, base - len(turned)),
        reasons=(
            *d.reasons,
            *(ScaleDown(ScaleDownKind.RECORDED_DRAIN, x.slice_key) for x in turned),
        ),
    )


def _idle_or_gone(sl: Slice, ev: Evidence | None) -> bool:
    """Every host's Ray node is idle, or it has none and needs no drain (the gate's (b)/(c)):
    a record never finishes a deletion over running work nor over a node merely not seen."""
    for host in sl.hosts:
        node = sl.nodes.get(host.pod_name)
        if node is not None:
            if not node.idle:
                return False
        elif ev is None or not gone_from_ray(host, ev):
            return False
    return True


@dataclass(frozen=True)
class Surplus:
    """What leaves a group that runs more slices than maxReplicas (see `surplus_removals`)."""

    deletions: tuple[SliceDeletion, ...] = ()
    preempt: tuple[SliceDeletion, ...] = ()  # drain now, delete later
    preempting: Mapping[str, datetime] = field(default_factory=dict)  # slice key → deadline
    still_draining: tuple[ScaleDown, ...] = ()  # preempted, not done yet
    waiting: tuple[Keep, ...] = ()  # hosts absent from Ray, not long enough
    # Slices the group runs (when not above maxReplicas: an upper bound, never above it).
    running: int = 0

    @property
    def reasons(self) -> tuple[Reason, ...]:
        """Why, in the order the stage says it: removals, drains, drains going on, waits."""
        removed = (x.reason for x in (*self.deletions, *self.preempt))
        return (*removed, *self.still_draining, *self.waiting)


@dataclass
class _Tally:
    """The surplus being chosen, slice by slice: working notes private to `surplus_removals`."""

    running: int
    deletions: list[SliceDeletion] = field(default_factory=list)
    preempt: list[SliceDeletion] = field(default_factory=list)
    preempting: dict[str, datetime] = field(default_factory=dict)
    still_draining: list[ScaleDown] = field(default_factory=list)
    waiting: list[Keep] = field(default_factory=list)

    @property
    def leaving(self) -> int:
        return len(self.deletions) + len(self.preempt) + len(self.still_draining)

    def result(self) -> Surplus:
        return Surplus(
            tuple(self.deletions),
            tuple(self.preempt),
            MappingProxyType(self.preempting),
            tuple(self.still_draining),
            tuple(self.waiting),
            self.running,
        )


def surplus_removals(
    slices: GroupSlices,
    preempting: Mapping[str, datetime],
    deadline_s: float,
    now: datetime,
    ev: Evidence | None = None,
    *,
    wall_shift: timedelta = timedelta(0),
) -> Surplus:
    """Whole slices out of a group above maxReplicas (a user lowered it, or set it to 0).

    `now` is the monotonic clock (`tick_of`): preemption deadlines run on it; the deadline a
    reason shows is on the wall clock (`now + wall_shift`).

    KubeRay with autoscaling on never deletes surplus pods itself, so we name them. The rule,
    in order, until the group is back at maxReplicas:

    1. slices with no work: every host idle in Ray or gone from it (`gone_from_ray`: DEAD,
       absent for the whole liveness grace, or never had a node and not Running), longest idle
       first (no idle timeout: they are over the limit). A host merely absent from this reply
       (a partial reply, a GCS restart) is not "no work": its slice waits (Keep(ABSENT));
    2. busy slices already drained for preemption, once every host is drained (drained again
       for idle termination, so the gate's (a) holds) or their deadline has passed (its (d));
    3. other busy slices, least used first (Ray's order): drained with reason preemption and
       a deadline so Ray moves their work; they are deleted by a later plan (step 2).

    Slices being deleted already (terminating) are not counted; pods without a replica label
    in a multi-host group cannot be told apart and are never chosen. The choice is tallied in
    working notes private to this call; the result is frozen (its `reasons` say why).
    """
    group = slices.group
    at_most = len(slices.slices) - len(slices.by_state(SliceState.TERMINATING))
    if at_most <= group.max_replicas:  # not above: no need to look at each slice
        return Surplus(running=at_most)
    live = [
        s for s in slices.slices if s.state is not SliceState.TERMINATING and _identified(s, group)
    ]
    out = _Tally(running=len(live))
    surplus = len(live) - group.max_replicas
    if surplus <= 0:
        return out.result()
    for sl in _surplus_order(live, preempting, now, ev):
        if out.leaving >= surplus:
            break
        _remove_one(sl, group.max_replicas, preempting, deadline_s, now, out, ev, wall_shift)
    return out.result()


def _remove_one(
    sl: Slice,
    limit: int,
    preempting: Mapping[str, datetime],
    deadline_s: float,
    now: datetime,
    out: _Tally,
    ev: Evidence | None = None,
    wall_shift: timedelta = timedelta(0),
) -> None:
    def why(kind: ScaleDownKind, deadline: datetime | None = None) -> ScaleDown:
        on_wall = deadline + wall_shift if deadline is not None else None
        return ScaleDown(
            kind, sl.key, len(sl.hosts), running=out.running, limit=limit, deadline=on_wall
        )

    deadline = preempting.get(sl.key)
    if deadline is not None and deadline <= now:
        # Drained for preemption and its time is up (the gate's (d)): no second drain.
        gone = deletion(sl, DeleteKind.SURPLUS, why(ScaleDownKind.PREEMPTED, deadline))
        out.deletions.append(replace(gone, node_ids=()))
    elif _no_work(sl, ev):
        kind = DeleteKind.IDLE if sl.idle_since_ms() is not None else DeleteKind.SURPLUS
        out.deletions.append(deletion(sl, kind, why(ScaleDownKind.ABOVE_MAX)))
    elif deadline is not None and _drained(sl, ev):
        # Drained for preemption, nothing left running: drained again (idle termination,
        # accepted for a node with no work) and deleted in the same patch.
        out.deletions.append(
            deletion(sl, DeleteKind.SURPLUS, why(ScaleDownKind.PREEMPTED, deadline))
        )
    elif any(not _idle_or_none(sl, h.pod_name, ev) for h in sl.hosts if h.pod_name not in sl.nodes):
        # Hosts absent from this reply, not yet for the grace: they cannot be drained, and no
        # preemption deadline is started for work Ray was never told to move.
        detail = "Ray nodes absent from the latest replies, not yet for the whole grace"
        out.waiting.append(Keep(KeepKind.ABSENT_FROM_RAY, slice=sl.key, detail=detail))
    else:
        deadline = deadline or now + timedelta(seconds=deadline_s)
        out.preempting[sl.key] = deadline
        reason = why(ScaleDownKind.PREEMPT, deadline)
        if sl.key not in preempting:
            out.preempt.append(deletion(sl, DeleteKind.PREEMPT, reason))
        else:
            out.still_draining.append(reason)


def _surplus_order(
    live: list[Slice], preempting: Mapping[str, datetime], now: datetime, ev: Evidence | None
) -> list[Slice]:
    def key(sl: Slice) -> tuple[int, float, str]:
        if not sl.nodes and _no_work(sl, ev):
            return (0, 0.0, sl.key)  # nothing joined Ray, none due: no work can be on it
        if sl.nodes and _no_work(sl, ev):  # longest idle first
            latest = max(_since_or_latest(n) for n in sl.nodes.values())
            return (1, float(latest), sl.key)  # the earliest idle-since: the longest idle
        if sl.key in preempting:
            return (2, 0.0, sl.key)
        return (3, _utilisation(sl), sl.key)  # least used first, as Ray's scheduler orders

    def ordered(sl: Slice) -> tuple[int, bool, float, str]:
        # A do-not-disrupt slice goes last of its kind: after every slice of its kind
        # without the annotation, yet an idle one before any busy one (it stops no work).
        kind, rank, name = key(sl)
        return (kind, sl.do_not_disrupt is not None, rank, name)

    return sorted(live, key=ordered)


def _utilisation(sl: Slice) -> float:
    """Mean share in use over every resource of every host (Ray's termination order)."""
    shares = [
        (total - node.available.get(resource, 0.0)) / total
        for node in sl.nodes.values()
        for resource, total in node.total.items()
        if total > 0
    ]
    return sum(shares) / len(shares) if shares else 0.0


def _no_work(sl: Slice, ev: Evidence | None) -> bool:
    """Every host is idle in Ray, or has no Ray node and needs none drained (`gone_from_ray`).
    "No Ray node in this reply" alone is not "no work": a reply may be partial."""
    return all(_idle_or_none(sl, h.pod_name, ev) for h in sl.hosts)


def _idle_or_none(sl: Slice, pod: str, ev: Evidence | None) -> bool:
    node = sl.nodes.get(pod)
    if node is not None:
        return node.status is NodeStatus.IDLE
    host = next(h for h in sl.hosts if h.pod_name == pod)
    return ev is not None and gone_from_ray(host, ev)


def _drained(sl: Slice, ev: Evidence | None) -> bool:
    """Every host's Ray node is draining with nothing running on it any more (or is gone)."""
    return bool(sl.nodes) and all(
        _drained_node(sl.nodes[h.pod_name])
        if h.pod_name in sl.nodes
        else ev is not None and gone_from_ray(h, ev)
        for h in sl.hosts
    )


def _drained_node(n: RayNode) -> bool:
    return n.status is NodeStatus.DRAINING and quiet(n)


def _identified(sl: Slice, group: WorkerGroup) -> bool:
    if not group.is_multi_host or not sl.hosts:
        return True
    labels = sl.hosts[0].labels
    return LABEL_REPLICA_NAME in labels or LABEL_LEGACY_REPLICA in labels


def _since_or_latest(node: RayNode) -> int:
    """A node's idle-since; one not idle counts as idle from the latest moment (never idle)."""
    return node.idle_since_ms if node.idle and node.idle_since_ms is not None else 1 << 62
