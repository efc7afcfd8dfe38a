"""A multi-host slice's whole life against the real API server, the real KubeRay operator and
real Ray: scale up from zero on a slice reservation, idle drain, whole-slice deletion.

Mostly the daemon runs as the restricted user, bound to exactly the Role KubeRay creates for
its autoscaler: it must work without a RayCluster watch and without Events, and say so once. One
test runs it as the sidecar user (deploy/sidecar Role: RayCluster watch and Events).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.e2e.controlplane import RESTRICTED_USER, SIDECAR_USER
from tests.e2e.procs import Daemon, RayProbe
from tests.e2e.ray_bridge import HOST_INDEX, REPLICA_INDEX, REPLICA_NAME, labels_of, pod_name
from tests.e2e.world import (
    HOSTS,
    IDLE_TIMEOUT_S,
    SLICE_RESERVATION,
    SLICE_UP_S,
    TPU_GROUP,
    World,
    tpu_raycluster,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
IDLE_S = IDLE_TIMEOUT_S

# contract.md §3: the Role KubeRay creates for its autoscaler container.
KUBERAY_AUTOSCALER_RULES = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": [""], "resources": ["pods/resize"], "verbs": ["patch"]},
    {"apiGroups": ["ray.io"], "resources": ["rayclusters"], "verbs": ["get", "patch"]},
]
RESTRICTED_MODE = (
    "RayCluster by GET on pod events + periodic refresh (no list/watch rayclusters); "
    "Events off (no create events); capacity Events not read (no get/list/watch events); "
    "node maintenance not read (no get/list/watch nodes)"
)


async def test_slice_scales_up_from_zero_then_idles_away_whole(world: World) -> None:
    await world.create_raycluster(tpu_raycluster(replicas=0, max_replicas=2))
    probe = await world.ray_up()
    await _assert_kuberay_role(world)
    daemon = await world.start_daemon(RESTRICTED_USER)

    # --- up: a slice reservation makes the daemon ask for one replica (4 pods) ---------------
    driver = await world.start_driver(SLICE_RESERVATION)
    await world.wait_for(lambda: world.replicas() == 1, 60, "replicas 0 -> 1")
    await world.wait_for(lambda: len(world.running_slices()) == 1, SLICE_UP_S, "the slice up")
    await world.wait_for(lambda: "SLICE_READY" in driver.output(), 120, "the reservation placed")
    (replica, pods), *_ = world.running_slices().items()
    _assert_operator_labels(replica, pods)
    await _assert_ray_sees_the_slice(world, probe, replica, pods)
    assert world.observer.replicas_seen(TPU_GROUP) == [0, 1], "never more than the one slice"
    assert world.workers_to_delete() == []
    await _assert_restricted_mode(daemon)

    # --- down: demand gone -> idle -> all 4 hosts drained -> the slice deleted whole ----------
    names = sorted(pod_name(p) for p in pods)
    await world.stop_driver(driver)
    await world.wait_for(
        lambda: sorted(world.workers_to_delete()) == names or world.replicas() == 0,
        IDLE_S + 60,
        "the idle slice to be scaled down",
    )
    await world.wait_for(lambda: not world.observer.worker_pods(TPU_GROUP), 60, "pods gone")
    await world.wait_for(lambda: world.workers_to_delete() == [], 60, "workersToDelete cleared")
    assert world.replicas() == 0
    assert world.observer.replicas_seen(TPU_GROUP) == [0, 1, 0]
    # Exactly the slice's 4 pods, all together; on a loaded machine a slice whose Ray hosts
    # never registered may have been replaced first (whole: the invariant checker judges every
    # workersToDelete write), and then only because the daemon said so.
    assert set(names) <= world.observer.ever_deleted, "the slice's 4 pods, all together"
    if world.observer.ever_deleted != set(names):
        assert any(line.get("action") == "replace" for line in daemon.events("decision"))
    assert not await probe.workers(), "no Ray worker node is left alive"
    assert await daemon.metric("kuberay_scaler_drains_total", outcome="accepted") >= HOSTS
    world.assert_invariants()


async def _assert_kuberay_role(world: World) -> None:
    """The Role our restricted user is bound to is the one the operator made (contract §3)."""
    path = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{world.namespace}/roles/e2e"
    await world.wait_for(
        lambda: _exists(world, path), 30, "KubeRay's autoscaler Role", async_ok=True
    )
    role = await world.admin.ok("GET", path)
    rules = [{k: r.get(k) for k in ("apiGroups", "resources", "verbs")} for r in role["rules"]]
    assert rules == KUBERAY_AUTOSCALER_RULES


async def _exists(world: World, path: str) -> bool:
    return (await world.admin.request("GET", path)).ok


def _assert_operator_labels(replica: str, pods: list[dict[str, Any]]) -> None:
    """KubeRay's multi-host indexing labels (contract §2), on pods it named itself."""
    assert replica.startswith(f"{TPU_GROUP}-") and len(replica) == len(TPU_GROUP) + 6
    assert [labels_of(p)[HOST_INDEX] for p in pods] == [str(i) for i in range(HOSTS)]
    assert {labels_of(p)[REPLICA_INDEX] for p in pods} == {"0"}
    assert {labels_of(p)[REPLICA_NAME] for p in pods} == {replica}
    for pod in pods:
        assert pod_name(pod).startswith(f"e2e-{TPU_GROUP}-worker-")
        assert labels_of(pod)["ray.io/node-type"] == "worker"
        assert labels_of(pod)["ray.io/group"] == TPU_GROUP


