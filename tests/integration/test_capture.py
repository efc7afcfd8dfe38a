"""`kuberay-scaler capture` against the stand-ins and a real Ray head (issue 12 item 8).

The daemon runs in dry run (so nothing moves); `capture` runs as a user would run it, as a
subprocess configured like the daemon; the captured files, replanned offline at the captured
moment, give the daemon's own decision (its /debug/plan). No secret reaches the files.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kuberay_scaler.cli.capture import META_FILE, PODS_FILE, RAY_STATE_FILE, RAYCLUSTER_FILE
from kuberay_scaler.cli.offline import plan_capture
from kuberay_scaler.core.defaults import JOIN_SETTLE_S
from kuberay_scaler.core.planner.policy import Policy
from kuberay_standins.demo import Scenario, demo_raycluster
from kuberay_standins.harness import DaemonProcess, LocalCluster
from kuberay_standins.ray_local import RayDriver

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

SECRET = "s3cr3t-value-never-written"
DEMAND = """
@ray.remote(num_cpus=2)
def work():
    time.sleep(3600)

refs = [work.remote() for _ in range(2)]
"""


def _with_secrets(rc: dict[str, Any]) -> dict[str, Any]:
    for g in rc["spec"]["workerGroupSpecs"]:
        g["template"]["spec"]["containers"][0]["env"] = [{"name": "API_KEY", "value": SECRET}]
    rc["spec"]["headGroupSpec"]["rayStartParams"]["redis-password"] = SECRET
    rc["metadata"].setdefault("annotations", {})[
        "kubectl.kubernetes.io/last-applied-configuration"
    ] = json.dumps({"secret": SECRET})
    return rc


@pytest.fixture
def local_raycluster() -> dict[str, Any]:
    rc = demo_raycluster(Scenario())
    rc["spec"]["workerGroupSpecs"][1]["replicas"] = 1  # one CPU pod up before the capture
    return _with_secrets(rc)


def _debug_plan(daemon: DaemonProcess) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://{daemon.http}/debug/plan", timeout=5) as reply:
            doc: dict[str, Any] = json.loads(reply.read())
            return doc
    except (OSError, ValueError):
        return None


def _settled(cluster: LocalCluster) -> bool:
    """Every CPU pod's Ray container started more than JOIN_SETTLE_S ago: until then the task
    its node runs may be the very task still reported pending, and the second pod waits (in
    the daemon and in an offline plan of a capture alike: the rule reads the pod's startedAt)."""
    now = datetime.now(UTC)
    for pod in cluster.worker_pods("cpu-group"):
        for status in pod.get("status", {}).get("containerStatuses", []):
            started = status.get("state", {}).get("running", {}).get("startedAt")
            if not started:
                return False
            since = datetime.fromisoformat(started.replace("Z", "+00:00"))
            if now - since <= timedelta(seconds=JOIN_SETTLE_S + 1):
                return False
    return True


def _decided(doc: dict[str, Any] | None) -> bool:
    """The daemon planned with demand known, the CPU pod's Ray node had joined and runs a
    task, and that pod no longer settles (see `_settled`)."""
    if not doc or doc.get("held"):
        return False
    groups = {g["name"]: g for g in doc["groups"]}
    cpu = groups.get("cpu-group")
    return (
        bool(cpu)
        and cpu["replicas"]["target"] == 2
        and any(s["state"] == "complete" and s["idle_s"] is None for s in cpu["slices"])
        and not any(r["kind"] == "join_settling" for r in cpu["reasons"])
    )


def _essence(doc: dict[str, Any]) -> dict[str, Any]:
    """What must agree: targets, deletions, writes (without GCS pinning), reasons' kinds."""
    return {
        "held": doc["held"],
        "groups": {
            g["name"]: (
                g["replicas"],
                [d["slice"] for d in g["delete"]],
                sorted(r["kind"] for r in g["reasons"]),
                [(s["slice"], s["state"]) for s in g["slices"]],
            )
            for g in doc["groups"]
        },
        "writes": [w["write"] for w in doc["writes"]],
        "patch": [op for op in doc["patch"] if op["path"] != "/metadata/uid"],
        "infeasible": doc["infeasible"],
    }


async def test_capture_replans_offline_to_the_daemons_own_decision(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    assert cluster.head is not None
    daemon = cluster.start_daemon(KUBERAY_SCALER_DRY_RUN="true")
    driver = await asyncio.to_thread(
        RayDriver.start,
        cluster.head.gcs_address,
        DEMAND,
        node_ip=cluster.head.ip,
        env=cluster.head.client_env(),
        wait_ready=False,
    )
    try:
        await cluster.wait_for(
            lambda: _settled(cluster) and _decided(_debug_plan(daemon)), 240, "the daemon's plan"
        )
        out = tmp_path / "capture"
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "kuberay_scaler", "capture", str(out)],
            env=cluster.daemon_env(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        daemons = _debug_plan(daemon)
        assert daemons is not None
    finally:
        await asyncio.to_thread(driver.stop)

    for name in (RAYCLUSTER_FILE, PODS_FILE, RAY_STATE_FILE, META_FILE):
        text = (out / name).read_text()
        assert SECRET not in text, name
        if cluster.head.auth_token:
            assert cluster.head.auth_token not in text, name
    meta = json.loads((out / META_FILE).read_text())
    assert meta["cluster"] == cluster.name and meta["pods"] >= 2  # head + the CPU pod
    assert any(p.endswith("env[0].value") for p in meta["redacted"])
    # KubeRay's Role (the harness's token) lists no events: none written, and it says why.
    assert meta["events"].startswith("not read") and not (out / "events.json").exists()
    assert meta["nodes"].startswith("not read") and not (out / "nodes.json").exists()

    offline = plan_capture(out, Policy())
    assert _essence(offline) == _essence(daemons)
    assert {g["name"]: g["replicas"]["target"] for g in offline["groups"]} == {
        "tpu-group": 0,
        "cpu-group": 2,
    }
