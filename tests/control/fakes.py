"""Fakes behind the control loop's Protocols (loop/ports.py), for reconciler unit tests.

`FakeApiServer` holds the one RayCluster; `FakeWriter` applies RFC 6902 patches to it (the uid
guard and `test` ops are honoured, so a stale patch fails as on a real API server) and can be
told to answer with any outcome the real writer classifies: 409/422 stale, 422 invalid, 429,
5xx, 403, 404. `FakeView` is the daemon's cache of that object (it lags until refreshed or
told). `FakeGcs` accepts drains unless told to refuse or fail some nodes. `FakeClock` drives
both of the loop's clocks. `Loop` wires them into a Reconciler.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

import jsonpatch
from ray.core.generated import autoscaler_pb2

from kuberay_scaler.adapters.ray_gcs.poller import observation_of
from kuberay_scaler.core.model.drains import DrainReason, HostDrain, SliceDrainResult
from kuberay_scaler.core.model.outcome import OutcomeKind, PatchOutcome
from kuberay_scaler.core.model.ray import RayObservation, RayState
from kuberay_scaler.core.model.report import AutoscalingReport
from kuberay_scaler.core.patch.ops import Op, ops_json
from kuberay_scaler.core.planner.policy import Policy
from kuberay_scaler.loop.config import LoopConfig
from kuberay_scaler.loop.reconciler import Reconciler
from tests.factories import NOW, NOW_MS

# HTTP status → the outcome the real writer's `classify` gives it.
STATUS_OUTCOME: dict[int, OutcomeKind] = {
    409: "stale",
    422: "invalid",
    429: "throttled",
    500: "transient",
    503: "transient",
    403: "forbidden",
    404: "gone",
}


# The fake monotonic reading at NOW: far from the epoch, as a real monotonic clock is (seconds
# since boot), so any place that mixes the two clocks reads a difference of decades and shows.
MONO_AT_NOW = 5_000.0
# From an epoch-ms instant near NOW to the same instant on the monotonic clock, in ms.
_MONO_SHIFT_MS = int(MONO_AT_NOW * 1000) - NOW_MS


def on_monotonic(ray: RayState) -> RayState:
    """`ray` with its idle clocks moved from the wall clock the factories stamp them on (idle
    `idle_s` at NOW) to the monotonic clock the daemon stamps replies on (app.py): the instant
    NOW - idle_s is MONO_AT_NOW - idle_s there, whatever the wall clock did since."""
    nodes = tuple(
        n if n.idle_since_ms is None else replace(n, idle_since_ms=n.idle_since_ms + _MONO_SHIFT_MS)
        for n in ray.nodes
    )
    return replace(ray, nodes=nodes)


@dataclass
class FakeClock:
    """Wall and monotonic time that move only when told; the monotonic clock reads MONO_AT_NOW
    when the wall reads NOW."""

    wall_now: datetime = NOW
    mono_now: float = MONO_AT_NOW

    def wall(self) -> datetime:
        return self.wall_now

    def monotonic(self) -> float:
        return self.mono_now

    def advance(self, seconds: float) -> None:
        self.wall_now += timedelta(seconds=seconds)
        self.mono_now += seconds


@dataclass
class FakeApiServer:
    """The stored RayCluster: what is true, whatever the daemon's cache says."""

    obj: dict[str, Any]

    def __post_init__(self) -> None:
        self.obj = copy.deepcopy(self.obj)
        self.obj["metadata"].setdefault("resourceVersion", "1")

    def store(self, obj: dict[str, Any]) -> dict[str, Any]:
        version = int(self.obj["metadata"].get("resourceVersion", "1")) + 1
        obj["metadata"]["resourceVersion"] = str(version)
        self.obj = obj
        return copy.deepcopy(obj)

    def edit(self, path: list[str | int], value: Any) -> None:
        """Another writer changes the stored object (e.g. kubectl scale)."""
        target: Any = self.obj
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        self.store(self.obj)


@dataclass
class WriteCall:
    ops: list[dict[str, Any]]
    expected_uid: str
    outcome: PatchOutcome


