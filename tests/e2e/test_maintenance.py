"""Involuntary disruption on the real control plane (issue 33 item 1): the DisruptionTarget
condition on a pod (as the API server sets it on eviction) and GKE's maintenance label on the
kwok Nodes the slices run on (read with deploy/node-maintenance's ClusterRole), with real Ray.

- a busy slice one of whose pods gets DisruptionTarget: all its hosts are drained in Ray before
  the pod goes, a replacement slice is launched, and nothing of it is deleted by the daemon;
- with the nodes ClusterRole: an idle slice on a node with upcoming maintenance leaves before
  the group's longer-idle slice.

The observer's invariant checker judges every write (nothing busy deleted without a drain)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import yaml

from kuberay_scaler.core.model.signals import SCHEDULED_MAINTENANCE_TIME
from tests.e2e.controlplane import REPO, RESTRICTED_USER
from tests.e2e.ray_bridge import pod_name
from tests.e2e.world import (
    IDLE_TIMEOUT_S,
    SLICE_RESERVATION,
    SLICE_UP_S,
    TPU_GROUP,
    World,
    tpu_raycluster,
)
from tests.invariants import gcs_node_states

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

NODES_ROLE = REPO / "deploy" / "node-maintenance" / "clusterrole.yaml"
RBAC = "/apis/rbac.authorization.k8s.io/v1"
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


async def ray_states(world: World) -> dict[str, str]:
    head = world.bridge.head
    assert head is not None
    return await gcs_node_states(head.gcs_address, head.auth_token)


async def test_a_going_busy_slice_is_drained_and_replaced_before_its_pod_goes(
    world: World,
) -> None:
    await world.create_raycluster(tpu_raycluster(replicas=0, max_replicas=2))
    await world.ray_up()
    daemon = await world.start_daemon(RESTRICTED_USER)
    driver = await world.start_driver(SLICE_RESERVATION)  # keeps the slice's hosts busy
    await world.wait_for(lambda: len(world.running_slices()) == 1, SLICE_UP_S, "the slice up")
    await world.wait_for(lambda: "SLICE_READY" in driver.output(), 120, "the reservation placed")
    (replica, pods), *_ = world.running_slices().items()
    names = sorted(pod_name(p) for p in pods)

    # The eviction API's first step: the DisruptionTarget condition on one pod (status patch).
    condition = {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "EvictionByEvictionAPI",
        "message": "Eviction API: evicting",
        "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    path = f"/api/v1/namespaces/{world.namespace}/pods/{names[1]}/status"
    await world.admin.ok(
        "PATCH", path, {"status": {"conditions": [condition]}}, content_type=STRATEGIC
    )

    async def all_draining() -> bool:
        states = await ray_states(world)
        return all(states.get(n) == "DRAINING" for n in names)

    await world.wait_for(all_draining, 60, "every host of the going slice drained", async_ok=True)
    await world.wait_for(lambda: world.replicas() == 2, 30, "a replacement launched ahead")
    assert all(
        p["metadata"]["name"] in {pod_name(q) for q in world.observer.worker_pods(TPU_GROUP)}
        for p in pods
    ), "the going slice's pods are all still there: the eviction removes them, not us"
    assert not set(names) & set(world.workers_to_delete())
    assert not set(names) & world.observer.ever_deleted

    # The eviction itself: the pod goes; the new slice comes up beside the drained one.
    await world.admin.ok(
        "DELETE",
        f"/api/v1/namespaces/{world.namespace}/pods/{names[1]}",
        query={"gracePeriodSeconds": "0"},
    )
    await world.wait_for(
        lambda: any(r != replica for r in world.running_slices()), SLICE_UP_S, "the replacement up"
    )
    reasons = [line for line in daemon.events("decision") if "replaced_ahead" in str(line)]
    assert reasons, "the plan said why it added a slice"
    # Under KubeRay's Role alone nodes are not read: said once, never asked for.
    [access] = [line["mode"] for line in daemon.events("kubernetes access")]
    assert "node maintenance not read (no get/list/watch nodes)" in access
    assert await daemon.metric("kuberay_scaler_api_requests_total", resource="nodes") == 0
    world.assert_invariants()


async def bind_nodes_role(world: World, user: str) -> str:
    """deploy/node-maintenance's ClusterRole as shipped, bound to the test user; returns the
    binding's name (cluster-scoped: the test deletes it)."""
    role = yaml.safe_load(NODES_ROLE.read_text())
    reply = await world.admin.request("POST", f"{RBAC}/clusterroles", role)
    assert reply.ok or reply.status == 409, reply.body
    name = f"{world.namespace}-{role['metadata']['name']}"
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": role["metadata"]["name"],
        },
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
    await world.admin.ok("POST", f"{RBAC}/clusterrolebindings", binding)
    return name


async def label_node(world: World, node: str, value: str | None) -> None:
    patch: dict[str, Any] = {"metadata": {"labels": {SCHEDULED_MAINTENANCE_TIME: value}}}
    await world.admin.ok("PATCH", f"/api/v1/nodes/{node}", patch, content_type=MERGE)


async def test_an_idle_slice_on_a_maintenance_node_leaves_before_a_longer_idle_one(
    world: World,
) -> None:
    cluster = tpu_raycluster(replicas=1, min_replicas=1, max_replicas=2)
    await world.create_raycluster(cluster)
    await world.ray_up()
    await world.wait_for(lambda: len(world.running_slices()) == 1, SLICE_UP_S, "slice A up")
    (older, _), *_ = world.running_slices().items()
    # Slice B comes up later: idle for less time than A, so without maintenance A leaves.
    await world.admin.ok(
        "PATCH",
        world.raycluster_path,
        [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 2}],
        content_type="application/json-patch+json",
    )
    await world.wait_for(lambda: len(world.running_slices()) == 2, SLICE_UP_S, "slice B up")
    [younger] = [r for r in world.running_slices() if r != older]
    pods_b = world.running_slices()[younger]
    node = pods_b[2]["spec"]["nodeName"]
    window = str(int(time.time()) + 7200)
    binding = await bind_nodes_role(world, RESTRICTED_USER)
    try:
        await label_node(world, node, window)
        daemon = await world.start_daemon(RESTRICTED_USER)
        [access] = [line["mode"] for line in daemon.events("kubernetes access")]
        assert "node maintenance read" in access
        names_b = sorted(pod_name(p) for p in pods_b)
        await world.wait_for(
            lambda: (
                sorted(world.workers_to_delete()) == names_b
                or younger not in world.observer.slices(TPU_GROUP)
            ),
            IDLE_TIMEOUT_S + 60,
            "the slice on the maintenance node to leave",
        )
        await world.wait_for(lambda: world.replicas() == 1, 30, "one slice left")
        assert older in world.observer.slices(TPU_GROUP), "the longer-idle slice stays"
        names_a = {pod_name(p) for p in world.observer.slices(TPU_GROUP)[older]}
        assert not names_a & world.observer.ever_deleted
        plan = await daemon.plan() or {}
        announced = (plan.get("node_maintenance") or {}).get("announced") or []
        assert [a["node"] for a in announced] == [node]
        said = [
            line for line in daemon.events("decision") if "GKE maintenance on node" in str(line)
        ]
        assert said, "the plan named the rule"
        await asyncio.to_thread(daemon.stop)
        world.assert_invariants()
    finally:
        await label_node(world, node, None)
        await world.admin.request("DELETE", f"{RBAC}/clusterrolebindings/{binding}")
