"""The patch is built from the parsed spec: the parser fills the guards and the draining record,
and the ops built from them apply to the raw object exactly as the planned spec says."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import jsonpatch
import pytest

from kuberay_scaler.core.decision import Observation
from kuberay_scaler.core.model.cluster import ClusterSpec
from kuberay_scaler.core.parse.pod_cache import PodCache
from kuberay_scaler.core.parse.raycluster import parse_raycluster
from kuberay_scaler.core.patch.intent import (
    DRAINING_ANNOTATION,
    clear_ops,
    record_ops,
    with_record,
)
from kuberay_scaler.core.patch.ops import Add, Remove, Replace, Test, build_patch, ops_json
from tests.factories import (
    cluster,
    group,
    head_node,
    plan_of,
    slice_pods,
    state,
    tpu_group,
    tpu_slice_nodes,
)

WTD = "/spec/workerGroupSpecs/0/scaleStrategy/workersToDelete"


def _only_group(raw: dict[str, Any]) -> Any:
    (parsed,) = parse_raycluster(cluster(raw)).groups
    return parsed


@pytest.mark.parametrize(
    ("strategy", "stored"),
    [
        (None, (False, False, False)),  # no scaleStrategy key
        ({}, (True, False, False)),
        ({"workersToDelete": None}, (True, True, True)),
        ({"workersToDelete": ["a-0"]}, (True, True, False)),
    ],
)
def test_the_parser_says_how_the_entry_stores_workers_to_delete(
    strategy: dict[str, Any] | None, stored: tuple[bool, bool, bool]
) -> None:
    raw = group("cpu") if strategy is None else group("cpu", scaleStrategy=strategy)
    g = _only_group(raw)
    assert (g.scale_strategy_present, g.workers_to_delete_present, g.workers_to_delete_null) == (
        stored
    )


def test_the_parser_says_whether_num_of_hosts_and_replicas_are_stored() -> None:
    raw = group("cpu")
    assert _only_group(raw).num_of_hosts_present and _only_group(raw).replicas_present
    del raw["numOfHosts"], raw["replicas"]
    g = _only_group(raw)
    assert not g.num_of_hosts_present and not g.replicas_present


def test_the_draining_record_is_parsed_with_the_spec() -> None:
    rc = cluster(tpu_group())
    bare = parse_raycluster(rc)
    assert (dict(bare.draining), bare.draining_record, bare.has_annotations) == ({}, None, False)
    record = json.dumps({"tpu": ["tpu-a"]})
    rc["metadata"]["annotations"] = {DRAINING_ANNOTATION: record, "other": "x"}
    spec = parse_raycluster(rc)
    assert dict(spec.draining) == {"tpu": ("tpu-a",)}
    assert spec.draining_record == record and spec.has_annotations


def test_a_malformed_record_names_no_slice_but_is_still_cleared_under_its_guard() -> None:
    rc = cluster(tpu_group())
    rc["metadata"]["annotations"] = {DRAINING_ANNOTATION: "not json"}
    spec = parse_raycluster(rc)
    assert dict(spec.draining) == {}
    ops = clear_ops(spec)
    assert ops == [Test(ops[0].path, "not json"), Remove(ops[0].path)]
    cleared = jsonpatch.apply_patch(rc, ops_json(ops), in_place=False)
    assert DRAINING_ANNOTATION not in cleared["metadata"]["annotations"]


@pytest.mark.parametrize("annotations", [None, {"other": "x"}])
def test_the_spec_with_the_record_is_the_parse_of_the_object_the_record_leaves(
    annotations: dict[str, str] | None,
) -> None:
    """The dry path (`with_record`) and the daemon (which parses the object its record write
    returned) build the patch from the same spec."""
    rc = cluster(tpu_group(replicas=2))
    if annotations is not None:
        rc["metadata"]["annotations"] = annotations
    spec = parse_raycluster(rc)
    draining = {"tpu": ["tpu-a", "tpu-b"]}
    ops = record_ops(spec, draining)
    assert all(isinstance(op, Add) for op in ops)
    after = jsonpatch.apply_patch(rc, ops_json(ops), in_place=False)
    assert with_record(spec, draining) == parse_raycluster(after)


def test_a_null_workers_to_delete_is_tested_as_null_then_replaced() -> None:
    rc = cluster(tpu_group(replicas=1, scaleStrategy={"workersToDelete": None}))
    pods = slice_pods("tpu", "tpu-a", 4)
    result = plan_of(rc, pods, state([head_node(), *tpu_slice_nodes("tpu-a", 4, idle_s=900)]))
    ops = build_patch(parse_raycluster(rc), result)
    named = [f"tpu-a-{i}" for i in range(4)]
    assert [op for op in ops if op.path == WTD] == [Test(WTD, None), Replace(WTD, named)]
    after = jsonpatch.apply_patch(rc, ops_json(ops), in_place=False)
    assert after["spec"]["workerGroupSpecs"][0]["scaleStrategy"]["workersToDelete"] == named
    assert after["spec"]["workerGroupSpecs"][0]["replicas"] == 0


def test_the_patch_is_built_from_the_spec_alone() -> None:
    """The raw object is not needed once parsed: the same ops from the spec whatever object
    (or none) is around, and they apply to the object the spec was parsed from."""
    rc = cluster(group("cpu", replicas=1), tpu_group(replicas=1))
    pods = slice_pods("tpu", "tpu-a", 4)
    result = plan_of(rc, pods, state([head_node(), *tpu_slice_nodes("tpu-a", 4, idle_s=900)]))
    spec = parse_raycluster(rc)
    rc["spec"]["workerGroupSpecs"] = "gone"  # the raw object mangled after parsing
    ops = build_patch(spec, result)
    assert ops and isinstance(ops[0], Test) and ops[0].path == "/metadata/uid"
    assert Replace("/spec/workerGroupSpecs/1/replicas", 0) in ops


def test_each_op_has_one_json_form_and_is_frozen() -> None:
    ops = [Test("/a", [1]), Replace("/a", 2), Add("/b", {"c": 3}), Remove("/b")]
    assert ops_json(ops) == [
        {"op": "test", "path": "/a", "value": [1]},
        {"op": "replace", "path": "/a", "value": 2},
        {"op": "add", "path": "/b", "value": {"c": 3}},
        {"op": "remove", "path": "/b"},
    ]
    with pytest.raises(dataclasses.FrozenInstanceError):
        ops[0].path = "/x"  # type: ignore[misc]


def test_observation_parse_gives_the_types_the_daemon_builds() -> None:
    rc = cluster(tpu_group(replicas=1))
    pods = slice_pods("tpu", "tpu-a", 4)
    observed = Observation.parse(rc, pods)
    spec = parse_raycluster(rc)
    assert isinstance(observed.spec, ClusterSpec) and observed.spec == spec
    hosts, problems = PodCache().hosts({p["metadata"]["name"]: p for p in pods}, spec)
    assert list(observed.hosts) == list(hosts) and list(observed.pod_problems) == list(problems)
