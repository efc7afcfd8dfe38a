"""TPU-like hosts as the GCS sees them, and slice drains against real raylets.

One head, one v6e-16 slice of 4 hosts (TPU env + explicit TPU chips) and a few CPU hosts that the
drain tests may consume. Drained hosts exit for good, so each drain test has hosts of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from ray.core.generated import autoscaler_pb2

from kuberay_scaler.adapters.ray_gcs.client import GcsClient
from kuberay_scaler.adapters.ray_gcs.drain import deadline_in, drain_slice
from kuberay_standins.ray_local import (
    HostSpec,
    RayDriver,
    RayHead,
    RayHost,
    loopback_ip,
    start_hosts,
    stop_all,
    tpu_slice_specs,
)
from tests.ray.helpers import DEAD, node_by_id, node_by_instance, wait_for_state

pytestmark = pytest.mark.ray

SLICE = "tpu-group-q8m4z"
TPU_PODS = [f"{SLICE}-worker-{i}" for i in range(4)]
IDLE_STATUS = autoscaler_pb2.NodeStatus.Value("IDLE")
RUNNING = autoscaler_pb2.NodeStatus.Value("RUNNING")


def _cpu_spec(n: int, name: str) -> HostSpec:
    return HostSpec(
        ip=loopback_ip(n),
        num_cpus=1,
        env={"RAY_CLOUD_INSTANCE_ID": name, "RAY_NODE_TYPE_NAME": "cpu-group"},
    )


@pytest.fixture(scope="module")
def hosts(head: RayHead) -> Iterator[dict[str, RayHost]]:
    tpu_ips = [loopback_ip(n) for n in (21, 22, 23, 24)]
    specs = [
        *tpu_slice_specs(SLICE, tpu_ips, instance_ids=TPU_PODS),
        _cpu_spec(31, "cpu-idle-0"),
        # Drained to death by its own test; the others read cpu-idle-0 alive in any order.
        _cpu_spec(34, "cpu-drained-0"),
        _cpu_spec(32, "cpu-pair-0"),
        _cpu_spec(33, "cpu-pair-1"),
    ]
    started = start_hosts(head.gcs_address, specs)
    try:
        yield {h.instance_id: h for h in started}
    finally:
        stop_all(started)


def _busy_body(node_ids: list[bytes], actor_options: str) -> str:
    """A driver holding one actor on each node (hard node affinity), then waiting."""
    return "\n".join(
        [
            "from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy",
            f"@ray.remote({actor_options})",
            "class Hold:",
            "    def ready(self): return True",
            f"nodes = {[n.hex() for n in node_ids]!r}",
            "holds = [Hold.options(scheduling_strategy="
            "NodeAffinitySchedulingStrategy(node_id=n, soft=False)).remote() for n in nodes]",
            "ray.get([h.ready.remote() for h in holds])",
        ]
    )


async def test_tpu_hosts_carry_instance_ids_labels_and_tpu_resources(
    hosts: dict[str, RayHost], client: GcsClient
) -> None:
    state = await wait_for_state(
        client,
        lambda s: all(node_by_instance(s, pod) is not None for pod in TPU_PODS),
        what="all four TPU hosts",
    )
    for worker_id, pod in enumerate(TPU_PODS):
        node = node_by_instance(state, pod)
        assert node.node_id == hosts[pod].node_id
        assert node.ray_node_type_name == "tpu-group"
        assert node.node_ip_address == hosts[pod].ip
        resources = dict(node.total_resources)
        assert resources["TPU"] == 4.0
        assert resources[SLICE] == 1.0
        assert resources["accelerator_type:TPU-V6E"] == 1.0
        assert ("TPU-v6e-16-head" in resources) == (worker_id == 0)
        labels = dict(node.labels)
        assert labels["ray.io/tpu-slice-name"] == SLICE
        assert labels["ray.io/tpu-worker-id"] == str(worker_id)
        assert labels["ray.io/tpu-topology"] == "4x4"
        assert labels["ray.io/tpu-pod-type"] == "v6e-16"
        assert labels["ray.io/accelerator-type"] == "TPU-V6E"


async def test_cpu_host_has_no_tpu_resources(hosts: dict[str, RayHost], client: GcsClient) -> None:
    state = await client.get_cluster_resource_state()
    node = node_by_instance(state.cluster_resource_state, "cpu-idle-0")
    assert node.ray_node_type_name == "cpu-group"
    assert dict(node.total_resources)["CPU"] == 1.0
    assert not any(k.startswith("TPU") for k in node.total_resources)
    assert "ray.io/tpu-slice-name" not in node.labels


async def test_busy_slice_refuses_idle_drain_and_is_not_deleted(
    hosts: dict[str, RayHost],
    client: GcsClient,
    start_driver: Callable[..., RayDriver],
) -> None:
    node_ids = [hosts[pod].node_id for pod in TPU_PODS]
    start_driver(_busy_body(node_ids, 'num_cpus=0, resources={"TPU": 4}'))
    await wait_for_state(
        client,
        lambda s: all(_status(s, n) == RUNNING for n in node_ids),
        what="the whole slice busy",
    )
    result = await drain_slice(
        client,
        [n.hex() for n in node_ids],
        reason_message="idle slice",
        deadline_ms=deadline_in(60),
    )
    assert not result.may_delete
    assert result.drained_node_ids == ()
    assert {h.outcome for h in result.hosts} == {"rejected"}
    assert all("no longer idle" in h.message for h in result.hosts)
    state = (await client.get_cluster_resource_state()).cluster_resource_state
    assert all(_status(state, n) not in (DEAD, None) for n in node_ids)


async def test_idle_single_host_drain_is_accepted_and_the_node_dies(
    hosts: dict[str, RayHost], client: GcsClient
) -> None:
    host = hosts["cpu-drained-0"]
    await wait_for_state(
        client,
        lambda s: _status(s, host.node_id) == IDLE_STATUS,
        what="cpu-drained-0 idle",
    )
    result = await drain_slice(
        client, [host.node_id.hex()], reason_message="idle slice", deadline_ms=deadline_in(60)
    )
    assert result.may_delete
    assert result.drained_node_ids == (host.node_id.hex(),)
    await wait_for_state(
        client, lambda s: _status(s, host.node_id) == DEAD, what="cpu-drained-0 dead"
    )


async def test_partly_busy_slice_is_kept_and_lists_hosts_already_drained(
    hosts: dict[str, RayHost],
    client: GcsClient,
    start_driver: Callable[..., RayDriver],
) -> None:
    idle, busy = hosts["cpu-pair-0"], hosts["cpu-pair-1"]
    start_driver(_busy_body([busy.node_id], "num_cpus=1"))
    await wait_for_state(
        client,
        lambda s: _status(s, busy.node_id) == RUNNING and _status(s, idle.node_id) == IDLE_STATUS,
        what="one pair host busy, the other idle",
    )
    result = await drain_slice(
        client,
        [idle.node_id.hex(), busy.node_id.hex()],
        reason_message="idle slice",
        deadline_ms=deadline_in(60),
    )
    assert not result.may_delete
    assert result.drained_node_ids == (idle.node_id.hex(),)
    (refused,) = result.refused
    assert refused.node_id == busy.node_id.hex()
    assert refused.outcome == "rejected"
    assert "no longer idle" in result.reason
    state = await wait_for_state(
        client, lambda s: _status(s, idle.node_id) == DEAD, what="drained host dead"
    )
    assert _status(state, busy.node_id) not in (DEAD, None)


async def test_drain_with_a_non_positive_deadline_is_refused_before_any_call(
    client: GcsClient,
) -> None:
    with pytest.raises(ValueError, match="positive"):
        await drain_slice(client, ["00" * 28], reason_message="x", deadline_ms=0)


def _status(state: Any, node_id: bytes) -> int | None:
    node = node_by_id(state, node_id)
    return None if node is None else int(node.status)
