"""Prometheus metrics. Nothing reads these back for decisions.

`Metrics` holds what the loop says (reconciles, decisions, slices, health, availability) in a
registry of its own: the composition root (app.py) makes one and hands it to the recorder
(loop/record.py) and to the web server (/metrics); a test makes its own and reads it without
touching any other. The adapters' request counters below are still process-wide (`REGISTRY`):
every `Metrics` serves them too, so /metrics shows all of them from one registry.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# --- the adapters (kube/, ray_gcs/): process-wide, registered into every `Metrics` ----------
REGISTRY = CollectorRegistry(auto_describe=True)

API_REQUESTS = Counter(
    "kuberay_scaler_api_requests_total",
    "Kubernetes API requests by verb, resource and HTTP code ('error' when no response).",
    ["verb", "resource", "code"],
    registry=REGISTRY,
)
WATCH_RESTARTS = Counter(
    "kuberay_scaler_watch_restarts_total",
    "Watch streams restarted, by resource and cause (closed, silent, gone, error).",
    ["resource", "cause"],
    registry=REGISTRY,
)
GCS_RTT_SECONDS = Histogram(
    "kuberay_scaler_gcs_rpc_duration_seconds",
    "Round-trip time of GCS RPCs by method.",
    ["method"],
    registry=REGISTRY,
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5),
)
GCS_ERRORS = Counter(
    "kuberay_scaler_gcs_rpc_errors_total",
    "GCS RPC failures by method and gRPC status code.",
    ["method", "code"],
    registry=REGISTRY,
)
DRAINS = Counter(
    "kuberay_scaler_drains_total",
    "DrainNode outcomes per host (accepted, rejected, error).",
    ["outcome"],
    registry=REGISTRY,
)
PATCHES = Counter(
    "kuberay_scaler_patches_total",
    "RayCluster patch outcomes (applied, stale, invalid, forbidden, throttled, transient, gone).",
    ["outcome"],
    registry=REGISTRY,
)
GCS_CONNECTED = Gauge(
    "kuberay_scaler_gcs_connected",
    "1 while the last GCS poll got an answer, 0 while the GCS is unreachable or refusing.",
    registry=REGISTRY,
)
_ADAPTERS = (
    API_REQUESTS,
    WATCH_RESTARTS,
    GCS_RTT_SECONDS,
    GCS_ERRORS,
    DRAINS,
    PATCHES,
    GCS_CONNECTED,
)


class Metrics:
    """The loop's metrics in a registry of their own (plus the adapters' shared ones)."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.reconcile_seconds = Histogram(
            "kuberay_scaler_reconcile_duration_seconds",
            "Wall time of one reconcile (snapshot, plan, drain, patch).",
            registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.reconciles = Counter(
            "kuberay_scaler_reconciles_total",
            "Reconciles by outcome (ok, held, error).",
            ["outcome"],
            registry=r,
        )
        self.decisions = Counter(
            "kuberay_scaler_decisions_total",
            "Scaling decisions by group, action and reason code.",
            ["group", "action", "reason"],
            registry=r,
        )
        self.slices = Gauge(
            "kuberay_scaler_slices",
            "Slices per worker group by state.",
            ["group", "state"],
            registry=r,
        )
        self.target_replicas = Gauge(
            "kuberay_scaler_target_replicas",
            "Replicas (slices) the last plan asked for, per group.",
            ["group"],
            registry=r,
        )
        for collector in _ADAPTERS:
            r.register(collector)
        self.last_successful_reconcile = Gauge(
            "kuberay_scaler_last_successful_reconcile_timestamp_seconds",
            "Unix time of the last reconcile whose inputs were fresh and whose planned writes"
            " were all done (a held or backed-off reconcile does not count).",
            registry=r,
        )
        self.reconcile_failures = Counter(
            "kuberay_scaler_reconcile_failures_total",
            "Failed reconciles by cause (the exception type, or patch_<outcome>, or stale).",
            ["cause"],
            registry=r,
        )
        self.overrides = Counter(
            "kuberay_scaler_overrides_total",
            "Times another writer reset a group's replicas after ours (we then back off for the"
            " group).",
            ["group"],
            registry=r,
        )
        # --- the deletion gate (core/planner/gate.py) ---
        self.deletions_blocked = Counter(
            "kuberay_scaler_deletions_blocked_total",
            "Slice deletions the deletion gate dropped, by the planner path that made them;"
            " non-zero means a planner path disagreed with the gate (each is logged at error).",
            ["path"],
            registry=r,
        )
        # --- health by progress ---
        self.blind_seconds = Gauge(
            "kuberay_scaler_blind_seconds",
            "Seconds an input has been unknown or stale (0 while fresh), by source (gcs, pods,"
            " raycluster).",
            ["source"],
            registry=r,
        )
        self.oldest_unmet_want = Gauge(
            "kuberay_scaler_oldest_unmet_want_seconds",
            "Age of the oldest want the plan has had of a group (replicas, deletions) that the"
            ' cluster does not show yet, by group (0: none); group "*" while an input is'
            " unknown. /healthz fails past KUBERAY_SCALER_UNHEALTHY_AFTER_S.",
            ["group"],
            registry=r,
        )
        # --- group availability and fallback ---
        self.group_available = Gauge(
            "kuberay_scaler_group_available",
            "1 while a worker group can get capacity (available or suspect), 0 while it is"
            " unavailable; cause: none, suspect, or why it is unavailable (stockout, quota,"
            " unschedulable, image, provisioning-deadline).",
            ["group", "cause"],
            registry=r,
        )
        self.fallbacks = Counter(
            "kuberay_scaler_fallbacks_total",
            "Slices opened in group `to` for demand that prefers the unavailable group `from`.",
            ["from", "to", "cause"],
            registry=r,
        )

    def sample(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        """One sample's value (tests, and anything reading its own metrics back)."""
        return self.registry.get_sample_value(name, labels)
