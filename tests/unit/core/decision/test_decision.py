"""decide(): the writes of one decision, in order, from one observation (pure)."""

from __future__ import annotations

import json
from typing import Any

import jsonpatch

from kuberay_scaler.adapters.ray_gcs.poller import observation_of
from kuberay_scaler.core.decision import (
    Decision,
    Drain,
    Observation,
    Patch,
    RecordIntent,
    decide,
)
from kuberay_scaler.core.model.plan import Memory
from kuberay_scaler.core.model.ray import RayObservation
from kuberay_scaler.core.model.reasons import ProblemKind, ScaleDown, ScaleDownKind
from kuberay_scaler.core.patch.intent import DRAINING_ANNOTATION
from kuberay_scaler.core.patch.ops import ops_json
from kuberay_scaler.core.planner.deadlines import Deadlines
from kuberay_scaler.core.planner.policy import Policy
from tests.factories import (
    NOW,
    NOW_MS,
    NOW_S,
    cluster,
    group,
    head_node,
    node_id_of,
    slice_pods,
    state,
    tasks,
    tpu_group,
    tpu_slice_nodes,
)
from tests.fuzz.pipeline import refused_outright

DRAIN_45 = Policy(
    deadlines=Deadlines(drain_deadline_s=45)
)  # Ray's drain deadline (not the default)


def _idle_inputs(*keys: str) -> tuple[dict[str, Any], list[dict[str, Any]], RayObservation]:
    """The RayCluster, pods and Ray state of idle TPU slices `keys`."""
    pods = [p for k in keys for p in slice_pods("tpu", k, 4)]
    nodes = [head_node(), *(n for k in keys for n in tpu_slice_nodes(k, 4, idle_s=900))]
    rc = cluster(tpu_group(replicas=len(keys)))
    return rc, pods, RayObservation(state(nodes), 0.0, cluster_id="c-1")


def _idle(*keys: str) -> Observation:
    return Observation.parse(*_idle_inputs(*keys))


def test_scale_down_is_record_then_one_drain_per_slice_then_the_patch() -> None:
    decision = decide(_idle("tpu-a", "tpu-b"), Memory(), DRAIN_45, NOW)
    record, *drains, patch = decision.writes
    assert isinstance(record, RecordIntent) and isinstance(patch, Patch)
    assert dict(record.draining) == {"tpu": ("tpu-a", "tpu-b")}
    assert all(isinstance(d, Drain) for d in drains)
    assert [(d.slice_key, d.cluster_id) for d in drains] == [("tpu-a", "c-1"), ("tpu-b", "c-1")]
    assert all(d.deadline_ms == int((NOW.timestamp() + 45) * 1000) for d in drains)
    assert {n for d in drains for n in d.node_ids} == {
        node_id_of(f"tpu-{k}-{i}") for k in "ab" for i in range(4)
    }
    # The patch applies to the object as the record left it, and removes the record.
    rc = _idle_inputs("tpu-a", "tpu-b")[0]  # the object planned from
    after_record = jsonpatch.apply_patch(rc, ops_json(record.ops), in_place=False)
    final = jsonpatch.apply_patch(after_record, ops_json(patch.ops), in_place=False)
    assert DRAINING_ANNOTATION not in final["metadata"]["annotations"]
    assert final["spec"]["workerGroupSpecs"][0]["replicas"] == 0


def test_no_change_means_no_writes() -> None:
    rc = cluster(group("cpu"))
    decision = decide(
        Observation.parse(rc, [], RayObservation(state([head_node()]), 0.0)),
        Memory(),
        Policy(),
        NOW,
    )
    assert decision.writes == () and decision.error is None


def test_scale_up_is_one_patch_without_record_or_drain() -> None:
    rc = cluster(group("cpu", max_replicas=5))
    observed = Observation.parse(
        rc, [], RayObservation(state([head_node()], [tasks({"CPU": 8}, 2)]), 0.0)
    )
    (patch,) = decide(observed, Memory(), Policy(), NOW).writes
    assert isinstance(patch, Patch)
    assert (
        jsonpatch.apply_patch(rc, ops_json(patch.ops))["spec"]["workerGroupSpecs"][0]["replicas"]
        == 2
    )


