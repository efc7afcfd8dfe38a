"""Ray's view of the cluster, parsed from GetClusterResourceStateReply."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from types import MappingProxyType

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
    """Known Ray state at one moment. Absence of a RayState means demand is unknown.

    The views every frame reads (nodes by instance, the alive ones, the idle positions) are
    plain fields computed once when the state is built (by the parser, or the poller when it
    hands on a state with a few nodes changed): outside equality, hashing and `repr`, a
    function of `nodes` alone, never written again."""

    nodes: tuple[RayNode, ...]
    tasks: tuple[TaskDemand, ...]
    gangs: tuple[GangDemand, ...]
    constraint: tuple[TaskDemand, ...]  # the request_resources floor for the whole cluster
    # Derived from `nodes` at construction (see `_views`).
    by_instance: Mapping[str, RayNode] = field(init=False, compare=False, repr=False)
    alive_ids: frozenset[str] = field(init=False, compare=False, repr=False)
    idle_at: tuple[int, ...] = field(init=False, compare=False, repr=False)
    alive: tuple[RayNode, ...] = field(init=False, compare=False, repr=False)
    entries: Mapping[str, tuple[RayNode, ...]] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        # The dataclass idiom for derived fields of a frozen value: set once, here, never after.
        for name, value in _views(self.nodes).items():
            object.__setattr__(self, name, value)

    def node_by_instance(self) -> Mapping[str, RayNode]:
        """Alive nodes keyed by instance id (pod name); a DEAD entry never hides a live one, and
        of two alive entries for one pod the busier wins (never the order of the reply): a pod
        with any entry not idle is not idle. Read-only."""
        return self.by_instance

    def alive_instance_ids(self) -> frozenset[str]:
        """Instance ids (pod names) of the alive nodes: a poller that hands on the same state
        object hands on the same set (the liveness tracker's fast path)."""
        return self.alive_ids

    def idle_positions(self) -> tuple[int, ...]:
        """Where in `nodes` the idle ones are (those with an idle-since)."""
        return self.idle_at

    def alive_nodes(self) -> tuple[RayNode, ...]:
        """The nodes not DEAD, in reply order."""
        return self.alive

    def entries_by_instance(self) -> Mapping[str, tuple[RayNode, ...]]:
        """Every entry (any status) per instance id, in reply order: what the deletion gate
        judges, since a pod may carry more than one raylet. Read-only."""
        return self.entries


def _views(nodes: tuple[RayNode, ...]) -> dict[str, object]:
    """RayState's derived fields, in two passes over the nodes."""
    alive: dict[str, RayNode] = {}
    # Almost every pod has one entry: one tuple each, grown only for the rare second one.
    entries: dict[str, tuple[RayNode, ...]] = {}
    dead = NodeStatus.DEAD
    for node in nodes:
        instance = node.instance_id
        if not instance:
            continue
        seen = entries.get(instance)
        entries[instance] = (node,) if seen is None else (*seen, node)
        if node.status is dead:
            continue
        held = alive.get(instance)
        if held is None or _busier(node, held):
            alive[instance] = node
    return {
        "by_instance": MappingProxyType(alive),
        "alive_ids": frozenset(alive),
        "idle_at": tuple(i for i, n in enumerate(nodes) if n.idle_since_ms is not None),
        "alive": tuple(n for n in nodes if n.status is not dead),
        "entries": MappingProxyType(entries),
    }


def _busier(node: RayNode, than: RayNode) -> bool:
    """`node` shows more work than `than`: not idle beats idle; of two idle, the shorter idle
    (the later idle-since)."""
    if node.idle != than.idle:
        return not node.idle
    return node.idle and (node.idle_since_ms or 0) > (than.idle_since_ms or 0)


def node_content(n: RayNode) -> object:
    """A node's part of `RayObservation.content`: all of it but its idle-since."""
    return (
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

    def content(
        self, entries: Callable[[tuple[RayNode, ...]], tuple[object, ...]] | None = None
    ) -> object:
        """What the plan reads of this observation, minus what moves on every poll (versions)
        and the idle-since times (time alone moves a plan from those; the loop's timer replans
        for them): equal contents plan alike (the poller wakes the loop when it changes).
        `entries`: the nodes' parts (`node_content` of each), from the caller's memo if it keeps
        one."""
        if self.state is None:  # not the error text: it changes on every retry
            return ("unknown", self.epoch)
        s = self.state
        nodes = entries(s.nodes) if entries is not None else tuple(map(node_content, s.nodes))
        return ("known", self.epoch, self.cluster_id, nodes, s.tasks, s.gangs, s.constraint)

    @property
    def demand_pending(self) -> bool:
        s = self.state
        return s is not None and bool(s.tasks or s.gangs or s.constraint)
