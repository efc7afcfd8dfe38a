"""Above maxReplicas through the loop (issue 12 items 1–2): idle surplus drained then deleted in
one reconcile; busy surplus drained with reason preemption, deleted by a later reconcile."""

from __future__ import annotations

from kuberay_scaler.core.defaults import PREEMPT_DEADLINE_S
from kuberay_scaler.core.model.drains import DrainReason
from kuberay_scaler.core.model.ray import NodeStatus
from tests.control.fakes import make_loop
from tests.control.worlds import spec_group, surplus_busy_slice_world, workers_to_delete
from tests.factories import (
    cluster,
    head_node,
    node,
    node_id_of,
    slice_pods,
    state,
    tpu_group,
    tpu_slice_nodes,
)

PREEMPTION, IDLE_TERMINATION = DrainReason.PREEMPTION, DrainReason.IDLE_TERMINATION


async def test_busy_slice_above_max_is_preempted_then_deleted_once_drained() -> None:
    loop, busy = surplus_busy_slice_world()

    await loop.reconciler.reconcile()
    # Drained with reason preemption, every host, and nothing written to the RayCluster.
    assert sorted(d.node_id for d in loop.gcs.drains) == sorted(
        node_id_of(f"tpu-a-{i}") for i in range(4)
    )
    assert {d.reason for d in loop.gcs.drains} == {PREEMPTION}
    assert not loop.writer.calls
    assert workers_to_delete(loop) == []

    # Still busy before the preemption deadline: no second drain, nothing deleted.
    loop.clock.advance(PREEMPT_DEADLINE_S / 2)
    loop.see_ray(state([head_node(), *busy]))
    await loop.reconciler.reconcile()
    assert len(loop.gcs.drains) == 4
    assert workers_to_delete(loop) == []

    # Ray reports the hosts drained (DRAINING, nothing in use): the whole slice is deleted.
    drained = [
        node(
            n.instance_id,
            group_name="tpu",
            resources=dict(n.total),
            labels=dict(n.labels),
            draining=True,
        )
        for n in busy
    ]
    assert {n.status for n in drained} == {NodeStatus.DRAINING}
    loop.clock.advance(1)
    loop.see_ray(state([head_node(), *drained]))
    await loop.reconciler.reconcile()
    # Drained once more for idle termination (the gate's (a): accepted now), then deleted.
    assert [d.reason for d in loop.gcs.drains[4:]] == [IDLE_TERMINATION] * 4
    assert sorted(workers_to_delete(loop)) == [f"tpu-a-{i}" for i in range(4)]
    assert spec_group(loop)["replicas"] == 0


async def test_a_slice_still_busy_when_its_preemption_notice_ends_is_deleted_whole() -> None:
    """Found live (e2e max_replicas_edited 2 -> 1): past the deadline the plan sent one more
    idle-termination drain, the fresh read found the slice busy and kept it, and a new notice
    began: the surplus slice was never deleted. The notice over, it goes with no second drain."""
    loop, busy = surplus_busy_slice_world()
    await loop.reconciler.reconcile()
    assert {d.reason for d in loop.gcs.drains} == {PREEMPTION}

    loop.clock.advance(PREEMPT_DEADLINE_S + 1)
    loop.see_ray(state([head_node(), *busy]))
    await loop.reconciler.reconcile()
    assert [d.reason for d in loop.gcs.drains] == [PREEMPTION] * 4  # no idle drain after it
    assert sorted(workers_to_delete(loop)) == [f"tpu-a-{i}" for i in range(4)]  # the whole slice
    assert spec_group(loop)["replicas"] == 0


async def test_idle_slice_above_max_is_drained_and_deleted_in_one_reconcile() -> None:
    rc = cluster(tpu_group(replicas=2, max_replicas=1))
    pods = slice_pods("tpu", "tpu-a", 4) + slice_pods("tpu", "tpu-b", 4)
    nodes = [
        head_node(),
        *tpu_slice_nodes("tpu-a", 4, busy_hosts=(0,)),
        *tpu_slice_nodes("tpu-b", 4, idle_s=5),  # far below the idle timeout: over max anyway
    ]
    loop = make_loop(rc, pods, state(nodes))
    await loop.reconciler.reconcile()
    assert {d.reason for d in loop.gcs.drains} == {IDLE_TERMINATION}
    assert sorted(workers_to_delete(loop)) == [f"tpu-b-{i}" for i in range(4)]
    assert spec_group(loop)["replicas"] == 1


async def test_a_refused_drain_above_max_keeps_the_slice_and_the_target_at_max() -> None:
    rc = cluster(tpu_group(replicas=3, max_replicas=1))
    pods = [p for k in ("tpu-a", "tpu-b", "tpu-c") for p in slice_pods("tpu", k, 4)]
    nodes = [
        head_node(),
        *tpu_slice_nodes("tpu-a", 4, busy_hosts=(0,)),
        *tpu_slice_nodes("tpu-b", 4, idle_s=50),
        *tpu_slice_nodes("tpu-c", 4, idle_s=40),
    ]
    loop = make_loop(rc, pods, state(nodes))
    # Became busy between the plan and its drain: every host refuses, the slice is kept.
    loop.gcs.refuse = {node_id_of(f"tpu-c-{i}") for i in range(4)}
    await loop.reconciler.reconcile()
    # The whole drained slice only.
    assert sorted(workers_to_delete(loop)) == [f"tpu-b-{i}" for i in range(4)]
    assert spec_group(loop)["replicas"] == 1  # never above maxReplicas
