"""Issue 30, "deadlines that nothing wakes": every deadline the plan holds is a wake-up time.

The daemon's loop waits for a change at most `min(resync, Reconciler.seconds_to_wake())`
(app.py); here that wait runs on virtual time with no change arriving, so only a wake-up the
plan asked for (or the resync) can bring the next reconcile. KubeRay's e2e case "maxReplicas
2 -> 1": the busy surplus worker is drained with the 30 s preemption notice and must be removed
when the notice ends, not at the next resync (worst case past 60 s of the test's 60).
"""

from __future__ import annotations

from kuberay_scaler.core.defaults import PREEMPT_DEADLINE_S
from kuberay_scaler.core.model.drains import DrainReason
from kuberay_scaler.core.model.labels import ANNOTATION_MAX_PROVISION
from kuberay_scaler.core.model.ray import NodeStatus, RayNode
from kuberay_scaler.core.planner.deadlines import Deadlines
from kuberay_scaler.core.planner.policy import Policy
from kuberay_scaler.loop.trigger import WAKE_MARGIN_S
from tests.control.fakes import Loop, make_loop
from tests.control.worlds import broken_busy_slice_world, named_pods
from tests.factories import (
    cluster,
    head_node,
    slice_pods,
    state,
    tasks,
    tpu_group,
    tpu_slice_nodes,
)

RESYNC_S = 30.0  # KUBERAY_SCALER_RESYNC_INTERVAL_S's default


async def _wait_for_nothing(loop: Loop, ray: object) -> float:
    """The loop's wait when no change comes: the wake-up the plan asked for, else the resync;
    then the timer's reconcile. Returns the virtual seconds waited."""
    wake = loop.reconciler.seconds_to_wake()
    waited = RESYNC_S if wake is None else min(RESYNC_S, wake)
    loop.clock.advance(waited)
    loop.see_ray(ray)  # the poller keeps publishing the same (busy) state
    await loop.reconciler.reconcile({"timer"})
    return waited


async def test_a_preempted_surplus_slice_is_removed_when_its_notice_ends_not_at_a_resync() -> None:
    rc = cluster(tpu_group(replicas=2, max_replicas=1))
    pods = slice_pods("tpu", "tpu-a", 4) + slice_pods("tpu", "tpu-b", 4)
    busy = state(
        [
            head_node(),
            *tpu_slice_nodes("tpu-a", 4, busy_hosts=(0,)),
            *tpu_slice_nodes("tpu-b", 4, busy_hosts=(1, 2)),
        ]
    )
    loop = make_loop(rc, pods, busy)
    loop.clock.advance(17)  # the drain lands mid-way between two resyncs
    loop.see_ray(busy)
    await loop.reconciler.reconcile()
    assert {d.reason for d in loop.gcs.drains} == {DrainReason.PREEMPTION}
    assert named_pods(loop) == set()
    # 2 s later the poller sees tpu-a's hosts DRAINING (work still on one): a change-woken
    # reconcile, after which the resync timer starts again.
    drained = {d.node_id for d in loop.gcs.drains}
    draining = state(
        [
            RayNode(**{**n.__dict__, "status": NodeStatus.DRAINING}) if n.node_id in drained else n
            for n in busy.nodes
        ]
    )
    loop.clock.advance(2)
    loop.see_ray(draining)
    await loop.reconciler.reconcile({"gcs"})
    assert named_pods(loop) == set()

    waited = 2.0
    while not named_pods(loop) and waited < 2 * RESYNC_S + PREEMPT_DEADLINE_S:
        waited += await _wait_for_nothing(loop, draining)
    assert named_pods(loop), "the surplus slice was never removed"
    # Removed at its deadline (plus the wake margin), by the plan's own wake-up, not a resync.
    assert PREEMPT_DEADLINE_S <= waited <= PREEMPT_DEADLINE_S + WAKE_MARGIN_S, waited


async def test_the_broken_busy_bound_ending_is_a_wake_up() -> None:
    """A broken slice kept over busy hosts is drained for preemption when its bound ends (here
    45 s, between two resyncs), not at the resync after it."""
    loop, ray = broken_busy_slice_world(
        Policy(deadlines=Deadlines(broken_busy_max_s=45, preempt_deadline_s=30))
    )
    await loop.reconciler.reconcile()
    assert loop.gcs.drains == []
    waited = 0.0
    while not loop.gcs.drains and waited < 3 * RESYNC_S:
        waited += await _wait_for_nothing(loop, ray)
    assert {d.reason for d in loop.gcs.drains} == {DrainReason.PREEMPTION}
    assert 45 <= waited <= 45 + WAKE_MARGIN_S, waited


async def test_a_groups_provisioning_deadline_is_a_wake_up() -> None:
    """Issue 29's deadline path under KubeRay's Role (no Events): a slice Unschedulable since it
    was created falls back when the group's own deadline (here 45 s, between two resyncs)
    passes, not at the resync after it (bench_fallback: deadline + 10.4 s before)."""
    v6e = tpu_group("v6e", replicas=1, priority=10)
    v6e["template"].setdefault("metadata", {})["annotations"] = {ANNOTATION_MAX_PROVISION: "45"}
    v5e = tpu_group("v5e", accelerator="tpu-v5-lite-podslice", topology="4x4")
    pods = slice_pods("v6e", "v6e-a", 4, phase="Pending", age_s=0)
    for pod in pods:  # no node fits: the scheduler's condition, never bound
        pod["spec"].pop("nodeName", None)
        condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
        pod["status"] = {"phase": "Pending", "conditions": [condition]}
    demand = state([head_node()], [tasks({"TPU": 4}, 4)])
    loop = make_loop(cluster(v6e, v5e), pods, demand)
    await loop.reconciler.reconcile()

    def v5e_replicas() -> int:
        groups = loop.server.obj["spec"]["workerGroupSpecs"]
        return int(next(g for g in groups if g["groupName"] == "v5e").get("replicas") or 0)

    assert v5e_replicas() == 0
    waited = 0.0
    while not v5e_replicas() and waited < 3 * RESYNC_S:
        waited += await _wait_for_nothing(loop, demand)
    assert v5e_replicas() == 1, "never fell back to v5e"
    assert 45 <= waited <= 45 + WAKE_MARGIN_S, waited
