"""Prometheus metrics. Nothing reads these back for decisions.

Every metric has one owner and no registry is module-global: `Metrics` makes its own registry
and holds what the loop says (reconciles, decisions, slices, health, availability) and the
adapters' counters, split by adapter package (`kube`: `KubeCounters`, `gcs`: `GcsCounters`). The
composition root (app.py) makes one `Metrics`, hands `.kube` / `.gcs` to the adapters it builds,
the whole to the recorder (loop/record.py) and to the web server (/metrics); a test makes its own
and reads it without touching any other. An adapter built without counters counts into a set of
its own (a test that does not read them, a one-shot command).
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# --- the adapters' collectors: one function each, so `Metrics` registers them in one order -----


def _api_requests(r: CollectorRegistry) -> Counter:
    return Counter(
        "kuberay_scaler_api_requests_total",
        "Kubernetes API requests by verb, resource and HTTP code ('error' when no response).",
        ["verb", "resource", "code"],
        registry=r,
    )


def _watch_restarts(r: CollectorRegistry) -> Counter:
    return Counter(
        "kuberay_scaler_watch_restarts_total",
        "Watch streams restarted, by resource and cause (closed, silent, gone, error).",
        ["resource", "cause"],
        registry=r,
    )


def _gcs_rpc_duration(r: CollectorRegistry) -> Histogram:
    return Histogram(
        "kuberay_scaler_gcs_rpc_duration_seconds",
        "Round-trip time of GCS RPCs by method.",
        ["method"],
        registry=r,
        buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5),
    )


def _gcs_rpc_errors(r: CollectorRegistry) -> Counter:
    return Counter(
        "kuberay_scaler_gcs_rpc_errors_total",
        "GCS RPC failures by method and gRPC status code.",
        ["method", "code"],
        registry=r,
    )


def _drains(r: CollectorRegistry) -> Counter:
    return Counter(
        "kuberay_scaler_drains_total",
        "DrainNode outcomes per host (accepted, rejected, error).",
        ["outcome"],
        registry=r,
    )


def _patches(r: CollectorRegistry) -> Counter:
    return Counter(
        "kuberay_scaler_patches_total",
        "RayCluster patch outcomes (applied, stale, invalid, forbidden, throttled, transient,"
        " gone).",
        ["outcome"],
        registry=r,
    )


def _gcs_connected(r: CollectorRegistry) -> Gauge:
    return Gauge(
        "kuberay_scaler_gcs_connected",
        "1 while the last GCS poll got an answer, 0 while the GCS is unreachable or refusing.",
        registry=r,
    )


@dataclass(frozen=True)
class KubeCounters:
    """What the Kubernetes adapters (adapters/kube/) count: requests, watch restarts, patches.
    The label names live here, not in the adapters."""

    api_requests: Counter
    watch_restarts: Counter
    patches: Counter
    registry: CollectorRegistry

    @classmethod
    def new(cls, registry: CollectorRegistry | None = None) -> KubeCounters:
        """Counters of their own, in `registry` (default: a new one)."""
        r = registry or CollectorRegistry(auto_describe=True)
        return cls(_api_requests(r), _watch_restarts(r), _patches(r), r)

    def request(self, verb: str, resource: str, code: str) -> None:
        self.api_requests.labels(verb=verb, resource=resource, code=code).inc()

    def watch_restart(self, resource: str, cause: str) -> None:
        self.watch_restarts.labels(resource=resource, cause=cause).inc()

    def patch(self, outcome: str) -> None:
        self.patches.labels(outcome=outcome).inc()

    def sample(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        return self.registry.get_sample_value(name, labels)


@dataclass(frozen=True)
class GcsCounters:
    """What the GCS adapters (adapters/ray_gcs/) count: RPC times and errors, drains, and
    whether the last poll got an answer. The label names live here, not in the adapters."""

    rpc_duration: Histogram
    rpc_errors: Counter
    drains: Counter
    connected: Gauge
    registry: CollectorRegistry

    @classmethod
    def new(cls, registry: CollectorRegistry | None = None) -> GcsCounters:
        """Counters of their own, in `registry` (default: a new one)."""
        r = registry or CollectorRegistry(auto_describe=True)
        return cls(_gcs_rpc_duration(r), _gcs_rpc_errors(r), _drains(r), _gcs_connected(r), r)

    def rpc(self, method: str, seconds: float) -> None:
        self.rpc_duration.labels(method).observe(seconds)

    def rpc_error(self, method: str, code: str) -> None:
        self.rpc_errors.labels(method, code).inc()

    def drain(self, outcome: str) -> None:
        self.drains.labels(outcome).inc()

    def gcs_answered(self, answered: bool) -> None:
        self.connected.set(1 if answered else 0)

    def sample(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        return self.registry.get_sample_value(name, labels)


class Metrics:
    """The loop's metrics and the adapters' counters, in a registry of their own."""

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
        # The adapters' counters, registered here so /metrics keeps its order.
        api_requests, watch_restarts = _api_requests(r), _watch_restarts(r)
        rpc_duration, rpc_errors, drains = _gcs_rpc_duration(r), _gcs_rpc_errors(r), _drains(r)
        patches, connected = _patches(r), _gcs_connected(r)
        self.kube = KubeCounters(api_requests, watch_restarts, patches, r)
        self.gcs = GcsCounters(rpc_duration, rpc_errors, drains, connected, r)
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
