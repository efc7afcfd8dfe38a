"""The deletion gate: the one check every deletion passes on its way to a patch. Pure.

Idle scale-down, surplus above maxReplicas, broken-slice replacement, restart adoption (a
recorded drain finished), preemption, a partly drained slice: whatever path named a slice, its
pods reach `workersToDelete` only through `gate()`. A pod may be named only if each of its Ray
nodes (every GCS entry with its instance id, not just one) is

  (a) drain-accepted in this execution, or
  (b) DEAD, or absent from fresh GCS replies continuously for the liveness grace on the daemon's
      own clock (`HostClock.missing_s`, which restarts on a new GCS, a blind spell or a daemon
      restart, and counts from the last reply that showed the node in any state), or
  (c) the pod never had a Ray node (as far as this daemon saw) and is not Running, or
  (d) its slice's preemption deadline has passed.

The evidence is the last read before the write: after the drains answered, the shell
reads Ray again and takes the pod cache's uids (`Evidence.after`); a pod whose live Ray nodes in
that read are not among the ones drained (a raylet replaced meanwhile: a new node id on the same
pod) or whose uid changed since the plan (the pod recreated under its name) is refused, and so is
every pod needing Ray's word when that read failed. Only (d) is judged without it.

A slice with one pod that fails is dropped whole (a partial deletion is worse than none) with
a typed `Keep(GATE_...)` reason; the shell counts it (`kuberay_scaler_deletions_blocked_total`)
and logs it at error: the planner paths use `gone_from_ray` themselves, so a block means one of
them disagreed. The gate is the last line, not the rule book.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from types import MappingProxyType

from kuberay_scaler.core.liveness import HostClock
from kuberay_scaler.core.model.hosts import Host, HostPhase
from kuberay_scaler.core.model.plan import DeleteKind, Plan, SliceDeletion
from kuberay_scaler.core.model.ray import NodeStatus, RayNode, RayState
from kuberay_scaler.core.model.reasons import Keep, KeepKind, Reason, ScaleDown

SliceRef = tuple[str, str]  # (group, slice key)


def _no_deadlines() -> Mapping[str, float]:
    return MappingProxyType({})


@dataclass(frozen=True)
class Evidence:
    """What the gate judges pods by: the pods, every GCS entry per pod, the daemon's clock."""

    hosts: Mapping[str, Host]  # pod name → host
    entries: Mapping[str, tuple[RayNode, ...]]  # pod name → every GCS entry for it, any status
    ray_known: bool  # a fresh GCS reply was planned from
    clock: HostClock
    grace_s: float  # the liveness grace (KUBERAY_SCALER_MISSING_NODE_GRACE_S)
    # Preemption deadlines, slice key → monotonic seconds (Memory.preempting).
    deadlines: Mapping[str, float] = field(default_factory=_no_deadlines)
    # The pod cache's uids as of the last read (pod name → uid); None: not read (the plan as
    # `plan` shows it, or before the drains). A pod whose uid differs from the plan's is new.
    uids_now: Mapping[str, str] | None = None
    last_read_failed: bool = False  # the read after the drains failed: only (d) may go

    def with_fresh(self, fresh: RayState | None) -> Evidence:
        """Also judge by a fresher read: a node alive in either view must be drained or dead."""
        if fresh is None:
            return self
        merged: dict[str, dict[str, RayNode]] = {
            pod: {n.node_id: n for n in nodes} for pod, nodes in self.entries.items()
        }
        for pod, nodes in fresh.entries_by_instance().items():
            for n in nodes:
                seen = merged.setdefault(pod, {}).get(n.node_id)
                if seen is None or seen.status is NodeStatus.DEAD or n.alive:
                    merged[pod][n.node_id] = n
        entries = {pod: tuple(by_id.values()) for pod, by_id in merged.items()}
        return replace(self, entries=MappingProxyType(entries))

    def after(self, last: RayState | None, uids: Mapping[str, str]) -> Evidence:
        """Judged by the last read, made after every drain answered: Ray's state then (None: it
        failed) and the pod cache's uids then."""
        newer = replace(self, uids_now=MappingProxyType(dict(uids)))
        return replace(newer, last_read_failed=True) if last is None else newer.with_fresh(last)

    def alive_node_ids(self, pods: Iterable[str]) -> tuple[str, ...]:
        """Every live Ray node of these pods: what a drain must cover (a pod may have two)."""
        return tuple(n.node_id for p in pods for n in self.entries.get(p, ()) if n.alive)


def evidence_for(
    hosts: Iterable[Host],
    ray: RayState | None,
    clock: HostClock | None,
    grace_s: float,
    now: datetime,
    deadlines: Mapping[str, float] | None = None,
) -> Evidence:
    hosts = hosts if isinstance(hosts, tuple) else tuple(hosts)
    if clock is None:  # one-shot use (offline `plan`): the pods' own timestamps
        clock = HostClock.from_timestamps(hosts, ray.node_by_instance() if ray else {}, now)
    return Evidence(
        hosts=_by_name(hosts),
        entries=ray.entries_by_instance() if ray else MappingProxyType({}),
        ray_known=ray is not None,
        clock=clock,
        grace_s=grace_s,
        deadlines=MappingProxyType(dict(deadlines or {})),
    )


# The last hosts tuple and its by-name view: the daemon hands the pod cache's tuple on frame
# after frame while no pod changed (a pure memo: a tuple never changes; one entry, replaced
# whole, so concurrent callers at worst build it again).
_LAST_BY_NAME: tuple[tuple[Host, ...], Mapping[str, Host]] = ((), MappingProxyType({}))


