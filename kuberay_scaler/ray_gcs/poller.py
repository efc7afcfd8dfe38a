"""Poll `GetClusterResourceState` and publish what the GCS said, or that we do not know.

An observation with `reply=None` means "unknown": unreachable, restarted, replaced, refused. The
planner must hold on unknown, never read it as "no demand". `gcs_epoch` counts the GCS
incarnations we have seen: it grows when the cluster id changes (a new GCS) or when the
`cluster_resource_state_version` counter, which only ever grows inside one GCS process, goes
back (a GCS restarted with fault tolerance keeps its cluster id but loses that counter).
Every report the loop sends is a full one, so a GCS that forgot the last one is told again at
the next reconcile.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from kuberay_scaler.metrics import GCS_CONNECTED
from kuberay_scaler.ray_gcs.cadence import Cadence
from kuberay_scaler.ray_gcs.errors import GcsError

log = structlog.get_logger(__name__)


class StateSource(Protocol):
    """What the poller needs from `GcsClient`."""

    @property
    def cluster_id(self) -> str | None: ...

    async def get_cluster_resource_state(self) -> Any: ...


@dataclass(frozen=True)
class GcsObservation:
    """One poll's result. `reply` is a `GetClusterResourceStateReply`, or None when unknown."""

    reply: Any
    observed_at: float  # monotonic seconds
    cluster_id: str | None
    error: str | None
    gcs_epoch: int

    @property
    def known(self) -> bool:
        return self.reply is not None

    def fresh(self, now: float, max_age: float) -> bool:
        """Known and no older than `max_age` seconds at monotonic time `now`."""
        return self.known and now - self.observed_at <= max_age


class GcsPoller:
    """Polls at most `interval_s` apart, sooner while polls are cheap or the state moves (see
    `cadence`); `on_observation` gets every observation, `on_change` each one whose content
    changed (to wake the loop)."""

    def __init__(
        self,
        client: StateSource,
        *,
        interval_s: float,
        on_change: Callable[[GcsObservation], None] | None = None,
        on_observation: Callable[[GcsObservation], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"poll interval must be positive, got {interval_s}")
        self._client = client
        self._interval_s = interval_s
        self._on_change = on_change
        self._on_observation = on_observation
        self._monotonic = monotonic
        self._epoch = 0
        self._cluster_id: str | None = None
        self._last_version = -1
        self._fingerprint: object = None
        self._cadence = Cadence(ceiling_s=interval_s)
        self._last_cost_s = 0.0
        self._last_change = monotonic()
        self.content_version = 0  # rises whenever the content (not the version) changed
        self._wake = asyncio.Event()
        self._unknown_kind: str | None = None  # the kind of failure last logged
        self.latest = GcsObservation(
            reply=None,
            observed_at=monotonic(),
            cluster_id=None,
            error="not polled yet",
            gcs_epoch=0,
        )

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
            demand_pending=_demand_pending(self.latest.reply),
            last_change=self._last_change,
            now=self._monotonic(),
        )

    async def poll_once(self) -> GcsObservation:
        cpu = time.process_time()
        try:
            try:
                reply = await self._client.get_cluster_resource_state()
            except GcsError as err:
                return self._publish(self._unknown(err))
            return self._publish(self._known(reply))
        finally:
            self._last_cost_s = time.process_time() - cpu

    def _unknown(self, err: GcsError) -> GcsObservation:
        error = str(err)
        # Once per state change: the message itself changes on every poll during a backoff.
        kind = type(err).__name__
        if self.latest.known or self._unknown_kind != kind:
            log.warning("gcs_state_unknown", error=error, gcs_epoch=self._epoch)
        self._unknown_kind = kind
        GCS_CONNECTED.set(0)
        return GcsObservation(
            reply=None,
            observed_at=self._monotonic(),
            cluster_id=self._cluster_id,
            error=error,
            gcs_epoch=self._epoch,
        )

    def _known(self, reply: Any) -> GcsObservation:
        cluster_id = self._client.cluster_id
        version = int(reply.cluster_resource_state.cluster_resource_state_version)
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
        GCS_CONNECTED.set(1)
        self._cluster_id = cluster_id
        self._last_version = version
        return GcsObservation(
            reply=reply,
            observed_at=self._monotonic(),
            cluster_id=cluster_id,
            error=None,
            gcs_epoch=self._epoch,
        )

    def _publish(self, observation: GcsObservation) -> GcsObservation:
        self.latest = observation
        if self._on_observation is not None:
            self._on_observation(observation)
        fingerprint = _fingerprint(observation)
        if fingerprint != self._fingerprint:
            self._fingerprint = fingerprint
            self.content_version += 1
            self._last_change = self._monotonic()
            if self._on_change is not None:
                self._on_change(observation)
        return observation


def _fingerprint(observation: GcsObservation) -> object:
    """The observation minus what changes on every poll (counters, idle clocks).

    The volatile fields are zeroed in place and serialized; the ones anything reads (the state
    version, idle clocks) are then restored. No copy of a 10k-node reply is made, and nothing
    else runs in between (one event loop, no await). `node_state_version` is read by nothing
    and stays zero.
    """
    if observation.reply is None:
        return ("unknown", observation.error, observation.gcs_epoch)
    state = observation.reply.cluster_resource_state
    versions = state.cluster_resource_state_version, state.last_seen_autoscaler_state_version
    nodes = state.node_states
    idle_ms = [n.idle_duration_ms for n in nodes]
    state.cluster_resource_state_version = state.last_seen_autoscaler_state_version = 0
    for node in nodes:
        node.node_state_version = node.idle_duration_ms = 0
    try:
        data = state.SerializeToString(deterministic=True)
    finally:
        state.cluster_resource_state_version, state.last_seen_autoscaler_state_version = versions
        for node, ms in zip(nodes, idle_ms, strict=True):
            if ms:
                node.idle_duration_ms = ms
    return ("known", observation.gcs_epoch, data)


def _demand_pending(reply: Any) -> bool:
    if reply is None:
        return False
    state = reply.cluster_resource_state
    return bool(
        state.pending_resource_requests
        or state.pending_gang_resource_requests
        or state.cluster_resource_constraints
    )
