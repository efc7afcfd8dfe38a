"""Scale-down: idle slices leave (longest idle first, never below minReplicas), and drains a
previous run recorded are finished."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from kuberay_scaler.model.cluster import DEFAULT_IDLE_TIMEOUT_S, ClusterSpec, WorkerGroup
from kuberay_scaler.model.labels import LABEL_LEGACY_REPLICA, LABEL_REPLICA_NAME
from kuberay_scaler.model.plan import DeleteKind, GroupDecision, Plan, SliceDeletion
from kuberay_scaler.model.ray import NodeStatus
from kuberay_scaler.model.reasons import (
    Keep,
    KeepKind,
    Reason,
    Replace,
    ScaleDown,
    ScaleDownKind,
)
from kuberay_scaler.model.slices import GroupSlices, Slice, SliceMap, SliceState

SliceRef = tuple[str | None, str | None]  # (group, slice key) of a bin demand uses


def idle_deletions(
    slices: GroupSlices,
    keep_at_least: int,
    needed: set[SliceRef],
    timeout_s: float,
    reasons: list[Reason],
) -> list[SliceDeletion]:
    """Idle slices past `timeout_s` that demand does not use, while more than `keep_at_least`
    replicas (after this plan's additions) stay."""
    group = slices.group
    idle: list[tuple[int, Slice]] = []
    for sl in slices.by_state(SliceState.COMPLETE):
        idle_ms = sl.idle_ms()
        if idle_ms is None or idle_ms < timeout_s * 1000 or (group.name, sl.key) in needed:
            continue
        idle.append((idle_ms, sl))
    idle.sort(key=lambda pair: (-pair[0], pair[1].key))  # longest idle first
    chosen = idle[: max(0, keep_at_least)]
    if len(chosen) < len(idle):
        reasons.append(
            Keep(KeepKind.MIN_REPLICAS, len(idle) - len(chosen), min_replicas=group.min_replicas)
        )
    out = []
    for idle_ms, sl in chosen:
        why = ScaleDown(ScaleDownKind.IDLE, sl.key, len(sl.hosts), idle_ms / 1000, timeout_s)
        reasons.append(why)
        out.append(deletion(sl, DeleteKind.IDLE, why))
    return out


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


def finish_recorded_drains(result: Plan, draining: Mapping[str, tuple[str, ...]]) -> Plan:
    """Add a deletion for every recorded slice that still exists and is not yet being deleted."""
    if not draining or result.slice_map is None or result.held:
        return result
    groups = tuple(_finish(d, result.slice_map, draining.get(d.group, ())) for d in result.groups)
    return replace(result, groups=groups)


def _finish(d: GroupDecision, slice_map: SliceMap, keys: tuple[str, ...]) -> GroupDecision:
    gs = slice_map.groups.get(d.group)
    if not keys or gs is None or d.held:
        return d
    planned = {x.slice_key for x in d.deletions}
    extra = [
        deletion(sl, DeleteKind.IDLE, ScaleDown(ScaleDownKind.RECORDED_DRAIN, sl.key))
        for sl in gs.slices
        if sl.key in keys
        and sl.key not in planned
        and sl.state is not SliceState.TERMINATING
        and not _broken_but_busy(sl)
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


def _broken_but_busy(sl: Slice) -> bool:
    # A recorded replacement whose hosts turned busy is kept, as the replace path keeps it
    # (planner/replace.py): a record never finishes a deletion over running work.
    return sl.state is SliceState.BROKEN and bool(sl.working_hosts)


@dataclass
class Surplus:
    """What leaves a group that runs more slices than maxReplicas (see `surplus_removals`)."""

    deletions: list[SliceDeletion] = field(default_factory=list)
    preempt: list[SliceDeletion] = field(default_factory=list)  # drain now, delete later
    preempting: dict[str, datetime] = field(default_factory=dict)  # slice key → deadline
    still_draining: list[ScaleDown] = field(default_factory=list)  # preempted, not done yet
    running: int = 0  # slices the group runs

    @property
    def leaving(self) -> int:
        return len(self.deletions) + len(self.preempt) + len(self.still_draining)


def surplus_removals(
    slices: GroupSlices,
    preempting: Mapping[str, datetime],
    deadline_s: float,
    now: datetime,
    reasons: list[Reason],
) -> Surplus:
    """Whole slices out of a group above maxReplicas (a user lowered it, or set it to 0).

    KubeRay with autoscaling on never deletes surplus pods itself, so we name them. The rule,
    in order, until the group is back at maxReplicas:

    1. slices with no work: no Ray node joined (pending, partial, broken), then complete slices
       whose hosts are all idle, longest idle first (no idle timeout: they are over the limit);
    2. busy slices already drained for preemption, once every host is drained (no work left,
       or gone from Ray) or their deadline has passed;
    3. other busy slices, least used first (Ray's order): drained with reason preemption and
       a deadline so Ray moves their work; they are deleted by a later plan (step 2).

    Slices being deleted already (terminating) are not counted; pods without a replica label
    in a multi-host group cannot be told apart and are never chosen.
    """
    group = slices.group
    live = [
        s for s in slices.slices if s.state is not SliceState.TERMINATING and _identified(s, group)
    ]
    out = Surplus(running=len(live))
    surplus = len(live) - group.max_replicas
    if surplus <= 0:
        return out
    for sl in _surplus_order(live, preempting, now):
        if out.leaving >= surplus:
            break
        _remove_one(sl, group.max_replicas, preempting, deadline_s, now, out)
    reasons.extend(x.reason for x in (*out.deletions, *out.preempt))
    reasons.extend(out.still_draining)
    return out


def _remove_one(
    sl: Slice,
    limit: int,
    preempting: Mapping[str, datetime],
    deadline_s: float,
    now: datetime,
    out: Surplus,
) -> None:
    def why(kind: ScaleDownKind, deadline: datetime | None = None) -> ScaleDown:
        return ScaleDown(
            kind, sl.key, len(sl.hosts), running=out.running, limit=limit, deadline=deadline
        )

    deadline = preempting.get(sl.key)
    if _no_work(sl):
        kind = DeleteKind.IDLE if sl.idle_ms() is not None else DeleteKind.SURPLUS
        out.deletions.append(deletion(sl, kind, why(ScaleDownKind.ABOVE_MAX)))
    elif deadline is not None and (deadline <= now or _drained(sl)):
        # Already drained for preemption: no second drain, straight to deletion.
        gone = deletion(sl, DeleteKind.SURPLUS, why(ScaleDownKind.PREEMPTED, deadline))
        out.deletions.append(replace(gone, node_ids=()))
    else:
        deadline = deadline or now + timedelta(seconds=deadline_s)
        out.preempting[sl.key] = deadline
        reason = why(ScaleDownKind.PREEMPT, deadline)
        if sl.key not in preempting:
            out.preempt.append(deletion(sl, DeleteKind.PREEMPT, reason))
        else:
            out.still_draining.append(reason)


def _surplus_order(
    live: list[Slice], preempting: Mapping[str, datetime], now: datetime
) -> list[Slice]:
    def key(sl: Slice) -> tuple[int, float, str]:
        if not sl.nodes:
            return (0, 0.0, sl.key)  # nothing joined Ray: no work can be on it
        if _no_work(sl):  # longest idle first
            return (1, -float(min(n.idle_ms for n in sl.nodes.values())), sl.key)
        if sl.key in preempting:
            return (2, 0.0, sl.key)
        return (3, _utilisation(sl), sl.key)  # least used first, as Ray's scheduler orders

    return sorted(live, key=key)


def _utilisation(sl: Slice) -> float:
    """Mean share in use over every resource of every host (Ray's termination order)."""
    shares = [
        (total - node.available.get(resource, 0.0)) / total
        for node in sl.nodes.values()
        for resource, total in node.total.items()
        if total > 0
    ]
    return sum(shares) / len(shares) if shares else 0.0


def _no_work(sl: Slice) -> bool:
    """Every host that joined Ray is idle (true for a slice none of whose hosts joined)."""
    return all(n.status is NodeStatus.IDLE for n in sl.nodes.values())


def _drained(sl: Slice) -> bool:
    """Every host's Ray node is draining with nothing running on it any more."""
    return all(
        n.status is NodeStatus.DRAINING and _all_free(n.total, n.available)
        for n in sl.nodes.values()
    )


def _all_free(total: Mapping[str, float], available: Mapping[str, float]) -> bool:
    return all(available.get(k, 0.0) >= v for k, v in total.items() if not k.startswith("node:"))


def _identified(sl: Slice, group: WorkerGroup) -> bool:
    if not group.is_multi_host or not sl.hosts:
        return True
    labels = sl.hosts[0].labels
    return LABEL_REPLICA_NAME in labels or LABEL_LEGACY_REPLICA in labels
