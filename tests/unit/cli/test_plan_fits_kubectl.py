"""`kuberay-scaler plan` fits kubectl, and says what it decided and why (issue 12 item 7)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.protobuf import json_format

from kuberay_scaler.cli import offline
from kuberay_scaler.cli.main import main
from kuberay_scaler.core.planner.policy import Policy
from tests.control.fakes import reply_of
from tests.factories import (
    NOW,
    cluster,
    cpu_nodes,
    group,
    head_node,
    pod,
    slice_pods,
    state,
    tasks,
    tpu_group,
    tpu_slice_nodes,
)


def _write(tmp: Path, name: str, obj: Any, as_json: bool = True) -> Path:
    path = tmp / name
    path.write_text(json.dumps(obj) if as_json else yaml.safe_dump(obj))
    return path


def _ray(tmp: Path, ray: Any) -> Path:
    path = tmp / "ray.json"
    path.write_text(json_format.MessageToJson(reply_of(ray)))
    return path


def _groups(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {g["name"]: g for g in doc["groups"]}


def _kinds(group_doc: dict[str, Any]) -> set[str]:
    return {r["kind"] for r in group_doc["reasons"]}


def test_raycluster_from_stdin_inside_a_kubectl_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rc = cluster(group("cpu", max_replicas=3))
    listing = {"apiVersion": "v1", "kind": "List", "items": [{"kind": "ConfigMap"}, rc]}
    monkeypatch.setattr("sys.stdin", io.StringIO(yaml.safe_dump(listing)))
    ray = _ray(tmp_path, state([head_node()], [tasks({"CPU": 8}, 2)]))
    doc = offline.plan_files(Path("-"), None, ray, Policy(), now=NOW)
    assert _groups(doc)["cpu"]["replicas"] == {"current": 0, "target": 2}


def test_pods_from_stdin_and_a_list_of_pods(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rc = _write(tmp_path, "rc.json", cluster(group("cpu", replicas=2)))
    pods = {"kind": "List", "items": [pod("cpu-0", "cpu"), pod("cpu-1", "cpu")]}
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(pods)))
    ray = _ray(tmp_path, state([head_node(), *cpu_nodes(["cpu-0", "cpu-1"], free_cpu=0)]))
    doc = offline.plan_files(rc, Path("-"), ray, Policy(), now=NOW)
    slices = _groups(doc)["cpu"]["slices"]
    assert [s["slice"] for s in slices] == ["cpu-0", "cpu-1"]


def test_only_one_input_may_come_from_stdin(tmp_path: Path) -> None:
    with pytest.raises(offline.InputError, match="only one input"):
        offline.plan_files(Path("-"), Path("-"), None, Policy(), now=NOW)


def test_json_is_read_by_the_json_parser_not_yaml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rc = cluster(group("cpu", replicas=2000, max_replicas=2000))
    pods = {"kind": "PodList", "items": [pod(f"cpu-{i}", "cpu") for i in range(2000)]}
    paths = (_write(tmp_path, "rc.json", rc), _write(tmp_path, "pods.json", pods))

    def no_yaml(*_: Any, **__: Any) -> Any:
        raise AssertionError("JSON went through the YAML parser")

    monkeypatch.setattr(yaml, "safe_load_all", no_yaml)
    doc = offline.plan_files(*paths, None, Policy(), now=NOW)
    assert len(_groups(doc)["cpu"]["slices"]) == 2000


def test_without_ray_state_the_plan_holds_and_still_shows_the_slice_map(tmp_path: Path) -> None:
    rc = _write(tmp_path, "rc.yaml", cluster(tpu_group(replicas=2)), as_json=False)
    pods = slice_pods("tpu", "tpu-a", 4) + slice_pods("tpu", "tpu-b", 3)
    pods_path = _write(tmp_path, "pods.json", {"kind": "PodList", "items": pods})
    doc = offline.plan_files(rc, pods_path, None, Policy(), now=NOW)
    assert doc["held"]["kind"] == "demand_unknown"
    assert doc["patch"] == [] and doc["writes"] == []
    slices = {s["slice"]: s for s in _groups(doc)["tpu"]["slices"]}
    assert slices["tpu-a"]["state"] == "complete"  # unknown Ray state: pods decide
    assert slices["tpu-b"]["state"] == "partial"
    assert slices["tpu-b"]["reason"] == "3 of 4 hosts"
    assert [h["pod"] for h in slices["tpu-a"]["hosts"]] == [f"tpu-a-{i}" for i in range(4)]


def test_cli_plan_without_ray_state(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = _write(tmp_path, "rc.json", cluster(group("cpu")))
    assert main(["plan", "--raycluster", str(rc)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["held"]["kind"] == "demand_unknown"


def test_every_unchanged_group_says_why(tmp_path: Path) -> None:
    rc = cluster(
        group("busy", replicas=1, max_replicas=3),
        group("fresh", replicas=1, max_replicas=3),
        group("coming", replicas=1, max_replicas=3),
        group("full", replicas=1, max_replicas=1, cpu="16"),
        group("empty", max_replicas=3),
    )
    pods = [
        pod("busy-0", "busy"),
        pod("fresh-0", "fresh"),
        pod("coming-0", "coming", phase="Pending", age_s=30),
        pod("full-0", "full"),
    ]
    nodes = [
        head_node(),
        *cpu_nodes(["busy-0"], "busy", free_cpu=0),
        *cpu_nodes(["fresh-0"], "fresh", idle_s=10),
        *cpu_nodes(["full-0"], "full", cpu=16, free_cpu=0),
    ]
    demand = [tasks({"CPU": 16}, 1)]  # only a "full" host offers 16 CPUs, and it is at max
    doc = offline.plan_files(
        _write(tmp_path, "rc.json", rc),
        _write(tmp_path, "pods.json", {"kind": "PodList", "items": pods}),
        _ray(tmp_path, state(nodes, demand)),
        Policy(),
        now=NOW,
    )
    groups = _groups(doc)
    assert all(g["replicas"]["current"] == g["replicas"]["target"] for g in groups.values())
    assert "busy" in _kinds(groups["busy"])
    assert "idle_below_timeout" in _kinds(groups["fresh"])
    assert "pending" in _kinds(groups["coming"])
    assert "at_max_replicas" in _kinds(groups["full"])  # the demand waits there
    assert "no_slices" in _kinds(groups["empty"])
    for g in groups.values():
        assert g["reasons"], g["name"]


def test_writes_are_listed_in_order_record_drains_patch(tmp_path: Path) -> None:
    rc = cluster(tpu_group(replicas=2))
    pods = slice_pods("tpu", "tpu-a", 4) + slice_pods("tpu", "tpu-b", 4)
    nodes = [
        head_node(),
        *tpu_slice_nodes("tpu-a", 4, idle_s=900),
        *tpu_slice_nodes("tpu-b", 4, busy_hosts=(0,)),
    ]
    doc = offline.plan_files(
        _write(tmp_path, "rc.json", rc),
        _write(tmp_path, "pods.json", {"kind": "PodList", "items": pods}),
        _ray(tmp_path, state(nodes)),
        Policy(),
        now=NOW,
    )
    assert [w["write"] for w in doc["writes"]] == ["record_intent", "drain", "patch"]
    assert doc["writes"][1]["slice"] == "tpu-a"
    assert doc["writes"][1]["reason"] == "idle_termination"
    assert doc["writes"][-1]["ops"] == doc["patch"]
    states = {s["slice"]: s["state"] for s in _groups(doc)["tpu"]["slices"]}
    assert states == {"tpu-a": "complete", "tpu-b": "complete"}
