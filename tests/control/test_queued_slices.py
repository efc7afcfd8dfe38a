"""The loop and Kueue-gated slices, against the control fakes: pods are gated the way
Kueue gates the pods of a workload slice it has not admitted (`spec.schedulingGates:
[{name: kueue.x-k8s.io/elastic-job}]`, Pending, `PodScheduled=False/SchedulingGated`). A
ClusterQueue's quota admits one slice, then two: the queued slice is never replaced, nothing is
provisioned twice, and it runs once its gates are lifted; demand gone while it is queued cancels
it undrained. Every write is judged by the invariant checker against the world it landed in."""

from __future__ import annotations

from typing import Any

from structlog.testing import capture_logs

from kuberay_scaler.core.model.ray import RayNode
from kuberay_scaler.core.model.slices import SliceState
from tests.control.fakes import Loop, WriteCall, make_loop
from tests.control.worlds import spec_group, workers_to_delete
from tests.factories import (
    KUEUE_ELASTIC_GATE,
    cluster,
    head_node,
    slice_pods,
    state,
    tasks,
    tpu_group,
    tpu_slice_nodes,
)
from tests.invariants import Violation, World, Write, check_write

TPU4 = {"TPU": 4}


class _Judge:
    """Every write against the pods and Ray nodes as they are when it lands."""

    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        self.nodes: list[RayNode] = []
        self.violations: list[Violation] = []
        self._before: dict[str, Any] = loop.server.obj
        loop.writer.after_apply = self._judge

    def _judge(self, call: WriteCall) -> None:
        pods = {p["metadata"]["name"]: p for p in self.loop.pods.pods}
        ray = {n.instance_id: n.status.value for n in self.nodes}
        after = self.loop.server.obj
        self.violations += check_write(
            Write(self._before, after, by="kuberay-scaler"), World(pods, ray)
        )
        self._before = after


async def _step(
    loop: Loop, judge: _Judge, nodes: list[RayNode], pending_tpu_tasks: int, every_s: float = 10
) -> None:
    judge.nodes = nodes
    loop.clock.advance(every_s)
    demand = [tasks(TPU4, pending_tpu_tasks)] if pending_tpu_tasks else []
    loop.see_ray(state([head_node(), *nodes], tasks=demand))
    await loop.reconciler.reconcile()


def _queued(replica: str) -> list[dict[str, Any]]:
    return slice_pods("tpu", replica, 4, age_s=0, gates=(KUEUE_ELASTIC_GATE,))


def _admitted_and_queued() -> tuple[Loop, _Judge, list[dict[str, Any]], list[RayNode]]:
    """Two tpu slices asked for: Kueue admitted tpu-a (its pods, busy Ray nodes returned), tpu-b
    waits gated in the queue; every write judged."""
    admitted = slice_pods("tpu", "tpu-a", 4, age_s=0)
    loop = make_loop(cluster(tpu_group(replicas=2, max_replicas=4)), [*admitted, *_queued("tpu-b")])
    busy = tpu_slice_nodes("tpu-a", 4, busy_hosts=(0, 1, 2, 3))
    return loop, _Judge(loop), admitted, busy


def _state_of(loop: Loop, key: str) -> SliceState:
    plan = loop.reconciler.status.last_plan
    assert plan is not None and plan.slice_map is not None
    [sl] = [s for s in plan.slice_map.groups["tpu"].slices if s.key == key]
    return sl.state


async def test_quota_for_one_slice_then_two_no_replacement_nothing_provisioned_twice() -> None:
    # Two slices asked for; Kueue admits one (it runs, busy), the other waits in the queue.
    loop, judge, admitted, busy = _admitted_and_queued()
    # 20 minutes in the queue (past the 15-min provisioning deadline), the demand it will serve
    # pending all along: 4 TPU tasks wait for tpu-b.
    for _ in range(40):
        await _step(loop, judge, busy, pending_tpu_tasks=4, every_s=30)
    assert _state_of(loop, "tpu-b") is SliceState.QUEUED
    assert loop.writer.applied == []  # no replacement, no second slice for the same demand
    assert spec_group(loop)["replicas"] == 2 and workers_to_delete(loop) == []
    assert loop.gcs.drains == []
    [report, *_] = reversed(loop.gcs.reports)
    queued = [p for p in report.pending_pods if p.pod_name.startswith("tpu-b")]
    assert len(queued) == 4 and all("queued in Kueue" in p.detail for p in queued)

    # Quota frees: Kueue lifts the gates; the pods run and join Ray; the tasks run there.
    loop.pods.pods = [*admitted, *slice_pods("tpu", "tpu-b", 4, age_s=0)]
    both = [*busy, *tpu_slice_nodes("tpu-b", 4, busy_hosts=(0, 1, 2, 3))]
    for _ in range(3):
        await _step(loop, judge, both, pending_tpu_tasks=0)
    assert _state_of(loop, "tpu-b") is SliceState.COMPLETE
    assert loop.writer.applied == [] and spec_group(loop)["replicas"] == 2
    assert judge.violations == []


async def test_demand_gone_while_queued_cancels_the_slice_undrained() -> None:
    loop, judge, _, busy = _admitted_and_queued()
    # Wanted while the daemon's view of Ray settles (the first 180 s of fresh replies).
    for _ in range(20):
        await _step(loop, judge, busy, pending_tpu_tasks=4)
    assert loop.writer.applied == []
    # The job no longer wants the second slice: after the idle timeout (60 s) it is cancelled.
    gone_at = loop.clock.monotonic()
    for _ in range(20):
        await _step(loop, judge, busy, pending_tpu_tasks=0)
        if loop.writer.applied:
            break
    assert loop.clock.monotonic() - gone_at >= 60
    assert workers_to_delete(loop) == [f"tpu-b-{i}" for i in range(4)]
    assert spec_group(loop)["replicas"] == 1
    assert loop.gcs.drains == []  # its pods never ran: nothing to drain
    assert judge.violations == []


async def test_the_log_says_when_a_slice_enters_and_leaves_the_queue() -> None:
    loop, judge, admitted, busy = _admitted_and_queued()
    with capture_logs() as logs:
        await _step(loop, judge, busy, pending_tpu_tasks=4)
        await _step(loop, judge, busy, pending_tpu_tasks=4)
        loop.pods.pods = [*admitted, *slice_pods("tpu", "tpu-b", 4, age_s=0)]  # gates lifted
        await _step(loop, judge, busy, pending_tpu_tasks=4)
    said = [(e["event"], e.get("slice"), e.get("state")) for e in logs if "queue" in e["event"]]
    assert said == [("slice queued", "tpu-b", None), ("slice left the queue", "tpu-b", "pending")]
    queued = next(e for e in logs if e["event"] == "slice queued")
    assert "queued in Kueue" in queued["reason"]
