"""What the control loop needs from the outside world, as Protocols over plain data.

The adapters (kube/, ray_gcs/) implement these; tests use the fakes in tests/control/fakes.py.
The loop never constructs an adapter (app.py wires them in) and never imports one: what crosses
these seams is the core's data (model/), so no protobuf and no HTTP type reaches control/.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from kuberay_scaler.core.decision import Decision
from kuberay_scaler.core.model.drains import DrainReason, SliceDrainResult
from kuberay_scaler.core.model.outcome import PatchOutcome
from kuberay_scaler.core.model.plan import Plan
from kuberay_scaler.core.model.ray import RayObservation
from kuberay_scaler.core.model.report import AutoscalingReport
from kuberay_scaler.core.model.signals import CapacityEvent, NodeMaintenance
from kuberay_scaler.core.patch.ops import Op
from kuberay_scaler.core.planner.gate import Blocked
from kuberay_scaler.loop.handsoff import Overridden
from kuberay_scaler.loop.health import LoopStatus, Outcome, Want

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


class Sink(Protocol):
    """Where the loop says what happened: metrics, logs, Events and the status the probes read
    (control.record.Recorder). Never raises."""

    @property
    def status(self) -> LoopStatus: ...

    def published(self, decision: Decision) -> None: ...

    def blocked(self, blocked: Sequence[Blocked]) -> None: ...

    def carrying_out(self, decision: Decision) -> None: ...

    def sent(self, ops: Sequence[Mapping[str, Any]]) -> None: ...

    def applied(self, result: Plan) -> None: ...

    def drains_only(self, result: Plan) -> None: ...

    def not_written(self, result: Plan) -> None: ...

    def replanning(self, error: str) -> None: ...

    def refresh_failed(self, error: str) -> None: ...

    def forbidden(self, message: str) -> None: ...

    def overridden(self, notice: Overridden) -> None: ...

    def recreated(self, old_uid: str, uid: str) -> None: ...

    def crashed(self, error: BaseException) -> None: ...

    def not_served(self, problem: str, *, event: bool) -> None: ...

    def giving_up(self, problem: str, after_s: float) -> None: ...

    def blind(self, seconds: Mapping[str, float]) -> None: ...

    def wanted(self, wants: Mapping[str, Want], now: float) -> None: ...

    def reconciled(self, outcome: Outcome, *, seconds: float, now: float) -> None: ...
