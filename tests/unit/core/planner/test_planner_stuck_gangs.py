"""A gang stuck on a broken slice is replaced as a gang (item 4): one host of a slice
died, the job's placement group is RESCHEDULING with that host's bundle pinned to the slice,
and the surviving hosts hold only that group's bundles. The slice is drained for preemption now
and replaced once the deadline passes, instead of being kept busy for up to 30 min."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from kuberay_scaler.core.model.plan import DeleteKind, Memory
from kuberay_scaler.core.model.ray import GangDemand, GangStrategy, RayNode
from kuberay_scaler.core.model.reasons import Keep, KeepKind, Replace
from tests.factories import (
    NOW,
    NOW_S,
    cluster,
    head_node,
    plan_of,
    selector_bundle,
    slice_pods,
    state,
    tpu_group,
    tpu_slice_nodes,
)

PG = "31de5490dcaa8f272536c672df9b02000000"
OTHER_PG = "d22d8963e079f06cf71ef8917e9702000000"


def _holding(node: RayNode, pg: str, index: int, bundle_tpu: float = 4.0) -> RayNode:
    """`node` with one `{TPU: bundle_tpu}` bundle of `pg` placed on it, as the GCS reports it,
    and every TPU in use (beyond the bundle's, by work outside the group)."""
    total = {
        **node.total,
        f"TPU_group_{pg}": bundle_tpu,
        f"TPU_group_{index}_{pg}": bundle_tpu,
        f"bundle_group_{pg}": 1000.0,
        f"bundle_group_{index}_{pg}": 1000.0,
    }
    available = {
        **node.available,
        "TPU": 0.0,
        f"TPU_group_{pg}": 0.0,
        f"TPU_group_{index}_{pg}": 0.0,
        f"bundle_group_{pg}": 999.999,
        f"bundle_group_{index}_{pg}": 999.999,
    }
    return replace(node, total=total, available=available, idle_since_ms=None)


def _broken_gang_slice(
    pg_on_hosts: str = PG, bundle_tpu: float = 4.0
) -> tuple[list[dict[str, object]], list[RayNode]]:
    pods = slice_pods("tpu", "tpu-a", 4, age_s=3700, running_for_s=3600)
    pods[3]["status"]["phase"] = "Failed"  # host 3 died
    survivors = tpu_slice_nodes("tpu-a", 4, idle_s=None)[:3]
    nodes = [_holding(n, pg_on_hosts, i, bundle_tpu) for i, n in enumerate(survivors)]
    return pods, nodes


def _rescheduling(pg: str = PG) -> GangDemand:
    pinned = selector_bundle({"TPU": 4}, {"ray.io/tpu-slice-name": "tpu-a"})
    return GangDemand((pinned,), GangStrategy.SPREAD, details=f"{pg}:SPREAD|RESCHEDULING")


def test_a_slice_only_its_rescheduling_gang_holds_is_drained_now_and_then_replaced() -> None:
    pods, nodes = _broken_gang_slice()
    rc = cluster(tpu_group(replicas=1))
    ray = state([head_node(), *nodes], gangs=[_rescheduling()])
    first = plan_of(rc, pods, ray)
    decision = first.group("tpu")
    assert decision is not None
    [preempt] = decision.preempt
    assert preempt.kind is DeleteKind.PREEMPT and preempt.slice_key == "tpu-a"
    assert isinstance(preempt.reason, Replace) and "RESCHEDULING" in preempt.reason.cause
    assert decision.deletions == ()  # never deleted in the plan that drains it
    deadline = first.memory.preempting["tpu-a"]
    assert deadline == NOW_S + 30  # monotonic seconds (the wall clock stands in)
    # Past the preemption deadline it is replaced whole, without a second drain.
    later = plan_of(rc, pods, ray, memory=first.memory, now=NOW + timedelta(seconds=31))
    [gone] = later.group("tpu").deletions  # type: ignore[union-attr]
    assert gone.kind is DeleteKind.REPLACE and gone.node_ids == ()


def test_without_a_rescheduling_gang_the_busy_broken_slice_is_kept_as_before() -> None:
    pods, nodes = _broken_gang_slice()
    result = plan_of(cluster(tpu_group(replicas=1)), pods, state([head_node(), *nodes]))
    decision = result.group("tpu")
    assert decision is not None and decision.preempt == () and decision.deletions == ()
    kinds = [r.kind for r in decision.reasons if isinstance(r, Keep)]
    assert kinds == [KeepKind.BROKEN_BUT_BUSY]


def test_a_host_held_by_another_group_keeps_the_slice() -> None:
    pods, nodes = _broken_gang_slice(pg_on_hosts=OTHER_PG)
    ray = state([head_node(), *nodes], gangs=[_rescheduling()])
    decision = plan_of(cluster(tpu_group(replicas=1)), pods, ray).group("tpu")
    assert decision is not None and decision.preempt == ()


def test_work_outside_the_waiting_gang_keeps_the_slice() -> None:
    pods, nodes = _broken_gang_slice(bundle_tpu=2.0)  # 2 TPUs used outside the group
    ray = state([head_node(), *nodes], gangs=[_rescheduling()])
    decision = plan_of(cluster(tpu_group(replicas=1)), pods, ray).group("tpu")
    assert decision is not None and decision.preempt == ()


def test_a_pending_not_rescheduling_gang_does_not_count() -> None:
    pods, nodes = _broken_gang_slice()
    gang = replace(_rescheduling(), details=f"{PG}:SPREAD|PENDING")
    ray = state([head_node(), *nodes], gangs=[gang])
    decision = plan_of(cluster(tpu_group(replicas=1)), pods, ray, memory=Memory()).group("tpu")
    assert decision is not None and decision.preempt == ()
