"""Infeasible demand and truthful pending lines, reported to a real GCS (issue 12 items 5, 6).

A real head (num_cpus 0) and a driver whose demand no group of the RayCluster can serve; the
demand is read from the GCS, planned by our planner, reported with ReportAutoscalingState, read
back with GetClusterStatus and printed by `ray status`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kuberay_scaler.adapters.ray_gcs.client import GcsClient
from kuberay_scaler.adapters.ray_gcs.report import build_autoscaling_state
from kuberay_scaler.adapters.ray_gcs.state import parse_ray_state
from kuberay_scaler.loop.report import report_from_plan
from kuberay_standins.ray_local import RayDriver, RayHead
from tests.factories import NOW, NOW_MS, cluster, group, plan_of, pod
from tests.ray.helpers import head_explains, run_ray_status, wait_for_state

pytestmark = pytest.mark.ray

DEMAND = """
from ray.util.placement_group import placement_group
from ray.autoscaler.sdk import request_resources

@ray.remote(num_gpus=8)
def huge():
    pass

refs = [huge.remote() for _ in range(2)]
pg = placement_group([{"CPU": 1}, {"special": 1}], strategy="STRICT_PACK")
request_resources(bundles=[{"special": 2}])

@ray.remote(num_cpus=8)
def fits():
    time.sleep(3600)

small = [fits.remote() for _ in range(2)]
"""


@pytest.fixture(scope="module")
def demand(head: RayHead) -> Iterator[RayDriver]:
    with head_explains(head):
        driver = RayDriver.start(head.gcs_address, DEMAND, node_ip=head.ip, env=head.client_env())
    try:
        yield driver
    finally:
        driver.stop()


def _all_visible(state: Any) -> bool:
    bundles = [dict(r.request.resources_bundle) for r in state.pending_resource_requests]
    return (
        {"GPU": 8.0, "CPU": 1.0} in bundles
        and {"CPU": 8.0} in bundles
        and any(g.requests for g in state.pending_gang_resource_requests)
        and len(state.cluster_resource_constraints) == 1
    )


def _raycluster() -> dict[str, Any]:
    # One CPU group with a pod that is Running but whose Ray node never joins.
    return cluster(group("cpu", replicas=1, max_replicas=3))


async def test_infeasible_demand_reaches_the_gcs_and_ray_status_stays_truthful(
    demand: RayDriver, client: GcsClient, head: RayHead
) -> None:
    state = await wait_for_state(client, _all_visible, what="the driver's demand")
    ray = parse_ray_state(state, read_at_ms=NOW_MS)
    now = NOW  # the pods' clock (factories); the GCS does not care about report times
    pods = [pod("cpu-abc12", "cpu", running_for_s=30)]
    result = plan_of(_raycluster(), pods, ray, now=now)
    assert {i.demand for i in result.infeasible if i.certain}, result.infeasible

    report = report_from_plan(result, int(now.timestamp()), launches_asked=False)
    version = await client.report(build_autoscaling_state(report))
    stored = (await client.get_cluster_status()).autoscaling_state
    assert stored.autoscaler_state_version == version

    # Items 5: every kind of infeasible demand is held by the GCS as we sent it.
    assert [dict(r.resources_bundle) for r in stored.infeasible_resource_requests] == [
        {"GPU": 8.0, "CPU": 1.0}
    ] * 2
    (pg,) = stored.infeasible_gang_resource_requests
    assert sorted(tuple(dict(r.resources_bundle).items()) for r in pg.requests) == [
        (("CPU", 1.0),),
        (("special", 1.0),),
    ]
    (floor,) = stored.infeasible_cluster_resource_constraints
    assert [dict(r.request.resources_bundle) for r in floor.resource_requests] == [{"special": 2.0}]

    # Item 6: the Running pod without a Ray node is launching, with why; the dry run asked for
    # no new slice (a second 8-CPU task would need one), so nothing else shows as launching.
    out = run_ray_status(head, verbose=True)
    pending = out.split("Pending:", 1)[1].split("Recent failures:", 1)[0]
    assert " cpu-abc12: cpu, launching: pod running, ray node not joined for 30 s" in pending
    assert "cpu, running" not in pending
    assert " launching\n" not in pending.replace(", launching:", "")
    assert result.group("cpu").target == 2  # type: ignore[union-attr]  # it would launch one


async def test_a_report_written_for_real_shows_the_launch(
    demand: RayDriver, client: GcsClient, head: RayHead
) -> None:
    state = await wait_for_state(client, _all_visible, what="the driver's demand")
    now = NOW  # the pods' clock (factories); the GCS does not care about report times
    result = plan_of(
        _raycluster(), [pod("cpu-abc12", "cpu")], parse_ray_state(state, read_at_ms=NOW_MS), now=now
    )
    report = report_from_plan(result, int(now.timestamp()))
    await client.report(build_autoscaling_state(report))
    out = run_ray_status(head)
    assert " cpu, 1 launching" in out
