"""KubeRay's own autoscaler e2e scenarios (v2 variants), written by us, in both deploy modes.

Each test names the peer test it mirrors (ray-project/kuberay ray-operator/test/e2eautoscaler/,
`raycluster_autoscaler_test.go` and `raycluster_autoscaler_part2_test.go`), asserts the peer's
expectation within the peer's own timeout, and our invariants (tests/invariants.py via the
observer: whole slices only, nothing busy or undrained deleted, replicas within bounds, no error
logged). The daemon runs with the product's defaults (docs/e2e.md, "Peer scenarios").
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tests.e2e.deploy import MODES, Deploy, Mode
from tests.e2e.peer import (
    IDLES_KEPT_FOR_PLACEMENT_GROUP,
    LONG,
    MEDIUM,
    PLACEMENT_GROUP_READY,
    SHORT,
    Scenario,
    concurrent_tasks,
    create_actor,
    detached_placement_group,
    raycluster,
    request_resources,
    terminate_actor,
    worker_group,
)
from tests.e2e.world import World

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> Mode:
    value: Mode = request.param
    return value


@pytest.fixture
async def sc(world: World, mode: Mode) -> AsyncIterator[Scenario]:
    yield Scenario(world, Deploy(mode))


# --- raycluster_autoscaler_test.go -------------------------------------------------------------


async def test_detached_actors_up_and_down(sc: Scenario) -> None:
    """TestRayClusterAutoscaler: each detached actor brings a worker; each kill removes one."""
    await sc.start(raycluster(worker_group("small-group", max_replicas=3)))
    await sc.run(create_actor("actor1"))
    await sc.until(lambda: sc.desired_workers() == 1, MEDIUM, "1 worker for actor1")
    await sc.run(create_actor("actor2"))
    await sc.until(lambda: sc.desired_workers() == 2, MEDIUM, "2 workers for actor2")
    await sc.run(terminate_actor("actor1"))
    await sc.until(lambda: sc.desired_workers() == 1, MEDIUM, "1 worker after actor1 ends")
    await sc.run(terminate_actor("actor2"))
    await sc.until(lambda: sc.desired_workers() == 0, MEDIUM, "0 workers after actor2 ends")
    sc.finish()


async def test_fake_gpu(sc: Scenario) -> None:
    """TestRayClusterAutoscalerWithFakeGPU: a GPU actor brings a gpu-group worker."""
    params = {"num-cpus": "1", "num-gpus": "1"}
    await sc.start(raycluster(worker_group("gpu-group", max_replicas=3, params=params)))
    await sc.run(create_actor("gpu_actor", gpus=1))
    await sc.until(lambda: sc.desired_workers() == 1, MEDIUM, "1 GPU worker")
    await sc.until(lambda: sc.pods("gpu-group") == 1, SHORT, "its pod seen")
    await sc.run(terminate_actor("gpu_actor"))
    await sc.until(lambda: sc.desired_workers() == 0, MEDIUM, "the GPU worker removed")
    sc.finish()


TPU_V4_SINGLE_HOST = {
    "cloud.google.com/gke-tpu-topology": "2x2x1",
    "cloud.google.com/gke-tpu-accelerator": "tpu-v4-podslice",
}
TPU_V6E_MULTI_HOST = {
    "cloud.google.com/gke-tpu-topology": "4x4",
    "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
}


@pytest.mark.parametrize(
    ("group", "hosts", "max_replicas", "selector"),
    [
        ("tpu-group", 1, 3, TPU_V4_SINGLE_HOST),
        ("tpu-multi-host-group", 4, 4, TPU_V6E_MULTI_HOST),
    ],
    ids=["v4-2x2x1-single-host", "v6e-4x4-multi-host"],
)
async def test_fake_tpu_slice_up_then_max_zero_removes_it_whole(
    sc: Scenario, group: str, hosts: int, max_replicas: int, selector: dict[str, str]
) -> None:
    """TestRayClusterAutoscalerWithFakeTPU: one TPU actor per host brings one whole slice;
    maxReplicas 0 then removes the whole slice. No Node here offers a v4 2x2x1 (as in the
    peer's kind cluster), so that slice's pod stays Pending; the v6e 4x4 slice runs Ray."""
    params = {"num-cpus": "1", "resources": "'{\"TPU\":4}'"}
    spec = worker_group(
        group, max_replicas=max_replicas, params=params, hosts=hosts, node_selector=selector
    )
    await sc.start(raycluster(spec))
    names = [f"tpu_actor_{i}" for i in range(hosts)]
    await sc.run_all([create_actor(n, custom={"TPU": 4}) for n in names])
    await sc.until(lambda: sc.replica_sum() == 1, LONG, "one TPU replica")
    await sc.until(lambda: sc.pods(group) == hosts, LONG, f"the slice's {hosts} pods")
    if hosts > 1:  # Nodes offer v6e 4x4 here: Ray on all 4 hosts, an actor on each
        await sc.world.wait_for(
            lambda: sc.busy_workers(group, hosts), LONG, "the actors on the slice", async_ok=True
        )
    pods = {p["metadata"]["name"] for p in sc.world.observer.worker_pods(group)}
    await sc.run_all([terminate_actor(n) for n in names])
    await sc.set_group_field(0, "maxReplicas", 0)
    await sc.until(lambda: sc.all_workers() == 0, MEDIUM, "every worker pod gone")
    named = sc.world.observer.ever_deleted
    assert named in (set(), pods), f"the slice {sorted(pods)} was named in part: {sorted(named)}"
    # One slice's demand asked for one slice, never a second one while its hosts joined Ray.
    assert sc.world.observer.replicas_seen(group) == [0, 1, 0], "duplicate scale-up"
    sc.finish()


async def test_custom_resource(sc: Scenario) -> None:
    """TestRayClusterAutoscalerWithCustomResource."""
    params = {"num-cpus": "1", "resources": "'{\"CustomResource\": 1}'"}
    await sc.start(raycluster(worker_group("custom-resource-group", params=params)))
    await sc.run(create_actor("custom_resource_actor", custom={"CustomResource": 1}))
    await sc.until(lambda: sc.desired_workers() == 1, MEDIUM, "1 custom-resource worker")
    await sc.until(lambda: sc.pods("custom-resource-group") == 1, SHORT, "its pod seen")
    await sc.run(terminate_actor("custom_resource_actor"))
    await sc.until(lambda: sc.desired_workers() == 0, MEDIUM, "the worker removed")
    sc.finish()


async def test_desired_state(sc: Scenario) -> None:
    """TestRayClusterAutoscalerWithDesiredState: many tasks at once scale to maxReplicas; with
    scale-down off (idle timeout 3600 s) the cluster still has maxReplicas pods after them."""
    params = {"num-cpus": "1", "resources": "'{\"CustomResource\": 1}'"}
    group = worker_group("custom-resource-group", max_replicas=3, params=params)
    await sc.start(raycluster(group, idle_timeout_s=3600))
    await sc.run(concurrent_tasks(24, 3, 6))
    await sc.until(lambda: sc.all_workers() == 3, SHORT, "maxReplicas pods")
    assert sc.replica_sum() == 3
    sc.finish()


async def test_min_replicas_raised(sc: Scenario) -> None:
    """TestRayClusterAutoscalerMinReplicasUpdate: minReplicas 0 -> 2 with replicas 1: KubeRay
    runs 2; three actors then bring the group to 3 (replicas written 3)."""
    await sc.start(raycluster(worker_group("test-group", replicas=1, max_replicas=3)))
    await sc.until(lambda: sc.desired_workers() == 1, MEDIUM, "the first worker")
    await sc.set_group_field(0, "minReplicas", 2)
    await sc.until(lambda: sc.desired_workers() == 2, MEDIUM, "KubeRay's second worker")
    for i in range(3):
        await sc.run(create_actor(f"actor{i}"))
    await sc.until(lambda: sc.desired_workers() == 3, LONG, "3 workers for 3 actors")
    assert sc.replica_sum() == 3
    sc.finish()


@pytest.mark.parametrize(("initial", "updated"), [(2, 3), (2, 1)], ids=["2-to-3", "2-to-1"])
async def test_max_replicas_edited(sc: Scenario, initial: int, updated: int) -> None:
    """TestRayClusterAutoscalerMaxReplicasUpdate: max(initial, updated) busy actors; replicas
    reach `initial`; maxReplicas edited; replicas reach `updated` within the peer's 1 min
    (lowered: a busy worker is preempted, with our drain notice first)."""
    group = worker_group("test-group", replicas=1, min_replicas=1, max_replicas=initial)
    await sc.start(raycluster(group))
    await sc.until(lambda: sc.desired_workers() == 1, MEDIUM, "the first worker")
    for i in range(max(initial, updated)):
        await sc.run(create_actor(f"actor{i}"))
    await sc.until(lambda: sc.desired_workers() == initial, LONG, f"{initial} workers")
    assert sc.replica_sum() == initial
    # The case: every worker busy (an actor placed on each) when maxReplicas drops.
    await sc.world.wait_for(
        lambda: sc.busy_workers("test-group", initial), LONG, "every worker busy", async_ok=True
    )
    await sc.set_group_field(0, "maxReplicas", updated)
    await sc.until(lambda: sc.desired_workers() == updated, LONG, f"desired {updated}")
    await sc.until(lambda: sc.replica_sum() == updated, SHORT, f"replicas {updated}")
    if updated < initial:
        await sc.until(lambda: sc.live_pods("test-group") == updated, SHORT, "surplus pod gone")
    sc.finish()


# --- raycluster_autoscaler_part2_test.go -------------------------------------------------------


async def test_per_group_idle_timeouts(sc: Scenario) -> None:
    """TestRayClusterAutoscalerV2IdleTimeout: groups with 10 s and 30 s idle timeouts each lose
    their worker within their timeout + 30 s once idle."""
    short = worker_group("short-idle-timeout-group", max_replicas=1, idle_timeout_s=10)
    long_ = worker_group(
        "long-idle-timeout-group", max_replicas=1, idle_timeout_s=30, params={"num-cpus": "2"}
    )
    await sc.start(raycluster(short, long_, idle_timeout_s=None))
    await sc.run(create_actor("actor-long-timeout", cpus=2))
    await sc.run(create_actor("actor-short-timeout", cpus=1))
    await sc.until(lambda: sc.desired_workers() == 2, MEDIUM, "a worker in each group")
    await sc.until(lambda: sc.pods("short-idle-timeout-group") == 1, SHORT, "its pod seen")
    await sc.until(lambda: sc.pods("long-idle-timeout-group") == 1, SHORT, "its pod seen")
    await sc.run(terminate_actor("actor-short-timeout"))
    await sc.until(lambda: sc.desired_workers() == 1, 10 + 30, "the short-timeout worker gone")
    await sc.run(terminate_actor("actor-long-timeout"))
    await sc.until(lambda: sc.desired_workers() == 0, 30 + 30, "the long-timeout worker gone")
    sc.finish()


async def test_gpu_nodes_for_cpu_tasks(sc: Scenario) -> None:
    """TestRayClusterAutoscalerGPUNodesForCPUTasks: with only a GPU group, CPU work gets a GPU
    worker."""
    params = {"num-cpus": "1", "num-gpus": "1"}
    await sc.start(raycluster(worker_group("gpu-group", params=params)))
    await sc.run(create_actor("cpu_actor", cpus=1))
    await sc.until(lambda: sc.desired_workers() == 1, MEDIUM, "a GPU worker for CPU work")
    await sc.until(lambda: sc.pods("gpu-group") == 1, SHORT, "its pod seen")
    await sc.run(terminate_actor("cpu_actor"))
    await sc.until(lambda: sc.desired_workers() == 0, MEDIUM, "the worker removed")
    sc.finish()


async def test_idle_nodes_kept_for_an_upcoming_placement_group(sc: Scenario) -> None:
    """TestRayClusterAutoscalerDoNotRemoveIdlesForPlacementGroup: workers take 15 s to start
    (init container), the idle timeout is 6 s; the idle worker pg2 needs is kept."""
    group = worker_group("short-idle-group", max_replicas=2, init_sleep_s=15)
    await sc.start(raycluster(group, idle_timeout_s=6))
    output = await sc.run(IDLES_KEPT_FOR_PLACEMENT_GROUP)
    assert "PG_SCRIPT_OK" in output
    sc.finish()


async def test_request_resources(sc: Scenario) -> None:
    """TestRayClusterAutoscalerSDKRequestResources."""
    await sc.start(raycluster(worker_group("request-group", max_replicas=2)))
    await sc.run(request_resources(1))
    await sc.until(lambda: sc.desired_workers() == 1, MEDIUM, "1 worker for request_resources")
    sc.finish()


async def test_new_worker_group(sc: Scenario) -> None:
    """TestRayClusterAutoscalerAddNewWorkerGroup: a group added to the running cluster is
    scaled for its demand; the old one keeps working."""
    await sc.start(raycluster(worker_group("cpu-group", max_replicas=3)))
    await sc.run(create_actor("cpu_actor", cpus=1))
    await sc.until(lambda: sc.pods("cpu-group") == 1, MEDIUM, "a cpu-group worker")
    gpu = worker_group("gpu-group", max_replicas=3, params={"num-cpus": "0", "num-gpus": "1"})
    await sc.patch(
        [
            {"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 1},
            {"op": "add", "path": "/spec/workerGroupSpecs/-", "value": gpu},
        ]
    )
    await sc.run(create_actor("gpu_actor", cpus=0, gpus=1))
    await sc.until(lambda: sc.pods("gpu-group") == 1, MEDIUM, "a gpu-group worker")
    await sc.run(create_actor("cpu_actor_2", cpus=1))
    await sc.until(lambda: sc.pods("cpu-group") == 2, MEDIUM, "a second cpu-group worker")
    await sc.run(terminate_actor("gpu_actor"))
    await sc.until(lambda: sc.pods("gpu-group") == 0, MEDIUM, "the gpu-group worker gone")
    sc.finish()


@pytest.mark.parametrize(
    ("cpus", "strategy", "expected"),
    [("2", "STRICT_PACK", 1), ("2", "PACK", 1), ("2", "STRICT_SPREAD", 2), ("1", "SPREAD", 2)],
    ids=["STRICT_PACK", "PACK", "STRICT_SPREAD", "SPREAD"],
)
async def test_placement_group(sc: Scenario, cpus: str, strategy: str, expected: int) -> None:
    """TestRayClusterAutoscalerPlacementGroup: a detached placement group of 2 one-CPU bundles
    brings the workers its strategy needs; its workers deleted behind everyone's back are
    replaced by as many new ones and the group is placed again."""
    group = worker_group("cpu-group", max_replicas=3, params={"num-cpus": cpus})
    await sc.start(raycluster(group))
    await sc.run(detached_placement_group(2, 1, strategy))
    await sc.until(lambda: sc.pods("cpu-group") == expected, MEDIUM, f"{expected} workers")
    assert "PG_READY" in await sc.run(PLACEMENT_GROUP_READY)
    old = {p["metadata"]["name"] for p in sc.world.observer.worker_pods("cpu-group")}
    ns = sc.world.namespace
    for name in sorted(old):
        await sc.world.admin.ok("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}")
    sc.world.timeline.add(f"test: deleted the workers {sorted(old)}")

    def replaced() -> bool:
        pods = sc.world.observer.worker_pods("cpu-group", live=False)
        names = {p["metadata"]["name"] for p in pods}
        return not names & old and len(names) == expected

    await sc.until(replaced, MEDIUM, f"{expected} new workers")
    assert "PG_READY" in await sc.run(PLACEMENT_GROUP_READY)
    sc.finish()


async def test_head_pod_restart(sc: Scenario, mode: Mode) -> None:
    """TestRayClusterAutoscalerGCSFT, without its Redis: the head pod is deleted and KubeRay
    makes a new one (a new Ray cluster on the same GCS address); scaling works before and
    after. In drop-in mode the daemon is a container of the head pod: it goes with the pod and
    a new one starts from the new pod's rendered command. As a sidecar process here it keeps
    running across the restart and must notice the new GCS by itself."""
    await sc.start(raycluster(worker_group("small-group", max_replicas=2)))
    await sc.run(create_actor("actor1"))
    await sc.until(lambda: sc.desired_workers() == 1, MEDIUM, "a worker for actor1")
    await sc.run(terminate_actor("actor1"))
    await sc.until(lambda: sc.desired_workers() == 0, MEDIUM, "the worker removed")

    world = sc.world
    old = world.bridge.head_pod
    assert old is not None
    await world.admin.ok("DELETE", f"/api/v1/namespaces/{world.namespace}/pods/{old}")
    world.timeline.add(f"test: deleted the head pod {old}")
    if mode == "drop-in" and sc.daemon is not None:
        # The kubelet stops the pod's containers, ours among them.
        await asyncio.to_thread(sc.daemon.stop)
    await sc.until(
        lambda: world.bridge.head_pod not in (None, old) and world.bridge.head_ready.is_set(),
        MEDIUM,
        "a new head pod with Ray up",
    )
    if mode == "drop-in":
        sc.daemon = await sc.deploy.start(world)
    await sc.run(create_actor("actor1"))
    await sc.until(lambda: sc.desired_workers() == 1, MEDIUM, "a worker after the restart")
    await sc.run(terminate_actor("actor1"))
    await sc.until(lambda: sc.desired_workers() == 0, MEDIUM, "the worker removed again")
    sc.finish()


async def test_conservative_upscaling(sc: Scenario) -> None:
    """TestRayClusterAutoscalerUpscalingModeConservative: 10 actors at once; the first write
    asks for at most 5 workers; eventually all 10 run."""
    await sc.start(
        raycluster(worker_group("test-group", max_replicas=10), upscaling_mode="Conservative")
    )
    await sc.run_all([create_actor(f"actor{i}") for i in range(10)])
    await sc.until(lambda: sc.desired_workers() == 10, LONG, "10 workers")
    await sc.until(lambda: sc.pods("test-group") == 10, LONG, "10 worker pods")
    seen = sc.world.observer.replicas_seen("test-group")
    raised = [v for v in seen if v > 0]
    assert raised and raised[0] <= 5, f"the first scale-up asked for {raised[:1]} (> 5): {seen}"
    sc.finish()
