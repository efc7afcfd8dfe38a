"""Broken slices and the first promise: a broken slice with a busy Ray node is kept
(KeepKind.BROKEN_BUT_BUSY); a replaced one has its live (idle) hosts drained before the patch;
hosts with no Ray node are not drained; unknown demand holds."""

from __future__ import annotations

import json
from typing import Any

import jsonpatch

from kuberay_scaler.core.decision import Drain, Observation, Patch, RecordIntent, decide
from kuberay_scaler.core.model.plan import DeleteKind, Memory
from kuberay_scaler.core.model.ray import RayObservation
from kuberay_scaler.core.model.reasons import HoldKind, Keep, KeepKind, Replace, SliceFault
from kuberay_scaler.core.model.slices import SliceState
from kuberay_scaler.core.patch.intent import DRAINING_ANNOTATION
from kuberay_scaler.core.patch.ops import ops_json
from kuberay_scaler.core.planner.deadlines import Deadlines
from kuberay_scaler.core.planner.policy import Policy
from tests.factories import (
    NOW,
    cluster,
    deleted_pods,
    head_node,
    node_id_of,
    plan_of,
    slice_pods,
    state,
    tpu_group,
    tpu_slice_nodes,
)

POLICY = Policy(deadlines=Deadlines(max_provision_s=600, missing_node_grace_s=120))


def _unknown_host_slice() -> list[dict[str, Any]]:
    """A 4-host slice whose host 2 pod is in phase Unknown (kubelet unreachable)."""
    pods = slice_pods("tpu", "tpu-a", 4)
    pods[2]["status"]["phase"] = "Unknown"
    return pods


def _failed_host_slice() -> list[dict[str, Any]]:
    pods = slice_pods("tpu", "tpu-a", 4)
    pods[2]["status"]["phase"] = "Failed"
    pods[2]["status"]["reason"] = "Evicted"
    return pods


def _observe(pods: list[dict[str, Any]], nodes: list[Any]) -> Observation:
    rc = cluster(tpu_group(replicas=1))
    return Observation.parse(
        rc, pods, RayObservation(state([head_node(), *nodes]), 0.0, cluster_id="c-1")
    )


def test_a_broken_slice_with_a_busy_host_is_kept_with_its_kind() -> None:
    nodes = tpu_slice_nodes("tpu-a", 4, idle_s=900, busy_hosts=(1,))
    rc = cluster(tpu_group(replicas=1))
    result = plan_of(rc, _unknown_host_slice(), state([head_node(), *nodes]), policy=POLICY)
    decision = result.group("tpu")
    assert decision is not None
    sl = result.slice_map.groups["tpu"].slices[0] if result.slice_map else None
    assert sl is not None and sl.state is SliceState.BROKEN  # judged broken, still kept
    assert decision.deletions == () and deleted_pods(result, "tpu") == []
    kept = [r for r in decision.reasons if isinstance(r, Keep)]
    assert [(r.kind, r.slice) for r in kept] == [(KeepKind.BROKEN_BUT_BUSY, "tpu-a")]
    assert "busy" in str(kept[0])  # rendered at the edges like the other kinds
    assert decision.target == 1


def test_a_kept_busy_broken_slice_writes_nothing_and_starts_no_backoff() -> None:
    nodes = tpu_slice_nodes("tpu-a", 4, idle_s=None)  # every host running work
    decision = decide(_observe(_failed_host_slice(), nodes), Memory(), POLICY, NOW)
    assert decision.writes == ()
    assert "tpu" not in decision.plan.memory.backoff  # replaced nothing: no backoff counted


