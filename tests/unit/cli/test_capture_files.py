"""`capture` writes plan-ready files and never a secret (pure part)."""

from __future__ import annotations

import json
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format

from kuberay_scaler.cli.capture import REDACTED, read_captured_at, write_capture
from kuberay_scaler.cli.offline import InputError, plan_capture, plan_files
from kuberay_scaler.core.defaults import JOIN_SETTLE_S
from kuberay_scaler.core.parse.pods import slim_pod
from kuberay_scaler.core.patch.intent import DRAINING_ANNOTATION as DRAINING
from kuberay_scaler.core.planner.policy import Policy
from tests.control.fakes import reply_of
from tests.factories import NOW, cluster, cpu_nodes, group, head_node, pod, state, tasks


def test_secrets_are_redacted_and_the_capture_replans(tmp_path: Path) -> None:
    rc = cluster(group("cpu", replicas=1, max_replicas=3))
    rc["metadata"]["annotations"] = {
        "kubectl.kubernetes.io/last-applied-configuration": '{"token": "hunter2"}',
        "keep": "me",
    }
    rc["metadata"]["managedFields"] = [{"manager": "kubectl"}]
    rc["spec"]["headGroupSpec"]["rayStartParams"] = {"redis-password": "hunter2", "num-cpus": "0"}
    container = rc["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    container["env"] = [
        {"name": "TOKEN", "value": "hunter2"},
        {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
    ]
    running = pod("cpu-0", "cpu")
    running["spec"]["containers"][0]["env"] = [{"name": "TOKEN", "value": "hunter2"}]
    reply = json_format.MessageToDict(
        reply_of(state([head_node(), *cpu_nodes(["cpu-0"], free_cpu=0)], [tasks({"CPU": 8}, 1)]))
    )
    meta = {"captured_at": NOW.isoformat(), "cluster": "rc"}
    out = write_capture(tmp_path, rc, {"items": [running]}, reply, meta)

    for path in out.iterdir():
        assert "hunter2" not in path.read_text(), path.name
    written = json.loads((out / "raycluster.json").read_text())
    assert written["metadata"]["annotations"] == {"keep": REDACTED}  # a value may be a secret
    assert "managedFields" not in written["metadata"]
    env = written["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["env"]
    assert env[0] == {"name": "TOKEN", "value": REDACTED}
    assert env[1]["valueFrom"]["secretKeyRef"]["name"] == "s"  # a reference, kept
    assert written["spec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    assert read_captured_at(out) == datetime(2026, 11, 30, 12, 0, tzinfo=UTC)

    doc = plan_capture(out, Policy())
    assert {g["name"]: g["replicas"]["target"] for g in doc["groups"]} == {"cpu": 2}


def test_secrets_in_the_ray_start_line_of_a_pod_are_redacted(tmp_path: Path) -> None:
    # Found when the operator stand-in started writing KubeRay's `ray start` line into pods:
    # rayStartParams such as redis-password travel in the Ray container's args too.
    rc = cluster(group("cpu", replicas=1))
    running = pod("cpu-0", "cpu")
    running["spec"]["containers"][0]["command"] = ["/bin/bash", "-lc", "--"]
    running["spec"]["containers"][0]["args"] = [
        "ulimit -n 65536; ray start --block --num-cpus=8 --redis-password=hunter2 "
        "--auth-token 'hunter3' --keep=me"
    ]
    reply = json_format.MessageToDict(reply_of(state([head_node()])))
    meta = {"captured_at": NOW.isoformat(), "cluster": "rc"}
    out = write_capture(tmp_path, rc, {"items": [running]}, reply, meta)
    text = (out / "pods.json").read_text()
    assert "hunter2" not in text and "hunter3" not in text
    [args] = json.loads(text)["items"][0]["spec"]["containers"][0]["args"]
    assert f"--redis-password={REDACTED}" in args and "--num-cpus=8" in args and "--keep=me" in args


def _leaky_cluster() -> tuple[dict[str, Any], dict[str, Any]]:
    """A RayCluster and a pod with a secret in every place issue 20 found one leaking."""
    rc = cluster(group("cpu", replicas=1, max_replicas=3))
    rc["metadata"]["annotations"] = {"vault.example.com/token": "hunter2", DRAINING: "{}"}
    head = rc["spec"]["headGroupSpec"]
    head["rayStartParams"] = {"storage": "s3://AKIAXX:hunter3@bucket/ray", "num-cpus": "0"}
    template = rc["spec"]["workerGroupSpecs"][0]["template"]
    template.setdefault("metadata", {})["annotations"] = {"db": "postgres://u:hunter4@db/x"}
    container = template["spec"]["containers"][0]
    container["args"] = ["--redis-password", "hunter5", "--num-cpus", "8"]
    container["env"] = [{"name": "URL", "value": "https://u:hunter6@example.com/"}]
    running = pod("cpu-0", "cpu")
    running["metadata"]["annotations"] = {"secret-ish": "hunter7"}
    running["spec"]["containers"][0]["command"] = ["ray", "start", "--auth-token", "hunter8"]
    running["spec"]["containers"][0]["args"] = [
        "ray start --address=10.0.0.1:6379 --storage=gs://k:hunter9@b/p"
        " --dashboard-url 'https://x.example.com/?X-Amz-Signature=hunter10&region=eu'"
    ]
    return rc, running


def test_every_annotation_flag_value_and_url_credential_is_redacted(tmp_path: Path) -> None:
    """Before: annotations (RayCluster, pod template, pod), `--flag VALUE` given as two words and
    credentials inside URLs were written as they were."""
    rc, running = _leaky_cluster()
    reply = json_format.MessageToDict(reply_of(state([head_node()])))
    out = write_capture(tmp_path / "cap", rc, {"items": [running]}, reply, {"cluster": "rc"})

    text = "".join(p.read_text() for p in out.iterdir())
    leaked = [f"hunter{i}" for i in range(2, 11) if f"hunter{i}" in text]
    assert leaked == []
    written = json.loads((out / "raycluster.json").read_text())
    assert written["metadata"]["annotations"][DRAINING] == "{}"  # the planner reads this one
    assert written["metadata"]["annotations"]["vault.example.com/token"] == REDACTED
    args = written["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["args"]
    assert args == ["--redis-password", REDACTED, "--num-cpus", "8"]
    storage = written["spec"]["headGroupSpec"]["rayStartParams"]["storage"]
    assert storage.startswith("s3://") and storage.endswith("@bucket/ray")
    [pod_args] = json.loads((out / "pods.json").read_text())["items"][0]["spec"]["containers"][0][
        "args"
    ]
    assert "--address=10.0.0.1:6379" in pod_args and "region=" in pod_args


def test_capture_files_are_private(tmp_path: Path) -> None:
    """Before: 0644 files in a 0755 directory."""
    rc, running = _leaky_cluster()
    reply = json_format.MessageToDict(reply_of(state([head_node()])))
    out = write_capture(tmp_path / "cap", rc, {"items": [running]}, reply, {"cluster": "rc"})

    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert set(modes.values()) == {0o600}, modes


def test_a_rewritten_capture_file_becomes_private(tmp_path: Path) -> None:
    out = tmp_path / "cap"
    out.mkdir()
    (out / "pods.json").write_text("old")
    (out / "pods.json").chmod(0o644)
    rc, running = _leaky_cluster()
    reply = json_format.MessageToDict(reply_of(state([head_node()])))

    write_capture(out, rc, {"items": [running]}, reply, {"cluster": "rc"})

    assert stat.S_IMODE((out / "pods.json").stat().st_mode) == 0o600


def test_a_capture_taken_while_a_worker_settles_replans_to_the_same_hold(tmp_path: Path) -> None:
    """The settle after a worker joins reads only the pod's own `startedAt` and the
    moment planned at, both in a capture (the daemon's pod view keeps `startedAt` too): the
    offline plan holds exactly while the daemon would, and asks for the worker after."""
    rc = cluster(group("cpu", replicas=1, max_replicas=3))
    worker = pod("cpu-0", "cpu", age_s=12, running_for_s=10)
    assert slim_pod(worker)["status"]["containerStatuses"] == worker["status"]["containerStatuses"]
    lagging = state([head_node(), *cpu_nodes(["cpu-0"], free_cpu=0)], [tasks({"CPU": 8}, 1)])
    reply = json_format.MessageToDict(reply_of(lagging))
    held_for = JOIN_SETTLE_S - 10
    for at, target, holds in ((NOW, 1, True), (NOW + timedelta(seconds=held_for), 2, False)):
        meta = {"captured_at": at.isoformat(), "cluster": "rc"}
        out = write_capture(tmp_path / str(target), rc, {"items": [worker]}, reply, meta)
        doc = plan_capture(out, Policy())
        (cpu,) = [g for g in doc["groups"] if g["name"] == "cpu"]
        assert cpu["replicas"]["target"] == target, at
        assert any(r["kind"] == "join_settling" for r in cpu["reasons"]) is holds, at


def test_shell_exports_and_registry_credentials_are_redacted(tmp_path: Path) -> None:
    """Issue 30: `export VAR=secret` inside a `bash -c` command and `user:pass@registry/...` in
    an image reference were written as they were."""
    rc = cluster(group("cpu", replicas=1, max_replicas=3))
    container = rc["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    container["image"] = "robot:hunter11@registry.example.com/team/ray:2.9.0"
    container["command"] = ["bash", "-c"]
    container["args"] = [
        "export HF_HOME=/data; export WANDB=hunter12 && export DB_PASS='hunter13 and more';"
        ' export API="hunter14" && ray start --num-cpus=8'
    ]
    running = pod("cpu-0", "cpu")
    running["spec"]["containers"][0]["image"] = "u:hunter15@gcr.io/p/ray@sha256:" + "a" * 64
    running["spec"]["containers"][0]["command"] = ["/bin/bash", "-c", "export X=hunter16; ray"]
    plain = pod("cpu-1", "cpu")
    plain["spec"]["containers"][0]["image"] = "rayproject/ray:2.9@sha256:" + "b" * 64
    reply = json_format.MessageToDict(reply_of(state([head_node()])))
    out = write_capture(tmp_path, rc, {"items": [running, plain]}, reply, {"cluster": "rc"})

    text = "".join(p.read_text() for p in out.iterdir())
    leaked = [f"hunter{i}" for i in range(11, 17) if f"hunter{i}" in text]
    assert leaked == []
    written = json.loads((out / "raycluster.json").read_text())
    spec = written["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    assert spec["image"].endswith("@registry.example.com/team/ray:2.9.0"), spec["image"]
    assert "ray start --num-cpus=8" in spec["args"][0] and "export WANDB=" in spec["args"][0]
    items = json.loads((out / "pods.json").read_text())["items"]
    # A digest is no credential: an image without one is kept whole.
    assert items[1]["spec"]["containers"][0]["image"] == "rayproject/ray:2.9@sha256:" + "b" * 64


def _ca_event(pod_name: str, reason: str, message: str, at: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{pod_name}.{reason}", "namespace": "default"},
        "involvedObject": {"kind": "Pod", "name": pod_name, "namespace": "default"},
        "reason": reason,
        "message": message,
        "source": {"component": "cluster-autoscaler"},
        "lastTimestamp": at,
        "count": 1,
    }


STOCKOUT = (
    "Node scale up in zones us-east5-b associated with this pod failed: GCE out of resources."
    " Pod is at risk of not being scheduled."
)


def test_the_events_judged_are_captured_redacted_and_replanned(tmp_path: Path) -> None:
    rc = cluster(group("cpu", replicas=1, max_replicas=3))
    running = pod("cpu-0", "cpu")
    reply = json_format.MessageToDict(reply_of(state([head_node()])))
    leaky = _ca_event(
        "cpu-0",
        "TriggeredScaleUp",
        "pod triggered scale-up: [{https://u:hunter2@example.com/grp?sig=hunter2 0->1 (max: 3)}]",
        "2026-11-30T11:59:00Z",
    )
    events = [leaky, _ca_event("cpu-0", "FailedScaleUp", STOCKOUT, "2026-11-30T11:59:30Z")]
    meta = {"captured_at": NOW.isoformat(), "cluster": "rc"}
    out = write_capture(tmp_path / "cap", rc, {"items": [running]}, reply, meta, events=events)

    written = out / "events.json"
    assert stat.S_IMODE(written.stat().st_mode) == 0o600
    assert "hunter2" not in written.read_text()
    doc = plan_capture(out, Policy())
    judged = [(e["pod"], e["reason"], e["signal"], e["last_seen"]) for e in doc["capacity_events"]]
    assert judged == [
        ("cpu-0", "TriggeredScaleUp", "scale-up-triggered", "2026-11-30T11:59:00+00:00"),
        ("cpu-0", "FailedScaleUp", "stockout", "2026-11-30T11:59:30+00:00"),
    ]
    # The explicit-file form judges the same file the same way.
    explicit = plan_files(
        out / "raycluster.json",
        out / "pods.json",
        out / "ray-state.json",
        Policy(),
        now=NOW,
        events=written,
    )
    assert explicit["capacity_events"] == doc["capacity_events"]
    # Rewritten without Events (a token without the Role): no stale file left to mislead.
    write_capture(out, rc, {"items": [running]}, reply, meta, events=None)
    assert not written.exists()
    assert "capacity_events" not in plan_capture(out, Policy())


def test_events_of_pods_not_captured_or_not_events_at_all(tmp_path: Path) -> None:
    rc = cluster(group("cpu", replicas=1))
    pods = tmp_path / "pods.json"
    pods.write_text(json.dumps({"kind": "PodList", "items": [pod("cpu-0", "cpu")]}))
    rc_file = tmp_path / "rc.json"
    rc_file.write_text(json.dumps(rc))
    events = tmp_path / "events.json"
    other = _ca_event("elsewhere-0", "FailedScaleUp", STOCKOUT, "2026-11-30T11:59:30Z")
    events.write_text(json.dumps({"kind": "EventList", "items": [other]}))
    doc = plan_files(rc_file, pods, None, Policy(), now=NOW, events=events)
    assert doc["capacity_events"] == []  # the daemon drops news of pods it does not have
    events.write_text(json.dumps({"kind": "EventList", "items": [{"kind": "Pod"}]}))
    with pytest.raises(InputError, match="item 0 is not an Event"):
        plan_files(rc_file, pods, None, Policy(), now=NOW, events=events)


def test_the_nodes_maintenance_is_captured_and_replanned(tmp_path: Path) -> None:
    """capture keeps the pods' nodes slimmed to their GKE maintenance facts; `plan` judges them
    as the daemon does: the idle slice on the node with a window leaves first."""
    from kuberay_scaler.cli.capture import NODES_FILE
    from kuberay_scaler.core.parse.nodes import slim_node

    rc = cluster(group("cpu", replicas=2, min_replicas=1, max_replicas=3))
    pods = [pod("cpu-0", "cpu"), pod("cpu-1", "cpu")]
    for p in pods:
        p["spec"]["nodeName"] = f"node-{p['metadata']['name']}"
    idle = [*cpu_nodes(["cpu-0"], idle_s=900), *cpu_nodes(["cpu-1"], idle_s=100)]
    reply = json_format.MessageToDict(reply_of(state([head_node(), *idle])))
    start = int(NOW.timestamp()) + 7200
    raw = {
        "kind": "Node",
        "metadata": {
            "name": "node-cpu-1",
            "labels": {"cloud.google.com/scheduled-maintenance-time": str(start), "a": "b"},
        },
        "spec": {"taints": []},
        "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.9"}]},
    }
    meta = {"captured_at": NOW.isoformat(), "cluster": "rc"}
    out = write_capture(tmp_path / "cap", rc, {"items": pods}, reply, meta, nodes=[slim_node(raw)])
    written = out / NODES_FILE
    assert stat.S_IMODE(written.stat().st_mode) == 0o600
    assert "10.0.0.9" not in written.read_text()  # only the maintenance facts are kept
    doc = plan_capture(out, Policy())
    [announced] = doc["node_maintenance"]
    assert announced["node"] == "node-cpu-1" and "GKE maintenance" in announced["window"]
    assert "maintenance" in json.dumps(doc["groups"])
    patch = json.dumps(doc["patch"])
    assert "cpu-1" in patch and "cpu-0" not in patch
    without = plan_files(
        out / "raycluster.json", out / "pods.json", out / "ray-state.json", Policy(), now=NOW
    )
    patch = json.dumps(without["patch"])  # without the node facts the longest idle leaves
    assert "cpu-0" in patch and "cpu-1" not in patch
    write_capture(out, rc, {"items": pods}, reply, meta, nodes=None)
    assert not written.exists()