async def _assert_ray_sees_the_slice(
    world: World, probe: RayProbe, replica: str, pods: list[dict[str, Any]]
) -> None:
    """Four Ray hosts joined by pod name; only host 0 carries the slice head resource."""
    nodes = {n.instance_id: n for n in await probe.workers()}
    assert set(nodes) == {pod_name(p) for p in pods}
    for pod in pods:
        node = nodes[pod_name(pod)]
        assert node.ray_node_type_name == TPU_GROUP
        assert node.labels["ray.io/tpu-slice-name"] == replica
        assert node.total_resources["TPU"] == 4
        is_host_zero = labels_of(pod)[HOST_INDEX] == "0"
        assert ("TPU-v6e-16-head" in node.total_resources) == is_host_zero


async def _busy(probe: RayProbe, instance_id: str) -> bool:
    return await probe.busy([instance_id]) == [instance_id]


async def _assert_restricted_mode(daemon: Daemon) -> None:
    """Poll mode and no Events, said exactly once; and not one request refused."""
    modes = [line.get("mode") for line in daemon.events("kubernetes access")]
    assert modes == [RESTRICTED_MODE]
    assert await daemon.metric("kuberay_scaler_api_requests_total", code="403") == 0
    assert await daemon.metric("kuberay_scaler_api_requests_total", resource="events") == 0


async def test_idle_slice_deleted_whole_in_sidecar_mode(world: World) -> None:
    """A slice that exists without demand (replicas preset to 1) is deleted once idle; as the
    sidecar user (deploy/ Role) the daemon watches the RayCluster and records Events."""
    await world.create_raycluster(tpu_raycluster(replicas=1))
    probe = await world.ray_up()
    daemon = await world.start_daemon(SIDECAR_USER)
    await world.wait_for(lambda: len(world.running_slices()) == 1, SLICE_UP_S, "the slice up")
    (replica, pods), *_ = world.running_slices().items()
    names = sorted(pod_name(p) for p in pods)
    assert world.replicas() == 1, "a slice still coming up is not idle"

    await world.wait_for(lambda: world.replicas() == 0, IDLE_S + 90, "the idle slice removed")
    await world.wait_for(lambda: not world.observer.worker_pods(TPU_GROUP), 60, "pods gone")
    await world.wait_for(lambda: world.workers_to_delete() == [], 60, "workersToDelete cleared")
    assert world.observer.ever_deleted == set(names)
    assert world.observer.replicas_seen(TPU_GROUP) == [1, 0]
    assert not await probe.workers()
    modes = [line.get("mode") for line in daemon.events("kubernetes access")]
    assert modes == [
        "RayCluster by watch; Events on; capacity Events not read (no get/list/watch events);"
        " node maintenance not read (no get/list/watch nodes)"
    ]
    events = await world.admin.ok("GET", f"/api/v1/namespaces/{world.namespace}/events")
    ours = [e for e in events["items"] if e.get("reason") == "ScaledDown"]
    assert ours and replica in ours[0]["message"], "a ScaledDown Event naming the slice"
    assert ours[0]["involvedObject"]["kind"] == "RayCluster"
    world.assert_invariants()


