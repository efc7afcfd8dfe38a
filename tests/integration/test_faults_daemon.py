"""Faults at the daemon level: the whole daemon as a subprocess against the stand-ins and a
real Ray head. A kill -9 between the draining record and the delete patch (failure catalogue row
24); the API server down while demand arrives (row 1)."""

from __future__ import annotations

import asyncio

import pytest

from kuberay_scaler.core.patch.intent import DRAINING_ANNOTATION
from kuberay_standins.harness import LocalCluster
from tests.integration.test_daemon import RESERVE_SLICE, _driver, _get, _replicas

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def _recorded(cluster: LocalCluster) -> bool:
    annotations = cluster.current()["metadata"].get("annotations") or {}
    return DRAINING_ANNOTATION in annotations


def _doomed(cluster: LocalCluster) -> list[str]:
    spec = cluster.current()["spec"]["workerGroupSpecs"]
    tpu = next(g for g in spec if g["groupName"] == "tpu-group")
    return list((tpu.get("scaleStrategy") or {}).get("workersToDelete") or [])


async def test_kill_9_between_the_record_and_the_delete_patch_is_adopted(
    cluster: LocalCluster,
) -> None:
    """Item 10 / catalogue row 24 with a real daemon process and a real Ray head."""
    daemon = cluster.start_daemon()
    driver = await asyncio.to_thread(_driver, cluster, RESERVE_SLICE)
    try:
        await cluster.wait_for(lambda: "SLICE_READY" in driver.output(), 240, "the slice")
    finally:
        await asyncio.to_thread(driver.stop)
    slice_pods = sorted(p["metadata"]["name"] for p in cluster.worker_pods("tpu-group"))
    assert len(slice_pods) == 4 and _replicas(cluster, "tpu-group") == 1
    # Every RayCluster PATCH now waits 3 s before it applies: the record lands, the delete patch
    # hangs, and the daemon is killed -9 inside that window.
    cluster.api.faults.delay(r"/rayclusters/", 3.0)
    await cluster.wait_for(lambda: _recorded(cluster), 180, "the draining record")
    daemon.process.kill()
    daemon.process.wait(10)
    cluster.api.faults.clear()
    assert _doomed(cluster) == [] and _replicas(cluster, "tpu-group") == 1  # not half-written
    again = cluster.start_daemon()
    await cluster.wait_for(lambda: not _recorded(cluster), 180, "the record finished")
    assert sorted(_doomed(cluster)) == slice_pods or not cluster.worker_pods("tpu-group")
    assert _replicas(cluster, "tpu-group") == 0  # decremented once, not twice
    await cluster.wait_for(lambda: not cluster.worker_pods("tpu-group"), 120, "slice deleted")
    assert _replicas(cluster, "tpu-group") == 0
    assert not cluster.violations  # never a partial slice named for deletion
    code, _ = await asyncio.to_thread(again.stop)
    assert code == 0


async def test_api_server_down_is_not_ready_writes_nothing_and_recovers_once(
    cluster: LocalCluster,
) -> None:
    """Catalogue row 1 with a real daemon: no plan on a stale cache, no duplicate scale-up after."""
    daemon = cluster.start_daemon()
    await cluster.wait_for(lambda: _get(daemon, "/readyz")[0] == 200, 120, "ready")
    cluster.api.faults.refuse_connections(True)
    await cluster.wait_for(lambda: _get(daemon, "/readyz")[0] == 503, 120, "not ready")
    assert "not synced" in _get(daemon, "/readyz")[1]
    seen = len(cluster.api.requests)
    driver = await asyncio.to_thread(_driver, cluster, RESERVE_SLICE)  # demand while blind
    try:
        await asyncio.sleep(5)
        assert _replicas(cluster, "tpu-group") == 0
        assert [r for r in cluster.api.requests[seen:] if r.method == "PATCH"] == []
        assert _get(daemon, "/healthz")[0] == 200  # blind is not dead: holding and saying so
        cluster.api.faults.refuse_connections(False)
        await cluster.wait_for(lambda: "SLICE_READY" in driver.output(), 240, "the slice")
    finally:
        await asyncio.to_thread(driver.stop)
    assert _replicas(cluster, "tpu-group") == 1  # scaled once, not once per missed event
    assert len(cluster.worker_pods("tpu-group")) == 4
    assert not cluster.violations
    code, _ = await asyncio.to_thread(daemon.stop)
    assert code == 0
