"""A RayCluster edited between the daemon's plan and its patch: the guarded patch is refused by
the real API server (422), the daemon replans, and the write never lands on the wrong group."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kuberay_scaler.adapters.kube.session import open_api
from kuberay_scaler.adapters.kube.writer import RayClusterWriter
from kuberay_scaler.core.patch.ops import Op, Replace, Test
from tests.e2e.controlplane import RESTRICTED_USER
from tests.e2e.kube import JSON_PATCH
from tests.e2e.observer import group_named
from tests.e2e.procs import Daemon
from tests.e2e.world import (
    CLUSTER,
    SLICE_RESERVATION,
    SLICE_UP_S,
    TPU_GROUP,
    World,
    cpu_group,
    tpu_raycluster,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
CPU_GROUP = "cpu-group"


def _insert_group_in_front() -> list[dict[str, Any]]:
    return [{"op": "add", "path": "/spec/workerGroupSpecs/0", "value": cpu_group(CPU_GROUP)}]


async def test_group_inserted_under_a_stale_plan_is_never_patched(world: World) -> None:
    """In poll mode (KubeRay's Role: no RayCluster watch) the daemon's copy of the RayCluster
    refreshes on its GET cadence, pod events and its resync; with all three long or absent it
    plans the next scale-up from the copy taken before a group was inserted in front of ours.
    Unguarded, that patch would scale `cpu-group` (now index 0); guarded, it is refused,
    refreshed and replanned. (The GET cadence is set long here: at its 2.5 s default the copy
    is usually fresh again before the demand arrives, and the refusal this test is about
    would depend on timing.)"""
    await world.create_raycluster(tpu_raycluster(replicas=0))
    await world.ray_up()
    daemon = await world.start_daemon(
        RESTRICTED_USER,
        KUBERAY_SCALER_RESYNC_INTERVAL_S="600",
        KUBERAY_SCALER_RAYCLUSTER_POLL_INTERVAL_S="300",
    )
    await _until_reads_settle(daemon)
    await world.admin.ok(
        "PATCH", world.raycluster_path, _insert_group_in_front(), content_type=JSON_PATCH
    )
    await world.wait_for(
        lambda: group_named(world.observer.raycluster, CPU_GROUP) is not None, 30, "the insert"
    )
    world.timeline.add("test: inserted cpu-group at index 0")

    driver = await world.start_driver(SLICE_RESERVATION)
    await world.wait_for(lambda: world.replicas(TPU_GROUP) == 1, 90, "tpu-group scaled to 1")
    await world.wait_for(lambda: len(world.running_slices()) == 1, SLICE_UP_S, "the slice up")
    await world.wait_for(lambda: "SLICE_READY" in driver.output(), 120, "the reservation placed")

    assert world.observer.replicas_seen(CPU_GROUP) == [0], "the inserted group was never touched"
    assert world.observer.replicas_seen(TPU_GROUP) == [0, 1]
    refused = [
        line
        for line in daemon.events("raycluster patch not applied")
        if line.get("kind") == "stale"
    ]
    assert refused, "the first patch, planned on the old copy, must have been refused"
    assert "422" in refused[0]["error"]
    assert await daemon.metric("kuberay_scaler_patches_total", outcome="stale") >= 1
    world.assert_invariants()


async def test_guarded_patch_refused_for_a_reorder_or_a_replicas_change(
    bare_world: World,
) -> None:
    """The daemon's own writer, with the restricted token, against the real server: a patch
    planned from an older RayCluster is classified `stale` (replan), never applied."""
    world = bare_world
    created = await world.create_raycluster(tpu_raycluster(replicas=0))
    uid = created["metadata"]["uid"]
    role = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{world.namespace}/roles/{CLUSTER}"
    await world.wait_for(lambda: _ok(world, role), 30, "KubeRay's autoscaler Role", async_ok=True)
    identity = world.daemon_identity(RESTRICTED_USER)
    api = await open_api(str(identity.kubeconfig), request_timeout=10)
    writer = RayClusterWriter(api, namespace=world.namespace, name=CLUSTER)
    try:
        planned_at_0 = _scale_ops(0, TPU_GROUP, planned_from=0, to=1)
        await world.admin.ok(
            "PATCH", world.raycluster_path, _insert_group_in_front(), content_type=JSON_PATCH
        )
        outcome = await writer.apply(planned_at_0, expected_uid=uid)
        assert outcome.kind == "stale", outcome
        assert await _replicas(world) == {CPU_GROUP: 0, TPU_GROUP: 0}

        # Replanned at index 1, but meanwhile someone else set replicas to 1.
        await world.admin.ok(
            "PATCH",
            world.raycluster_path,
            [{"op": "replace", "path": "/spec/workerGroupSpecs/1/replicas", "value": 1}],
            content_type=JSON_PATCH,
        )
        outcome = await writer.apply(
            _scale_ops(1, TPU_GROUP, planned_from=0, to=2), expected_uid=uid
        )
        assert outcome.kind == "stale", outcome
        assert await _replicas(world) == {CPU_GROUP: 0, TPU_GROUP: 1}

        # Planned from what is stored now: applied.
        outcome = await writer.apply(
            _scale_ops(1, TPU_GROUP, planned_from=1, to=0), expected_uid=uid
        )
        assert outcome.kind == "applied", outcome
        assert await _replicas(world) == {CPU_GROUP: 0, TPU_GROUP: 0}

        # A RayCluster of the same name but another UID (deleted and recreated): refused too.
        outcome = await writer.apply(
            _scale_ops(1, TPU_GROUP, planned_from=0, to=1), expected_uid="not-" + uid
        )
        assert outcome.kind == "stale", outcome
        # A patch that applies but yields an invalid object: a validation 422, not "stale".
        invalid: list[Op] = [Replace("/spec/workerGroupSpecs/1/replicas", "x")]
        outcome = await writer.apply(invalid, expected_uid=uid)
        assert outcome.kind == "invalid", outcome
    finally:
        await api.close()


async def _until_reads_settle(daemon: Daemon, quiet_polls: int = 4) -> None:
    """Wait until the daemon's start-up GETs of the RayCluster are done (the count of them stays
    put for a while), so the next change it can only learn about by a resync or a refused
    patch."""
    last, same = -1.0, 0
    while same < quiet_polls:
        count = await daemon.metric(
            "kuberay_scaler_api_requests_total", verb="get", resource="rayclusters"
        )
        same = same + 1 if count == last else 0
        last = count
        await asyncio.sleep(0.5)


def _scale_ops(index: int, group: str, *, planned_from: int, to: int) -> list[Op]:
    """The shape of the daemon's guarded scale patch (core/patch/ops.py)."""
    base = f"/spec/workerGroupSpecs/{index}"
    return [
        Test(f"{base}/groupName", group),
        Test(f"{base}/replicas", planned_from),
        Replace(f"{base}/replicas", to),
    ]


async def _replicas(world: World) -> dict[str, int]:
    obj = await world.admin.ok("GET", world.raycluster_path)
    return {g["groupName"]: g.get("replicas") for g in obj["spec"]["workerGroupSpecs"]}


async def _ok(world: World, path: str) -> bool:
    return (await world.admin.request("GET", path)).ok
