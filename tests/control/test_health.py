"""Issue 20, promise 2: health judged by progress, on the fake clock.

The loop is unhealthy once it has had work to do (a write, a drain, demand it should serve) and
has not achieved it for UNHEALTHY_AFTER_S, whatever the cause: write failures with backoff in
between, an exception on every reconcile, a GCS or an API server it cannot read. The
last-success metric advances only when the inputs were fresh and the planned writes were done.
Every test also asserts the invariants (no undrained deletion, targets within [min, max]).
"""

from __future__ import annotations

from typing import Any

import pytest

from kuberay_scaler.core.model.drains import DrainReason, SliceDrainResult
from kuberay_scaler.loop.config import LoopConfig
from tests.control.fakes import FakeGcs, Loop, make_loop
from tests.control.worlds import scale_up_world, spec_group, workers_to_delete
from tests.factories import (
    cluster,
    group,
    head_node,
    slice_pods,
    state,
    tpu_group,
    tpu_slice_nodes,
)

UNHEALTHY_AFTER_S = 20.0
CONFIG = LoopConfig(unhealthy_after_s=UNHEALTHY_AFTER_S)


async def every(loop: Loop, seconds: float, ray: Any, step: float = 2.0) -> list[bool]:
    """Reconcile every `step` seconds for `seconds`, the GCS showing `ray` (None: unknown);
    the health after each reconcile."""
    health = []
    elapsed = 0.0
    while elapsed < seconds:
        loop.clock.advance(step)
        elapsed += step
        loop.see_ray(ray)
        await loop.reconciler.reconcile()
        health.append(loop.reconciler.health()[0])
    return health


def blind_seconds(loop: Loop, source: str) -> float:
    value = loop.reconciler.metrics.sample("kuberay_scaler_blind_seconds", {"source": source})
    assert value is not None
    return value


def last_success(loop: Loop) -> float:
    metrics = loop.reconciler.metrics
    value = metrics.sample("kuberay_scaler_last_successful_reconcile_timestamp_seconds")
    return value or 0.0


@pytest.mark.parametrize("status", [500, 403])
async def test_every_patch_failing_for_40_s_fails_healthz(status: int) -> None:
    loop, demand = scale_up_world(config=CONFIG)
    loop.writer.answer(status, times=1000)
    health = await every(loop, 40, demand)
    assert len(loop.writer.calls) >= 2  # it kept trying, with backoff in between
    assert spec_group(loop).get("replicas", 0) == 0  # nothing applied, nothing invented
    assert not health[-1], f"healthz still 200 after 40 s of {status}: {loop.reconciler.health()}"
    assert health[0], "unhealthy before UNHEALTHY_AFTER_S passed"


class RaisingGcs(FakeGcs):
    """Every drain raises (say the int64 overflow of an absurd drain deadline)."""

    async def drain(self, node_ids: Any, *, reason: DrainReason, **kw: Any) -> SliceDrainResult:
        raise OverflowError("Value out of range: 1e+303")


async def test_a_drain_raising_on_every_reconcile_fails_healthz() -> None:
    pods = slice_pods("tpu", "tpu-a", 4)
    nodes = [head_node(), *tpu_slice_nodes("tpu-a", 4, idle_s=900)]
    ray = state(nodes)
    loop = make_loop(cluster(tpu_group(replicas=1)), pods, ray, config=CONFIG)
    raising = RaisingGcs(monotonic=loop.clock.monotonic)  # reads stamped as the loop's are
    raising.fresh, raising.cluster_id = loop.gcs.fresh, loop.gcs.cluster_id
    loop.reconciler._gcs = raising
    health = await every(loop, 40, ray)
    assert workers_to_delete(loop) == [], "deleted without an accepted drain"
    assert spec_group(loop)["replicas"] == 1
    assert not health[-1], f"healthz 200 while every drain raises: {loop.reconciler.health()}"


async def test_gcs_unreachable_with_demand_pending_fails_healthz_and_stops_the_success_clock() -> (
    None
):
    loop, _ = scale_up_world(config=CONFIG)
    await loop.reconciler.reconcile()
    assert spec_group(loop)["replicas"] == 2  # served once; the demand is still pending
    blind_from = loop.clock.wall().timestamp()
    health = await every(loop, 60, None)
    assert spec_group(loop)["replicas"] == 2  # blind: nothing written
    assert not health[-1], f"healthz 200 after 60 s blind with demand: {loop.reconciler.health()}"
    assert last_success(loop) <= blind_from, "held reconciles counted as successes"
    assert blind_seconds(loop, "gcs") >= 55 and blind_seconds(loop, "pods") == 0


async def test_pods_unreadable_with_demand_pending_fails_healthz() -> None:
    """401 (token revoked) or 403 (RBAC removed): the informer is not synced, the plan holds."""
    loop, demand = scale_up_world(config=CONFIG)
    loop.pods.synced = False
    health = await every(loop, 60, demand)
    assert spec_group(loop).get("replicas", 0) == 0
    assert not health[-1], f"healthz 200 after 60 s unsynced with demand: {health}"


async def test_a_quiet_loop_with_nothing_to_do_stays_healthy() -> None:
    loop = make_loop(cluster(group("cpu", max_replicas=5)), [], state([head_node()]), config=CONFIG)
    health = await every(loop, 120, state([head_node()]))
    assert all(health) and loop.writer.calls == []


async def test_write_failures_that_recover_are_healthy_again() -> None:
    loop, demand = scale_up_world(config=CONFIG)
    loop.writer.answer(500, times=1000)
    assert not (await every(loop, 40, demand))[-1]
    loop.writer._script.clear()
    health = await every(loop, 120, demand)
    assert health[-1] and spec_group(loop)["replicas"] == 2
    assert last_success(loop) == loop.clock.wall().timestamp()  # fresh and written: progress
