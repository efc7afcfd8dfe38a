"""Ray's view of the cluster, parsed from GetClusterResourceStateReply."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from types import MappingProxyType
from typing import Any, TypeVar

_T = TypeVar("_T")  # what a RayState memo holds

HEAD_RESOURCE = "node:__internal_head__"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


def epoch_ms(at: datetime) -> int:
    """`at` in whole milliseconds since the epoch (exact: no float rounding), the clock idle
    clocks are kept on (`RayNode.idle_since_ms`); a naive `at` is read as UTC."""
    return ((at if at.tzinfo is not None else at.replace(tzinfo=UTC)) - _EPOCH) // _MS


class NodeStatus(StrEnum):
    RUNNING = "RUNNING"
    IDLE = "IDLE"
    DRAINING = "DRAINING"
    DEAD = "DEAD"
    UNKNOWN = "UNSPECIFIED"


@dataclass(frozen=True)
class LabelConstraint:
    """`key in values` (or `not in` when negated)."""

    key: str
    values: frozenset[str]
    negated: bool = False

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = labels.get(self.key)
        inside = present is not None and present in self.values
        return not inside if self.negated else inside


@dataclass(frozen=True)
class LabelSelector:
    """All constraints must hold."""

    constraints: tuple[LabelConstraint, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(c.matches(labels) for c in self.constraints)

    def __str__(self) -> str:
        parts = []
        for c in self.constraints:
            op = "notin" if c.negated else "in"
            parts.append(f"{c.key} {op} ({','.join(sorted(c.values))})")
        return ", ".join(parts)


def selectors_match(selectors: tuple[LabelSelector, ...], labels: Mapping[str, str]) -> bool:
    """Ray treats a list of selectors as alternatives: any one that matches will do."""
    return not selectors or any(s.matches(labels) for s in selectors)


@dataclass(frozen=True)
class Bundle:
    """One unit of demand: resources that must fit on one host, with label selectors."""

    resources: Mapping[str, float]
    selectors: tuple[LabelSelector, ...] = ()

    def describe(self) -> str:
        res = ", ".join(f"{k}: {v:g}" for k, v in sorted(self.resources.items()))
        sel = " | ".join(str(s) for s in self.selectors)
        return "{" + res + "}" + (f" where {sel}" if sel else "")


@dataclass(frozen=True)
class TaskDemand:
    """`count` identical task/actor requests."""

    bundle: Bundle
    count: int


class GangStrategy(StrEnum):
    STRICT_SPREAD = "STRICT_SPREAD"  # every bundle on a distinct host
    STRICT_PACK = "STRICT_PACK"  # all bundles on one host
    PACK = "PACK"  # best effort, as few hosts as possible
    SPREAD = "SPREAD"  # best effort, spread


@dataclass(frozen=True)
class GangDemand:
    """A placement group: all bundles or nothing."""

    bundles: tuple[Bundle, ...]
    strategy: GangStrategy
    details: str = ""


@dataclass(frozen=True)
class RayNode:
    node_id: str  # hex
    instance_id: str  # pod name on KubeRay
    node_type: str
    status: NodeStatus
    total: Mapping[str, float]
    available: Mapping[str, float]
    labels: Mapping[str, str]
    # Since when Ray says the node has been idle, in ms on the clock the reply was stamped on
    # (the daemon's monotonic clock, the planner's tick; epoch ms in one-shot use): the adapter
    # subtracts the reply's idle_duration_ms from when it read the reply; None unless IDLE.
    # A point in time, not a duration: an idle node is equal from one poll to the next.
    idle_since_ms: int | None
    ip: str
    is_head: bool

    def idle_ms(self, now_ms: int) -> int:
        """How long it has been idle at `now_ms` (epoch ms); 0 unless idle."""
        since = self.idle_since_ms
        return 0 if since is None or not self.idle else max(0, now_ms - since)

    @property
    def alive(self) -> bool:
        return self.status is not NodeStatus.DEAD

    @property
    def idle(self) -> bool:
        return self.status is NodeStatus.IDLE


@dataclass(frozen=True)
class RayState:
    """Known Ray state at one moment. Absence of a RayState means demand is unknown."""

    nodes: tuple[RayNode, ...]
    tasks: tuple[TaskDemand, ...]
    gangs: tuple[GangDemand, ...]
    constraint: tuple[TaskDemand, ...]  # the request_resources floor for the whole cluster

    def node_by_instance(self) -> Mapping[str, RayNode]:
        """Alive nodes keyed by instance id (pod name); a DEAD entry never hides a live one, and
        of two alive entries for one pod the busier wins (never the order of the reply): a pod
        with any entry not idle is not idle. Built once per state (the slice map, the clock and
        the gate all ask), read-only."""
        return self._memo("_node_by_instance", self._alive_by_instance)

    def alive_instance_ids(self) -> frozenset[str]:
        """Instance ids (pod names) of the alive nodes. Built once per state: a poller that
        hands on the same state object hands on the same set (the liveness tracker's fast path)."""
        return self._cached("_alive_instance_ids", lambda: frozenset(self.node_by_instance()))

    def idle_positions(self) -> tuple[int, ...]:
        """Where in `nodes` the idle ones are (those with an idle-since). Built once per state."""
        return self._cached(
            "_idle_positions",
            lambda: tuple(i for i, n in enumerate(self.nodes) if n.idle_since_ms is not None),
        )

    def alive_nodes(self) -> tuple[RayNode, ...]:
        """The nodes not DEAD, in reply order. Built once per state."""
        dead = NodeStatus.DEAD
        return self._cached(
            "_alive_nodes", lambda: tuple(n for n in self.nodes if n.status is not dead)
        )

    def entries_by_instance(self) -> Mapping[str, tuple[RayNode, ...]]:
        """Every entry (any status) per instance id, in reply order: what the deletion gate
        judges, since a pod may carry more than one raylet. Built once per state, read-only."""
        return self._memo("_entries_by_instance", self._all_by_instance)

    def _memo(self, name: str, build: Callable[[], dict[str, Any]]) -> Mapping[str, Any]:
        return self._cached(name, lambda: MappingProxyType(build()))

    def _cached(self, name: str, build: Callable[[], _T]) -> _T:
        # A frozen dataclass: the memo goes into __dict__ directly (not a field, so equality,
        # hashing and `replace` ignore it). Pure: a function of the fields only.
        found: _T | None = self.__dict__.get(name)
        if found is None:
            found = build()
            object.__setattr__(self, name, found)
        return found

    def _alive_by_instance(self) -> dict[str, RayNode]:
        out: dict[str, RayNode] = {}
        dead = NodeStatus.DEAD
        for node in self.nodes:
            instance = node.instance_id
            if node.status is dead or not instance:
                continue
            seen = out.get(instance)
            if seen is None or _busier(node, seen):
                out[instance] = node
        return out

    def _all_by_instance(self) -> dict[str, tuple[RayNode, ...]]:
        # Almost every pod has one entry: one tuple each, grown only for the rare second one.
        out: dict[str, tuple[RayNode, ...]] = {}
        for node in self.nodes:
            instance = node.instance_id
            if instance:
                seen = out.get(instance)
                out[instance] = (node,) if seen is None else (*seen, node)
        return out


def _busier(node: RayNode, than: RayNode) -> bool:
    """`node` shows more work than `than`: not idle beats idle; of two idle, the shorter idle
    (the later idle-since)."""
    if node.idle != than.idle:
        return not node.idle
    return node.idle and (node.idle_since_ms or 0) > (than.idle_since_ms or 0)


@dataclass(frozen=True)
class RayObservation:
    """What one read of the GCS said, parsed: the only form Ray's state crosses the adapter in.

    `state` is None when the state is unknown (unreachable, refused, restarted, or a reply that
    could not be parsed: `unusable`). Unknown is never "no demand": the planner holds on it.
    """

    state: RayState | None
    observed_at: float  # monotonic seconds
    cluster_id: str | None = None  # drains are pinned to it
    epoch: int = 0  # GCS incarnation the state came from
    version: int = 0  # cluster_resource_state_version (told back to Ray in reports)
    error: str | None = None  # why the state is unknown
    unusable: bool = False  # the GCS answered, but not with a reply we can read

    @property
    def known(self) -> bool:
        return self.state is not None

    def fresh(self, now: float, max_age: float) -> bool:
        """Known and no older than `max_age` seconds at monotonic time `now`."""
        return self.state is not None and now - self.observed_at <= max_age

    def alive_instances(self) -> frozenset[str] | None:
        """Instance ids (pod names) of the live Ray nodes; None when the state is unknown."""
        return None if self.state is None else self.state.alive_instance_ids()

    def content(self) -> object:
        """What the plan reads of this observation, minus what moves on every poll (versions)
        and the idle-since times (time alone moves a plan from those; the loop's timer replans
        for them): equal contents plan alike (the poller wakes the loop when it changes)."""
        if self.state is None:  # not the error text: it changes on every retry
            return ("unknown", self.epoch)
        s = self.state
        nodes = tuple(
            (
                n.node_id,
                n.instance_id,
                n.node_type,
                n.status,
                n.total,
                n.available,
                n.labels,
                n.ip,
                n.is_head,
            )
            for n in s.nodes
        )
        return ("known", self.epoch, self.cluster_id, nodes, s.tasks, s.gangs, s.constraint)

    @property
    def demand_pending(self) -> bool:
        s = self.state
        return s is not None and bool(s.tasks or s.gangs or s.constraint)
