"""Capacity signals from Events: the cluster-autoscaler's on our pods, KubeRay's on our RayCluster.

Only where the token may get/list/watch `events` (KubeRay's own Role may not; the optional
deploy/capacity-events Role grants it): `detect_access` asks at start, and a 403 from a watch
later turns the reader off for good. Either way it says once which signals the daemon runs with
(`capacity signals` log line; `document()` for /debug/plan). Off, `events()` is empty and the
planner has the pod conditions and the provisioning deadline.

Two informers, each selecting on the server: `involvedObject.kind=Pod,source=cluster-autoscaler`
and `involvedObject.kind=RayCluster,involvedObject.name=<name>`. Every Event is parsed once, as
it arrives (core/parse/events.py); what the store keeps per Event is its parsed `CapacityEvent`
when it is capacity news about a pod named like ours (or our RayCluster), else a name-only stub.
`events()` is the newest per (pod, reason) of pods in the pod cache now, plus the RayCluster's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict
from typing import Any

import structlog
from kubernetes_asyncio.client import ApiClient

from kuberay_scaler.adapters.kube.informer import Change, Informer, Source, notify
from kuberay_scaler.core.defaults import WATCH_SILENCE_TIMEOUT_S
from kuberay_scaler.core.model.signals import CapacityEvent
from kuberay_scaler.core.parse.events import (
    CLUSTER_AUTOSCALER,
    newest_per_key,
    parse_event,
    pod_name_prefix,
)
from kuberay_scaler.runtime.metrics import KubeCounters

log = structlog.get_logger(__name__)

RawObject = dict[str, Any]
_PARSED = "capacity"  # where a stored stub keeps its parsed event
_FORBIDDEN_CHECK_S = 1.0
# What the planner always has, Events or not.
ALWAYS = ("pod conditions (Unschedulable, image pull, crash loop)", "provisioning deadline")
FROM_EVENTS = ("cluster-autoscaler Events on pods", "KubeRay Events on the RayCluster")
NOT_READ = "not read: the Role grants no get/list/watch on events (deploy/capacity-events adds it)"


class CapacityEventsReader:
    """Implements `loop.ports.CapacityFeed`; run `run()` as a task (it returns at once when
    reading is off). `on_change()` runs when the capacity news changes; it must not block."""

    def __init__(
        self,
        api: ApiClient,
        *,
        namespace: str,
        cluster: str,
        enabled: bool,
        pods: Callable[[], Mapping[str, Any]],
        groups: Callable[[], Collection[str]] = tuple,
        on_change: Callable[[], None] | None = None,
        silent_timeout: float = WATCH_SILENCE_TIMEOUT_S,
        counters: KubeCounters | None = None,
    ) -> None:
        self._cluster = cluster
        self._prefix = pod_name_prefix(cluster)
        self._pods = pods
        self._groups = groups
        self._on_change = on_change
        self._off = asyncio.Event()
        self.state = "read" if enabled else NOT_READ
        path = f"/api/v1/namespaces/{namespace}/events"
        counters = counters or KubeCounters.new()
        self._informers = (
            Informer(
                api,
                Source(
                    "events",
                    path,
                    field_selector=f"involvedObject.kind=Pod,source={CLUSTER_AUTOSCALER}",
                ),
                silent_timeout=silent_timeout,
                on_change=self._changed,
                transform=self._slim,
                counters=counters,
            ),
            Informer(
                api,
                Source(
                    "events",
                    path,
                    field_selector=f"involvedObject.kind=RayCluster,involvedObject.name={cluster}",
                ),
                silent_timeout=silent_timeout,
                on_change=self._changed,
                transform=self._slim,
                counters=counters,
            ),
        )
        if not enabled:
            self._off.set()
        log.info("capacity signals", events=self.state, signals=list(self.signals()))

    @property
    def reading(self) -> bool:
        return not self._off.is_set()

    def signals(self) -> tuple[str, ...]:
        """What the planner learns capacity from, with this token."""
        return (*FROM_EVENTS, *ALWAYS) if self.reading else ALWAYS

    def events(self) -> tuple[CapacityEvent, ...]:
        if not self.reading:
            return ()
        pods = self._pods()
        kept = (
            parsed
            for informer in self._informers
            for stub in informer.store.values()
            if (parsed := stub.get(_PARSED)) is not None
            and (parsed.pod is None or parsed.pod in pods)
        )
        return newest_per_key(kept)

    def document(self) -> dict[str, Any]:
        """/debug/plan's `capacity_signals`: how the signals are read, and what they say now."""
        return {
            "events": self.state,
            "signals": list(self.signals()),
            "synced": all(i.synced for i in self._informers) if self.reading else None,
            "capacity_events": [asdict(e) for e in self.events()],
        }

    async def run(self) -> None:
        """List and watch until cancelled, or until a 403 turns reading off."""
        if not self.reading:
            return
        tasks = [asyncio.create_task(informer.run()) for informer in self._informers]
        try:
            while self.reading:
                # A 403 before the first list flips nothing the informer reports: look.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_FORBIDDEN_CHECK_S):
                        await self._off.wait()
                self._check_forbidden()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    # --- informer callbacks ---------------------------------------------------------------------

    def _slim(self, raw: RawObject) -> RawObject:
        """What the store keeps of one Event: its name and version, and its capacity news when
        it is about our RayCluster or a pod named like ours."""
        meta = raw.get("metadata") or {}
        stub: RawObject = {
            "metadata": {"name": meta.get("name"), "resourceVersion": meta.get("resourceVersion")}
        }
        parsed = parse_event(raw, cluster=self._cluster, groups=self._group_names())
        if parsed is not None and (parsed.pod is None or parsed.pod.startswith(self._prefix)):
            stub[_PARSED] = parsed
        return stub

    def _group_names(self) -> Collection[str]:
        try:
            return self._groups()
        except Exception:  # the view's object is the user's: never let it stop the watch
            return ()

    def _changed(self, changes: Sequence[Change]) -> None:
        if not changes:  # a synced flip: is it a 403?
            self._check_forbidden()
        elif any(_PARSED in c.object for c in changes):
            self._notify()

    def _check_forbidden(self) -> None:
        if self.reading and any(i.failure_status == 403 for i in self._informers):
            self.state = "not read: the watch got 403 Forbidden (Role changed?); turned off"
            log.warning("capacity signals", events=self.state, signals=list(ALWAYS))
            self._off.set()
            self._notify()

    def _notify(self) -> None:
        notify(self._on_change, log, "capacity on_change callback failed")
