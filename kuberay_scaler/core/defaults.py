"""Every default that more than one layer needs, in one place.

Settings (the environment) starts from these; the adapters', the loop's and the planner's own
keyword defaults are the same values, so a component built without Settings (tests, the `plan`
command, the demo) behaves as the daemon does.
"""

from __future__ import annotations

# The RayCluster CRD (KUBERAY_CRD_VER picks the version).
RAY_API_GROUP = "ray.io"
CRD_VERSION = "v1"

# GCS side.
# The longest wait between polls; small or busy clusters are polled sooner
# (adapters/ray_gcs/cadence.py).
GCS_POLL_INTERVAL_S = 5.0
GCS_RPC_TIMEOUT_S = 5.0
GCS_STALE_AFTER_S = 15.0
DRAIN_DEADLINE_S = 30.0
# A busy slice above maxReplicas (the user lowered it) is drained (reason preemption) this long
# before it is deleted. Ray's own autoscaler stops such a node at once; 30 s is the notice a spot
# VM gets on GCE and a pod's default termination grace, so work written for preemption gets the
# notice it expects, and the slice is still gone within KubeRay's e2e budget of 60 s.
PREEMPT_DEADLINE_S = 30.0
# A busy slice on a node with GKE maintenance scheduled gets its replacement launched this long
# before the window: a TPU slice takes minutes to come up, and a replacement added
# days ahead would only idle out. Its drain starts PREEMPT_DEADLINE_S before the window.
MAINTENANCE_REPLACE_AHEAD_S = 1800.0
# Disruption (docs/planner.md "Disruption"). A group that added a slice removes no idle
# slice for this long: about what a TPU slice takes to come up on GKE (node pool scale-up, image
# pull, Ray join: minutes), so no slice is removed sooner than a new one could come back. Shorter
# than the cluster-autoscaler's 10 min, which also covers its guess of utilisation; Ray tells us.
SCALE_DOWN_DELAY_AFTER_ADD_S = 300.0
# Slices of one group leaving at once by voluntary disruption: the cluster-autoscaler's
# --max-scale-down-parallelism (10), so every group of up to 10 slices behaves as before.
DISRUPTION_BUDGET = "10"

# Kubernetes side.
K8S_REQUEST_TIMEOUT_S = 30.0
MAX_RETRY_AFTER_S = 60.0  # a Retry-After is honoured up to this, never longer
WATCH_SILENCE_TIMEOUT_S = 120.0
RESYNC_INTERVAL_S = 30.0
# Poll mode (KubeRay's Role: get/patch on rayclusters, no watch): GET the RayCluster this often, so
# a spec edit is acted on in ~1.5 s (p50) and < 3 s (p99). Two GETs per 5 s: as many requests as
# Ray's own 5 s loop (GET RayCluster + LIST every pod), a small fraction of its bytes.
RAYCLUSTER_POLL_INTERVAL_S = 2.5
# A burst of pod events brings the next GET forward, never closer than this to the previous one.
RAYCLUSTER_MIN_GET_GAP_S = 1.0
DEBOUNCE_S = 0.2
WRITE_EXPECTATION_TIMEOUT_S = 60.0

# Liveness, judged by progress: /healthz fails when the loop has had work to do (a write, a
# drain, demand to serve) and has not achieved it for UNHEALTHY_AFTER_S, or after this many
# failed attempts since it last did (a held reconcile that had nothing to do is not a failure).
UNHEALTHY_AFTER_FAILURES = 5
UNHEALTHY_AFTER_S = 300.0
# A target that does not exist or is not served (RayCluster 404, CRD version not served, 401/403
# that persist): not ready at once, and the process exits non-zero after this long, so drop-in
# mode (no probes) shows the restarts. A server that is merely down never makes it exit.
GIVE_UP_AFTER_S = 600.0

# Another writer reset a group's replicas: hands off the group this long, doubling per override
# up to the max; an override older than the memory no longer counts toward the doubling.
OVERRIDE_BACKOFF_S = 120.0
OVERRIDE_BACKOFF_MAX_S = 1800.0
OVERRIDE_MEMORY_S = 3600.0

# Slices and replacement.
MAX_PROVISION_TIME_S = 900.0
# Group availability: an unavailable group (stockout, quota, ...) waits this long
# before one slice is tried again, doubling per failed probe up to the max.
UNAVAILABLE_BACKOFF_S = 180.0
UNAVAILABLE_MAX_BACKOFF_S = 1800.0
# Pods still Unschedulable this long after the cluster-autoscaler said NotTriggerScaleUp: the
# group is unavailable.
CAPACITY_GRACE_S = 60.0
MISSING_NODE_GRACE_S = 180.0
REPLACE_BACKOFF_S = 300.0
MAX_REPLACE_BACKOFF_S = 1800.0
# A slice whose drain every host refused is retried when its Ray idle state changes, or after
# this wait (doubling per refused round, capped), never at once.
DRAIN_RETRY_S = 10.0
MAX_DRAIN_RETRY_S = 300.0
# A broken slice kept because a host is busy is kept at most this long; then its live hosts are
# drained for preemption (PREEMPT_DEADLINE_S) and it is replaced whole.
BROKEN_BUSY_MAX_S = 1800.0
# A worker host whose Ray container started less than this long ago is whole only just now: the
# GCS may report the work that moved onto it both as running there and as still pending (each
# raylet reports its own resources and queued demand apart). Demand its used part can hold waits
# that long at most before a slice is added for it (planner/capacity.py `_settling_bin`); read
# from the pod's own `startedAt`, so an offline `plan --capture` decides alike.
JOIN_SETTLE_S = 30.0
# A slice launched for a slice reservation (ray.util.tpu.SlicePlacementGroup) is kept this long
# after the last reservation its group served was pending. Ray waits at most 100 s
# for each reservation (DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S in Ray 2.60), then removes it and
# every head the SlicePlacementGroup held; a real slice takes minutes to come up, so it arrives
# after its reservation is gone. 600 s covers the rest of its provisioning after that timeout,
# a few 100 s attempts of a caller's retry, and the goal: no launch, delete, relaunch
# within 10 min.
RESERVATION_GRACE_S = 600.0


def raycluster_api(version: str = CRD_VERSION) -> str:
    """`ray.io/v1`: the apiVersion of RayCluster objects."""
    return f"{RAY_API_GROUP}/{version}"


def rayclusters_path(namespace: str, version: str = CRD_VERSION) -> str:
    """The collection URL of RayClusters in `namespace`."""
    return f"/apis/{RAY_API_GROUP}/{version}/namespaces/{namespace}/rayclusters"
