"""Above maxReplicas: whole surplus slices leave, idle first, busy ones drained for
preemption and deleted by a later plan (`surplus_removals`). Pure, one frozen result."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from kuberay_scaler.core.model.cluster import WorkerGroup
from kuberay_scaler.core.model.labels import LABEL_LEGACY_REPLICA, LABEL_REPLICA_NAME
from kuberay_scaler.core.model.plan import At, DeleteKind, SliceDeletion
from kuberay_scaler.core.model.ray import NodeStatus, RayNode
from kuberay_scaler.core.model.reasons import Keep, KeepKind, Reason, ScaleDown, ScaleDownKind
from kuberay_scaler.core.model.slices import GroupSlices, Slice, SliceState
from kuberay_scaler.core.planner.gate import Evidence, gone_from_ray, quiet
from kuberay_scaler.core.planner.scale_down import deletion


@dataclass(frozen=True)
class Surplus:
    """What leaves a group that runs more slices than maxReplicas (see `surplus_removals`)."""

    deletions: tuple[SliceDeletion, ...] = ()
    preempt: tuple[SliceDeletion, ...] = ()  # drain now, delete later
    preempting: Mapping[str, float] = field(default_factory=dict)  # slice key → deadline
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
    preempting: dict[str, float] = field(default_factory=dict)
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
    preempting: Mapping[str, float],
    deadline_s: float,
    at: At,
    ev: Evidence | None = None,
) -> Surplus:
    """Whole slices out of a group above maxReplicas (a user lowered it, or set it to 0).

    Preemption deadlines run on the monotonic clock (`at.mono_s`, seconds); the deadline a
    reason shows is on the wall clock (`at.shown`).

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
    for sl in _surplus_order(live, preempting, ev):
        if out.leaving >= surplus:
            break
        _remove_one(sl, group.max_replicas, preempting, deadline_s, at, out, ev)
    return out.result()


def _remove_one(
    sl: Slice,
    limit: int,
    preempting: Mapping[str, float],
    deadline_s: float,
    at: At,
    out: _Tally,
    ev: Evidence | None = None,
) -> None:
    def why(kind: ScaleDownKind, deadline: float | None = None) -> ScaleDown:
        on_wall = at.shown(deadline) if deadline is not None else None
        return ScaleDown(
            kind, sl.key, len(sl.hosts), running=out.running, limit=limit, deadline=on_wall
        )

    deadline = preempting.get(sl.key)
    if deadline is not None and deadline <= at.mono_s:
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
        deadline = at.mono_s + deadline_s if deadline is None else deadline
        out.preempting[sl.key] = deadline
        reason = why(ScaleDownKind.PREEMPT, deadline)
        if sl.key not in preempting:
            out.preempt.append(deletion(sl, DeleteKind.PREEMPT, reason))
        else:
            out.still_draining.append(reason)


def _surplus_order(
    live: list[Slice], preempting: Mapping[str, float], ev: Evidence | None
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