@dataclass
class FakeWriter:
    """Applies patches to the server; `answer(status, ...)` scripts the next replies."""

    server: FakeApiServer
    calls: list[WriteCall] = field(default_factory=list)
    after_apply: Callable[[WriteCall], None] | None = None  # runs after each call (inject here)
    _script: deque[PatchOutcome] = field(default_factory=deque)

    def answer(
        self,
        status: int,
        *,
        times: int = 1,
        retry_after: float | None = None,
        kind: OutcomeKind | None = None,
    ) -> None:
        """The next `times` patches fail with HTTP `status` (and are not applied); `kind`
        overrides the usual outcome (a 422 from a failed `test` op is "stale")."""
        kind = kind or STATUS_OUTCOME[status]
        wait = retry_after if kind == "throttled" else None
        for _ in range(times):
            self._script.append(PatchOutcome(kind, message=f"HTTP {status}", retry_after=wait))

    @property
    def sent(self) -> list[list[dict[str, Any]]]:
        return [c.ops for c in self.calls]

    @property
    def applied(self) -> list[list[dict[str, Any]]]:
        return [c.ops for c in self.calls if c.outcome.kind == "applied"]

    async def apply(self, ops: Sequence[Op], *, expected_uid: str) -> PatchOutcome:
        sent = copy.deepcopy(ops_json(ops))  # the JSON patch, as the kube writer sends it
        outcome = self._script.popleft() if self._script else self._apply(sent, expected_uid)
        call = WriteCall(sent, expected_uid, outcome)
        self.calls.append(call)
        if self.after_apply is not None:
            self.after_apply(call)
        return outcome

    def _apply(self, ops: list[dict[str, Any]], expected_uid: str) -> PatchOutcome:
        guard = {"op": "test", "path": "/metadata/uid", "value": expected_uid}
        body = ops if ops and ops[0] == guard else [guard, *ops]
        try:
            patched = jsonpatch.apply_patch(self.server.obj, body, in_place=False)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as err:
            return PatchOutcome("stale", message=f"HTTP 422: {err}")
        return PatchOutcome("applied", obj=self.server.store(patched))


@dataclass
class FakeView:
    """The daemon's cached RayCluster: a copy of the server's, refreshed only when asked."""

    server: FakeApiServer
    synced: bool = True
    refreshes: int = 0
    failure_status: int | None = None
    cached: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.cached = copy.deepcopy(self.server.obj)

    def current(self) -> dict[str, Any] | None:
        return self.cached

    def observe(self, obj: dict[str, Any]) -> None:
        self.cached = copy.deepcopy(obj)

    async def refresh(self) -> dict[str, Any] | None:
        self.refreshes += 1
        self.cached = copy.deepcopy(self.server.obj)
        return self.cached


@dataclass
class FakePods:
    pods: list[dict[str, Any]] = field(default_factory=list)
    synced: bool = True
    failure_status: int | None = None

    @property
    def store(self) -> Mapping[str, dict[str, Any]]:
        return {p["metadata"]["name"]: p for p in self.pods}


@dataclass
class DrainCall:
    node_id: str  # hex
    cluster_id: str | None
    deadline_ms: int
    reason: DrainReason = DrainReason.IDLE_TERMINATION


@dataclass
class FakeGcs:
    """Accepts every drain unless the node is in `refuse` (rejected) or `fail` (RPC error);
    a node in `busy` refuses idle-termination drains only (Ray accepts preemption for it)."""

    cluster_id: str | None = "cluster-1"
    refuse: set[str] = field(default_factory=set)
    busy: set[str] = field(default_factory=set)
    fail: set[str] = field(default_factory=set)
    report_fails: bool = False
    drains: list[DrainCall] = field(default_factory=list)
    reports: list[AutoscalingReport] = field(default_factory=list)
    fresh: Any = None  # what a fresh read returns (a reply or a RayState; None: it fails)
    fresh_fails: bool = False
    epoch: int = 1
    # The clock the daemon stamps a fresh read on (the monotonic one, app.py); None: the
    # one-shot world, where the wall clock (NOW) stands in.
    monotonic: Callable[[], float] | None = None

    async def drain(
        self,
        node_ids: Sequence[str],
        *,
        reason: DrainReason,
        message: str,
        deadline_ms: int,
        cluster_id: str | None,
    ) -> SliceDrainResult:
        hosts = []
        for node_id in node_ids:
            self.drains.append(DrainCall(node_id, cluster_id, deadline_ms, reason))
            if node_id in self.fail:
                hosts.append(HostDrain(node_id, "error", "UNAVAILABLE: injected"))
            elif node_id in self.refuse or (
                reason is DrainReason.IDLE_TERMINATION and node_id in self.busy
            ):
                hosts.append(HostDrain(node_id, "rejected", "node is busy"))
            else:
                hosts.append(HostDrain(node_id, "accepted"))
        return SliceDrainResult(tuple(hosts))

    async def fresh_state(self) -> RayObservation:
        if self.fresh_fails or self.fresh is None:
            return RayObservation(None, 0.0, self.cluster_id, self.epoch, error="injected")
        if self.monotonic is None:
            return observation(self.fresh, cluster_id=self.cluster_id, epoch=self.epoch)
        return read_now(self.fresh, self.monotonic(), cluster_id=self.cluster_id, epoch=self.epoch)

    async def report(self, report: AutoscalingReport) -> bool:
        if self.report_fails:
            return False
        self.reports.append(report)
        return True

    @property
    def drained(self) -> list[str]:
        return [d.node_id for d in self.drains]


