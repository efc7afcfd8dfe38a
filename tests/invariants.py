"""The invariant checker every tier that sees writes uses (stand-in write log, integration harness,
soak, e2e observer).

Each write to a RayCluster is judged against the world as it was when the write landed: the pods
(from the API server) and the Ray nodes by instance id (from the GCS, read by the tier itself, not
by the code under test). The rules:

- ``partial-slice``: every live pod of a slice named in ``workersToDelete`` is named with it;
- ``busy-deleted`` / ``undrained-deleted``: a slice whose hosts are all alive in Ray is deleted only
  when every host's drain was accepted (DRAINING, or DEAD because an accepted IDLE_TERMINATION
  drain makes the raylet exit). The partial-drain rule: a slice with a host that is DEAD, unknown
  to Ray or whose pod is gone is broken and may be deleted whole, busy hosts and all (its
  multi-host work is lost already; KubeRay replaces a broken replica whole too);
- ``out-of-bounds``: a write that changes ``replicas`` leaves it within [minReplicas, maxReplicas]
  (KubeRay clamps to that range; a value we write outside it is a planner bug even when clamped);
- ``second-scale-up``: no raise of a group's replicas while the previous raise by the same writer
  is not visible yet (fewer slices exist than it asked for) and the demand is the same;
- ``write-while-blind``: while Ray demand is unknown (the tier says the GCS is down), the daemon
  writes nothing but the clearing of a processed ``workersToDelete``;
- ``not-cleared``: at the end, no ``workersToDelete`` names a pod that is gone;
- ``daemon-exited``: the daemon never exits unless the tier stopped it.

A violation carries the write and the world it was judged against; `assert_clean` renders them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

INT32_MAX = 2**31 - 1
REPLICA_NAME = "ray.io/worker-group-replica-name"
GROUP = "ray.io/group"
NODE_TYPE = "ray.io/node-type"
# Ray node states as the GCS reports them (autoscaler.proto NodeStatus), plus ABSENT.
RUNNING, DEAD, IDLE, DRAINING, ABSENT = "RUNNING", "DEAD", "IDLE", "DRAINING", "ABSENT"
NODE_STATUS_NAMES = {0: "UNSPECIFIED", 1: RUNNING, 2: DEAD, 3: IDLE, 4: DRAINING}
BLIND_GRACE_S = 5.0  # a write this soon after the GCS went down was decided while it was up


@dataclass(frozen=True)
class Write:
    """One committed version of a RayCluster: the object before and after, and who wrote it."""

    before: Mapping[str, Any] | None
    after: Mapping[str, Any]
    by: str = ""
    at: float = field(default_factory=time.monotonic)
    request: str = ""


@dataclass(frozen=True)
class World:
    """What the tier saw when the write landed."""

    pods: Mapping[str, Mapping[str, Any]]  # every pod of the cluster by name (any phase)
    ray: Mapping[str, str] | None = None  # pod name (instance id) -> Ray node status; None unknown
    blind_since: float | None = None  # monotonic time the GCS went down; None: demand known
    demand: Hashable = None  # a fingerprint of Ray's demand; None: unknown (same demand assumed)

    def summary(self, groups: Iterable[str]) -> str:
        lines = []
        for group in sorted(set(groups)):
            for name, pod in sorted(self.pods.items()):
                labels = _labels(pod)
                if labels.get(GROUP) != group or labels.get(NODE_TYPE) != "worker":
                    continue
                phase = (pod.get("status") or {}).get("phase")
                gone = " terminating" if _terminating(pod) else ""
                ray = (self.ray or {}).get(name, ABSENT) if self.ray is not None else "?"
                lines.append(
                    f"    {group} {labels.get(REPLICA_NAME, '-')} {name}: {phase}{gone}, ray {ray}"
                )
        blind = "" if self.blind_since is None else f" (GCS down since {self.blind_since:.1f})"
        return "\n".join(lines) or f"    (no worker pods){blind}"


@dataclass(frozen=True)
class Violation:
    rule: str
    group: str
    message: str
    write: Write
    world: World
    slice: str = ""  # the slice key, for the deletion rules

    def __str__(self) -> str:
        return (
            f"[{self.rule}] {self.group}: {self.message}\n"
            f"  write by {self.write.by or '?'}: {self.write.request[:600] or '(no request)'}\n"
            f"  change: {json.dumps(group_diff(self.write, self.group))}\n"
            f"  world it was made from:\n{self.world.summary([self.group])}"
        )


# --- reading RayClusters and pods -------------------------------------------------------------


def groups_of(raycluster: Mapping[str, Any] | None) -> dict[str, Mapping[str, Any]]:
    spec = (raycluster or {}).get("spec") or {}
    out: dict[str, Mapping[str, Any]] = {}
    for group in spec.get("workerGroupSpecs") or []:
        if isinstance(group, Mapping):
            out.setdefault(str(group.get("groupName")), group)
    return out


def workers_to_delete(group: Mapping[str, Any] | None) -> list[str]:
    names = ((group or {}).get("scaleStrategy") or {}).get("workersToDelete") or []
    return [str(n) for n in names]


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _labels(pod: Mapping[str, Any]) -> Mapping[str, str]:
    return (pod.get("metadata") or {}).get("labels") or {}


def _terminating(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def group_diff(write: Write, group: str) -> dict[str, Any]:
    before, after = groups_of(write.before).get(group), groups_of(write.after).get(group)
    return {
        "replicas": [(before or {}).get("replicas"), (after or {}).get("replicas")],
        "workersToDelete": [workers_to_delete(before), workers_to_delete(after)],
        "min": (after or {}).get("minReplicas"),
        "max": (after or {}).get("maxReplicas"),
    }


def slice_members(world: World, group: str, hosts: int = 2) -> dict[str, list[str]]:
    """Pods of `group` by slice: the replica name when numOfHosts > 1 (KubeRay sets and reads
    it only then), otherwise each pod alone."""
    members: dict[str, list[str]] = {}
    for name, pod in world.pods.items():
        labels = _labels(pod)
        if labels.get(GROUP) == group and labels.get(NODE_TYPE) == "worker":
            key = (labels.get(REPLICA_NAME) or name) if hosts > 1 else name
            members.setdefault(key, []).append(name)
    return members


# --- the pure rules -------------------------------------------------------------------------


def check_write(write: Write, world: World) -> list[Violation]:
    """Every stateless rule for one write."""
    found: list[Violation] = []
    before_groups, after_groups = groups_of(write.before), groups_of(write.after)
    for name, group in after_groups.items():
        prev = before_groups.get(name)
        for rule, message, key in (
            *((r, m, "") for r, m in _bounds(prev, group)),
            *_deletions(world, name, group, prev),
            *((r, m, "") for r, m in _blind(write, world, prev, group)),
        ):
            found.append(Violation(rule, name, message, write, world, key))
    return found


def _bounds(prev: Mapping[str, Any] | None, group: Mapping[str, Any]) -> list[tuple[str, str]]:
    replicas = group.get("replicas")
    # An absent value is the CRD default 0 (the API server stores it so): writing it is no change.
    if prev is not None and _int(prev.get("replicas"), 0) == _int(replicas, 0):
        return []
    if not isinstance(replicas, int):
        return []
    low, high = _int(group.get("minReplicas"), 0), _int(group.get("maxReplicas"), INT32_MAX)
    if low <= replicas <= high:
        return []
    return [("out-of-bounds", f"replicas set to {replicas}, outside [{low}, {high}]")]


def _deletions(
    world: World, name: str, group: Mapping[str, Any], prev: Mapping[str, Any] | None
) -> list[tuple[str, str, str]]:
    was = set(workers_to_delete(prev))
    doomed = workers_to_delete(group)
    fresh = [n for n in doomed if n not in was]
    if not fresh:
        return []
    hosts = max(1, _int(group.get("numOfHosts"), 1))
    members = slice_members(world, name, hosts)
    key_of = {pod: key for key, pods in members.items() for pod in pods}
    found: list[tuple[str, str, str]] = []
    for key in sorted({key_of[n] for n in fresh if n in key_of}):
        pods = members[key]
        live = [p for p in pods if not _terminating(world.pods[p])]
        left_out = sorted(p for p in live if p not in doomed)
        if left_out:
            found.append(("partial-slice", f"slice {key} named without {left_out}", key))
        found.extend((rule, message, key) for rule, message in _drain_rule(world, key, pods, hosts))
    return found


def _drain_rule(world: World, key: str, pods: list[str], hosts: int) -> list[tuple[str, str]]:
    if world.ray is None:
        return []  # the tier cannot tell; `write-while-blind` covers the daemon's side
    states = {p: world.ray.get(p, ABSENT) for p in pods}
    if len(pods) < hosts or any(s in (DEAD, ABSENT) for s in states.values()):
        return []  # broken slice: replaced whole, busy or not (the partial-drain rule)
    busy = sorted(p for p, s in states.items() if s == RUNNING)
    if busy:
        return [("busy-deleted", f"slice {key} deleted with busy hosts {busy}")]
    undrained = sorted(p for p, s in states.items() if s != DRAINING)
    if undrained:
        return [("undrained-deleted", f"slice {key} deleted, no accepted drain on {undrained}")]
    return []


def _blind(
    write: Write, world: World, prev: Mapping[str, Any] | None, group: Mapping[str, Any]
) -> list[tuple[str, str]]:
    if world.blind_since is None or write.at - world.blind_since < BLIND_GRACE_S:
        return []
    if prev is None or _only_cleared(prev, group, world):
        return []
    if dict(prev) == dict(group):
        return []
    return [("write-while-blind", "group changed while Ray demand was unknown")]


def _only_cleared(prev: Mapping[str, Any], group: Mapping[str, Any], world: World) -> bool:
    """The change removes processed names (pods gone) from workersToDelete and nothing else."""
    was, now = workers_to_delete(prev), workers_to_delete(group)
    removed = set(was) - set(now)
    if not removed or set(now) - set(was) or any(n in world.pods for n in removed):
        return False
    strip = ("scaleStrategy",)
    rest_before = {k: v for k, v in prev.items() if k not in strip}
    rest_after = {k: v for k, v in group.items() if k not in strip}
    return rest_before == rest_after


def not_cleared(raycluster: Mapping[str, Any] | None, world: World) -> list[tuple[str, str]]:
    """Groups whose workersToDelete still names pods that are gone."""
    found = []
    for name, group in groups_of(raycluster).items():
        stale = [n for n in workers_to_delete(group) if n not in world.pods]
        if stale:
            found.append((name, f"workersToDelete still names gone pods {stale}"))
    return found


# --- the stateful checker ---------------------------------------------------------------------


@dataclass
class _Raise:
    target: int
    demand: Hashable
    hosts: int = 1


def _slice_count(world: World, group: str, hosts: int) -> int:
    return len(slice_members(world, group, hosts))


class InvariantChecker:
    """Feed it every write (in commit order) with the world it landed in; it collects violations.

    `daemon` names the writer whose writes are judged (None: every writer, for tiers that cannot
    tell writers apart, such as a watch-based observer).
    """

    def __init__(self, daemon: str | None = None, *, track_scale_ups: bool = True) -> None:
        self.daemon = daemon
        self.track_scale_ups = track_scale_ups
        self.violations: list[Violation] = []
        self.writes_seen = 0
        self.judged = 0
        self._raises: dict[str, _Raise] = {}
        self._last: Write | None = None

    def record(self, write: Write, world: World) -> list[Violation]:
        self.writes_seen += 1
        self._last = write
        if self.daemon is not None and write.by != self.daemon:
            self._forget_visible(world)
            return []
        self.judged += 1
        found = check_write(write, world)
        if self.track_scale_ups:
            found += self._second_scale_up(write, world)
        self.violations.extend(found)
        return found

    def _second_scale_up(self, write: Write, world: World) -> list[Violation]:
        self._forget_visible(world)
        found = []
        before_groups = groups_of(write.before)
        for name, group in groups_of(write.after).items():
            old = _int((before_groups.get(name) or {}).get("replicas"), 0)
            new = _int(group.get("replicas"), 0)
            if new < old:
                self._raises.pop(name, None)
            if new <= old:
                continue
            pending = self._raises.get(name)
            if pending is not None and (pending.demand is None or pending.demand == world.demand):
                message = (
                    f"raised to {new} while the raise to {pending.target} is not visible "
                    f"({_slice_count(world, name, pending.hosts)} slices exist), same demand"
                )
                found.append(Violation("second-scale-up", name, message, write, world))
            hosts = max(1, _int(group.get("numOfHosts"), 1))
            self._raises[name] = _Raise(new, world.demand, hosts)
        return found

    def _forget_visible(self, world: World) -> None:
        for name, pending in list(self._raises.items()):
            if _slice_count(world, name, pending.hosts) >= pending.target:
                del self._raises[name]

    def daemon_exited(self, code: int | None, detail: str = "") -> None:
        """The daemon exited without the tier asking it to."""
        write = self._last or Write(None, {}, by="")
        self.violations.append(
            Violation("daemon-exited", "-", f"exit code {code}: {detail[-800:]}", write, World({}))
        )

    def finish(self, raycluster: Mapping[str, Any] | None, world: World) -> list[Violation]:
        """End-of-run rules on the final state."""
        write = Write(raycluster, raycluster or {}, by="(final state)")
        found = [
            Violation("not-cleared", g, m, write, world) for g, m in not_cleared(raycluster, world)
        ]
        self.violations.extend(found)
        return found

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for violation in self.violations:
            out[violation.rule] = out.get(violation.rule, 0) + 1
        return out

    def report(self, limit: int = 20) -> str:
        shown = "\n\n".join(str(v) for v in self.violations[:limit])
        more = len(self.violations) - limit
        return shown + (f"\n\n... and {more} more" if more > 0 else "")

    def assert_clean(self) -> None:
        assert not self.violations, (
            f"{len(self.violations)} invariant violation(s):\n\n{self.report()}"
        )


# --- wiring for tiers with async Ray views ------------------------------------------------------

RayView = Callable[[], Awaitable[Mapping[str, str] | None]]


class WriteFeed:
    """Judges writes in commit order with a Ray view read right after each one lands.

    `offer` is synchronous (a write-log listener); it snapshots the pods at once and queues the
    write; a single task reads the GCS and hands both to the checker, so order is kept.
    """

    def __init__(
        self,
        checker: InvariantChecker,
        ray_view: RayView | None,
        *,
        blind_since: Callable[[], float | None] = lambda: None,
        demand: Callable[[], Hashable] = lambda: None,
    ) -> None:
        self.checker = checker
        self._ray_view = ray_view
        self._blind_since = blind_since
        self._demand = demand
        self._queue: asyncio.Queue[tuple[Write, World]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self.errors: list[str] = []
        self.cleanups: list[Callable[[], None]] = []

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def offer(self, write: Write, pods: Mapping[str, Mapping[str, Any]]) -> None:
        world = World(pods=dict(pods), blind_since=self._blind_since(), demand=self._demand())
        self._queue.put_nowait((write, world))

    async def _run(self) -> None:
        while True:
            write, world = await self._queue.get()
            ray = None
            if self._ray_view is not None and _touches_deletions(write):
                try:
                    ray = await self._ray_view()
                except Exception as error:  # the GCS may be down on purpose: judge without it
                    self.errors.append(repr(error))
            self.checker.record(write, World(world.pods, ray, world.blind_since, world.demand))
            self._queue.task_done()

    async def drain(self, timeout_s: float = 60.0) -> None:
        async with asyncio.timeout(timeout_s):
            await self._queue.join()

    async def close(self) -> None:
        for cleanup in self.cleanups:
            cleanup()
        self.cleanups.clear()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task


def _touches_deletions(write: Write) -> bool:
    before = groups_of(write.before)
    return any(
        set(workers_to_delete(g)) - set(workers_to_delete(before.get(n)))
        for n, g in groups_of(write.after).items()
    )


async def gcs_node_states(address: str, token: str | None = None) -> dict[str, str]:
    """Ray node status by instance id, read straight from the GCS with Ray's own protobufs."""
    import grpc
    from ray.core.generated import autoscaler_pb2, autoscaler_pb2_grpc

    metadata = [("authorization", f"Bearer {token}")] if token else None
    async with grpc.aio.insecure_channel(address, options=[("grpc.enable_http_proxy", 0)]) as ch:
        stub = autoscaler_pb2_grpc.AutoscalerStateServiceStub(ch)
        request = autoscaler_pb2.GetClusterResourceStateRequest(
            last_seen_cluster_resource_state_version=0
        )
        reply = await stub.GetClusterResourceState(request, timeout=10, metadata=metadata)
    best: dict[str, str] = {}
    for node in reply.cluster_resource_state.node_states:
        status = NODE_STATUS_NAMES.get(int(node.status), "UNSPECIFIED")
        if node.instance_id and best.get(node.instance_id, DEAD) == DEAD:
            best[node.instance_id] = status  # a live node wins over an older dead one
    return best


