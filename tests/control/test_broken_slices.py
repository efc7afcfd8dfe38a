"""The loop and broken slices (docs/reliability.md, "Broken slices"): a broken slice whose Ray
nodes are busy is kept; once they are idle it is replaced, its live hosts drained first. Every
write is judged by the invariant checker (tests/invariants.py) against the world it landed in."""

from __future__ import annotations

from typing import Any

from kuberay_scaler.core.model.drains import DrainReason
from kuberay_scaler.core.model.ray import NodeStatus, RayNode
from kuberay_scaler.core.model.reasons import Keep, KeepKind
from tests.control.fakes import Loop, WriteCall, make_loop
from tests.control.worlds import spec_group, workers_to_delete
from tests.factories import (
    cluster,
    head_node,
    node_id_of,
    slice_pods,
    state,
    tpu_group,
    tpu_slice_nodes,
)
from tests.invariants import DRAINING, Violation, World, Write, check_write


def _unknown_host_pods() -> list[dict[str, Any]]:
    pods = slice_pods("tpu", "tpu-a", 4, age_s=3700, running_for_s=3600)
    pods[2]["status"]["phase"] = "Unknown"  # kubelet unreachable; the raylet still runs
    return pods


def _failed_host_pods() -> list[dict[str, Any]]:
    pods = slice_pods("tpu", "tpu-a", 4, age_s=3700, running_for_s=3600)
    pods[3]["status"]["phase"] = "Failed"
    return pods


class _Judge:
    """Judges every write the loop sends against the pods and the Ray nodes as the GCS has them
    at that moment (a node whose drain was accepted is DRAINING)."""

    def __init__(self, loop: Loop, pods: list[dict[str, Any]]) -> None:
        self.loop, self.pods = loop, {p["metadata"]["name"]: p for p in pods}
        self.nodes: list[RayNode] = []
        self.violations: list[Violation] = []
        self.drains_before: list[int] = []  # drains sent when each write went out
        self._before: dict[str, Any] = loop.server.obj
        loop.writer.after_apply = self._judge

    def _judge(self, call: WriteCall) -> None:
        self.drains_before.append(len(self.loop.gcs.drains))
        drained = set(self.loop.gcs.drained)
        ray = {
            n.instance_id: DRAINING if n.node_id in drained else n.status.value
            for n in self.nodes
            if n.status is not NodeStatus.DEAD
        }
        after = self.loop.server.obj
        write = Write(self._before, after, by="kuberay-scaler")
        self.violations += check_write(write, World(self.pods, ray))
        self._before = after


def _judged(pods: list[dict[str, Any]]) -> tuple[Loop, _Judge]:
    """tpu-a's slot (at most 4) over `pods`, Ray showing the head alone; every write judged."""
    loop = make_loop(cluster(tpu_group(replicas=1, max_replicas=4)), pods, state([head_node()]))
    return loop, _Judge(loop, pods)


async def _reconcile(loop: Loop, judge: _Judge, nodes: list[RayNode]) -> None:
    judge.nodes = nodes
    loop.clock.advance(5)
    loop.see_ray(state([head_node(), *nodes]))
    await loop.reconciler.reconcile()


async def test_a_busy_broken_slice_is_kept_then_drained_and_replaced_once_idle() -> None:
    pods = _unknown_host_pods()
    busy = tpu_slice_nodes("tpu-a", 4, idle_s=None)
    loop, judge = _judged(pods)
    for _ in range(3):
        await _reconcile(loop, judge, busy)
    assert workers_to_delete(loop) == [] and loop.gcs.drains == []
    plan = loop.reconciler.status.last_plan
    assert plan is not None
    kept = [r for r in plan.groups[0].reasons if isinstance(r, Keep)]
    assert [(r.kind, r.slice) for r in kept] == [(KeepKind.BROKEN_BUT_BUSY, "tpu-a")]

    # The work ends: every host idle. Now the broken slice is replaced, its hosts drained first.
    await _reconcile(loop, judge, tpu_slice_nodes("tpu-a", 4, idle_s=10))
    assert sorted(loop.gcs.drained) == sorted(node_id_of(f"tpu-a-{i}") for i in range(4))
    assert all(d.reason is DrainReason.IDLE_TERMINATION for d in loop.gcs.drains)
    assert sorted(workers_to_delete(loop)) == [f"tpu-a-{i}" for i in range(4)]
    assert spec_group(loop)["replicas"] == 1  # KubeRay creates the fresh replica
    # record (no drain yet) → drains → patch (every drain sent before it)
    assert judge.drains_before == [0, 4]
    assert judge.violations == [], "\n".join(map(str, judge.violations))


async def test_a_host_turned_busy_after_the_plan_keeps_the_broken_slice() -> None:
    """The fresh GCS read before draining is made for a replaced slice even with a host gone."""
    pods = _failed_host_pods()
    idle = [n for n in tpu_slice_nodes("tpu-a", 4, idle_s=10) if n.instance_id != "tpu-a-3"]
    loop, judge = _judged(pods)
    judge.nodes = idle
    loop.clock.advance(5)
    loop.see_ray(state([head_node(), *idle]))
    # Between the plan and the drains, host 0 starts work.
    turned = [
        n
        for n in tpu_slice_nodes("tpu-a", 4, busy_hosts=(0,))
        if n.instance_id in {"tpu-a-0", "tpu-a-1", "tpu-a-2"}
    ]
    loop.gcs.fresh = state([head_node(), *turned])
    await loop.reconciler.reconcile()
    assert loop.gcs.drains == [], "a slice with a host turned busy was drained"
    assert workers_to_delete(loop) == []
    assert judge.violations == [], "\n".join(map(str, judge.violations))


async def test_dead_hosts_of_a_replaced_slice_are_not_drained() -> None:
    pods = _failed_host_pods()
    live = [n for n in tpu_slice_nodes("tpu-a", 4, idle_s=10) if n.instance_id != "tpu-a-3"]
    loop, judge = _judged(pods)
    await _reconcile(loop, judge, live)
    assert sorted(loop.gcs.drained) == sorted(node_id_of(f"tpu-a-{i}") for i in range(3))
    assert sorted(workers_to_delete(loop)) == [f"tpu-a-{i}" for i in range(4)]
    assert judge.drains_before == [0, 3]
    assert judge.violations == [], "\n".join(map(str, judge.violations))
