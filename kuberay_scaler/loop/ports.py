"""What the loop needs from the outside world, as Protocols over plain data.

The adapters (kube/, ray_gcs/) implement these; tests use the fakes in tests/control/fakes.py.
The loop never constructs an adapter (app.py wires them in) and never imports one: what crosses
these seams is the core's data (model/), so no protobuf and no HTTP type reaches loop/.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from kuberay_scaler.core.model.drains import DrainReason, SliceDrainResult
from kuberay_scaler.core.model.outcome import PatchOutcome
from kuberay_scaler.core.model.ray import RayObservation
from kuberay_scaler.core.model.report import AutoscalingReport
from kuberay_scaler.core.model.signals import CapacityEvent, NodeMaintenance
from kuberay_scaler.core.patch.ops import Op

RawObject = dict[str, Any]


class PodStore(Protocol):
    """The pods of the cluster as last listed/watched (kube.informer.Informer)."""

    @property
    def store(self) -> Mapping[str, RawObject]: ...

    @property
    def synced(self) -> bool: ...

    @property
    def failure_status(self) -> int | None:
        """HTTP status of the last failed list/watch, until one succeeds."""


class ClusterView(Protocol):
    """The RayCluster as last seen (kube.raycluster.RayClusterView)."""

    def current(self) -> RawObject | None: ...

    @property
    def synced(self) -> bool: ...

    @property
    def failure_status(self) -> int | None:
        """HTTP status of the last failed read, until one succeeds (None: none, or no answer)."""

    def observe(self, obj: RawObject) -> None:
        """Take a copy fresher than the cache (what a successful patch returned)."""

    async def refresh(self) -> RawObject | None:
        """GET now; raises the adapter's error when the GET fails."""


class CapacityFeed(Protocol):
    """Capacity news read from Events (kube.capacity.CapacityEventsReader): the newest per
    (pod, reason) for the cluster's pods now, and the RayCluster's; empty where the Role
    cannot read Events."""

    def events(self) -> tuple[CapacityEvent, ...]:
        """Oldest first."""


class NodeFeed(Protocol):
    """GKE maintenance announced on nodes (kube.nodes.NodeMaintenanceReader); empty where the
    token may not read nodes."""

    def maintenance(self) -> Mapping[str, NodeMaintenance]:
        """Node name → its announcement, for the nodes that announce one."""
        ...


class Gcs(Protocol):
    """The GCS calls the loop makes (ray_gcs.adapter.RayGcs)."""

    @property
    def cluster_id(self) -> str | None: ...

    async def fresh_state(self) -> RayObservation:
        """Ray's state read now (right before draining); unknown when the read fails."""

    async def drain(
        self,
        node_ids: Sequence[str],
        *,
        reason: DrainReason,
        message: str,
        deadline_ms: int,
        cluster_id: str | None,
    ) -> SliceDrainResult:
        """Drain every host (hex node ids) of one slice, pinned to `cluster_id`."""

    async def report(self, report: AutoscalingReport) -> bool:
        """Tell Ray what we are doing (`ray status`); False when it did not take it."""


class GcsFeed(Protocol):
    """The poller's side channel: ask for a poll soon (right after drains)."""

    def poll_soon(self) -> None: ...


class Writer(Protocol):
    """Guarded JSON patches of the RayCluster (kube.writer.RayClusterWriter)."""

    async def apply(self, ops: Sequence[Op], *, expected_uid: str) -> PatchOutcome: ...


class Events(Protocol):
    """Kubernetes Events on the RayCluster (kube.events.EventRecorder); never raises."""

    async def record(self, reason: str, message: str) -> None: ...
