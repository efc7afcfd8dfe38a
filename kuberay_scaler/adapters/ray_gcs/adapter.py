"""The loop's `Gcs` port (loop/ports.py) over one `GcsClient` and its poller.

Everything the loop sends or receives here is plain data (model/): a `RayObservation` from a
fresh read, a `SliceDrainResult` per slice drained (hex node ids), an `AutoscalingReport` to
tell Ray. The protobuf messages are built and read in this package only.
"""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from kuberay_scaler.adapters.ray_gcs.client import GcsClient
from kuberay_scaler.adapters.ray_gcs.drain import drain_slice
from kuberay_scaler.adapters.ray_gcs.errors import GcsError
from kuberay_scaler.adapters.ray_gcs.poller import GcsPoller
from kuberay_scaler.adapters.ray_gcs.report import build_autoscaling_state
from kuberay_scaler.core.model.drains import DrainReason, SliceDrainResult
from kuberay_scaler.core.model.ray import RayObservation
from kuberay_scaler.core.model.report import AutoscalingReport
from kuberay_scaler.runtime.metrics import GcsCounters

log = structlog.get_logger(__name__)


class RayGcs:
    """Implements `loop.ports.Gcs`."""

    def __init__(
        self, client: GcsClient, poller: GcsPoller, *, counters: GcsCounters | None = None
    ) -> None:
        self._client = client
        self._poller = poller
        self._counters = counters or GcsCounters.new()

    @property
    def cluster_id(self) -> str | None:
        return self._client.cluster_id

    async def fresh_state(self) -> RayObservation:
        """Read the state now (right before draining); unknown when the read fails."""
        return await self._poller.read_now()

    async def drain(
        self,
        node_ids: Sequence[str],
        *,
        reason: DrainReason,
        message: str,
        deadline_ms: int,
        cluster_id: str | None,
    ) -> SliceDrainResult:
        return await drain_slice(
            self._client,
            node_ids,
            reason_message=message,
            deadline_ms=deadline_ms,
            cluster_id=cluster_id,
            reason=reason,
            counters=self._counters,
        )

    async def report(self, report: AutoscalingReport) -> bool:
        """Tell Ray what we are doing; False when the GCS did not take it (it only informs)."""
        try:
            await self._client.report(build_autoscaling_state(report))
        except GcsError as err:
            log.debug("report to GCS failed", error=str(err))
            return False
        return True
