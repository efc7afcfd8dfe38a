"""The slice map: worker group → slices → hosts, each slice with a state and a reason."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from functools import cached_property

from kuberay_scaler.core.model.cluster import Problem, WorkerGroup
from kuberay_scaler.core.model.hosts import Host
from kuberay_scaler.core.model.ray import RayNode
from kuberay_scaler.core.model.reasons import SliceFault


class SliceState(StrEnum):
    COMPLETE = "complete"  # every host Running and joined to Ray
    PENDING = "pending"  # coming up: pods not all Running or not all in Ray yet
    # Held by a scheduling gate (Kueue has not admitted it yet): coming capacity, never broken,
    # never replaced for being slow, cancelled (undrained: it never ran) when demand goes.
    QUEUED = "queued"
    PARTIAL = "partial"  # fewer pods than numOfHosts exist (being created or half deleted)
    BROKEN = "broken"  # will not become useful on its own: replace it
    # Built to an older spec (more hosts than numOfHosts now, each in its place): it keeps
    # serving, is never preempted or replaced for it, and leaves first once idle.
    OUTDATED = "outdated"
    TERMINATING = "terminating"  # being deleted (a pod terminating or named in workersToDelete)


@dataclass(frozen=True)
class Slice:
    """One replica of a worker group: `expected_hosts` pods created and deleted together.

    What is derived from the fields alone (pod names, node ids, idle-since) is computed once
    per object (cached in its `__dict__`, outside the fields: equality ignores it); the slice
    memo hands the same object to frame after frame, so a steady slice never computes it again.
    """

    key: str
    group: str
    expected_hosts: int
    hosts: tuple[Host, ...]  # ordered by host index, then pod name
    nodes: Mapping[str, RayNode]  # pod name → live Ray node, for hosts that joined
    state: SliceState
    reason: str
    fault: SliceFault | None  # why it is broken (BROKEN only)
    created_at: datetime | None
    marked_for_deletion: bool
    # QUEUED: how long its oldest pod has existed (seconds, the daemon's clock), and the gates.
    queued_s: float | None = None
    gates: tuple[str, ...] = ()

    @cached_property
    def pod_names(self) -> tuple[str, ...]:
        return tuple(h.pod_name for h in self.hosts)

    @cached_property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(self.nodes[h.pod_name].node_id for h in self.hosts if h.pod_name in self.nodes)

    @cached_property
    def do_not_disrupt(self) -> str | None:
        """The first host's do-not-disrupt annotation ("key=value"), if any host has one."""
        return next((h.do_not_disrupt for h in self.hosts if h.do_not_disrupt), None)

    @cached_property
    def going(self) -> str | None:
        """ "<pod>: <reason>" of the first host with DisruptionTarget=True (the slice is going)."""
        return next(
            (f"{h.pod_name}: {h.disruption_target}" for h in self.hosts if h.disruption_target),
            None,
        )

    @property
    def working_hosts(self) -> tuple[str, ...]:
        """Pods whose live Ray node is not idle (running work, draining, or of unknown status)."""
        return tuple(
            h.pod_name
            for h in self.hosts
            if h.pod_name in self.nodes and not self.nodes[h.pod_name].idle
        )

    def idle_since_ms(self) -> int | None:
        """Since when every host has been idle (epoch ms): the latest of their idle-since
        times, or None if the slice is not complete or any host is busy/absent."""
        return self._idle_since

    @cached_property
    def _idle_since(self) -> int | None:
        if self.state not in _SERVING:
            return None
        latest: int | None = None
        for host in self.hosts:
            node = self.nodes.get(host.pod_name)
            if node is None or not node.idle or node.idle_since_ms is None:
                return None
            if latest is None or node.idle_since_ms > latest:
                latest = node.idle_since_ms
        return latest

    def idle_ms(self, now_ms: int) -> int | None:
        """How long every host has been idle at `now_ms` (epoch ms): the shortest, or None if
        any host is busy/absent."""
        since = self.idle_since_ms()
        return None if since is None else max(0, now_ms - since)

    @property
    def counts_as_capacity(self) -> bool:
        """Complete, outdated, pending and queued slices will serve work; the others never count."""
        return self.state in (
            SliceState.COMPLETE,
            SliceState.PENDING,
            SliceState.OUTDATED,
            SliceState.QUEUED,
        )


_SERVING = (SliceState.COMPLETE, SliceState.OUTDATED)  # every host up and in Ray
_COMING = (SliceState.PENDING, SliceState.PARTIAL)
_ARRIVING = (*_COMING, SliceState.QUEUED)


@dataclass(frozen=True)
class GroupSlices:
    """A group's slices. The views by state are built once per object (cached, outside the
    fields); the slice memo hands an unchanged group's object on, so a steady group of 10^4
    slices is not walked again for them."""

    group: WorkerGroup
    slices: tuple[Slice, ...]

    def by_state(self, state: SliceState) -> tuple[Slice, ...]:
        return self._by_state.get(state, ())

    @cached_property
    def _by_state(self) -> dict[SliceState, tuple[Slice, ...]]:
        out: dict[SliceState, list[Slice]] = {}
        for s in self.slices:
            out.setdefault(s.state, []).append(s)
        return {state: tuple(members) for state, members in out.items()}

    @cached_property
    def coming_up(self) -> tuple[Slice, ...]:
        """Pending and partial slices, in order: the ones with hosts still to join (queued ones
        are not among them: they wait for a queue, not for provisioning)."""
        return tuple(s for s in self.slices if s.state in _COMING)

    @cached_property
    def arriving(self) -> tuple[Slice, ...]:
        """Slices coming up and queued ones, in order: every host asked for not yet in Ray."""
        return tuple(s for s in self.slices if s.state in _ARRIVING)

    @cached_property
    def owner_of_pod(self) -> Mapping[str, tuple[str, str, SliceState]]:
        """Each host's pod name → its group's name, its slice's key and state (the capacity's
        view of a node)."""
        name = self.group.name
        return {host.pod_name: (name, sl.key, sl.state) for sl in self.slices for host in sl.hosts}

    @cached_property
    def worker_started_at(self) -> Mapping[str, datetime]:
        """When each worker host of a complete slice had its Ray container start."""
        return {
            host.pod_name: host.running_since
            for sl in self.by_state(SliceState.COMPLETE)
            for host in sl.hosts
            if host.running_since is not None and not host.is_head
        }

    @cached_property
    def latest_worker_start(self) -> datetime | None:
        """The latest of `worker_started_at` (None without one): no host of the group settles
        (capacity.py) once it is older than the settle time."""
        return max(self.worker_started_at.values(), default=None)

    @cached_property
    def idle_by_since(self) -> tuple[tuple[int, str, Slice], ...]:
        """Complete (and outdated) slices idle on every host, longest idle first (earliest
        idle-since, then key): (idle-since, key, slice)."""
        idle = []
        for s in (*self.by_state(SliceState.COMPLETE), *self.by_state(SliceState.OUTDATED)):
            since = s.idle_since_ms()
            if since is not None:
                idle.append((since, s.key, s))
        idle.sort(key=lambda t: (t[0], t[1]))
        return tuple(idle)


@dataclass(frozen=True)
class SliceMap:
    groups: Mapping[str, GroupSlices]
    head: tuple[Host, ...]
    orphans: tuple[Host, ...]  # pods of groups that are not (or no longer) in the spec
    problems: tuple[Problem, ...]
