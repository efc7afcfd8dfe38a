"""Every metric has one owner: two `Metrics` in one process share nothing, the adapters'
counters included, and an adapter counts into what it was handed (issue 31)."""

from __future__ import annotations

from typing import Any

from prometheus_client import generate_latest

from kuberay_scaler.adapters.ray_gcs.drain import drain_slice
from kuberay_scaler.adapters.ray_gcs.errors import GcsUnavailable
from kuberay_scaler.adapters.ray_gcs.poller import GcsPoller
from kuberay_scaler.runtime.metrics import Metrics
from tests.factories import gcs_reply


def exposition(metrics: Metrics) -> list[str]:
    """The /metrics text, without the creation times (they differ between any two)."""
    text = generate_latest(metrics.registry).decode()
    return [line for line in text.splitlines() if "_created" not in line]


def count_everything(metrics: Metrics) -> None:
    """One sample into each of the 20 metrics, through the calls their owners make."""
    metrics.kube.request("get", "pods", "200")
    metrics.kube.watch_restart("pods", "gone")
    metrics.kube.patch("applied")
    metrics.gcs.rpc("GetClusterResourceState", 0.01)
    metrics.gcs.rpc_error("DrainNode", "UNAVAILABLE")
    metrics.gcs.drain("accepted")
    metrics.gcs.gcs_answered(True)
    metrics.reconcile_seconds.observe(0.1)
    metrics.reconciles.labels("ok").inc()
    metrics.decisions.labels("g", "up", "DEMAND").inc()
    metrics.slices.labels("g", "busy").set(1)
    metrics.target_replicas.labels("g").set(1)
    metrics.last_successful_reconcile.set(1)
    metrics.reconcile_failures.labels("stale").inc()
    metrics.overrides.labels("g").inc()
    metrics.deletions_blocked.labels("idle").inc()
    metrics.blind_seconds.labels("gcs").set(1)
    metrics.oldest_unmet_want.labels("g").set(1)
    metrics.group_available.labels("g", "none").set(1)
    metrics.fallbacks.labels("a", "b", "stockout").inc()


def test_two_metrics_in_one_process_share_nothing() -> None:
    first, second, fresh = Metrics(), Metrics(), Metrics()
    count_everything(first)
    assert exposition(second) == exposition(fresh)
    changed = set(exposition(first)) - set(exposition(fresh))
    # Every family of the first moved: nothing it counts is served by another.
    families = {line.split(" ")[2] for line in exposition(fresh) if line.startswith("# TYPE")}
    moved = {f for f in families if any(line.startswith(f) for line in changed)}
    assert moved == families, families - moved


def test_the_adapter_counters_are_served_by_their_own_metrics_only() -> None:
    first, second = Metrics(), Metrics()
    first.kube.request("patch", "rayclusters", "200")
    first.gcs.drain("rejected")
    assert first.sample(
        "kuberay_scaler_api_requests_total",
        {"verb": "patch", "resource": "rayclusters", "code": "200"},
    )
    assert first.sample("kuberay_scaler_drains_total", {"outcome": "rejected"}) == 1.0
    assert second.sample("kuberay_scaler_drains_total", {"outcome": "rejected"}) is None
    assert first.kube.registry is first.registry is first.gcs.registry
    assert second.kube.registry is not first.registry


class DownThenUp:
    """A GCS source that refuses once, then answers."""

    cluster_id = "c0ffee"

    def __init__(self, reply: Any) -> None:
        self.calls = 0
        self.reply = reply

    async def get_cluster_resource_state(self) -> Any:
        self.calls += 1
        if self.calls == 1:
            raise GcsUnavailable("connect", "UNAVAILABLE", "refused")
        return self.reply


class RefusingDrains:
    cluster_id = "c0ffee"

    async def drain_node(self, node_id: bytes, **_: Any) -> object:
        raise GcsUnavailable("DrainNode", "UNAVAILABLE", "refused")


async def test_gcs_adapters_count_into_the_metrics_they_were_handed() -> None:
    ours, other = Metrics(), Metrics()
    poller = GcsPoller(DownThenUp(gcs_reply(1)), interval_s=1.0, counters=ours.gcs)
    await poller.poll_once()
    assert ours.sample("kuberay_scaler_gcs_connected") == 0.0
    await poller.poll_once()
    assert ours.sample("kuberay_scaler_gcs_connected") == 1.0
    await drain_slice(
        RefusingDrains(), ["61"], reason_message="idle", deadline_ms=5, counters=ours.gcs
    )
    assert ours.sample("kuberay_scaler_drains_total", {"outcome": "error"}) == 1.0
    assert exposition(other) == exposition(Metrics())
