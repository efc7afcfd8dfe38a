"""Another writer resets the replicas the daemon wrote (GitOps, `kubectl scale`): the daemon
names it from the RayCluster's managedFields and leaves the group alone (the whole daemon as a
subprocess against the stand-ins and a real Ray head; integration tier)."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kuberay_standins.harness import DaemonProcess, LocalCluster
from kuberay_standins.ray_local import RayDriver

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

RESERVE_SLICE = """
from ray.util.tpu import SlicePlacementGroup
handle = SlicePlacementGroup(topology="4x4", accelerator_version="v6e",
                             head_reservation_timeout_s=600)
ray.get(handle.placement_group.ready(), timeout=600)
print("SLICE_READY", flush=True)
"""
OVERRIDDEN = "replicas overridden by another writer"


def _get(daemon: DaemonProcess, path: str) -> str:
    with urllib.request.urlopen(f"http://{daemon.http}{path}", timeout=5) as reply:
        return str(reply.read().decode())


def _metric(daemon: DaemonProcess, name: str, **labels: str) -> float:
    """The sum of the samples of `name` (a counter: its _total samples) with these labels."""
    total = 0.0
    for family in text_string_to_metric_families(_get(daemon, "/metrics")):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                total += sample.value
    return total


def _reconciles(daemon: DaemonProcess) -> float:
    return _metric(daemon, "kuberay_scaler_reconciles_total")


def _patches(cluster: LocalCluster) -> int:
    return sum(1 for r in cluster.api.requests if r.method == "PATCH" and "/rayclusters/" in r.path)


def _replicas(cluster: LocalCluster, group: str) -> int:
    spec = cluster.current()["spec"]["workerGroupSpecs"]
    return int(next(g for g in spec if g["groupName"] == group).get("replicas", 0))


def _override(cluster: LocalCluster, group: str) -> None:
    """What GitOps does: its own value for replicas, and its entry in managedFields."""
    groups = cluster.current()["spec"]["workerGroupSpecs"]
    index = next(i for i, g in enumerate(groups) if g["groupName"] == group)
    managed = [
        {
            "manager": "kuberay-operator",
            "operation": "Update",
            "subresource": "status",
            "time": "2026-01-01T12:00:00Z",
            "fieldsV1": {"f:status": {}},
        },
        {
            "manager": "kubectl-edit",
            "operation": "Update",
            "time": "2026-01-01T10:00:00Z",
            "fieldsV1": {"f:spec": {"f:workerGroupSpecs": {}}},
        },
        {
            "manager": "argocd-controller",
            "operation": "Apply",
            "time": "2026-01-01T11:00:00Z",
            "fieldsV1": {"f:spec": {"f:workerGroupSpecs": {}}},
        },
    ]
    cluster.api.json_patch(
        "rayclusters",
        cluster.namespace,
        cluster.name,
        [
            {"op": "replace", "path": f"/spec/workerGroupSpecs/{index}/replicas", "value": 0},
            {"op": "add", "path": "/metadata/managedFields", "value": managed},
        ],
    )


async def test_an_override_is_named_from_managed_fields_and_the_group_left_alone(
    cluster: LocalCluster,
) -> None:
    daemon = cluster.start_daemon()
    assert cluster.head is not None
    driver = await asyncio.to_thread(
        RayDriver.start,
        cluster.head.gcs_address,
        RESERVE_SLICE,
        node_ip=cluster.head.ip,
        env=cluster.head.client_env(),
        wait_ready=False,
    )
    try:
        await cluster.wait_for(lambda: "SLICE_READY" in driver.output(), 240, "the slice")
        assert _replicas(cluster, "tpu-group") == 1
        _override(cluster, "tpu-group")
        await cluster.wait_for(
            lambda: any(line.get("event") == OVERRIDDEN for line in daemon.lines()),
            60,
            "the daemon to notice the override",
        )
        (notice,) = [line for line in daemon.lines() if line.get("event") == OVERRIDDEN]
        assert notice["group"] == "tpu-group" and (notice["ours"], notice["theirs"]) == (1, 0)
        assert notice["field_managers"] == ["argocd-controller", "kubectl-edit"]
        patches = _patches(cluster)
        # KubeRay deletes no pod for a lower replicas alone (no workersToDelete): the busy slice
        # runs on. The group is held, named so in the plan, and nothing is written to it.
        seen = await asyncio.to_thread(_reconciles, daemon)
        await cluster.wait_for(
            lambda: _reconciles(daemon) >= seen + 2, 60, "two reconciles after the override"
        )
        assert _patches(cluster) == patches and _replicas(cluster, "tpu-group") == 0
        assert len(cluster.worker_pods("tpu-group")) == 4  # nothing of the slice went
        plan = json.loads(await asyncio.to_thread(_get, daemon, "/debug/plan"))
        held = {g["name"]: g.get("held") for g in plan["groups"]}
        assert held["tpu-group"]["kind"] == "overridden" and held["cpu-group"] is None
        assert _metric(daemon, "kuberay_scaler_overrides_total", group="tpu-group") == 1
    finally:
        await asyncio.to_thread(driver.stop)
    code, _ = await asyncio.to_thread(daemon.stop)
    assert code == 0
    assert not cluster.violations