def test_a_drain_recorded_before_a_restart_is_finished() -> None:
    rc, pods, gcs = _idle_inputs("tpu-a")
    rc["metadata"]["annotations"] = {DRAINING_ANNOTATION: json.dumps({"tpu": ["tpu-a"]})}
    rc["spec"]["workerGroupSpecs"][0]["idleTimeoutSeconds"] = 3600  # not idle long enough now
    decision = decide(Observation.parse(rc, pods, gcs), Memory(), Policy(), NOW)
    (deletion,) = decision.plan.groups[0].deletions
    assert isinstance(deletion.reason, ScaleDown)
    assert deletion.reason.kind is ScaleDownKind.RECORDED_DRAIN
    # The object records the slice already: the record is never written again.
    assert [type(w).__name__ for w in decision.writes] == ["Drain", "Patch"]


def test_refused_drains_give_a_patch_that_keeps_those_slices() -> None:
    decision = decide(_idle("tpu-a", "tpu-b"), Memory(), Policy(), NOW)
    record = decision.record
    assert record is not None
    rc = _idle_inputs("tpu-a", "tpu-b")[0]  # the object planned from
    base = jsonpatch.apply_patch(rc, ops_json(record.ops), in_place=False)
    result, patch = refused_outright(decision, {("tpu", "tpu-a")}, base)
    assert patch is not None
    final = jsonpatch.apply_patch(base, ops_json(patch.ops), in_place=False)
    spec = final["spec"]["workerGroupSpecs"][0]
    assert spec["replicas"] == 1
    assert sorted(spec["scaleStrategy"]["workersToDelete"]) == [f"tpu-b-{i}" for i in range(4)]
    assert [d.slice_key for d in result.groups[0].deletions] == ["tpu-b"]


def test_an_unusable_gcs_reply_holds_and_is_a_named_problem() -> None:
    rc = cluster(group("cpu", max_replicas=5))
    decision = decide(
        Observation.parse(
            rc,
            [],
            observation_of(
                {"not": "a reply"}, observed_at=0.0, cluster_id=None, epoch=0, read_at_ms=NOW_MS
            ),
        ),
        Memory(),
        Policy(),
        NOW,
    )
    assert decision.plan.held is not None and decision.writes == ()
    assert [p.kind for p in decision.plan.problems] == [ProblemKind.RAY_STATE]


def _raycluster_writes(decision: Decision) -> list[str]:
    """The writes that patch the RayCluster (drains go to the GCS)."""
    return [type(w).__name__ for w in decision.writes if isinstance(w, (RecordIntent, Patch))]


def test_a_busy_slice_whose_preemption_notice_is_over_is_deleted_with_one_write() -> None:
    """No drain is sent once the notice is over (the gate's (d)), so recording a draining
    intent first would be one needless RayCluster write per such deletion."""
    rc = cluster(tpu_group(replicas=1, max_replicas=0))
    pods = slice_pods("tpu", "tpu-a", 4)
    busy = tpu_slice_nodes("tpu-a", 4, busy_hosts=(1,))
    observed = Observation.parse(rc, pods, RayObservation(state([head_node(), *busy]), 0.0, "c-1"))
    notice_over = Memory(preempting={"tpu-a": NOW_S - 1})
    decision = decide(observed, notice_over, Policy(), NOW)
    (deletion,) = decision.plan.groups[0].deletions
    assert deletion.slice_key == "tpu-a" and sorted(deletion.pods) == sorted(
        p["metadata"]["name"] for p in pods
    )
    assert decision.drains == ()
    assert _raycluster_writes(decision) == ["Patch"]
    (patch,) = decision.writes
    assert isinstance(patch, Patch)
    final = jsonpatch.apply_patch(rc, ops_json(patch.ops), in_place=False)
    spec = final["spec"]["workerGroupSpecs"][0]
    assert spec["replicas"] == 0
    assert sorted(spec["scaleStrategy"]["workersToDelete"]) == [f"tpu-a-{i}" for i in range(4)]
    assert DRAINING_ANNOTATION not in final["metadata"].get("annotations", {})


def test_an_idle_slice_still_records_its_drain_before_the_patch() -> None:
    """The counterpart: a drain that is sent is recorded first (record → drain → patch)."""
    decision = decide(_idle("tpu-a"), Memory(), Policy(), NOW)
    assert _raycluster_writes(decision) == ["RecordIntent", "Patch"]
    assert [d.slice_key for d in decision.drains] == ["tpu-a"]
