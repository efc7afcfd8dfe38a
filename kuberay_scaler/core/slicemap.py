"""Build the slice map from the parsed cluster, its pods and (optionally) Ray's nodes. Pure."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from types import MappingProxyType

from kuberay_scaler.core.defaults import MAX_PROVISION_TIME_S, MISSING_NODE_GRACE_S
from kuberay_scaler.core.liveness import HostClock
from kuberay_scaler.core.model.cluster import ClusterSpec, Problem, WorkerGroup, frozen_map
from kuberay_scaler.core.model.hosts import Host, HostPhase
from kuberay_scaler.core.model.labels import (
    LABEL_LEGACY_REPLICA,
    LABEL_REPLICA_NAME,
    TPU_SLICE_LABEL,
    TPU_WORKER_LABEL,
)
from kuberay_scaler.core.model.ray import RayNode, RayState
from kuberay_scaler.core.model.reasons import SliceFault
from kuberay_scaler.core.model.reasons import SliceFault as F
from kuberay_scaler.core.model.slices import GroupSlices, Slice, SliceMap, SliceState


@dataclass(frozen=True)
class SliceTimeouts:
    """How long a slice may take to come up, and how long a joined pod may lack its Ray node."""

    max_provision_s: float = MAX_PROVISION_TIME_S
    missing_node_grace_s: float = MISSING_NODE_GRACE_S


class SliceMemo:
    """Complete slices of the last frame, by the values that judged them (pure memoization).

    Owned by the caller that plans frame after frame (core/planner/memo.py FrameMemo, held by
    the daemon's observer); keyed by values and by the identity of frozen values the caller
    hands on unchanged, so no decision depends on it.

    A slice complete with every host joined to Ray is judged so from its group, its hosts and
    their Ray nodes alone (`_whole`: no timers, no `now`; one complete while Ray's view is
    unknown is not kept). When all of those are the very objects of last frame (frozen values;
    the pod cache keeps a Host per unchanged pod, the poller a RayNode per unchanged node) and
    the group is equal, the slice and its label problems are last frame's, value for value.
    Anything else is judged afresh. Holding last frame's entries only keeps it bounded.

    A whole group is taken at once when every one of its slices was judged so (complete, every
    host joined, each with a creation time: nothing read the timers or `now`) and its group,
    its hosts (in order) and their Ray nodes are equal to last frame's (tuple equality: C-speed
    identity for the unchanged objects): its slices, in order, and its problems are then last
    frame's, so a frame costs one comparison per host for such a group instead of a judgement.
    """

    def __init__(self) -> None:
        self._groups: dict[str, WorkerGroup] = {}
        self._slices: dict[tuple[str, str], _Judged] = {}
        self._next: dict[tuple[str, str], _Judged] = {}
        self._whole: dict[str, _WholeGroup] = {}
        self._whole_next: dict[str, _WholeGroup] = {}
        self.hits = 0  # slices taken from the memo (tests, the benchmark)
        self.group_hits = 0  # groups taken whole

    def whole_group(
        self, group: WorkerGroup, hosts: list[Host], joined: tuple[RayNode | None, ...]
    ) -> _WholeGroup | None:
        found = self._whole.get(group.name)
        if found is None or not (
            (found.group is group or found.group == group)
            and found.joined == joined
            and found.hosts == tuple(hosts)
        ):
            return None
        self._whole_next[group.name] = found
        self._next.update(found.judged)
        self._groups[group.name] = group
        self.hits += len(found.judged)
        self.group_hits += 1
        return found

    def put_whole_group(self, entry: _WholeGroup) -> None:
        self._whole_next[entry.group.name] = entry

    def same_group(self, group: WorkerGroup) -> bool:
        last = self._groups.get(group.name)
        self._groups[group.name] = group
        return last is group or last == group

    def get(
        self, group: str, key: str, hosts: list[Host], joined: tuple[RayNode | None, ...]
    ) -> _Judged | None:
        found = self._slices.get((group, key))
        if found is None or not _same(found.hosts, hosts) or not _same(found.joined, joined):
            return None
        self.hits += 1
        self._next[(group, key)] = found
        return found

    def put(self, group: str, judged: _Judged) -> None:
        self._next[(group, judged.slice.key)] = judged

    def end_frame(self) -> None:
        self._slices, self._next = self._next, {}
        self._whole, self._whole_next = self._whole_next, {}

    def clear(self) -> None:
        self._groups.clear()
        self._slices.clear()
        self._next.clear()
        self._whole.clear()
        self._whole_next.clear()


@dataclass(frozen=True)
class _Judged:
    slice: Slice
    hosts: tuple[Host, ...]
    joined: tuple[RayNode | None, ...]
    tpu_names: frozenset[str]  # the slice's TPU slice names (checked across slices)
    problems: tuple[Problem, ...]  # its own label problems


@dataclass(frozen=True)
class _WholeGroup:
    """A group all of whose slices were judged from its hosts and Ray nodes alone."""

    group: WorkerGroup
    hosts: tuple[Host, ...]  # the group's hosts as the frame listed them
    joined: tuple[RayNode | None, ...]  # each one's live Ray node
    slices: GroupSlices
    problems: tuple[Problem, ...]  # its identity and label problems
    judged: Mapping[tuple[str, str], _Judged]  # its slices, for the per-slice memo


def _same(a: tuple[object, ...], b: Sequence[object]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def build_slice_map(
    spec: ClusterSpec,
    hosts: Iterable[Host],
    ray: RayState | None,
    now: datetime,
    timeouts: SliceTimeouts = SliceTimeouts(),
    clock: HostClock | None = None,
    memo: SliceMemo | None = None,
) -> SliceMap:
    """Group hosts into slices and judge each one. `ray` None means Ray's view is unknown.

    Durations (provisioning age, how long a Ray node has been missing) come from `clock`, the
    daemon's own monotonic memory; without one (one-shot use) from the pods' timestamps.
    `memo`: last frame's complete slices (see SliceMemo); the result is the same without it.
    """
    hosts = list(hosts)
    nodes = ray.node_by_instance() if ray else {}
    if clock is None:
        clock = HostClock.from_timestamps(hosts, nodes, now)
    by_group: dict[str, list[Host]] = defaultdict(list)
    head: list[Host] = []
    orphans: list[Host] = []
    problems: list[Problem] = []
    for host in hosts:
        if host.is_head:
            head.append(host)
        elif spec.group(host.group) is None:
            orphans.append(host)
        else:
            by_group[host.group].append(host)
    for host in orphans:
        if host.group not in spec.skipped_groups:
            problems.append(Problem(f"pod {host.pod_name} is in no worker group of the spec"))
    memo = memo if memo is not None else SliceMemo()
    groups: dict[str, GroupSlices] = {}
    for g in spec.groups:
        members = by_group.get(g.name, [])
        joined = tuple([nodes.get(h.pod_name) for h in members]) if ray is not None else None
        whole = memo.whole_group(g, members, joined) if joined is not None else None
        if whole is not None:
            groups[g.name] = whole.slices
            problems.extend(whole.problems)
            continue
        gs, found = _group_slices(g, members, nodes, ray is not None, now, timeouts, clock, memo)
        groups[g.name] = gs
        own = [*_identity_problems(gs), *_label_problems(gs, found)]
        problems.extend(own)
        # Every slice whole, each with a creation time (their order is then not `now`'s).
        if (
            joined is not None
            and len(found) == len(gs.slices)
            and all(s.created_at is not None for s in gs.slices)
        ):
            judged = {(g.name, k): j for k, j in found.items()}
            memo.put_whole_group(_WholeGroup(g, tuple(members), joined, gs, tuple(own), judged))
    memo.end_frame()
    return SliceMap(
        groups=frozen_map(groups),
        head=tuple(head),
        orphans=tuple(orphans),
        problems=tuple(problems),
    )


def _group_slices(
    group: WorkerGroup,
    hosts: list[Host],
    nodes: Mapping[str, RayNode],
    ray_known: bool,
    now: datetime,
    timeouts: SliceTimeouts,
    clock: HostClock,
    memo: SliceMemo,
) -> tuple[GroupSlices, dict[str, _Judged]]:
    """The group's slices, and those that are complete with what judged them (see SliceMemo)."""
    members: dict[str, list[Host]] = defaultdict(list)
    for host in hosts:
        members[host.slice_key].append(host)
    doomed = set(group.workers_to_delete)
    reuse = memo.same_group(group)
    slices: list[Slice] = []
    complete: dict[str, _Judged] = {}
    for key, m in members.items():
        ordered = _in_order(m)
        joined = tuple(nodes.get(h.pod_name) for h in ordered)
        found = memo.get(group.name, key, ordered, joined) if reuse else None
        if found is None:
            sl = _judge(group, key, ordered, nodes, ray_known, doomed, timeouts, clock)
            if _whole_by_ray(group, sl, joined):
                found = _judged(group.name, sl, tuple(ordered), joined)
                memo.put(group.name, found)
        if found is not None:
            complete[key] = found
            sl = found.slice
        slices.append(sl)
    slices.sort(key=lambda s: (s.created_at or now, s.key))
    return GroupSlices(group=group, slices=tuple(slices)), complete


