"""Demand as the GCS reports it, and our reports as `ray status` prints them.

The head has no workers and num_cpus 0, so everything pends. One driver creates all the demand
for the module; tests read different parts of the reply.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from google.protobuf import json_format

from kuberay_scaler.adapters.ray_gcs.client import GcsClient
from kuberay_scaler.adapters.ray_gcs.errors import GcsReplaced
from kuberay_scaler.adapters.ray_gcs.report import (
    AutoscalingReport,
    FailedRequest,
    LaunchingGroup,
    PendingPod,
    build_autoscaling_state,
)
from kuberay_standins.ray_local import RayDriver, RayHead
from tests.ray.helpers import (
    SLICE_RESERVATIONS,
    fast_client,
    gangs,
    head_explains,
    needs_slice_reservations,
    node_by_id,
    run_ray_status,
    wait_for_state,
)

pytestmark = pytest.mark.ray

DEMAND = """
import threading
from ray.util.placement_group import placement_group
from ray.autoscaler.sdk import request_resources
try:
    from ray.util import tpu
except ImportError:  # older Ray (make ray-matrix): no slice reservations to make
    tpu = None

@ray.remote(num_cpus=1)
def work():
    time.sleep(3600)

@ray.remote(num_cpus=2)
class Holder:
    pass

tasks = [work.remote() for _ in range(10)]
actors = [Holder.remote() for _ in range(2)]
spread = placement_group([{"CPU": 1}] * 3, strategy="STRICT_SPREAD")
pack = placement_group(
    [{"CPU": 1, "TPU": 4}] * 2,
    strategy="STRICT_PACK",
    bundle_label_selector=[{"ray.io/accelerator-type": "TPU-V6E"}] * 2,
)
# Step 1 of a slice reservation blocks until a TPU head exists: run it aside.
if tpu is not None:
    threading.Thread(
        target=tpu.slice_placement_group,
        kwargs=dict(topology="4x4", accelerator_version="v6e", head_reservation_timeout_s=None),
        daemon=True,
    ).start()
