"""Ray GCS adapter: the only package that talks gRPC to Ray (see docs/ray-gcs.md).

- `client`: `GcsClient`, the grpc.aio client (auth, TLS, cluster id, reconnect, metrics).
- `poller`: `GcsPoller` publishes parsed `RayObservation`s; unknown state is explicit.
- `adapter`: `RayGcs`, the loop's `Gcs` port (fresh read, drains, report) over plain data.
- `drain`: `drain_slice`, all hosts of a slice or none.
- `report`: `AutoscalingReport` → `AutoscalingState` for `ray status`.
- `errors`: `GcsError` and its kinds.

Importing this package imports `ray` (about a second and ~80 MB): keep it out of pure code.
"""

from kuberay_scaler.adapters.ray_gcs.client import GcsClient, TlsFiles
from kuberay_scaler.adapters.ray_gcs.drain import (
    HostDrain,
    SliceDrainResult,
    deadline_in,
    drain_slice,
)
from kuberay_scaler.adapters.ray_gcs.errors import (
    GcsAuthError,
    GcsCallError,
    GcsError,
    GcsReplaced,
    GcsUnavailable,
)
from kuberay_scaler.adapters.ray_gcs.poller import GcsPoller
from kuberay_scaler.adapters.ray_gcs.report import (
    AutoscalingReport,
    FailedRequest,
    LaunchingGroup,
    PendingPod,
    StateVersionClock,
    build_autoscaling_state,
)

__all__ = [
    "AutoscalingReport",
    "FailedRequest",
    "GcsAuthError",
    "GcsCallError",
    "GcsClient",
    "GcsError",
    "GcsPoller",
    "GcsReplaced",
    "GcsUnavailable",
    "HostDrain",
    "LaunchingGroup",
    "PendingPod",
    "SliceDrainResult",
    "StateVersionClock",
    "TlsFiles",
    "build_autoscaling_state",
    "deadline_in",
    "drain_slice",
]