def _whole_by_ray(group: WorkerGroup, sl: Slice, joined: tuple[RayNode | None, ...]) -> bool:
    """Complete with every host joined: judged so from its group, hosts and nodes alone (a
    slice complete while Ray's view is unknown is not: Ray may later show a node missing)."""
    return (
        sl.state is SliceState.COMPLETE
        and not sl.marked_for_deletion
        and len(joined) == group.num_of_hosts
        and all(n is not None for n in joined)
    )


def _judged(
    group: str, sl: Slice, hosts: tuple[Host, ...], joined: tuple[RayNode | None, ...]
) -> _Judged:
    names, problems = _own_label_problems(group, sl)
    return _Judged(sl, hosts, joined, names, problems)


def _in_order(hosts: list[Host]) -> list[Host]:
    return sorted(hosts, key=_host_order) if len(hosts) > 1 else hosts


def _host_order(host: Host) -> tuple[int, str]:
    return (host.host_index if host.host_index is not None else 1 << 30, host.pod_name)


def _judge(
    group: WorkerGroup,
    key: str,
    hosts: list[Host],
    nodes: Mapping[str, RayNode],
    ray_known: bool,
    doomed: set[str],
    timeouts: SliceTimeouts,
    clock: HostClock,
) -> Slice:
    joined = {h.pod_name: nodes[h.pod_name] for h in hosts if h.pod_name in nodes}
    marked = bool(doomed) and any(h.pod_name in doomed for h in hosts)
    created = min((h.created_at for h in hosts if h.created_at), default=None)
    if _whole(group, hosts, joined, marked):
        state, reason, fault = SliceState.COMPLETE, _complete_reason(group.num_of_hosts), None
    else:
        state, reason, fault = _state(group, hosts, joined, ray_known, marked, timeouts, clock)
    queued = state is SliceState.QUEUED
    return Slice(
        key=key,
        group=group.name,
        expected_hosts=group.num_of_hosts,
        hosts=tuple(hosts),
        nodes=MappingProxyType(joined),  # a fresh dict: read-only without another copy
        state=state,
        reason=reason,
        fault=fault,
        created_at=created,
        marked_for_deletion=marked,
        queued_s=max((clock.age_s.get(h.pod_name, 0.0) for h in hosts), default=0.0)
        if queued
        else None,
        gates=gates_of(hosts) if queued else (),
    )