def observation(
    ray: Any,
    *,
    observed_at: float = 0.0,
    cluster_id: str | None = "cluster-1",
    epoch: int = 1,
    read_at_ms: int = NOW_MS,
) -> RayObservation:
    """What the poller publishes for `ray` (a reply read at `read_at_ms`, or an already parsed
    RayState)."""
    if isinstance(ray, RayState):
        return RayObservation(ray, observed_at, cluster_id, epoch)
    return observation_of(
        ray, observed_at=observed_at, cluster_id=cluster_id, epoch=epoch, read_at_ms=read_at_ms
    )


def read_now(ray: Any, mono_s: float, *, cluster_id: str | None, epoch: int) -> RayObservation:
    """What the daemon's poller publishes for `ray` read at monotonic `mono_s`: a reply's idle
    clocks end then, a parsed RayState's are moved onto the monotonic clock (on_monotonic)."""
    if isinstance(ray, RayState):
        ray = on_monotonic(ray)
    return observation(
        ray, observed_at=mono_s, cluster_id=cluster_id, epoch=epoch, read_at_ms=int(mono_s * 1000)
    )


@dataclass
class FakeFeed:
    polls_asked: int = 0

    def poll_soon(self) -> None:
        self.polls_asked += 1


@dataclass
class FakeEvents:
    recorded: list[tuple[str, str]] = field(default_factory=list)

    async def record(self, reason: str, message: str) -> None:
        self.recorded.append((reason, message))


@dataclass
class Loop:
    """A Reconciler wired to fakes; every piece is reachable for assertions and faults."""

    server: FakeApiServer
    view: FakeView
    pods: FakePods
    writer: FakeWriter
    gcs: FakeGcs
    feed: FakeFeed
    events: FakeEvents
    clock: FakeClock
    reconciler: Reconciler

    def see_ray(self, ray: Any, *, cluster_id: str = "cluster-1", epoch: int = 1) -> None:
        """The poller pushes an observation made now: a reply or a parsed RayState (None: GCS
        unknown)."""
        if ray is not None:  # the GCS itself now answers this (a fresh read gets it)
            self.gcs.fresh, self.gcs.cluster_id, self.gcs.epoch = ray, cluster_id, epoch
        now = self.clock.monotonic()  # the daemon stamps replies on the monotonic clock
        self.reconciler.observe_gcs(
            read_now(ray, now, cluster_id=cluster_id, epoch=epoch)
            if ray is not None
            else RayObservation(None, now, cluster_id, epoch, error="unreachable")
        )


async def run_for(loop: Loop, seconds: float, ray: Any, *, epoch: int = 1) -> None:
    """Fresh GCS replies showing `ray` (None: unknown) and a reconcile, every 5 s."""
    elapsed = 0.0
    while elapsed < seconds:
        loop.clock.advance(5)
        elapsed += 5
        loop.see_ray(ray, epoch=epoch)
        await loop.reconciler.reconcile()


def reply_of(ray: RayState, version: int = 1, read_at_ms: int = NOW_MS) -> Any:
    """The GetClusterResourceStateReply the GCS would send for `ray` (nodes and tasks), read at
    `read_at_ms` (epoch ms: its idle durations end then)."""
    reply = autoscaler_pb2.GetClusterResourceStateReply()
    st = reply.cluster_resource_state
    st.cluster_resource_state_version = version
    for n in ray.nodes:
        node = st.node_states.add()
        node.node_id = bytes.fromhex(n.node_id)
        node.instance_id = n.instance_id
        node.ray_node_type_name = n.node_type
        node.status = autoscaler_pb2.NodeStatus.Value(n.status.value)
        node.total_resources.update(n.total)
        node.available_resources.update(n.available)
        node.labels.update(n.labels)
        node.idle_duration_ms = n.idle_ms(read_at_ms)
        node.node_ip_address = n.ip
    for t in ray.tasks:
        request = st.pending_resource_requests.add()
        request.count = t.count
        request.request.resources_bundle.update(t.bundle.resources)
    return reply


def make_loop(
    raycluster: dict[str, Any],
    pods: list[dict[str, Any]] | None = None,
    ray: Any = None,
    *,
    policy: Policy | None = None,
    config: LoopConfig | None = None,
    clock: FakeClock | None = None,
) -> Loop:
    clock = clock or FakeClock()
    server = FakeApiServer(raycluster)
    view = FakeView(server)
    fake_pods = FakePods(list(pods or []))
    writer = FakeWriter(server)
    gcs, feed, events = FakeGcs(monotonic=clock.monotonic), FakeFeed(), FakeEvents()
    reconciler = Reconciler(
        config=config or LoopConfig(),
        policy=policy or Policy(),
        pods=fake_pods,
        cluster=view,
        feed=feed,
        gcs=gcs,
        writer=writer,
        events=events,
        wall=clock.wall,
        monotonic=clock.monotonic,
    )
    loop = Loop(server, view, fake_pods, writer, gcs, feed, events, clock, reconciler)
    if ray is not None:
        loop.see_ray(ray)
    return loop
