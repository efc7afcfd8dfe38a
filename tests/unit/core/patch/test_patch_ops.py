"""Guarded JSON patches: applied with the jsonpatch library they give exactly the planned spec."""

from __future__ import annotations

from typing import Any

import jsonpatch
import pytest

from kuberay_scaler.core.model.plan import Plan
from kuberay_scaler.core.model.reasons import Keep, KeepKind
from kuberay_scaler.core.parse.raycluster import parse_raycluster
from kuberay_scaler.core.patch.ops import PatchError, build_patch, ops_json
from kuberay_scaler.core.planner.gate import without
from tests.factories import (
    cluster,
    cpu_nodes,
    deep,
    group,
    head_node,
    plan_of,
    pod,
    slice_pods,
    state,
    tasks,
    tpu_group,
    tpu_slice_nodes,
)


def planned_spec(rc: dict[str, Any], result: Plan) -> dict[str, Any]:
    """What the RayCluster should look like once the plan is carried out."""
    want: dict[str, Any] = deep(rc)
    for d in result.groups:
        if not d.changes:
            continue
        raw = want["spec"]["workerGroupSpecs"][d.index]
        raw["replicas"] = d.target
        pods = [p for x in d.deletions for p in x.pods]
        if pods or d.clear_workers_to_delete:
            strategy = raw.get("scaleStrategy")
            if not isinstance(strategy, dict):
                strategy = raw["scaleStrategy"] = {}
            strategy["workersToDelete"] = pods
    return want


def assert_patch_gives_the_plan(rc: dict[str, Any], result: Plan) -> list[dict[str, Any]]:
    ops = ops_json(build_patch(parse_raycluster(rc), result))
    patched = jsonpatch.apply_patch(rc, ops, in_place=False)
    assert patched == planned_spec(rc, result)
    return ops


def _idle_tpu_cluster(**group_fields: Any) -> tuple[dict[str, Any], list[Any], Any]:
    rc = cluster(group("cpu", replicas=1), tpu_group(replicas=2, **group_fields))
    pods = slice_pods("tpu", "tpu-a", 4) + slice_pods("tpu", "tpu-b", 4) + [pod("cpu-a", "cpu")]
    nodes = [
        head_node(),
        *tpu_slice_nodes("tpu-a", 4, idle_s=900),
        *tpu_slice_nodes("tpu-b", 4, busy_hosts=(1,)),
        *cpu_nodes(["cpu-a"], free_cpu=0),
    ]
    return rc, pods, state(nodes)


def test_scale_up_patch_tests_name_and_replicas_then_replaces() -> None:
    rc = cluster(group("cpu"), tpu_group())
    result = plan_of(rc, ray=state([head_node()], [tasks({"TPU": 4}, 5)]))
    ops = assert_patch_gives_the_plan(rc, result)
    assert ops == [
        {"op": "test", "path": "/metadata/uid", "value": "uid-1"},
        {"op": "test", "path": "/spec/workerGroupSpecs/1/groupName", "value": "tpu"},
        {"op": "test", "path": "/spec/workerGroupSpecs/1/numOfHosts", "value": 4},
        {"op": "test", "path": "/spec/workerGroupSpecs/1/replicas", "value": 0},
        {"op": "replace", "path": "/spec/workerGroupSpecs/1/replicas", "value": 2},
    ]


def test_idle_slice_patch_names_every_pod_of_the_slice() -> None:
    rc, pods, ray = _idle_tpu_cluster()
    result = plan_of(rc, pods, ray)
    ops = assert_patch_gives_the_plan(rc, result)
    add = next(op for op in ops if op["path"].endswith("scaleStrategy"))
    assert add == {
        "op": "add",
        "path": "/spec/workerGroupSpecs/1/scaleStrategy",
        "value": {"workersToDelete": ["tpu-a-0", "tpu-a-1", "tpu-a-2", "tpu-a-3"]},
    }
    assert {"op": "replace", "path": "/spec/workerGroupSpecs/1/replicas", "value": 1} in ops
    assert not any("/0/" in op["path"] for op in ops)  # the untouched group is not in the patch


def test_workers_to_delete_key_absent_under_an_existing_scale_strategy_is_added() -> None:
    rc, pods, ray = _idle_tpu_cluster(scaleStrategy={})
    ops = assert_patch_gives_the_plan(rc, plan_of(rc, pods, ray))
    assert {
        "op": "add",
        "path": "/spec/workerGroupSpecs/1/scaleStrategy/workersToDelete",
        "value": ["tpu-a-0", "tpu-a-1", "tpu-a-2", "tpu-a-3"],
    } in ops


def test_existing_empty_workers_to_delete_is_tested_then_replaced() -> None:
    rc, pods, ray = _idle_tpu_cluster(scaleStrategy={"workersToDelete": []})
    ops = assert_patch_gives_the_plan(rc, plan_of(rc, pods, ray))
    path = "/spec/workerGroupSpecs/1/scaleStrategy/workersToDelete"
    assert {"op": "test", "path": path, "value": []} in ops
    assert [op["op"] for op in ops if op["path"] == path] == ["test", "replace"]


def test_null_scale_strategy_is_replaced_by_add() -> None:
    rc, pods, ray = _idle_tpu_cluster(scaleStrategy=None)
    assert_patch_gives_the_plan(rc, plan_of(rc, pods, ray))


def test_absent_replicas_key_is_added_not_replaced() -> None:
    raw = group("cpu")
    del raw["replicas"]
    rc = cluster(raw)
    result = plan_of(rc, ray=state([head_node()], [tasks({"CPU": 8}, 2)]))
    ops = assert_patch_gives_the_plan(rc, result)
    assert {"op": "add", "path": "/spec/workerGroupSpecs/0/replicas", "value": 2} in ops
    assert not any(op["op"] == "replace" for op in ops)