async def test_external_host_deletion_then_capacity_restored(world: World) -> None:
    """One host pod of a busy slice is deleted behind everyone's back: the operator removes the
    rest of the slice and makes a new one; the daemon keeps the one slice the reservation needs
    (never a second one for the bundles pinned to the lost slice) and never deletes the busy
    slice itself."""
    await world.create_raycluster(tpu_raycluster(replicas=1))
    probe = await world.ray_up()
    daemon = await world.start_daemon(RESTRICTED_USER)
    driver = await world.start_driver(SLICE_RESERVATION)
    await world.wait_for(lambda: len(world.running_slices()) == 1, SLICE_UP_S, "the slice up")
    await world.wait_for(lambda: "SLICE_READY" in driver.output(), 120, "the reservation placed")
    (lost, pods), *_ = world.running_slices().items()
    victim = pod_name(next(p for p in pods if labels_of(p)[HOST_INDEX] == "2"))

    await world.admin.ok("DELETE", f"/api/v1/namespaces/{world.namespace}/pods/{victim}")
    world.timeline.add(f"test: deleted pod {victim} of slice {lost}")
    await world.wait_for(
        lambda: lost not in world.observer.slices(TPU_GROUP), 60, "the rest of the slice gone"
    )
    await world.wait_for(
        lambda: len(world.running_slices()) == 1 and lost not in world.running_slices(),
        SLICE_UP_S,
        "a replacement slice up",
    )
    (new, new_pods), *_ = world.running_slices().items()
    nodes = {n.instance_id for n in await probe.workers()}
    assert nodes == {pod_name(p) for p in new_pods}, "Ray sees exactly the new slice's hosts"
    host_zero = pod_name(new_pods[0])
    await world.wait_for(
        lambda: _busy(probe, host_zero), 60, "the head bundle re-placed on host 0", async_ok=True
    )
    # The bundles pinned to the lost slice can never be placed again: the daemon must not
    # launch for them (they show as one rescheduling gang pinned by the old slice name).
    gangs = [g for g in (await probe.state()).pending_gang_resource_requests if g.requests]
    assert len(gangs) == 1 and gangs[0].details.endswith("RESCHEDULING")
    pins = {
        value
        for request in gangs[0].bundle_selectors[0].resource_requests
        for selector in request.label_selectors
        for constraint in selector.label_constraints
        for value in constraint.label_values
    }
    assert pins == {lost}
    await asyncio.sleep(IDLE_S + 5)  # long enough for a wrong idle scale-down or a 2nd slice
    assert set(world.running_slices()) == {new}
    assert victim not in world.observer.ever_deleted, "the daemon did not pick the busy slice"
    world.assert_invariants()
    seen = world.observer.replicas_seen(TPU_GROUP)
    assert max(seen) == 1, f"never a second slice for the pinned bundles: {seen}"
    # Launches are never cancelled (the operator may be re-creating the replica right now):
    # replicas must not dip while the lost slice's nodes die.
    decisions = [line.get("reason") for line in daemon.events("decision")]
    assert seen == [1], f"replicas dipped {seen}; daemon decisions: {decisions}"
