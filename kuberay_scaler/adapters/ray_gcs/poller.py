"""Poll `GetClusterResourceState` and publish what the GCS said, parsed, or that we do not know.

Every poll becomes one `RayObservation` (core/model/ray.py): the reply parsed here, once, so nothing
past this adapter reads protobuf. `state=None` means "unknown": unreachable, restarted, replaced,
refused, or a reply we cannot read. The planner must hold on unknown, never read it as "no
demand". `epoch` counts the GCS incarnations we have seen: it grows when the cluster id changes
(a new GCS) or when the `cluster_resource_state_version` counter, which only ever grows inside
one GCS process, goes back (a GCS restarted with fault tolerance keeps its cluster id but loses
that counter). Every report the loop sends is a full one, so a GCS that forgot the last one is
told again at the next reconcile.

Idle clocks become idle-since times on the clock replies are stamped on (state.py; the
daemon's monotonic clock, `monotonic_ms`), from when each reply arrived; an idle-since that
agrees with the last one's (unchanged.py: within the read's window) is kept, node object and
all. A reply that, zeroed (unchanged.py: versions and idle clocks set
to 0), equals the last parsed one is not parsed again: the last parse gets the new idle clocks,
which equals a full parse of it. Change detection then compares parsed values
(`RayObservation.content`: versions and idle clocks left out).

The cadence (cadence.py) is charged the poll's own work only: the client hands over the reply as
bytes, and the poller's thread CPU is taken around what it does synchronously with them (decode,
body, parse, publish), never across the RPC's await, during which the event loop runs whatever
else is due (a reconcile, pod events). The charge is the median of the last `COST_WINDOW` polls,
so a one-off cost (the first full parse, a collector pass) does not space out the next polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import operator
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

import structlog
from google.protobuf.message import DecodeError
from ray.core.generated import autoscaler_pb2

from kuberay_scaler.adapters.ray_gcs.cadence import Cadence
from kuberay_scaler.adapters.ray_gcs.errors import GcsError
from kuberay_scaler.adapters.ray_gcs.state import RayStateError, parse_ray_state
from kuberay_scaler.adapters.ray_gcs.unchanged import (
    ReadWindow,
    Zeroed,
    reparsed,
    with_idle_clocks,
    with_nodes_of,
    zeroed,
)
from kuberay_scaler.core.model.ray import RayNode, RayObservation, RayState, node_content
from kuberay_scaler.runtime.metrics import GcsCounters

log = structlog.get_logger(__name__)

COST_WINDOW = 3  # polls whose median own CPU is charged to the next interval
_Reply = autoscaler_pb2.GetClusterResourceStateReply


def wall_ms() -> int:
    """Epoch ms: what a reply is stamped with by default (one-shot use, where the planner's
    `now` stands in for its monotonic reading). The daemon stamps replies on the monotonic clock
    instead (`monotonic_ms`), the clock of the planner's `mono_s`: idle ages never see a wall
    step."""
    return time.time_ns() // 1_000_000


def monotonic_ms() -> int:
    """time.monotonic() in ms: the stamp of every poller wired to a Reconciler (whose `mono_s`
    is time.monotonic()); idle-since and the planner's tick are then on one clock."""
    return time.monotonic_ns() // 1_000_000


class StateSource(Protocol):
    """What the poller needs from `GcsClient`. A source that also has
    `get_cluster_resource_state_bytes` (`GcsClient` does) is polled through it: the poller
    decodes the reply itself, inside the CPU it charges to the cadence."""

    @property
    def cluster_id(self) -> str | None: ...

    async def get_cluster_resource_state(self) -> Any: ...


def observation_of(
    reply: Any, *, observed_at: float, cluster_id: str | None, epoch: int, read_at_ms: int
) -> RayObservation:
    """One reply, parsed (read at `read_at_ms`, epoch ms); an unusable one is an unknown
    observation that says why."""
    version = _version(reply)
    try:
        state = parse_ray_state(reply, read_at_ms=read_at_ms)
    except RayStateError as err:
        return RayObservation(
            None, observed_at, cluster_id, epoch, version, f"unusable GCS reply: {err}", True
        )
    return RayObservation(state, observed_at, cluster_id, epoch, version)