request_resources(bundles=[{"TPU": 4}] * 4)
"""


@pytest.fixture(scope="module")
def demand(head: RayHead) -> Iterator[RayDriver]:
    with head_explains(head):
        driver = RayDriver.start(head.gcs_address, DEMAND, node_ip=head.ip, env=head.client_env())
    try:
        yield driver
    finally:
        driver.stop()


def _bundle(request: Any) -> dict[str, float]:
    return dict(request.resources_bundle)


def _selectors(request: Any) -> list[dict[str, Any]]:
    return [json_format.MessageToDict(s) for s in request.label_selectors]


def _all_demand_visible(state: Any) -> bool:
    details = " ".join(g.details for g in gangs(state))
    counts = {
        tuple(sorted(_bundle(r.request).items())): r.count for r in state.pending_resource_requests
    }
    return (
        counts.get((("CPU", 1.0),)) == 10
        and counts.get((("CPU", 2.0),)) == 2
        and "STRICT_SPREAD" in details
        and "STRICT_PACK" in details
        and (
            not SLICE_RESERVATIONS
            or any("TPU-v6e-16-head" in _bundle(g.requests[0]) for g in gangs(state))
        )
        and len(state.cluster_resource_constraints) == 1
    )


async def _demand_state(client: GcsClient) -> Any:
    return await wait_for_state(client, _all_demand_visible, what="all demand of the driver")


async def test_head_node_is_marked_and_idle(client: GcsClient, head: RayHead) -> None:
    state = (await client.get_cluster_resource_state()).cluster_resource_state
    head_node = node_by_id(state, head.node_id)
    assert head_node is not None
    assert "node:__internal_head__" in dict(head_node.total_resources)
    assert dict(head_node.total_resources).get("CPU", 0) == 0
    assert head_node.node_ip_address == head.ip


async def test_identical_tasks_aggregate_into_one_count(
    demand: RayDriver, client: GcsClient
) -> None:
    state = await _demand_state(client)
    cpu1 = [r for r in state.pending_resource_requests if _bundle(r.request) == {"CPU": 1.0}]
    assert len(cpu1) == 1
    assert cpu1[0].count == 10


async def test_pending_actors_show_as_resource_requests(
    demand: RayDriver, client: GcsClient
) -> None:
    state = await _demand_state(client)
    actors = [r for r in state.pending_resource_requests if _bundle(r.request) == {"CPU": 2.0}]
    assert [a.count for a in actors] == [2]


async def test_strict_spread_gang_carries_anti_affinity(
    demand: RayDriver, client: GcsClient
) -> None:
    state = await _demand_state(client)
    (spread,) = [g for g in gangs(state) if "STRICT_SPREAD" in g.details]
    (selector,) = spread.bundle_selectors
    assert [_bundle(r) for r in selector.resource_requests] == [{"CPU": 1.0}] * 3
    constraints = {
        c.anti_affinity.label_name
        for r in selector.resource_requests
        for c in r.placement_constraints
    }
    assert len(constraints) == 1
    assert constraints.pop().startswith("_PG_")
    assert spread.details.endswith("|PENDING")


async def test_strict_pack_gang_carries_affinity_and_label_selectors(
    demand: RayDriver, client: GcsClient
) -> None:
    state = await _demand_state(client)
    (pack,) = [g for g in gangs(state) if "STRICT_PACK" in g.details]
    requests = pack.bundle_selectors[0].resource_requests
    assert [_bundle(r) for r in requests] == [{"CPU": 1.0, "TPU": 4.0}] * 2
    assert all(r.placement_constraints[0].HasField("affinity") for r in requests)
    expected = {
        "labelConstraints": [
            {
                "labelKey": "ray.io/accelerator-type",
                "operator": "LABEL_OPERATOR_IN",
                "labelValues": ["TPU-V6E"],
            }
        ]
    }
    assert all(_selectors(r) == [expected] for r in requests)
    # The legacy `requests` list has the bundles but never the label selectors.
    assert all(not r.label_selectors for r in pack.requests)


@needs_slice_reservations
async def test_slice_reservation_pends_as_head_bundle(demand: RayDriver, client: GcsClient) -> None:
    state = await _demand_state(client)
    (reservation,) = [
        g for g in gangs(state) if any("TPU-v6e-16-head" in _bundle(r) for r in g.requests)
    ]
    assert reservation.details.endswith(":PACK|PENDING")
    (request,) = reservation.bundle_selectors[0].resource_requests
    assert _bundle(request) == {"TPU-v6e-16-head": 1.0}
    constraints = {
        c["labelKey"]: c["labelValues"] for c in _selectors(request)[0]["labelConstraints"]
    }
    assert constraints == {"ray.io/tpu-worker-id": ["0"], "ray.io/tpu-pod-type": ["v6e-16"]}


async def test_request_resources_is_one_constraint(demand: RayDriver, client: GcsClient) -> None:
    state = await _demand_state(client)
    (constraint,) = state.cluster_resource_constraints
    (request,) = constraint.resource_requests
    assert _bundle(request.request) == {"TPU": 4.0}
    assert request.count == 4


async def test_demand_of_a_stopped_driver_disappears(
    start_driver: Callable[..., RayDriver], client: GcsClient
) -> None:
    body = "\n".join(
        [
            "@ray.remote(num_cpus=3)",
            "def odd(): time.sleep(3600)",
            "refs = [odd.remote() for _ in range(4)]",
        ]
    )
    driver = start_driver(body)

    def has_cpu3(state: Any) -> bool:
        return any(_bundle(r.request) == {"CPU": 3.0} for r in state.pending_resource_requests)

    state = await wait_for_state(client, has_cpu3, what="CPU:3 tasks")
    assert [
        r.count for r in state.pending_resource_requests if _bundle(r.request) == {"CPU": 3.0}
    ] == [4]
    driver.stop()
    await wait_for_state(client, lambda s: not has_cpu3(s), what="CPU:3 tasks gone")


async def test_every_call_asks_with_version_zero_and_the_counter_moves(
    client: GcsClient,
) -> None:
    # Two reads in a row: the GCS counter grows on each call, so it can never be a change flag.
    first = await client.get_cluster_resource_state()
    second = await client.get_cluster_resource_state()
    assert (
        second.cluster_resource_state.cluster_resource_state_version
        > first.cluster_resource_state.cluster_resource_state_version
    )


async def test_cluster_id_is_learned_once_and_sent(client: GcsClient) -> None:
    cluster_id = await client.connect()
    assert len(bytes.fromhex(cluster_id)) == 28
    await client.get_cluster_resource_state()
    assert client.cluster_id == cluster_id
    assert client.replacements == 0


async def test_a_wrong_cluster_id_is_refused_as_replaced(client: GcsClient) -> None:
    await client.connect()
    with pytest.raises(GcsReplaced, match="WrongClusterID"):
        await client.drain_node(
            b"\x01" * 28,
            reason_message="stale plan",
            deadline_timestamp_ms=1,
            cluster_id="ab" * 28,
        )
    # The client's own connection is still good: the wrong id was the caller's.
    assert client.connected
    await client.get_cluster_resource_state()


async def test_ray_status_shows_a_reported_launching_slice(
    head: RayHead, client: GcsClient
) -> None:
    now_s = int(time.time())
    report = AutoscalingReport(
        launching=(LaunchingGroup("tpu-group", hosts=4, requested_at_s=now_s),),
        pending_pods=(
            PendingPod("tpu-group-x7k2p-worker-0", "tpu-group", "Pending: Unschedulable"),
        ),
        failed=(FailedRequest("cpu-group", 1, "exceeded quota: cpu", now_s - 5, now_s),),
    )
    version = await client.report(build_autoscaling_state(report))
    status = await client.get_cluster_status()
    assert status.autoscaling_state.autoscaler_state_version == version
    out = run_ray_status(head, verbose=True)
    assert " tpu-group, 4 launching" in out
    assert " tpu-group-x7k2p-worker-0: tpu-group, pending: unschedulable" in out
    assert " cpu-group: LaunchFailed" in out
    assert "exceeded quota: cpu" in out


async def test_report_versions_grow_within_one_millisecond(head: RayHead) -> None:
    frozen_ms = int(time.time() * 1000)
    async with fast_client(head.gcs_address, wall_clock_ms=lambda: frozen_ms) as gcs:
        first = await gcs.report(build_autoscaling_state(AutoscalingReport()))
        second = await gcs.report(build_autoscaling_state(AutoscalingReport()))
        status = await gcs.get_cluster_status()
    assert second > first
    assert status.autoscaling_state.autoscaler_state_version == second


async def test_restarted_client_with_a_clock_behind_is_still_heard(head: RayHead) -> None:
    async with fast_client(head.gcs_address) as before:
        stored = await before.report(build_autoscaling_state(AutoscalingReport()))
    # A new process whose wall clock went back an hour must not be silently discarded.
    behind_ms = stored - 3_600_000
    report = AutoscalingReport(launching=(LaunchingGroup("cpu-group", hosts=1),))
    async with fast_client(head.gcs_address, wall_clock_ms=lambda: behind_ms) as after:
        version = await after.report(build_autoscaling_state(report))
        status = await after.get_cluster_status()
    assert version > stored
    assert [r.ray_node_type_name for r in status.autoscaling_state.pending_instance_requests] == [
        "cpu-group"
    ]