# --- the local harness (stand-ins + real Ray): integration tests and the soak ---------------


def watch_writes(
    api: Any,
    namespace: str,
    name: str,
    daemon: str | None,
    ray_view: RayView | None,
    *,
    blind_since: Callable[[], float | None] = lambda: None,
    demand: Callable[[], Hashable] = lambda: None,
) -> WriteFeed:
    """Judge every write to one RayCluster in a stand-in API server's write log."""
    feed = WriteFeed(InvariantChecker(daemon), ray_view, blind_since=blind_since, demand=demand)

    def on_write(logged: Any) -> None:
        event = logged.event
        if event.store != "rayclusters" or event.type != "MODIFIED" or event.prev is None:
            return
        if event.obj["metadata"]["name"] != name:
            return
        pods = {p["metadata"]["name"]: p for p in api.list("pods", namespace)}
        feed.offer(Write(event.prev, event.obj, logged.user, request=logged.request), pods)

    feed.start()
    feed.cleanups.append(api.subscribe_writes(on_write))
    return feed


def watch_local_cluster(
    cluster: Any,
    *,
    blind_since: Callable[[], float | None] = lambda: None,
    demand: Callable[[], Hashable] = lambda: None,
) -> WriteFeed:
    """Judge every RayCluster write of a started `kuberay_standins.harness.LocalCluster`.

    The daemon is the writer holding the cluster's token; the Ray view is read from whatever head
    the cluster has at the time (a soak restarts it).
    """

    async def ray_view() -> Mapping[str, str] | None:
        head = cluster.head
        if head is None or not head.alive():
            return None
        return await gcs_node_states(head.gcs_address, head.auth_token)

    daemon = cluster.api.user_of(cluster.token)
    return watch_writes(
        cluster.api,
        cluster.namespace,
        cluster.name,
        daemon,
        ray_view,
        blind_since=blind_since,
        demand=demand,
    )


async def finish_local_cluster(feed: WriteFeed, cluster: Any) -> InvariantChecker:
    """Judge what is queued, then the end-of-run rules on the cluster's final state."""
    await feed.drain()
    pods = {p["metadata"]["name"]: p for p in cluster.api.list("pods", cluster.namespace)}
    feed.checker.finish(cluster.current(), World(pods))
    await feed.close()
    return feed.checker