class GcsPoller:
    """Polls at most `interval_s` apart, sooner while polls are cheap or the state moves (see
    `cadence`); `on_observation` gets every observation, `on_change` each one whose content
    changed (to wake the loop)."""

    def __init__(
        self,
        client: StateSource,
        *,
        interval_s: float,
        on_change: Callable[[RayObservation], None] | None = None,
        on_observation: Callable[[RayObservation], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.thread_time,
        wall: Callable[[], int] = wall_ms,
        counters: GcsCounters | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"poll interval must be positive, got {interval_s}")
        self._client = client
        self._fetch: Callable[[], Any] = getattr(
            client, "get_cluster_resource_state_bytes", client.get_cluster_resource_state
        )
        self._interval_s = interval_s
        self._on_change = on_change
        self._on_observation = on_observation
        self._monotonic = monotonic
        self._cpu_clock = cpu_clock
        self._wall = wall
        self._counters = counters or GcsCounters.new()
        self._epoch = 0
        self._cluster_id: str | None = None
        self._last_version = -1
        self._content: object = None
        self._content_of: tuple[object, object, object] = (None, None, None)
        self._parsed: tuple[Zeroed, RayState] | None = None  # last reply (zeroed), its parse
        self.parses = 0  # full parses
        self.reparses = 0  # replies of which only what changed was parsed (unchanged.reparsed)
        self._cadence = Cadence(ceiling_s=interval_s)
        self._last_cost_s = 0.0  # what the cadence is charged: median of the last polls' own CPU
        self.last_poll_cpu_s = 0.0  # the last poll's own CPU (its synchronous work)
        self._costs: deque[float] = deque(maxlen=COST_WINDOW)
        self._last_change = monotonic()
        self._motion: object = None  # the last content without its epoch (`_moved`)
        self._motion_before: object = None  # and the one before it
        self.content_version = 0  # rises whenever the content (not the version) changed
        self._entries = NodeEntries()  # each node's part of the content, by node object
        self._wake = asyncio.Event()
        self._unknown_kind: str | None = None  # the kind of failure last logged
        self.latest = RayObservation(None, monotonic(), error="not polled yet")

    @property
    def gcs_epoch(self) -> int:
        return self._epoch

    def poll_soon(self) -> None:
        """Cut the current wait short (e.g. right after a drain or a patch)."""
        self._wake.set()

    async def run(self) -> None:
        """Poll until cancelled."""
        while True:
            await self.poll_once()
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.next_interval()):
                    await self._wake.wait()

    def next_interval(self) -> float:
        return self._cadence.next_interval(
            cost_s=self._last_cost_s,
            demand_pending=self.latest.demand_pending,
            last_change=self._last_change,
            now=self._monotonic(),
        )

    async def poll_once(self) -> RayObservation:
        sent = self._wall()
        # Charged: what runs after the reply is in, synchronously. The await itself also runs
        # every other task that is due (a reconcile, pod events): their CPU is not the poll's.
        try:
            reply = await self._fetch()
        except GcsError as err:
            cpu = self._cpu_clock()
            observation = self._unknown(err)
        else:
            cpu = self._cpu_clock()
            observation = self._read(reply, ReadWindow(sent, self._wall()))
        try:
            return self._publish(observation)
        finally:
            self._charge(self._cpu_clock() - cpu)

    def _charge(self, cost_s: float) -> None:
        self.last_poll_cpu_s = cost_s
        self._costs.append(cost_s)
        self._last_cost_s = statistics.median(self._costs)

    def _read(self, reply: Any, read: ReadWindow) -> RayObservation:
        if isinstance(reply, bytes):
            try:
                reply = _Reply.FromString(reply)
            except DecodeError as err:
                return self._undecodable(err)
        elif isinstance(reply, _Reply):  # the source's own message: zeroed here, so copied
            reply = _copied(reply)
        return self._known(reply, read)

    def _undecodable(self, err: DecodeError) -> RayObservation:
        error = f"unusable GCS reply: cannot decode: {err}"
        log.warning("gcs_reply_unusable", error=error, gcs_epoch=self._epoch)
        return RayObservation(
            None, self._monotonic(), self._cluster_id, self._epoch, error=error, unusable=True
        )

    async def read_now(self) -> RayObservation:
        """A read of its own (say right before draining), parsed like a poll but neither
        published nor counted toward epochs: two reads in flight cannot look like a restart."""
        try:
            reply = await self._client.get_cluster_resource_state()
        except GcsError as err:
            return RayObservation(
                None, self._monotonic(), self._client.cluster_id, self._epoch, error=str(err)
            )
        return observation_of(
            reply,
            observed_at=self._monotonic(),
            cluster_id=self._client.cluster_id,
            epoch=self._epoch,
            read_at_ms=self._wall(),
        )

    def _unknown(self, err: GcsError) -> RayObservation:
        error = str(err)
        # Once per state change: the message itself changes on every poll during a backoff.
        kind = type(err).__name__
        if self.latest.known or self._unknown_kind != kind:
            log.warning("gcs_state_unknown", error=error, gcs_epoch=self._epoch)
        self._unknown_kind = kind
        self._counters.gcs_answered(False)
        return RayObservation(None, self._monotonic(), self._cluster_id, self._epoch, error=error)

    def _known(self, reply: Any, read: ReadWindow) -> RayObservation:
        cluster_id = self._client.cluster_id
        version = _version(reply)
        replaced = self._cluster_id is not None and cluster_id != self._cluster_id
        restarted = not replaced and version <= self._last_version
        if replaced or restarted:
            self._epoch += 1
            log.warning(
                "gcs_new_epoch",
                gcs_epoch=self._epoch,
                cause="replaced" if replaced else "restarted",
                cluster_id=cluster_id,
            )
        elif not self.latest.known:
            log.info("gcs_state_known", gcs_epoch=self._epoch, cluster_id=cluster_id)
        self._unknown_kind = None
        self._counters.gcs_answered(True)
        self._cluster_id = cluster_id
        self._last_version = version
        observation = self._observe(reply, cluster_id, version, read)
        if observation.unusable:
            log.warning("gcs_reply_unusable", error=observation.error, gcs_epoch=self._epoch)
        return observation

    def _observe(
        self, reply: Any, cluster_id: str | None, version: int, read: ReadWindow
    ) -> RayObservation:
        """The reply parsed: the last parse with its idle clocks when only those moved, the last
        parse with what changed re-read when little did, a full parse otherwise. The poller owns
        the reply: it is zeroed in place (`unchanged.zeroed`) and kept to compare the next with."""
        observed_at = self._monotonic()
        last = self._parsed
        if last is not None and isinstance(reply, _Reply):
            before, previous = last
            now = zeroed(reply)
            assert now is not None  # a reply message
            if now.reply == before.reply:  # only versions and idle clocks moved
                state = with_idle_clocks(previous, now.idle_ms, read)
                self._parsed = (before, state)  # it stands for this reply too
            else:
                self.reparses += 1
                state = reparsed(previous, before, now, read)
                self._parsed = (now, state)
            return RayObservation(state, observed_at, cluster_id, self._epoch, version)
        self.parses += 1
        observation = observation_of(
            reply,
            observed_at=observed_at,
            cluster_id=cluster_id,
            epoch=self._epoch,
            read_at_ms=read.received_ms,
        )
        if observation.state is None:
            self._parsed = None
            return observation
        # Unchanged nodes keep last parse's objects (the slice map's memo knows them so).
        state = with_nodes_of(last[1] if last else None, observation.state, read)
        observation = replace(observation, state=state)
        reference = zeroed(reply)  # after the parse: it reads the idle clocks
        self._parsed = (reference, state) if reference is not None else None
        return observation

    def _publish(self, observation: RayObservation) -> RayObservation:
        self.latest = observation
        if self._on_observation is not None:
            self._on_observation(observation)
        # The same state object, GCS and epoch as last time: the same content (not rebuilt).
        same = (observation.state, observation.epoch, observation.cluster_id)
        state, epoch, cluster_id = self._content_of
        unchanged = (
            observation.state is not None
            and observation.state is state
            and (observation.epoch, observation.cluster_id) == (epoch, cluster_id)
        )
        self._content_of = same
        content = self._content if unchanged else observation.content(self._entries.of)
        if content != self._content:
            self._content = content
            self.content_version += 1
            if self._moved(content):
                self._last_change = self._monotonic()
            if self._on_change is not None:
                self._on_change(observation)
        return observation

    def _moved(self, content: object) -> bool:
        """Whether a changed content is movement the cadence speeds up for: not when it only
        goes back to the one before the last (replies that contradict each other, A B A B), nor
        when only the epoch moved (a version that goes back every other poll)."""
        motion = _without_epoch(content)
        moved = motion != self._motion and motion != self._motion_before
        if motion != self._motion:
            self._motion_before, self._motion = self._motion, motion
        return moved


