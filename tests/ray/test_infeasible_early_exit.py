"""With RAY_enable_infeasible_task_early_exit the GCS fails what we report infeasible (item 5).

A real head started with that flag, a driver waiting on a task no group can serve: once our
report names the request infeasible, the driver's `ray.get` fails instead of hanging.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from kuberay_scaler.adapters.ray_gcs.client import GcsClient
from kuberay_scaler.adapters.ray_gcs.report import build_autoscaling_state
from kuberay_scaler.adapters.ray_gcs.state import parse_ray_state
from kuberay_scaler.loop.report import report_from_plan
from kuberay_standins.ray_local import RayDriver, RayHead
from tests.factories import NOW, NOW_MS, cluster, group, plan_of
from tests.ray.helpers import wait_for_state

pytestmark = pytest.mark.ray

DRIVER = """
@ray.remote(num_gpus=8)
def huge():
    return 1

ref = huge.remote()
try:
    ray.get(ref, timeout=300)
    print("NO_ERROR", flush=True)
except Exception as err:  # the kind of error is what the test reads
    print(f"FAILED {type(err).__name__}: {err}".replace("\\n", " ")[:500], flush=True)
"""


@pytest.fixture(scope="module")
def head() -> Iterator[RayHead]:
    ray_head = RayHead.start(ip="127.0.0.12", env={"RAY_enable_infeasible_task_early_exit": "1"})
    try:
        yield ray_head
    finally:
        ray_head.stop()


def _gpu_pending(state: Any) -> bool:
    return any(
        dict(r.request.resources_bundle).get("GPU") == 8.0 for r in state.pending_resource_requests
    )


async def test_a_reported_infeasible_task_fails_fast_in_the_driver(
    head: RayHead, client: GcsClient
) -> None:
    driver = RayDriver.start(
        head.gcs_address, DRIVER, node_ip=head.ip, env=head.client_env(), wait_ready=False
    )
    try:
        state = await wait_for_state(client, _gpu_pending, what="the GPU task pending")
        await asyncio.sleep(5)
        assert "FAILED" not in driver.output(), "failed before anything was reported"
        result = plan_of(
            cluster(group("cpu", max_replicas=2)), [], parse_ray_state(state, read_at_ms=NOW_MS)
        )
        assert [i.count for i in result.infeasible] == [1]
        report = report_from_plan(result, int(NOW.timestamp()))
        await client.report(build_autoscaling_state(report))
        for _ in range(600):
            if "FAILED" in driver.output() or "NO_ERROR" in driver.output():
                break
            await asyncio.sleep(0.2)
        out = driver.output()
        assert "FAILED TaskUnschedulableError" in out, out
    finally:
        driver.stop()
