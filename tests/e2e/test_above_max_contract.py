"""What the real KubeRay operator does with a multi-host group above maxReplicas (issue 12
items 1–2): the facts the above-max rule relies on, without Ray and without the daemon.

- with autoscaling on, lowering maxReplicas below the running replicas deletes nothing;
- writing replicas = maxReplicas while a surplus slice stays deletes nothing either (a busy
  slice being drained keeps running until it is named);
- naming one pod of the surplus replica in workersToDelete takes that whole replica.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from tests.e2e.kube import JSON_PATCH
from tests.e2e.ray_bridge import HOST_INDEX, labels_of, pod_name
from tests.e2e.world import HOSTS, TPU_GROUP, World, tpu_raycluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
SETTLE_S = 60.0
QUIET_S = 20.0  # long enough for several operator reconciles


def _complete(world: World) -> dict[str, list[dict[str, Any]]]:
    return {k: v for k, v in world.observer.slices(TPU_GROUP).items() if len(v) == HOSTS}


async def _patch(world: World, ops: Sequence[dict[str, Any]]) -> None:
    await world.admin.ok("PATCH", world.raycluster_path, list(ops), content_type=JSON_PATCH)


async def test_surplus_replicas_stay_until_named_whole(bare_world: World) -> None:
    world = bare_world
    await world.create_raycluster(tpu_raycluster(replicas=2, max_replicas=2))
    await world.wait_for(lambda: len(_complete(world)) == 2, SETTLE_S, "2 slices")
    before = set(_complete(world))

    # A user lowers maxReplicas: the operator deletes nothing by itself.
    await _patch(
        world, [{"op": "replace", "path": "/spec/workerGroupSpecs/0/maxReplicas", "value": 1}]
    )
    await asyncio.sleep(QUIET_S)
    assert set(_complete(world)) == before, "the operator deleted a surplus replica by itself"

    # What the daemon writes while a busy surplus slice is drained: replicas = maxReplicas.
    await _patch(
        world, [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 1}]
    )
    await asyncio.sleep(QUIET_S)
    assert set(_complete(world)) == before, "replicas = maxReplicas deleted a slice"

    # Named (one pod is enough for the operator; the daemon names all): the whole replica goes.
    doomed = sorted(before)[0]
    victim = next(pod_name(p) for p in _complete(world)[doomed] if labels_of(p)[HOST_INDEX] == "0")
    await _patch(
        world,
        [
            {
                "op": "add",
                "path": "/spec/workerGroupSpecs/0/scaleStrategy",
                "value": {"workersToDelete": [victim]},
            }
        ],
    )
    await world.wait_for(
        lambda: doomed not in world.observer.slices(TPU_GROUP), SETTLE_S, "the named replica"
    )
    assert set(_complete(world)) == before - {doomed}


async def test_with_autoscaling_off_lowering_max_replicas_deletes_surplus_pods_at_once(
    bare_world: World,
) -> None:
    """Sidecar mode (`enableInTreeAutoscaling: false`, issue 30): the operator itself deletes
    surplus pods the moment maxReplicas is lowered, chosen by it, with no drain (README, sidecar
    mode). `replicas` stays 2 until someone writes it: the daemon writes it down to 1
    (tests/control/test_sidecar_max.py)."""
    world = bare_world
    cluster = tpu_raycluster(replicas=2, max_replicas=2)
    cluster["spec"]["enableInTreeAutoscaling"] = False
    cluster["spec"].pop("autoscalerOptions", None)
    await world.create_raycluster(cluster)
    await world.wait_for(lambda: len(_complete(world)) == 2, SETTLE_S, "2 slices")

    await _patch(
        world, [{"op": "replace", "path": "/spec/workerGroupSpecs/0/maxReplicas", "value": 1}]
    )
    await world.wait_for(
        lambda: len(world.observer.worker_pods(TPU_GROUP)) <= HOSTS,
        SETTLE_S,
        "the operator deleting the surplus by itself",
    )
    rc = world.observer.raycluster
    assert rc is not None and rc["spec"]["workerGroupSpecs"][0]["replicas"] == 2


async def test_with_autoscaling_off_a_group_idle_timeout_is_refused(bare_world: World) -> None:
    """The README's sidecar section: KubeRay's validation refuses a per-group
    `idleTimeoutSeconds` while `enableInTreeAutoscaling` is false (the API server or the
    operator says so; the operator builds no pod for it)."""
    world = bare_world
    cluster = tpu_raycluster(replicas=1, max_replicas=1)
    cluster["spec"]["enableInTreeAutoscaling"] = False
    cluster["spec"].pop("autoscalerOptions", None)
    cluster["spec"]["workerGroupSpecs"][0]["idleTimeoutSeconds"] = 60
    path = f"/apis/ray.io/v1/namespaces/{world.namespace}/rayclusters"
    created = await world.admin.request("POST", path, cluster)
    if not created.ok:  # refused by the API server itself
        assert "idleTimeoutSeconds" in str(created.body), created.body
        return
    events = f"/api/v1/namespaces/{world.namespace}/events"

    async def said() -> str:
        reply = await world.admin.ok("GET", events)
        return " ".join(str(e.get("message", "")) for e in reply.get("items", []))

    deadline = asyncio.get_running_loop().time() + SETTLE_S
    text = ""
    while "idleTimeoutSeconds" not in text:
        assert asyncio.get_running_loop().time() < deadline, f"no refusal said: {text[:500]}"
        await asyncio.sleep(1)
        text = await said()
    assert not world.observer.worker_pods(TPU_GROUP), "pods built for a refused spec"