class NodeEntries:
    """Each node's part of `RayObservation.content`, kept while its node object is handed on
    (the poller keeps an unchanged node's object, `unchanged.py`): a reply with new demand
    reuses every entry (one identity pass in C when no node changed), one with changed nodes
    builds theirs only; two contents whose entries are the same objects compare at C speed.
    Owned by the poller; holds the last content's nodes only."""

    def __init__(self) -> None:
        self._nodes: tuple[RayNode, ...] = ()
        self._entries: tuple[object, ...] = ()
        self._by_id: dict[str, tuple[RayNode, object]] = {}

    def of(self, nodes: tuple[RayNode, ...]) -> tuple[object, ...]:
        if len(nodes) == len(self._nodes) and all(map(operator.is_, nodes, self._nodes)):
            return self._entries
        last, by_id = self._by_id, {}
        entries = []
        for node in nodes:
            found = last.get(node.node_id)
            if found is None or found[0] is not node:
                found = (node, node_content(node))
            by_id[node.node_id] = found
            entries.append(found[1])
        self._nodes, self._entries, self._by_id = nodes, tuple(entries), by_id
        return self._entries


def _without_epoch(content: object) -> object:
    # RayObservation.content(): ("known", epoch, ...) or ("unknown", epoch).
    return content[:1] + content[2:] if isinstance(content, tuple) else content


def _copied(reply: Any) -> Any:
    copy = _Reply()
    copy.CopyFrom(reply)
    return copy


def _version(reply: Any) -> int:
    state = getattr(reply, "cluster_resource_state", None)
    return int(getattr(state, "cluster_resource_state_version", 0) or 0)
