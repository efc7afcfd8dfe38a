"""What the real KubeRay operator does with a multi-host group (contract.md §2), without Ray and
without the daemon: the facts our patches and the operator stand-in rely on."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from tests.e2e.kube import JSON_PATCH
from tests.e2e.ray_bridge import HOST_INDEX, REPLICA_INDEX, REPLICA_NAME, labels_of, pod_name
from tests.e2e.world import HOSTS, SLICE_UP_S, TPU_GROUP, World, tpu_raycluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
SETTLE_S = 60.0


def _replicas_by_index(world: World) -> dict[str, str]:
    """replica index label → replica name, for complete Running slices."""
    out = {}
    for replica, pods in world.observer.slices(TPU_GROUP).items():
        running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
        if len(running) == HOSTS:
            out[labels_of(pods[0])[REPLICA_INDEX]] = replica
    return out


async def _patch_group(world: World, ops: Sequence[dict[str, Any]]) -> None:
    await world.admin.ok("PATCH", world.raycluster_path, list(ops), content_type=JSON_PATCH)


async def test_workers_to_delete_takes_the_whole_replica_and_is_never_cleared(
    bare_world: World,
) -> None:
    world = bare_world
    await world.create_raycluster(tpu_raycluster(replicas=2, max_replicas=3))
    await world.wait_for(lambda: len(_replicas_by_index(world)) == 2, SETTLE_S, "2 slices")
    first = _replicas_by_index(world)
    assert set(first) == {"0", "1"}, "indices 0..replicas-1"
    for replica, pods in world.observer.slices(TPU_GROUP).items():
        hosts = sorted(labels_of(p)[HOST_INDEX] for p in pods)
        assert hosts == [str(i) for i in range(HOSTS)], f"{replica}: host indices"
        assert {labels_of(p)[REPLICA_NAME] for p in pods} == {replica}

    # Name ONE pod of replica 0 and scale to 1 in one patch: the operator deletes all 4.
    victim = next(
        pod_name(p)
        for p in world.observer.slices(TPU_GROUP)[first["0"]]
        if labels_of(p)[HOST_INDEX] == "1"
    )
    await _patch_group(
        world,
        [
            {"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 1},
            {
                "op": "add",
                "path": "/spec/workerGroupSpecs/0/scaleStrategy",
                "value": {"workersToDelete": [victim]},
            },
        ],
    )
    await world.wait_for(
        lambda: first["0"] not in world.observer.slices(TPU_GROUP), SETTLE_S, "replica 0 gone"
    )
    assert _replicas_by_index(world) == {"1": first["1"]}, "the other slice keeps index 1"
    assert world.workers_to_delete() == [victim], "the operator never clears workersToDelete"

    # Scale back to 2: the new replica reuses the lowest free index (0) under a new name.
    await _patch_group(
        world, [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 2}]
    )
    await world.wait_for(lambda: len(_replicas_by_index(world)) == 2, SETTLE_S, "2 slices again")
    second = _replicas_by_index(world)
    assert second["1"] == first["1"]
    assert second["0"] not in (first["0"], first["1"]), "replica names are never reused"
    assert world.workers_to_delete() == [victim], "still not cleared"


async def test_external_pod_deletion_takes_the_rest_of_the_slice(bare_world: World) -> None:
    world = bare_world
    await world.create_raycluster(tpu_raycluster(replicas=1))
    await world.wait_for(lambda: len(_replicas_by_index(world)) == 1, SETTLE_S, "the slice")
    before = _replicas_by_index(world)["0"]
    pods = world.observer.slices(TPU_GROUP)[before]
    victim = pod_name(next(p for p in pods if labels_of(p)[HOST_INDEX] == "2"))
    await world.admin.ok("DELETE", f"/api/v1/namespaces/{world.namespace}/pods/{victim}")
    await world.wait_for(
        lambda: before not in world.observer.slices(TPU_GROUP), SETTLE_S, "the rest deleted"
    )
    await world.wait_for(lambda: len(_replicas_by_index(world)) == 1, SETTLE_S, "a new slice")
    after = _replicas_by_index(world)
    assert after["0"] != before, "a new replica (new name), at the same index"
    assert world.replicas() == 1
    assert world.workers_to_delete() == []


async def test_ray_exiting_on_one_host_fails_the_whole_replica(world: World) -> None:
    """A Ray container that ends under restartPolicy Never (the bridge reports the pod Failed,
    as the kubelet would) makes the operator replace the whole replica (contract §2.2)."""
    await world.create_raycluster(tpu_raycluster(replicas=1))
    await world.ray_up()
    await world.wait_for(lambda: len(world.running_slices()) == 1, SLICE_UP_S, "the slice up")
    (before, pods), *_ = world.running_slices().items()
    crashed = pod_name(pods[1])
    world.bridge.hosts[crashed].kill()
    world.timeline.add(f"test: killed Ray of pod {crashed}")
    await world.wait_for(lambda: crashed in world.bridge.failed_pods, 30, "the pod marked Failed")
    await world.wait_for(
        lambda: before not in world.observer.slices(TPU_GROUP), SETTLE_S, "the replica deleted"
    )
    await world.wait_for(lambda: len(_replicas_by_index(world)) == 1, SETTLE_S, "a new replica")
    assert set(_replicas_by_index(world).values()) != {before}


async def test_pods_as_the_operator_builds_them(bare_world: World) -> None:
    """Names, labels, Ray env and restartPolicy of head and worker pods (autoscaler v2)."""
    world = bare_world
    await world.create_raycluster(tpu_raycluster(replicas=1))
    await world.wait_for(lambda: len(_replicas_by_index(world)) == 1, SETTLE_S, "the slice")
    head = world.observer.head_pod()
    assert head is not None
    worker = world.observer.worker_pods(TPU_GROUP)[0]
    # Kept next to the test's logs: what the stand-in's pod builder is compared against.
    (world.workdir / "operator-pods.json").write_text(json.dumps([head, worker], indent=1))
    assert pod_name(head).startswith("e2e-head-")
    assert labels_of(head)["ray.io/group"] == "headgroup"
    assert [c["name"] for c in head["spec"]["containers"]] == ["ray-head", "autoscaler"]
    autoscaler_env = {e["name"] for e in head["spec"]["containers"][1].get("env", [])}
    assert {"RAY_CLUSTER_NAME", "RAY_CLUSTER_NAMESPACE", "RAY_HEAD_POD_NAME"} <= autoscaler_env
    assert worker["spec"]["restartPolicy"] == "Never", "autoscaler v2 forces Never"
    env = {e["name"]: e for e in worker["spec"]["containers"][0]["env"]}
    assert env["RAY_CLOUD_INSTANCE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert "ray.io/group" in env["RAY_NODE_TYPE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"]
    owner = worker["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["controller"]) == ("RayCluster", True)