def test_a_replaced_slice_drains_its_live_idle_hosts_before_the_patch() -> None:
    nodes = tpu_slice_nodes("tpu-a", 4, idle_s=5)
    decision = decide(_observe(_unknown_host_slice(), nodes), Memory(), POLICY, NOW)
    (deletion,) = decision.plan.groups[0].deletions
    assert deletion.kind is DeleteKind.REPLACE
    assert isinstance(deletion.reason, Replace)
    assert deletion.reason.fault is SliceFault.HOST_FAILED
    # Same order as idle scale-down: draining-intent record → drains → guarded patch.
    record, drain, patch = decision.writes
    assert isinstance(record, RecordIntent) and dict(record.draining) == {"tpu": ("tpu-a",)}
    assert isinstance(drain, Drain) and drain.broken and not drain.preempt
    assert drain.cluster_id == "c-1"
    assert set(drain.node_ids) == {node_id_of(f"tpu-a-{i}") for i in range(4)}
    assert isinstance(patch, Patch)
    planned_from = cluster(tpu_group(replicas=1))  # as `_observe` builds it
    after = jsonpatch.apply_patch(planned_from, ops_json(record.ops), in_place=False)
    final = jsonpatch.apply_patch(after, ops_json(patch.ops), in_place=False)
    doomed = final["spec"]["workerGroupSpecs"][0]["scaleStrategy"]["workersToDelete"]
    assert sorted(doomed) == [f"tpu-a-{i}" for i in range(4)]  # whole slice
    assert final["spec"]["workerGroupSpecs"][0]["replicas"] == 1  # KubeRay recreates it


def test_hosts_without_a_ray_node_are_not_drained() -> None:
    # Host 2's pod failed and its Ray node is gone; host 3 never joined (no node either).
    nodes = [n for i, n in enumerate(tpu_slice_nodes("tpu-a", 4, idle_s=5)) if i < 2]
    decision = decide(_observe(_failed_host_slice(), nodes), Memory(), POLICY, NOW)
    (drain,) = decision.drains
    assert set(drain.node_ids) == {node_id_of("tpu-a-0"), node_id_of("tpu-a-1")}
    assert drain.pods == tuple(f"tpu-a-{i}" for i in range(4))  # judged whole by the gate
    assert not decision.blocked  # host 2 Failed (never seen with a node), host 3 never joined
    patch = decision.patch
    assert patch is not None
    assert isinstance(decision.writes[0], RecordIntent) and decision.writes[-1] is patch


def test_a_replaced_slice_with_no_ray_node_left_is_deleted_without_a_drain() -> None:
    decision = decide(_observe(_failed_host_slice(), []), Memory(), POLICY, NOW)
    assert decision.drains == () and decision.record is None
    (deletion,) = decision.plan.groups[0].deletions
    assert deletion.kind is DeleteKind.REPLACE and deletion.node_ids == ()
    assert decision.patch is not None


def test_unknown_demand_holds_a_broken_slice() -> None:
    rc = cluster(tpu_group(replicas=1))
    decision = decide(Observation.parse(rc, _unknown_host_slice(), None), Memory(), POLICY, NOW)
    assert decision.writes == ()
    assert decision.plan.held is not None and decision.plan.held.kind is HoldKind.DEMAND_UNKNOWN


def test_a_recorded_broken_slice_turned_busy_is_not_finished() -> None:
    # A replacement recorded (draining intent) whose patch never landed (stale, or a restart):
    # its hosts are busy now, so the record is not finished over them either.
    nodes = tpu_slice_nodes("tpu-a", 4, idle_s=None)
    gcs = RayObservation(state([head_node(), *nodes]), 0.0, cluster_id="c-1")
    rc = cluster(tpu_group(replicas=1))
    rc["metadata"]["annotations"] = {DRAINING_ANNOTATION: json.dumps({"tpu": ["tpu-a"]})}
    decision = decide(Observation.parse(rc, _unknown_host_slice(), gcs), Memory(), POLICY, NOW)
    assert decision.plan.groups[0].deletions == ()
    assert decision.drains == ()
    final = rc
    for write in decision.writes:
        assert isinstance(write, (RecordIntent, Patch))
        final = jsonpatch.apply_patch(final, ops_json(write.ops), in_place=False)
    group = final["spec"]["workerGroupSpecs"][0]
    assert not (group.get("scaleStrategy") or {}).get("workersToDelete")
    assert group["replicas"] == 1