def test_cleared_workers_to_delete_becomes_an_empty_list() -> None:
    rc = cluster(tpu_group(replicas=0, scaleStrategy={"workersToDelete": ["gone-0", "gone-1"]}))
    result = plan_of(rc, [], state([head_node()]))
    ops = assert_patch_gives_the_plan(rc, result)
    path = "/spec/workerGroupSpecs/0/scaleStrategy/workersToDelete"
    assert ops[-2:] == [
        {"op": "test", "path": path, "value": ["gone-0", "gone-1"]},
        {"op": "replace", "path": path, "value": []},
    ]


def test_replacement_keeps_replicas_and_names_the_broken_slice() -> None:
    rc = cluster(tpu_group(replicas=1))
    pods = slice_pods("tpu", "tpu-a", 4)
    pods[3]["status"]["phase"] = "Failed"
    result = plan_of(rc, pods, state([head_node(), *tpu_slice_nodes("tpu-a", 4)]))
    ops = assert_patch_gives_the_plan(rc, result)
    assert not any(op["path"].endswith("/replicas") for op in ops)


def test_no_changes_no_ops() -> None:
    rc = cluster(group("cpu", replicas=1))
    result = plan_of(
        rc, [pod("cpu-a", "cpu")], state([head_node(), *cpu_nodes(["cpu-a"], free_cpu=0)])
    )
    assert ops_json(build_patch(parse_raycluster(rc), result)) == []


def _scale_up_patch() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    rc = cluster(group("cpu"), tpu_group())
    result = plan_of(rc, ray=state([head_node()], [tasks({"TPU": 4}, 1)]))
    return rc, ops_json(build_patch(parse_raycluster(rc), result))


def _reorder(rc: dict[str, Any]) -> None:
    rc["spec"]["workerGroupSpecs"].reverse()


def _bump_replicas(rc: dict[str, Any]) -> None:
    rc["spec"]["workerGroupSpecs"][1]["replicas"] = 3


def _new_uid(rc: dict[str, Any]) -> None:
    rc["metadata"]["uid"] = "uid-2"


def _new_hosts(rc: dict[str, Any]) -> None:
    rc["spec"]["workerGroupSpecs"][1]["numOfHosts"] = 2


@pytest.mark.parametrize("change", [_reorder, _bump_replicas, _new_uid, _new_hosts])
def test_patch_fails_on_a_cluster_changed_since_the_plan(change: Any) -> None:
    rc, ops = _scale_up_patch()
    changed = deep(rc)
    change(changed)
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch(changed, ops)


def test_patch_fails_when_workers_to_delete_changed_since_the_plan() -> None:
    rc, pods, ray = _idle_tpu_cluster(scaleStrategy={"workersToDelete": []})
    ops = ops_json(build_patch(parse_raycluster(rc), plan_of(rc, pods, ray)))
    changed = deep(rc)
    changed["spec"]["workerGroupSpecs"][1]["scaleStrategy"]["workersToDelete"] = ["x"]
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch(changed, ops)


def test_building_from_a_moved_group_is_refused() -> None:
    rc = cluster(group("cpu"), tpu_group())
    result = plan_of(rc, ray=state([head_node()], [tasks({"TPU": 4}, 1)]))
    moved = deep(rc)
    _reorder(moved)
    with pytest.raises(PatchError, match="no longer at workerGroupSpecs"):
        ops_json(build_patch(parse_raycluster(moved), result))


def test_building_from_a_changed_group_is_refused() -> None:
    rc = cluster(group("cpu"), tpu_group())
    result = plan_of(rc, ray=state([head_node()], [tasks({"TPU": 4}, 1)]))
    changed = deep(rc)
    _bump_replicas(changed)
    with pytest.raises(PatchError, match="changed since the plan"):
        ops_json(build_patch(parse_raycluster(changed), result))


def test_a_refused_slice_put_back_restores_the_target_and_keeps_the_rest() -> None:
    rc, pods, ray = _idle_tpu_cluster()
    rc["spec"]["workerGroupSpecs"][1]["replicas"] = 3
    pods += slice_pods("tpu", "tpu-c", 4)
    ray = state([*ray.nodes, *tpu_slice_nodes("tpu-c", 4, idle_s=900)])
    result = plan_of(rc, pods, ray)
    decision = result.group("tpu")
    assert decision is not None
    assert (decision.target, len(decision.deletions)) == (1, 2)
    kept = without(result, {("tpu", "tpu-a"): Keep(KeepKind.DRAIN_REFUSED, slice="tpu-a")})
    after = kept.group("tpu")
    assert after is not None
    assert after.target == 2
    assert [d.slice_key for d in after.deletions] == ["tpu-c"]
    refused = [r for r in after.reasons if isinstance(r, Keep)]
    assert [(r.kind, r.slice) for r in refused] == [(KeepKind.DRAIN_REFUSED, "tpu-a")]
    assert_patch_gives_the_plan(rc, kept)


def test_drop_all_deletions_leaves_nothing_to_write() -> None:
    rc, pods, ray = _idle_tpu_cluster()
    refused = {("tpu", "tpu-a"): Keep(KeepKind.DRAIN_REFUSED, slice="tpu-a")}
    result = without(plan_of(rc, pods, ray), refused)
    assert not result.changes
    assert ops_json(build_patch(parse_raycluster(rc), result)) == []
