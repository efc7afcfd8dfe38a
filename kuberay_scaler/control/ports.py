"""What the control loop needs from the outside world, as Protocols.

The adapters (kube/, ray_gcs/) implement these; tests use the fakes in tests/control/fakes.py.
The loop never constructs an adapter: app.py wires them in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from kuberay_scaler.kube.writer import PatchOutcome
from kuberay_scaler.ray_gcs.drain import DrainClient

RawObject = dict[str, Any]


class PodStore(Protocol):
    """The pods of the cluster as last listed/watched (kube.informer.Informer)."""

    @property
    def store(self) -> Mapping[str, RawObject]: ...

    @property
    def synced(self) -> bool: ...


class ClusterView(Protocol):
    """The RayCluster as last seen (kube.raycluster.RayClusterView)."""

    def current(self) -> RawObject | None: ...

    @property
    def synced(self) -> bool: ...

    def observe(self, obj: RawObject) -> None:
        """Take a copy fresher than the cache (what a successful patch returned)."""

    async def refresh(self) -> RawObject | None:
        """GET now; raises the adapter's error when the GET fails."""


class Gcs(DrainClient, Protocol):
    """The GCS calls the loop makes (ray_gcs.client.GcsClient): drains, and these."""

    async def report(self, state: Any) -> int: ...

    async def get_cluster_resource_state(self) -> Any:
        """A fresh GetClusterResourceStateReply (read right before draining)."""


class GcsFeed(Protocol):
    """The poller's side channel: ask for a poll soon (right after drains)."""

    def poll_soon(self) -> None: ...


class Writer(Protocol):
    """Guarded JSON patches of the RayCluster (kube.writer.RayClusterWriter)."""

    async def apply(self, ops: Sequence[dict[str, Any]], *, expected_uid: str) -> PatchOutcome: ...


class Events(Protocol):
    """Kubernetes Events on the RayCluster (kube.events.EventRecorder); never raises."""

    async def record(self, reason: str, message: str) -> None: ...
