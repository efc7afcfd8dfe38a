"""Disruption rules through the loop: a going slice is drained for preemption and
replaced ahead, never deleted; the scale-down delay after a scale-up runs on the loop's
monotonic clock."""

from __future__ import annotations

import copy
from dataclasses import replace

from kuberay_scaler.core.model.drains import DrainReason
from kuberay_scaler.core.model.ray import NodeStatus
from tests.control.fakes import make_loop, run_for
from tests.control.worlds import spec_group, workers_to_delete
from tests.factories import (
    cluster,
    going,
    head_node,
    node_id_of,
    slice_pods,
    state,
    tasks,
    tpu_group,
    tpu_slice_nodes,
)

ALL = (0, 1, 2, 3)


async def test_a_going_slice_is_drained_for_preemption_and_replaced_never_deleted() -> None:
    pods = slice_pods("tpu", "tpu-a", 4) + slice_pods("tpu", "tpu-b", 4)
    going(pods[1])
    busy = [
        *tpu_slice_nodes("tpu-a", 4, busy_hosts=ALL),
        *tpu_slice_nodes("tpu-b", 4, busy_hosts=ALL),
    ]
    loop = make_loop(cluster(tpu_group(replicas=2)), pods, state([head_node(), *busy]))

    await loop.reconciler.reconcile()
    drained = [d for d in loop.gcs.drains if d.reason is DrainReason.PREEMPTION]
    assert sorted(d.node_id for d in drained) == sorted(node_id_of(f"tpu-a-{i}") for i in range(4))
    assert len(loop.gcs.drains) == 4  # tpu-b untouched
    assert spec_group(loop)["replicas"] == 3  # the replacement, before the pod is gone
    assert workers_to_delete(loop) == []  # nothing deleted: the eviction removes the pod

    # The next rounds neither drain it again nor add a second replacement.
    await run_for(loop, 15, state([head_node(), *busy]))
    assert len(loop.gcs.drains) == 4
    assert spec_group(loop)["replicas"] == 3
    assert workers_to_delete(loop) == []


async def test_no_idle_slice_leaves_within_the_delay_after_a_scale_up() -> None:
    pods = slice_pods("tpu", "tpu-a", 4)
    busy = tpu_slice_nodes("tpu-a", 4, busy_hosts=ALL)
    demand = [tasks({"TPU": 4}, 4)]
    loop = make_loop(cluster(tpu_group(replicas=1)), pods, state([head_node(), *busy], demand))
    await loop.reconciler.reconcile()
    assert spec_group(loop)["replicas"] == 2  # a slice added for the demand

    # The new slice comes up and takes the work; tpu-a turns idle and stays so past its timeout.
    loop.pods.pods += slice_pods("tpu", "tpu-b", 4)
    loop.clock.advance(120)
    nodes = [
        head_node(),
        *tpu_slice_nodes("tpu-a", 4, idle_s=100),
        *tpu_slice_nodes("tpu-b", 4, busy_hosts=ALL),
    ]
    loop.see_ray(state(nodes))
    await loop.reconciler.reconcile()
    # 120 s < the 300 s delay
    assert workers_to_delete(loop) == [] and spec_group(loop)["replicas"] == 2

    loop.clock.advance(200)  # 320 s after the scale-up
    loop.see_ray(state(nodes))
    await loop.reconciler.reconcile()
    assert sorted(workers_to_delete(loop)) == [f"tpu-a-{i}" for i in range(4)]
    assert spec_group(loop)["replicas"] == 1


async def test_a_slice_drained_for_a_disruption_that_did_not_happen_is_replaced() -> None:
    """At maxReplicas the going slice is only drained (no write): the loop must still remember
    it, so that once the condition is cleared and the deadline passed it is replaced whole."""
    pods = slice_pods("tpu", "tpu-a", 4) + slice_pods("tpu", "tpu-b", 4)
    going(pods[1])
    busy = [
        *tpu_slice_nodes("tpu-a", 4, busy_hosts=ALL),
        *tpu_slice_nodes("tpu-b", 4, busy_hosts=ALL),
    ]
    rc = cluster(tpu_group(replicas=2, max_replicas=2))
    loop = make_loop(rc, pods, state([head_node(), *busy]))
    await loop.reconciler.reconcile()
    assert len(loop.gcs.drains) == 4 and not loop.writer.calls

    # The pod was not deleted after all: a new object without the condition (as a watch brings).
    cleared = copy.deepcopy(pods[1])
    cleared["status"]["conditions"] = []
    loop.pods.pods[1] = cleared
    drained = [
        replace(n, status=NodeStatus.DRAINING, idle_since_ms=None)
        if n.instance_id.startswith("tpu-a")
        else n
        for n in busy
    ]
    loop.clock.advance(10)
    loop.see_ray(state([head_node(), *drained]))
    await loop.reconciler.reconcile()
    assert workers_to_delete(loop) == []  # before the deadline: it waits

    loop.clock.advance(25)  # past the 30 s notice
    loop.see_ray(state([head_node(), *drained]))
    await loop.reconciler.reconcile()
    assert sorted(workers_to_delete(loop)) == [f"tpu-a-{i}" for i in range(4)]
    assert spec_group(loop)["replicas"] == 2
    assert len(loop.gcs.drains) == 4  # no second drain