def gates_of(hosts: Sequence[Host]) -> tuple[str, ...]:
    """The scheduling gates holding any host of a slice, each once, in order of appearance."""
    return tuple(dict.fromkeys(g for h in hosts for g in h.gates)) if hosts else ()


KUEUE_GATE_PREFIX = "kueue.x-k8s.io/"


def queued_reason(gates: Sequence[str], have: int, want: int, age_s: float) -> str:
    """ "queued in Kueue (gate kueue.x-k8s.io/elastic-job) for 4 min", and the hosts if short."""
    kueue = any(g.startswith(KUEUE_GATE_PREFIX) for g in gates)
    where = "in Kueue" if kueue else "by the scheduler"
    short = f"; {have} of {want} hosts" if have < want else ""
    return f"queued {where} (gate {', '.join(gates)}) for {_dur(age_s)}{short}"


def _whole(
    group: WorkerGroup, hosts: list[Host], joined: Mapping[str, RayNode], marked: bool
) -> bool:
    """The common case, decided without the timers: every host Running and joined to Ray.

    `_state` reaches COMPLETE for exactly these slices (nothing before its last line can apply
    to them), so most slices of a large cluster skip its work.
    """
    want = group.num_of_hosts
    return (
        not marked
        and len(hosts) == want == len(joined)
        and all(h.phase is HostPhase.RUNNING for h in hosts)
        and (want == 1 or _identified(hosts[0]))
    )


