"""`kuberay-scaler plan`: the planner on files, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from kuberay_scaler.cli.main import main
from tests.factories import FIXTURES, SAMPLES, slice_pods

ROOT = Path(__file__).resolve().parents[3]
SAMPLE_NAMES = sorted(p.name for p in SAMPLES.glob("ray-cluster.*.yaml"))
RAY_STATES = FIXTURES / "ray_state"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith(("KUBERAY_SCALER_", "RAY_")):
            monkeypatch.delenv(key)


def run_plan(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    code = main(["plan", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def ray_state(name: str) -> Path:
    path = RAY_STATES / f"{name}.json"
    if not path.exists():
        pytest.skip(f"fixture {path.name} not captured yet")
    return path


def the_raycluster(path: Path) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    found: dict[str, Any] = next(d for d in docs if d.get("kind") == "RayCluster")
    return found


def apply_writes(rc: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any]:
    """The RayCluster after every patch the daemon would send (record intent, then the patch)."""
    for write in doc["writes"]:
        if write["write"] in ("record_intent", "patch"):
            rc = jsonpatch.apply_patch(rc, write["ops"], in_place=False)
    return rc


def assert_documented_shape(doc: dict[str, Any]) -> None:
    assert {"cluster", "patch", "groups", "infeasible", "problems"} <= doc.keys()
    for g in doc["groups"]:
        assert {"name", "num_of_hosts", "replicas", "delete", "drain", "reasons"} <= g.keys()
        assert set(g["replicas"]) >= {"current", "target"}
        for d in g["delete"]:
            assert {"slice", "pods"} <= d.keys()


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_every_sample_cluster_plans(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    sample = SAMPLES / name
    code, out, err = run_plan(
        capsys, "--raycluster", sample, "--ray-state", ray_state("pending_slice_reservation")
    )
    assert code == 0, err
    doc = json.loads(out)
    assert_documented_shape(doc)
    rc = the_raycluster(sample)
    assert doc["cluster"] == rc["metadata"]["name"]
    patched = apply_writes(rc, doc)
    for g, raw in zip(doc["groups"], patched["spec"]["workerGroupSpecs"], strict=True):
        assert raw.get("replicas") == g["replicas"]["target"]


def test_reservation_on_the_v6e_sample_adds_one_slice(capsys: pytest.CaptureFixture[str]) -> None:
    sample = SAMPLES / "ray-cluster.tpu-v6e-16-multihost.yaml"
    code, out, _ = run_plan(
        capsys, "--raycluster", sample, "--ray-state", ray_state("pending_slice_reservation")
    )
    assert code == 0
    (tpu,) = json.loads(out)["groups"]
    # The sample asks for replicas 1 with no pods: that replica is launching, and it serves
    # the reservation, so nothing changes.
    assert tpu["num_of_hosts"] == 4
    assert tpu["replicas"] == {"current": 1, "target": 1}


def test_idle_slice_from_pods_and_ray_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    state_path = ray_state("idle_tpu_slice")
    state = json.loads(state_path.read_text())["clusterResourceState"]["nodeStates"]
    tpu_hosts = sorted(
        (n for n in state if n.get("rayNodeTypeName") == "tpu-group"),
        key=lambda n: n["labels"]["ray.io/tpu-worker-id"],
    )
    pods = slice_pods(
        "tpu-group", "tpu-group-q8m4z", 4, cluster_name="raycluster-tpu-v6e-multihost"
    )
    for p, n in zip(pods, tpu_hosts, strict=True):
        p["metadata"]["name"] = n["instanceId"]
    pods_path = tmp_path / "pods.json"
    pods_path.write_text(json.dumps({"kind": "PodList", "apiVersion": "v1", "items": pods}))
    monkeypatch.setenv("KUBERAY_SCALER_IDLE_TIMEOUT_S", "1")
    sample = SAMPLES / "ray-cluster.tpu-v6e-16-multihost.yaml"
    code, out, err = run_plan(
        capsys, "--raycluster", sample, "--pods", pods_path, "--ray-state", state_path
    )
    assert code == 0, err
    doc = json.loads(out)
    (tpu,) = doc["groups"]
    assert tpu["replicas"] == {"current": 1, "target": 0}
    (deletion,) = tpu["delete"]
    assert deletion["slice"] == "tpu-group-q8m4z"
    assert sorted(deletion["pods"]) == sorted(n["instanceId"] for n in tpu_hosts)
    assert len(tpu["drain"]) == 4
    assert [w["write"] for w in doc["writes"]] == ["record_intent", "drain", "patch"]
    assert doc["patch"] == doc["writes"][-1]["ops"]
    patched = apply_writes(the_raycluster(sample), doc)
    assert "kuberay-scaler.ray.io/draining" not in patched["metadata"]["annotations"]
    group = patched["spec"]["workerGroupSpecs"][0]
    assert group["replicas"] == 0
    assert sorted(group["scaleStrategy"]["workersToDelete"]) == sorted(deletion["pods"])


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


BAD_RAYCLUSTERS = {
    "missing": None,
    "not yaml": "spec: [unclosed",
    "a ConfigMap": "kind: ConfigMap\nmetadata: {name: x}\n",
    "no spec": "kind: RayCluster\nmetadata: {name: x}\n",
    "a list": "- 1\n- 2\n",
    "two RayClusters": "kind: RayCluster\nspec: {}\n---\nkind: RayCluster\nspec: {}\n",
}


@pytest.mark.parametrize("text", BAD_RAYCLUSTERS.values(), ids=BAD_RAYCLUSTERS.keys())
def test_bad_raycluster_file_exits_2_naming_it(
    text: str | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "rc.yaml" if text is None else _write(tmp_path, "rc.yaml", text)
    code, out, err = run_plan(
        capsys, "--raycluster", path, "--ray-state", ray_state("idle_tpu_slice")
    )
    assert code == 2
    assert out == ""
    assert err.startswith(f"kuberay-scaler plan: RayCluster {path}:")
    assert len(err.strip().splitlines()) == 1


BAD_STATES = {
    "missing": None,
    "not json": "{nope",
    "a RayCluster": json.dumps({"kind": "RayCluster", "spec": {}}),
    "a list": "[]",
    "wrong field types": json.dumps({"clusterResourceState": {"nodeStates": 3}}),
}


@pytest.mark.parametrize("text", BAD_STATES.values(), ids=BAD_STATES.keys())
def test_bad_ray_state_file_exits_2_naming_it(
    text: str | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "state.json" if text is None else _write(tmp_path, "state.json", text)
    sample = SAMPLES / "ray-cluster.tpu-v4-multihost.yaml"
    code, out, err = run_plan(capsys, "--raycluster", sample, "--ray-state", path)
    assert code == 2
    assert out == ""
    assert err.startswith(f"kuberay-scaler plan: Ray state {path}:")


BAD_PODS = {
    "missing": None,
    "a string": "hello\n",
    "a number": "42\n",
    "a Service": "kind: Service\nmetadata: {name: x}\n",
    "two documents": "kind: PodList\nitems: []\n---\nkind: PodList\nitems: []\n",
}


@pytest.mark.parametrize("text", BAD_PODS.values(), ids=BAD_PODS.keys())
def test_bad_pods_file_exits_2_naming_it(
    text: str | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "pods.json" if text is None else _write(tmp_path, "pods.json", text)
    sample = SAMPLES / "ray-cluster.tpu-v4-multihost.yaml"
    code, out, err = run_plan(
        capsys,
        "--raycluster",
        sample,
        "--pods",
        path,
        "--ray-state",
        ray_state("idle_tpu_slice"),
    )
    assert code == 2
    assert out == ""
    assert err.startswith(f"kuberay-scaler plan: PodList {path}:")


def _python(*args: str) -> subprocess.CompletedProcess[str]:
    """This Python run apart, with nothing of the caller's environment but PATH."""
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_plan_runs_as_a_real_command() -> None:
    done = _python(
        "-m",
        "kuberay_scaler",
        "plan",
        "--raycluster",
        str(SAMPLES / "ray-cluster.autoscaler-v2.yaml"),
        "--ray-state",
        str(ray_state("pending_cpu_tasks")),
    )
    assert done.returncode == 0, done.stderr
    (small,) = json.loads(done.stdout)["groups"]
    # 10 × 1 CPU + 2 × 2 CPU on 1-CPU hosts; the 2-CPU actors fit no host of the sample.
    assert small["replicas"] == {"current": 0, "target": 10}
    assert len(json.loads(done.stdout)["infeasible"]) == 1