def _by_name(hosts: tuple[Host, ...]) -> Mapping[str, Host]:
    global _LAST_BY_NAME
    last = _LAST_BY_NAME
    if last[0] is hosts:
        return last[1]
    view = MappingProxyType({h.pod_name: h for h in hosts})
    _LAST_BY_NAME = (hosts, view)
    return view


def pod_blocker(
    pod: str, slice_key: str, ev: Evidence, accepted: frozenset[str], mono_s: float
) -> KeepKind | None:
    """Why `pod` may not be named in workersToDelete now (`mono_s`: the monotonic reading
    the preemption deadlines are judged at); None when it may."""
    host = ev.hosts.get(pod)
    if host is not None and _recreated(host, ev):
        return KeepKind.GATE_POD_REPLACED  # not the pod planned for, whatever the deadline
    deadline = ev.deadlines.get(slice_key)
    if deadline is not None and deadline <= mono_s:
        return None  # (d)
    if host is None:
        return KeepKind.GATE_POD_UNKNOWN
    if ev.last_read_failed:
        return KeepKind.GATE_RAY_UNKNOWN
    alive = [n for n in ev.entries.get(pod, ()) if n.alive]
    if alive:
        return None if all(n.node_id in accepted for n in alive) else KeepKind.GATE_NOT_DRAINED
    if gone_from_ray(host, ev):
        return None  # (b) or (c)
    return KeepKind.GATE_ABSENT if ev.ray_known else KeepKind.GATE_RAY_UNKNOWN


def _recreated(host: Host, ev: Evidence) -> bool:
    """The pod cache now holds another pod of this name than the plan saw (a pod gone from the
    cache is not: naming it deletes nothing)."""
    if ev.uids_now is None or not host.uid:
        return False
    now_uid = ev.uids_now.get(host.pod_name)
    return bool(now_uid) and now_uid != host.uid


def gone_from_ray(host: Host, ev: Evidence) -> bool:
    """A pod with no live Ray node that needs no drain: (b) DEAD or long absent, (c) never
    had a node and not Running. The planner paths ask this too, so they agree with the gate."""
    entries = ev.entries.get(host.pod_name, ())
    if any(n.alive for n in entries):
        return False
    if not ev.ray_known:
        return host.phase is not HostPhase.RUNNING and host.pod_name not in ev.clock.seen
    if entries:  # every entry DEAD
        return True
    missing = ev.clock.missing_s.get(host.pod_name)
    if missing is not None and missing >= ev.grace_s:
        return True
    return host.phase is not HostPhase.RUNNING and host.pod_name not in ev.clock.seen


def quiet(n: RayNode) -> bool:
    """No work on the node: IDLE, or DRAINING with every resource free again (a host drained
    for preemption whose work has moved). An idle-termination drain is accepted for it."""
    if n.status is NodeStatus.IDLE:
        return True
    return n.status is NodeStatus.DRAINING and all(
        n.available.get(k, 0.0) >= v for k, v in n.total.items() if not k.startswith("node:")
    )


@dataclass(frozen=True)
class Blocked:
    """A deletion the gate dropped: which planner path made it and the first pod that failed."""

    group: str
    slice_key: str
    pod: str
    kind: KeepKind
    path: str  # metrics label: idle, above_max, preempted, recorded_drain, replace, ...


def deletion_path(x: SliceDeletion) -> str:
    if isinstance(x.reason, ScaleDown):
        return x.reason.kind.value
    return "replace"


def gate(
    plan: Plan, ev: Evidence, accepted: frozenset[str], mono_s: float
) -> tuple[Plan, tuple[Blocked, ...]]:
    """`plan` without the deletions the gate refuses, and what it refused (at the monotonic
    reading `mono_s`)."""
    blocked: list[Blocked] = []
    dropped: dict[SliceRef, Reason] = {}
    for d in plan.groups:
        for x in d.deletions:
            for pod in x.pods:
                kind = pod_blocker(pod, x.slice_key, ev, accepted, mono_s)
                if kind is not None:
                    blocked.append(Blocked(d.group, x.slice_key, pod, kind, deletion_path(x)))
                    dropped[(d.group, x.slice_key)] = Keep(kind, slice=x.slice_key, detail=pod)
                    break
    return without(plan, dropped), tuple(blocked)


# Deletions that lowered the target (a kept slice gives its replica back); a replaced slice
# kept the target.
_TARGET_LOWERED = (DeleteKind.IDLE, DeleteKind.SURPLUS, DeleteKind.CANCEL)


def without(plan: Plan, dropped: Mapping[SliceRef, Reason]) -> Plan:
    """`plan` without some slice deletions, each with the reason it was kept; targets put back
    (never above maxReplicas: KubeRay clamps to it and deletes nothing unnamed)."""
    if not dropped:
        return plan
    groups = []
    for d in plan.groups:
        gone = [x for x in d.deletions if (d.group, x.slice_key) in dropped]
        if not gone:
            groups.append(d)
            continue
        back = sum(1 for x in gone if x.kind in _TARGET_LOWERED)
        gs = plan.slice_map.groups.get(d.group) if plan.slice_map else None
        limit = gs.group.max_replicas if gs else d.target + back
        groups.append(
            replace(
                d,
                deletions=tuple(x for x in d.deletions if x not in gone),
                target=min(d.target + back, limit),
                reasons=(*d.reasons, *(dropped[(d.group, x.slice_key)] for x in gone)),
            )
        )
    return replace(plan, groups=tuple(groups))
