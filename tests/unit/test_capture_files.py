"""`capture` writes plan-ready files and never a secret (issue 12 item 8, pure part)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from google.protobuf import json_format

from kuberay_scaler.capture import REDACTED, read_captured_at, write_capture
from kuberay_scaler.offline import plan_capture
from kuberay_scaler.planner.core import Policy
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
    assert written["metadata"]["annotations"] == {"keep": "me"}
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