def test_plan_reads_a_reply_through_the_adapter_without_loading_grpc() -> None:
    """`plan` parses a captured reply with the GCS adapter's converter (the core reads no
    protobuf), yet loads no gRPC: the adapter's package face imports nothing."""
    code = (
        "import sys; from datetime import UTC, datetime; from pathlib import Path;"
        " from kuberay_scaler.cli.offline import"
        " load_ray_state; state = load_ray_state(Path(sys.argv[1]), datetime.now(UTC));"
        " print(len(state.nodes), sorted(m for m in sys.modules if m.split('.')[0] == 'grpc'))"
    )
    done = _python("-c", code, str(ray_state("idle_tpu_slice")))
    assert done.returncode == 0, done.stderr
    nodes, grpc_modules = done.stdout.split(" ", 1)
    assert int(nodes) > 0 and grpc_modules.strip() == "[]"


def test_plan_events_judges_a_kubectl_event_list(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    sample = SAMPLES / "ray-cluster.tpu-v6e-16-multihost.yaml"
    rc = the_raycluster(sample)
    name, group = rc["metadata"]["name"], rc["spec"]["workerGroupSpecs"][0]["groupName"]
    refused = (
        f'Failed to create worker Pod for the cluster default/{name}, pods "{name}-{group}-worker-"'
        " is forbidden: exceeded quota: tpu, requested: google.com/tpu=4, used: google.com/tpu=0,"
        " limited: google.com/tpu=0"
    )
    events = tmp_path / "events.yaml"  # events.k8s.io/v1, as KubeRay v1.7.0 writes it
    events.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "events.k8s.io/v1",
                "kind": "Event",
                "metadata": {"name": "e1"},
                "regarding": {"kind": "RayCluster", "name": name},
                "reason": "FailedToCreateWorkerPod",
                "note": refused,
                "reportingController": "raycluster-controller",
                "eventTime": "2026-12-04T12:03:10.000000Z",
            }
        )
    )
    code, out, err = run_plan(capsys, "--raycluster", sample, "--events", events)
    assert code == 0, err
    [judged] = json.loads(out)["capacity_events"]
    assert (judged["signal"], judged["group"], judged["source"]) == (
        "quota",
        group,
        "raycluster-controller",
    )
    code, _, err = run_plan(capsys, "--capture", tmp_path, "--events", events)
    assert code == 2 and "--events goes with --raycluster" in err
