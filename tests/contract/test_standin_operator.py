"""Contract tests of the KubeRay operator stand-in (v1.7.0 reconcile rules) and its kubelet."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import yaml

from kuberay_standins.apiserver import ApiServerStandIn, StoredEvent
from kuberay_standins.operator import OperatorStandIn, resolve_env
from tests.factories import SAMPLES

pytestmark = pytest.mark.contract

NS = "default"
NAME = "raycluster-tpu-v6e-multihost"
GROUP = "tpu-group"
REPLICA_NAME = "ray.io/worker-group-replica-name"
REPLICA_INDEX = "ray.io/worker-group-replica-index"
HOST_INDEX = "ray.io/replica-host-index"


def tpu_sample(replicas: int, *, max_replicas: int = 2, autoscaling: bool = True) -> dict[str, Any]:
    """The v6e-16 multi-host fixture (4 hosts per slice), with our replica settings."""
    cluster: dict[str, Any] = yaml.safe_load(
        (SAMPLES / "ray-cluster.tpu-v6e-16-multihost.yaml").read_text()
    )
    cluster["spec"]["enableInTreeAutoscaling"] = autoscaling
    group = cluster["spec"]["workerGroupSpecs"][0]
    group.update(replicas=replicas, maxReplicas=max_replicas)
    return cluster


def cpu_cluster(
    replicas: int,
    *,
    num_of_hosts: int = 1,
    autoscaling: bool = True,
    max_replicas: int | None = None,
) -> dict[str, Any]:
    template = {"spec": {"containers": [{"name": "ray-worker", "image": "ray"}]}}
    group: dict[str, Any] = {
        "groupName": "cpu",
        "replicas": replicas,
        "minReplicas": 0,
        "numOfHosts": num_of_hosts,
        "template": template,
    }
    if max_replicas is not None:
        group["maxReplicas"] = max_replicas
    return {
        "metadata": {"name": NAME},
        "spec": {
            "enableInTreeAutoscaling": autoscaling,
            "headGroupSpec": {"template": {"spec": {"containers": [{"name": "ray-head"}]}}},
            "workerGroupSpecs": [group],
        },
    }


class RecordingHooks:
    def __init__(self) -> None:
        self.running: list[str] = []
        self.deleted: list[str] = []

    async def on_running(self, pod: dict[str, Any]) -> None:
        self.running.append(pod["metadata"]["name"])

    async def on_deleted(self, pod: dict[str, Any]) -> None:
        self.deleted.append(pod["metadata"]["name"])


@pytest.fixture
async def api() -> AsyncIterator[ApiServerStandIn]:
    yield ApiServerStandIn()  # the operator talks to the store directly: no HTTP needed


def workers(api: ApiServerStandIn, group: str = GROUP) -> list[dict[str, Any]]:
    return api.list("pods", NS, f"ray.io/node-type=worker,ray.io/group={group}")


def slices(api: ApiServerStandIn) -> dict[str, list[dict[str, Any]]]:
    by_replica: dict[str, list[dict[str, Any]]] = {}
    for pod in workers(api):
        by_replica.setdefault(pod["metadata"]["labels"][REPLICA_NAME], []).append(pod)
    return by_replica


def set_group(api: ApiServerStandIn, **fields: Any) -> None:
    ops = [
        {"op": "add", "path": f"/spec/workerGroupSpecs/0/{key}", "value": value}
        for key, value in fields.items()
    ]
    api.json_patch("rayclusters", NS, NAME, ops)


async def test_tpu_sample_scales_0_2_1_deleting_whole_replicas(api: ApiServerStandIn) -> None:
    hooks = RecordingHooks()
    api.create("rayclusters", NS, tpu_sample(0))
    operator = OperatorStandIn(api, NS, NAME, hooks=hooks, rng_seed=7)
    await operator.settle()
    (head,) = api.list("pods", NS, "ray.io/node-type=head")
    assert head["metadata"]["name"].startswith(f"{NAME}-head-")
    assert head["status"]["phase"] == "Running" and workers(api) == []

    set_group(api, replicas=2)
    actions = await operator.settle()
    replicas = slices(api)
    assert len(replicas) == 2 and all(len(pods) == 4 for pods in replicas.values())
    assert sum(a.startswith("create pod") for a in actions) == 8
    for name, pods in replicas.items():
        assert name.startswith(f"{GROUP}-") and len(name) == len(GROUP) + 6
        assert len({p["metadata"]["labels"][REPLICA_INDEX] for p in pods}) == 1
        assert sorted(int(p["metadata"]["labels"][HOST_INDEX]) for p in pods) == [0, 1, 2, 3]
    indices = {pods[0]["metadata"]["labels"][REPLICA_INDEX] for pods in replicas.values()}
    assert indices == {"0", "1"}
    assert all(p["status"]["phase"] == "Running" for p in workers(api))
    assert len(hooks.running) == 9  # head + 8 hosts

    doomed_name, doomed = sorted(replicas.items())[1]
    keep_name = sorted(replicas)[0]
    set_group(api, replicas=1, scaleStrategy={"workersToDelete": [doomed[2]["metadata"]["name"]]})
    actions = await operator.settle()
    assert list(slices(api)) == [keep_name]
    deleted = {a.split()[2].rstrip(":") for a in actions if a.startswith("delete pod")}
    assert deleted == {p["metadata"]["name"] for p in doomed}
    assert sorted(hooks.deleted) == sorted(deleted)
    cluster = api.get("rayclusters", NS, NAME)
    assert cluster is not None
    strategy = cluster["spec"]["workerGroupSpecs"][0]["scaleStrategy"]
    assert strategy["workersToDelete"] == [doomed[2]["metadata"]["name"]]  # never cleared
    assert doomed_name not in slices(api)


async def test_worker_pods_carry_kuberay_labels_env_and_tpu_webhook_env(
    api: ApiServerStandIn,
) -> None:
    api.create("rayclusters", NS, tpu_sample(1))
    operator = OperatorStandIn(api, NS, NAME, rng_seed=1)
    await operator.settle()
    for pod in workers(api):
        labels = pod["metadata"]["labels"]
        assert labels["ray.io/cluster"] == NAME and labels["ray.io/node-type"] == "worker"
        assert labels["ray.io/group"] == GROUP and labels["ray.io/is-ray-node"] == "yes"
        container = pod["spec"]["containers"][0]
        assert container["name"] == "ray-worker"
        env = resolve_env(pod, container)
        assert env["RAY_CLOUD_INSTANCE_ID"] == pod["metadata"]["name"]
        assert env["RAY_NODE_TYPE_NAME"] == GROUP
        assert env["TPU_WORKER_ID"] == labels[HOST_INDEX]
        assert env["TPU_ACCELERATOR_TYPE"] == "v6e-16" and env["TPU_TOPOLOGY"] == "4x4"
        assert env["JAX_PLATFORMS"] == "tpu,cpu"  # the template's own env is kept
        owner = pod["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"]) == ("RayCluster", NAME)
        assert [s["name"] for s in pod["status"]["containerStatuses"]] == ["ray-worker"]
        where = operator.slice_of(pod)
        assert where is not None and where.num_of_hosts == 4
        assert where.replica_name == labels[REPLICA_NAME]
        assert where.host_index == int(labels[HOST_INDEX])
        assert where.group_spec["groupName"] == GROUP


async def test_incomplete_replica_is_deleted_then_replaced(api: ApiServerStandIn) -> None:
    api.create("rayclusters", NS, tpu_sample(2))
    operator = OperatorStandIn(api, NS, NAME, rng_seed=3)
    await operator.settle()
    before = slices(api)
    victim_replica, victim_pods = sorted(before.items())[0]
    index = victim_pods[0]["metadata"]["labels"][REPLICA_INDEX]
    api.delete("pods", NS, victim_pods[0]["metadata"]["name"], grace_period_seconds=0)
    actions = await operator.settle()
    deleted = {a.split()[2].rstrip(":") for a in actions if a.startswith("delete pod")}
    assert deleted == {p["metadata"]["name"] for p in victim_pods[1:]}
    after = slices(api)
    assert victim_replica not in after and len(after) == 2
    (new_replica,) = set(after) - set(before)
    assert after[new_replica][0]["metadata"]["labels"][REPLICA_INDEX] == index  # index reused
    assert all(len(p) == 4 for p in after.values())


async def test_failed_pod_replaces_its_whole_replica(api: ApiServerStandIn) -> None:
    api.create("rayclusters", NS, tpu_sample(2))
    operator = OperatorStandIn(api, NS, NAME, rng_seed=5)
    await operator.settle()
    before = slices(api)
    broken_replica, broken_pods = sorted(before.items())[1]
    api.json_patch(
        "pods",
        NS,
        broken_pods[3]["metadata"]["name"],
        [{"op": "replace", "path": "/status/phase", "value": "Failed"}],
    )
    actions = await operator.settle()
    after = slices(api)
    assert broken_replica not in after and len(after) == 2
    assert set(before) - {broken_replica} <= set(after)
    assert sum(a.startswith("delete pod") for a in actions) == 4
    assert sum(a.startswith("create pod") for a in actions) == 4


async def test_delete_expectations_hold_the_group_until_pods_are_gone(
    api: ApiServerStandIn,
) -> None:
    api.create("rayclusters", NS, tpu_sample(2))
    operator = OperatorStandIn(api, NS, NAME, rng_seed=11)
    await operator.settle()
    victim = sorted(slices(api).items())[0][1][0]["metadata"]["name"]
    set_group(api, replicas=1, scaleStrategy={"workersToDelete": [victim]})
    first = operator.reconcile_once()
    assert sum(a.startswith("delete pod") for a in first) == 4
    terminating = [p for p in workers(api) if p["metadata"].get("deletionTimestamp")]
    assert len(terminating) == 4  # scheduled pods wait for the kubelet
    assert operator.reconcile_once() == []  # nothing more while they terminate
    await operator.kubelet_once()
    assert len(workers(api)) == 4
    assert operator.reconcile_once() == []


async def test_no_random_deletion_when_autoscaling_is_enabled(api: ApiServerStandIn) -> None:
    api.create("rayclusters", NS, tpu_sample(2))
    operator = OperatorStandIn(api, NS, NAME, rng_seed=2)
    await operator.settle()
    set_group(api, replicas=1)
    assert await operator.settle() == []
    assert len(workers(api)) == 8


async def test_surplus_replicas_are_removed_whole_when_autoscaling_is_off(
    api: ApiServerStandIn,
) -> None:
    api.create("rayclusters", NS, tpu_sample(2, autoscaling=False))
    operator = OperatorStandIn(api, NS, NAME, rng_seed=2)
    await operator.settle()
    set_group(api, replicas=1)
    await operator.settle()
    replicas = slices(api)
    assert len(replicas) == 1 and len(next(iter(replicas.values()))) == 4


async def test_not_a_multiple_of_num_of_hosts_is_an_error(api: ApiServerStandIn) -> None:
    # clamp(replicas) * numOfHosts is int32 in KubeRay: 715827883 * 3 wraps to -2147483647.
    api.create("rayclusters", NS, cpu_cluster(715827883, num_of_hosts=3))
    operator = OperatorStandIn(api, NS, NAME)
    actions = await operator.settle()
    expected = "desired worker pods (-2147483647) is not a multiple of NumOfHosts (3) for group cpu"
    assert operator.errors == [expected]
    assert f"error: {expected}" in actions
    assert workers(api, "cpu") == []


async def test_legacy_operator_with_gke_webhook_labels(api: ApiServerStandIn) -> None:
    api.create("rayclusters", NS, tpu_sample(1))
    operator = OperatorStandIn(api, NS, NAME, multi_host_indexing=False)
    await operator.settle()
    set_group(api, replicas=2)
    await operator.settle()
    pods = workers(api)
    assert len(pods) == 8
    assert not any(REPLICA_NAME in p["metadata"]["labels"] for p in pods)
    assert not any(REPLICA_INDEX in p["metadata"]["labels"] for p in pods)
    by_slice: dict[str, list[str]] = {}
    for pod in pods:
        env = resolve_env(pod, pod["spec"]["containers"][0])
        by_slice.setdefault(pod["metadata"]["labels"]["replicaIndex"], []).append(
            env["TPU_WORKER_ID"]
        )
        where = operator.slice_of(pod)
        assert where is not None and where.replica_name == pod["metadata"]["labels"]["replicaIndex"]
    assert {k: sorted(v) for k, v in by_slice.items()} == {
        f"{GROUP}-0": ["0", "1", "2", "3"],
        f"{GROUP}-1": ["0", "1", "2", "3"],
    }


async def test_legacy_operator_deletes_only_the_named_host(api: ApiServerStandIn) -> None:
    api.create("rayclusters", NS, tpu_sample(2))
    operator = OperatorStandIn(api, NS, NAME, multi_host_indexing=False)
    await operator.settle()
    victim = workers(api)[0]["metadata"]["name"]
    set_group(api, replicas=1, scaleStrategy={"workersToDelete": [victim]})
    await operator.settle()
    assert len(workers(api)) == 7  # the old per-pod path breaks slices apart


async def test_single_host_group_with_workers_to_delete(api: ApiServerStandIn) -> None:
    api.create("rayclusters", NS, cpu_cluster(3))
    operator = OperatorStandIn(api, NS, NAME)
    await operator.settle()
    pods = workers(api, "cpu")
    assert sorted(p["metadata"]["labels"][REPLICA_INDEX] for p in pods) == ["0", "1", "2"]
    assert not any(REPLICA_NAME in p["metadata"]["labels"] for p in pods)
    victim = pods[1]["metadata"]["name"]
    set_group(api, replicas=2, scaleStrategy={"workersToDelete": [victim]})
    actions = await operator.settle()
    assert any(a.startswith(f"delete pod {victim}") for a in actions)
    remaining = {p["metadata"]["name"] for p in workers(api, "cpu")}
    assert remaining == {p["metadata"]["name"] for p in pods} - {victim}
    set_group(api, replicas=1)
    await operator.settle()
    assert len(workers(api, "cpu")) == 2  # no random deletion with autoscaling on


async def test_single_host_surplus_goes_when_autoscaling_is_off(api: ApiServerStandIn) -> None:
    api.create("rayclusters", NS, cpu_cluster(3, autoscaling=False))
    operator = OperatorStandIn(api, NS, NAME)
    await operator.settle()
    set_group(api, replicas=1)
    await operator.settle()
    assert len(workers(api, "cpu")) == 1


async def test_replicas_are_clamped_and_suspended_groups_have_no_pods(
    api: ApiServerStandIn,
) -> None:
    api.create("rayclusters", NS, cpu_cluster(5, max_replicas=2))
    operator = OperatorStandIn(api, NS, NAME)
    await operator.settle()
    assert len(workers(api, "cpu")) == 2
    set_group(api, suspend=True)
    await operator.settle()
    assert workers(api, "cpu") == []


async def test_paused_operator_does_nothing_until_resumed(api: ApiServerStandIn) -> None:
    api.create("rayclusters", NS, cpu_cluster(0))
    operator = OperatorStandIn(api, NS, NAME)
    await operator.settle()
    operator.paused = True
    set_group(api, replicas=2)
    await operator.settle()
    assert workers(api, "cpu") == []
    operator.paused = False
    await operator.settle()
    assert len(workers(api, "cpu")) == 2


async def test_pods_of_a_deleted_cluster_are_garbage_collected(api: ApiServerStandIn) -> None:
    hooks = RecordingHooks()
    api.create("rayclusters", NS, cpu_cluster(2))
    operator = OperatorStandIn(api, NS, NAME, hooks=hooks)
    await operator.settle()
    api.delete("rayclusters", NS, NAME)
    await operator.settle()
    assert api.list("pods", NS) == []
    assert sorted(hooks.deleted) == sorted(hooks.running)


async def test_operator_writes_a_status_summary(api: ApiServerStandIn) -> None:
    api.create("rayclusters", NS, tpu_sample(1))
    operator = OperatorStandIn(api, NS, NAME, rng_seed=4)
    await operator.settle()
    cluster = api.get("rayclusters", NS, NAME)
    assert cluster is not None
    assert cluster["status"]["desiredWorkerReplicas"] == 4
    assert cluster["status"]["availableWorkerReplicas"] == 4
    assert cluster["status"]["state"] == "ready"


async def wait_until(api: ApiServerStandIn, condition: Callable[[], bool]) -> None:
    """Wait (event-driven, with a safety timeout) until ``condition`` holds."""
    changed = asyncio.Event()

    def listener(_: StoredEvent) -> None:
        changed.set()

    unsubscribe = api.subscribe(listener)
    try:
        async with asyncio.timeout(20):
            while not condition():
                await changed.wait()
                changed.clear()
    finally:
        unsubscribe()


async def test_run_loop_reacts_to_changes_with_start_delay(api: ApiServerStandIn) -> None:
    hooks = RecordingHooks()
    api.create("rayclusters", NS, copy.deepcopy(tpu_sample(0)))
    operator = OperatorStandIn(
        api, NS, NAME, hooks=hooks, start_delay=0.05, interval=0.05, rng_seed=9
    )
    task = asyncio.create_task(operator.run())
    try:
        set_group(api, replicas=1)
        await wait_until(
            api,
            lambda: (
                len(workers(api)) == 4
                and all(p.get("status", {}).get("phase") == "Running" for p in workers(api))
            ),
        )
        set_group(
            api,
            replicas=0,
            scaleStrategy={"workersToDelete": [workers(api)[0]["metadata"]["name"]]},
        )
        await wait_until(api, lambda: workers(api) == [])
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert len(hooks.running) == 5 and len(hooks.deleted) == 4


async def test_a_pod_no_node_fits_stays_pending_unschedulable_and_unbound(
    api: ApiServerStandIn,
) -> None:
    """The `unschedulable` hook is the scheduler's part: such a pod is never bound nor started,
    it carries `PodScheduled=False/Unschedulable` with the hook's message (written once)."""
    hooks = RecordingHooks()
    api.create("rayclusters", NS, tpu_sample(1))
    stuck = "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."

    def no_node(pod: dict[str, Any]) -> str | None:
        worker = pod["metadata"]["labels"].get("ray.io/node-type") == "worker"
        return stuck if worker else None

    operator = OperatorStandIn(api, NS, NAME, hooks=hooks, rng_seed=7, unschedulable=no_node)
    await operator.settle()
    pods = workers(api)
    assert len(pods) == 4
    for pod in pods:
        assert not pod["spec"].get("nodeName")
        assert pod["status"]["phase"] == "Pending"
        [condition] = pod["status"]["conditions"]
        assert (condition["type"], condition["status"], condition["reason"]) == (
            "PodScheduled",
            "False",
            "Unschedulable",
        )
        assert condition["message"] == stuck
    assert hooks.running == [api.list("pods", NS, "ray.io/node-type=head")[0]["metadata"]["name"]]
    before = api.resource_version
    await operator.settle()
    assert api.resource_version == before  # marked once, not rewritten every round
