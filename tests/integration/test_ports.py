"""The daemon next to a Ray head started with KubeRay's default ports, as in one head pod.

All containers of a pod share one network namespace. KubeRay starts the head with
`--metrics-export-port=8080` (and 6379, 8265, 10001, 52365); Ray's metrics agent binds 8080 on
every address, and only with `ray[default]` (plain `ray` starts no metrics exporter, so the
test first proves that the head really listens on 8080). The daemon with its default HTTP
address must then run beside it; the address that used to be our default exits 2 with one line.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kuberay_scaler.runtime.settings import DEFAULT_HTTP_PORT
from kuberay_standins.apiserver import RESTRICTED_TOKEN, ApiServerStandIn
from kuberay_standins.demo import Scenario, demo_raycluster
from kuberay_standins.ray_local import RayHead

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

HEAD_IP = "127.0.0.61"  # a loopback address of its own, as the head pod's IP
RAY_METRICS_PORT = 8080  # KubeRay's DefaultMetricsPort
# KubeRay's defaults for the head (ray-operator utils/constant.go, setMissingRayStartParams).
KUBERAY_HEAD_ARGS = (
    f"--metrics-export-port={RAY_METRICS_PORT}",
    "--dashboard-port=8265",
    "--ray-client-server-port=10001",
    "--dashboard-agent-listen-port=52365",
)
GCS_PORT = 6379
PORTS_LOCK = "/tmp/kuberay-scaler-test-ports.lock"
NAMESPACE = "default"


@dataclass
class Pod:
    """What the test's 'head pod' holds: the API stand-in, the Ray head, a kubeconfig."""

    api: ApiServerStandIn
    head: RayHead
    kubeconfig: Path
    cluster: str


@pytest.fixture
def machine_ports() -> Iterator[None]:
    """KubeRay's ports are fixed and Ray's exporter binds 8080 on every address: two runs of
    this test on one machine (worktrees side by side) take turns instead of colliding."""
    with open(PORTS_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture
async def pod(tmp_path: Path, machine_ports: None) -> AsyncIterator[Pod]:
    api = ApiServerStandIn(bookmark_interval=5.0)
    await api.start()
    head: RayHead | None = None
    try:
        raycluster = demo_raycluster(Scenario())
        api.create("rayclusters", NAMESPACE, raycluster)
        kubeconfig = tmp_path / "kubeconfig"
        api.write_kubeconfig(kubeconfig, RESTRICTED_TOKEN, namespace=NAMESPACE)
        head = await asyncio.to_thread(
            RayHead.start, ip=HEAD_IP, port=GCS_PORT, extra_args=KUBERAY_HEAD_ARGS
        )
        yield Pod(api, head, kubeconfig, raycluster["metadata"]["name"])
    finally:
        if head is not None:
            await asyncio.to_thread(head.stop)
        await api.stop()


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status, reply.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")
    except OSError as err:
        return 0, str(err)


def _listeners(port: int) -> set[str]:
    """Socket inodes listening on TCP `port` (any address), from /proc/net/tcp{,6}."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.add(fields[9])
    return found


def _socket_inodes(pids: list[int]) -> set[str]:
    inodes = set()
    for pid in pids:
        try:
            fds = list(os.scandir(f"/proc/{pid}/fd"))
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd.path)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


async def _ray_listens_on_metrics_port(head: RayHead, timeout_s: float = 120.0) -> str:
    """Wait until a process of the head's group listens on 8080 and serves Prometheus text."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        ours = _listeners(RAY_METRICS_PORT) & _socket_inodes(head.group_pids())
        status, body = _get(f"http://{HEAD_IP}:{RAY_METRICS_PORT}/metrics")
        if ours and status == 200 and "# TYPE" in body:
            return body
        last = f"listening={bool(ours)} status={status} {body[:200]}"
        await asyncio.sleep(1.0)
    raise AssertionError(
        f"Ray's metrics agent never listened on {RAY_METRICS_PORT} ({last}); "
        "is ray[default] installed?"
    )


def _daemon_env(pod: Pod, **overrides: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "KUBERAY_"))}
    return base | {
        "RAY_CLUSTER_NAME": pod.cluster,
        "RAY_CLUSTER_NAMESPACE": NAMESPACE,
        "KUBERAY_SCALER_KUBECONFIG": str(pod.kubeconfig),
        "KUBERAY_SCALER_GCS_ADDRESS": pod.head.gcs_address,
        "KUBERAY_SCALER_LOG_FORMAT": "json",
        **overrides,
    }


def _spawn_daemon(env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "kuberay_scaler", "run"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


async def test_daemon_with_default_address_runs_beside_kuberay_default_ray_head(
    pod: Pod, tmp_path: Path
) -> None:
    await _ray_listens_on_metrics_port(pod.head)
    assert pod.head.gcs_address == f"{HEAD_IP}:{GCS_PORT}"
    log_path = tmp_path / "daemon.log"
    # No KUBERAY_SCALER_HTTP_ADDRESS: the default.
    daemon = await asyncio.to_thread(_spawn_daemon, _daemon_env(pod), log_path)
    try:
        ready = f"http://{HEAD_IP}:{DEFAULT_HTTP_PORT}/readyz"
        deadline = time.monotonic() + 90
        status, body = 0, ""
        while time.monotonic() < deadline and daemon.poll() is None:
            status, body = _get(ready)
            if status == 200:
                break
            await asyncio.sleep(0.5)
        assert daemon.poll() is None, f"daemon exited {daemon.returncode}: {log_path.read_text()}"
        assert status == 200, f"/readyz on the default address: {status} {body}"
        status, metrics = _get(f"http://{HEAD_IP}:{DEFAULT_HTTP_PORT}/metrics")
        assert status == 200 and "kuberay_scaler_" in metrics
        # Ray's exporter still serves its own metrics on 8080, from its own process.
        assert "kuberay_scaler_" not in await _ray_listens_on_metrics_port(pod.head)
    finally:
        daemon.terminate()
        assert daemon.wait(30) == 0


async def test_address_in_use_is_one_line_and_exit_2(pod: Pod) -> None:
    """Our old default, 0.0.0.0:8080, is taken by Ray's metrics export: a setting to fix."""
    await _ray_listens_on_metrics_port(pod.head)
    address = f"0.0.0.0:{RAY_METRICS_PORT}"
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "kuberay_scaler", "run"],
        env=_daemon_env(pod, KUBERAY_SCALER_HTTP_ADDRESS=address),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("kuberay-scaler: KUBERAY_SCALER_HTTP_ADDRESS: ")
    assert address in lines[0] and "in use" in lines[0]
    assert "Traceback" not in done.stdout + done.stderr