@cache
def _complete_reason(want: int) -> str:
    return f"{want} of {want} hosts up"


def _state(
    group: WorkerGroup,
    hosts: list[Host],
    joined: Mapping[str, RayNode],
    ray_known: bool,
    marked: bool,
    timeouts: SliceTimeouts,
    clock: HostClock,
) -> tuple[SliceState, str, SliceFault | None]:
    want = group.num_of_hosts
    if group.max_provision_s is not None:  # the group's own deadline (its template annotation)
        timeouts = SliceTimeouts(group.max_provision_s, timeouts.missing_node_grace_s)
    terminating = [h for h in hosts if h.phase is HostPhase.TERMINATING]
    if marked or terminating:
        why = "named in workersToDelete" if marked else f"{len(terminating)} host(s) terminating"
        return SliceState.TERMINATING, why, None
    if want > 1 and not _identified(hosts[0]):
        # Without a replica label we cannot tell its siblings: never judge it broken and replace.
        return SliceState.PARTIAL, f"slice unknown: no replica label ({hosts[0].detail})", None
    failed = [h for h in hosts if h.phase is HostPhase.FAILED]
    if failed:
        return SliceState.BROKEN, f"host {_label(failed[0])} {failed[0].detail}", F.HOST_FAILED
    if len(hosts) > want:
        if _built_to_older_spec(hosts, joined, ray_known):
            why = (
                f"built to an older spec ({len(hosts)} hosts, numOfHosts {want} now):"
                " serves until idle, then removed first"
            )
            return SliceState.OUTDATED, why, None
        why = f"{len(hosts)} hosts, more than numOfHosts {want}"
        return SliceState.BROKEN, why, F.TOO_MANY_HOSTS
    age = max((clock.age_s.get(h.pod_name, 0.0) for h in hosts), default=0.0)
    gates = gates_of(hosts)
    if gates:
        # Held by a scheduling gate (Kueue admits the workload, then lifts it): waiting in a
        # queue is not slow provisioning, so no deadline judges it.
        return SliceState.QUEUED, queued_reason(gates, len(hosts), want, age), None
    if len(hosts) < want:
        if age > timeouts.max_provision_s:
            return SliceState.BROKEN, f"{len(hosts)} of {want} hosts", F.HOSTS_MISSING
        return SliceState.PARTIAL, f"{len(hosts)} of {want} hosts", None
    # Ray's view judges only after one full grace of fresh replies (see liveness.py).
    judge_ray = ray_known and clock.settling is None
    missing = _missing_for(hosts, joined, clock) if judge_ray else {}
    late = {p: s for p, s in missing.items() if s > timeouts.missing_node_grace_s}
    if late:
        pod, secs = max(late.items(), key=lambda kv: kv[1])
        return SliceState.BROKEN, f"Ray node of {pod} missing for {_dur(secs)}", F.RAY_NODE_MISSING
    not_running = [h for h in hosts if h.phase is not HostPhase.RUNNING]
    if not_running or (ray_known and len(joined) < want):
        why = (
            f"{want - len(not_running)} of {want} hosts running ({not_running[0].detail})"
            if not_running
            else f"{len(joined)} of {want} hosts joined Ray"
        )
        if age > timeouts.max_provision_s and (not_running or judge_ray):
            return SliceState.BROKEN, f"not up after {_dur(age)}: {why}", F.NOT_UP_IN_TIME
        return SliceState.PENDING, why, None
    return SliceState.COMPLETE, _complete_reason(want), None


