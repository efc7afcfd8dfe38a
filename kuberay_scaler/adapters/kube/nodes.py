"""GKE maintenance signals from nodes: the scheduled-maintenance-time label (or annotation) and
the impending-node-termination taint (docs/capacity-signals.md, "GKE maintenance").

Only where the token may get/list/watch `nodes` (cluster-scoped; KubeRay's Role may not, the
optional deploy/node-maintenance ClusterRole grants it): `detect_access` asks at start, and a
403 from the watch later turns the reader off for good. Either way it says once whether the
planner sees maintenance (`node maintenance` log line; `document()` for /debug/plan). Off,
`maintenance()` is empty and the planner has DisruptionTarget on pods alone.

One informer over every node (a taint cannot be selected on the server); each node is slimmed
to its name and its maintenance facts as it arrives (core/parse/nodes.py), so the store holds a
few fields per node, and the loop is woken only when what some node announces changes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from types import MappingProxyType
from typing import Any

import structlog
from kubernetes_asyncio.client import ApiClient

from kuberay_scaler.adapters.kube.informer import Change, Informer, Source, notify
from kuberay_scaler.core.defaults import WATCH_SILENCE_TIMEOUT_S
from kuberay_scaler.core.model.signals import NodeMaintenance
from kuberay_scaler.core.parse.nodes import node_maintenance, slim_node
from kuberay_scaler.runtime.metrics import KubeCounters

log = structlog.get_logger(__name__)

_FORBIDDEN_CHECK_S = 1.0
NOT_READ = "not read: no get/list/watch on nodes (deploy/node-maintenance adds it)"


class NodeMaintenanceReader:
    """Implements `loop.ports.NodeFeed`; run `run()` as a task (it returns at once when
    reading is off). `on_change()` runs when some node's announcement changes; never blocks."""

    def __init__(
        self,
        api: ApiClient,
        *,
        enabled: bool,
        on_change: Callable[[], None] | None = None,
        silent_timeout: float = WATCH_SILENCE_TIMEOUT_S,
        counters: KubeCounters | None = None,
    ) -> None:
        self._on_change = on_change
        self._off = asyncio.Event()
        self.state = "read" if enabled else NOT_READ
        self._informer = Informer(
            api,
            Source("nodes", "/api/v1/nodes"),
            silent_timeout=silent_timeout,
            on_change=self._changed,
            transform=slim_node,
            counters=counters,
        )
        self._known: Mapping[str, NodeMaintenance] = MappingProxyType({})
        if not enabled:
            self._off.set()
        log.info("node maintenance", nodes=self.state)

    @property
    def reading(self) -> bool:
        return not self._off.is_set()

    def maintenance(self) -> Mapping[str, NodeMaintenance]:
        return self._known if self.reading else MappingProxyType({})

    def document(self) -> dict[str, Any]:
        """/debug/plan's `node_maintenance`: whether nodes are read, and what they announce."""
        return {
            "nodes": self.state,
            "synced": self._informer.synced if self.reading else None,
            "announced": [asdict(m) for m in self.maintenance().values()],
        }

    async def run(self) -> None:
        """List and watch until cancelled, or until a 403 turns reading off."""
        if not self.reading:
            return
        task = asyncio.create_task(self._informer.run())
        try:
            while self.reading:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_FORBIDDEN_CHECK_S):
                        await self._off.wait()
                self._check_forbidden()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def _changed(self, changes: Sequence[Change]) -> None:
        if not changes:
            self._check_forbidden()
        announced = {
            m.node: m
            for raw in self._informer.store.values()
            if (m := node_maintenance(raw)) is not None
        }
        if announced != dict(self._known):
            self._known = MappingProxyType(announced)
            log.info("node maintenance", announced=[m.describe() for m in announced.values()])
            self._notify()

    def _check_forbidden(self) -> None:
        if self.reading and self._informer.failure_status == 403:
            self.state = "not read: the watch got 403 Forbidden (ClusterRole changed?); turned off"
            log.warning("node maintenance", nodes=self.state)
            self._off.set()
            self._notify()

    def _notify(self) -> None:
        notify(self._on_change, log, "node maintenance on_change callback failed")