def _built_to_older_spec(hosts: list[Host], joined: Mapping[str, RayNode], ray_known: bool) -> bool:
    """More hosts than numOfHosts, each in its own place (host indexes 0..n-1, as KubeRay made
    them for numOfHosts n), all Running and (Ray's view known) in Ray: a whole slice of the spec
    before an edit lowered numOfHosts, not a broken one (duplicate replica labels repeat an
    index; a host down makes it broken as any slice)."""
    indexes = sorted(h.host_index for h in hosts if h.host_index is not None)
    return (
        indexes == list(range(len(hosts)))
        and all(h.phase is HostPhase.RUNNING for h in hosts)
        and (not ray_known or len(joined) == len(hosts))
    )


def _missing_for(
    hosts: list[Host], joined: Mapping[str, RayNode], clock: HostClock
) -> dict[str, float]:
    """Seconds each running host has gone without a live Ray node, by the daemon's clock."""
    return {
        h.pod_name: clock.missing_s[h.pod_name]
        for h in hosts
        if h.phase is HostPhase.RUNNING
        and h.pod_name not in joined
        and h.pod_name in clock.missing_s
    }


def _identified(host: Host) -> bool:
    return LABEL_REPLICA_NAME in host.labels or LABEL_LEGACY_REPLICA in host.labels


def _identity_problems(gs: GroupSlices) -> list[Problem]:
    if not gs.group.is_multi_host:
        return []
    unknown = [h.pod_name for s in gs.slices for h in s.hosts if not _identified(h)]
    if not unknown:
        return []
    return [
        Problem(
            f"{len(unknown)} pod(s) carry neither {LABEL_REPLICA_NAME} nor {LABEL_LEGACY_REPLICA}"
            f" (e.g. {unknown[0]}): their slices cannot be told apart, so they are left alone",
            gs.group.name,
        )
    ]


def _label_problems(gs: GroupSlices, complete: Mapping[str, _Judged]) -> list[Problem]:
    """Cross-check Ray's TPU labels against the slice the pods say they belong to (a complete
    slice's own checks were made when it was judged, see `_judged`)."""
    problems: list[Problem] = []
    seen: dict[str, str] = {}
    group = gs.group.name
    for sl in gs.slices:
        if not sl.nodes:
            continue  # nothing Ray says to check against
        found = complete.get(sl.key)
        names, own = (
            (found.tpu_names, found.problems)
            if found is not None
            else _own_label_problems(group, sl)
        )
        if len(names) > 1:
            problems.append(
                Problem(
                    f"slice {sl.key}: hosts report different TPU slice names {sorted(names)}", group
                )
            )
        for name in names:
            if seen.setdefault(name, sl.key) != sl.key:
                problems.append(
                    Problem(f"TPU slice {name} spans slices {seen[name]} and {sl.key}", group)
                )
        problems.extend(own)
    return problems


def _own_label_problems(group: str, sl: Slice) -> tuple[frozenset[str], tuple[Problem, ...]]:
    """One slice's TPU slice names, and what its own hosts' labels contradict."""
    names = frozenset(
        n.labels[TPU_SLICE_LABEL] for n in sl.nodes.values() if TPU_SLICE_LABEL in n.labels
    )
    problems = _node_type_problems(group, sl)
    if not names and not any(TPU_WORKER_LABEL in n.labels for n in sl.nodes.values()):
        return names, tuple(problems)  # no TPU labels: no worker ids to compare
    for host in sl.hosts:
        node = sl.nodes.get(host.pod_name)
        worker = node.labels.get(TPU_WORKER_LABEL) if node is not None else None
        if worker is not None and host.host_index is not None and worker != str(host.host_index):
            problems.append(
                Problem(
                    f"pod {host.pod_name} is host {host.host_index} "
                    f"but Ray says TPU worker {worker}",
                    group,
                )
            )
    return names, tuple(problems)


def _node_type_problems(group: str, sl: Slice) -> list[Problem]:
    # KubeRay sets RAY_NODE_TYPE_NAME from the pod's group label; a mismatch means a wrong join.
    return [
        Problem(f"pod {pod} is in group {group} but its Ray node has type {n.node_type}", group)
        for pod, n in sl.nodes.items()
        if n.node_type and n.node_type != group
    ]


def _label(host: Host) -> str:
    return str(host.host_index) if host.host_index is not None else host.pod_name


def _dur(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"
