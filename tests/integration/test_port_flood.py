"""Issue 30, promise 2: no client that reaches the HTTP port can stall the loop.

The real `run` subprocess, at a 256 open-files limit (hard and soft: it cannot raise it), against
the API-server stand-in and a scripted GCS (a grpc server in this process, no Ray). A flood of
idle slow connections (each sent half a request head, then nothing) holds more sockets than the
limit allows; the API server then cuts every connection, so the daemon must reconnect; and only
then does demand appear. The due scale-up must still be written, /healthz must still answer,
and the error log stays bounded. Malformed requests are not logged as tracebacks at error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from ray.core.generated import (
    autoscaler_pb2,
    autoscaler_pb2_grpc,
    gcs_service_pb2,
    gcs_service_pb2_grpc,
)

from kuberay_standins.apiserver import ADMIN_TOKEN, ApiServerStandIn
from kuberay_standins.ports import free_port
from tests.control.fakes import reply_of
from tests.factories import cluster, group, head_node, state, tasks

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

FILE_LIMIT = 256
FLOOD = 320  # more than the daemon's whole file limit
NAMESPACE = "default"


class ScriptedGcs(autoscaler_pb2_grpc.AutoscalerStateServiceServicer):  # type: ignore[misc]
    """Answers GetClusterResourceState with `reply` (swap it to script demand), idle clocks
    growing with the time that passed as a GCS's do; accepts every drain."""

    def __init__(self, reply: Any) -> None:
        self.reply = reply
        self.version = 1
        self.last_call = time.monotonic()

    async def GetClusterResourceState(self, request: Any, context: Any) -> Any:
        self.version += 1
        state = self.reply.cluster_resource_state
        state.cluster_resource_state_version = self.version
        now = time.monotonic()
        elapsed_ms, self.last_call = round((now - self.last_call) * 1000), now
        for node in state.node_states:
            if node.idle_duration_ms:
                node.idle_duration_ms += elapsed_ms
        return self.reply

    async def DrainNode(self, request: Any, context: Any) -> Any:
        return autoscaler_pb2.DrainNodeReply(is_accepted=True)

    async def ReportAutoscalingState(self, request: Any, context: Any) -> Any:
        return autoscaler_pb2.ReportAutoscalingStateReply()

    async def GetClusterStatus(self, request: Any, context: Any) -> Any:
        return autoscaler_pb2.GetClusterStatusReply()


class _ClusterId(gcs_service_pb2_grpc.NodeInfoGcsServiceServicer):  # type: ignore[misc]
    async def GetClusterId(self, request: Any, context: Any) -> Any:
        return gcs_service_pb2.GetClusterIdReply(cluster_id=bytes(range(28)))


@dataclass
class World:
    api: ApiServerStandIn
    gcs: ScriptedGcs
    gcs_address: str
    workdir: Path


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    api = ApiServerStandIn(bookmark_interval=1.0)
    await api.start()
    api.create("rayclusters", NAMESPACE, cluster(group("cpu", max_replicas=5)))
    gcs = ScriptedGcs(reply_of(state([head_node()])))
    server = grpc.aio.server()
    autoscaler_pb2_grpc.add_AutoscalerStateServiceServicer_to_server(gcs, server)
    gcs_service_pb2_grpc.add_NodeInfoGcsServiceServicer_to_server(_ClusterId(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield World(api, gcs, f"127.0.0.1:{port}", tmp_path)
    finally:
        await server.stop(None)
        await api.stop()


def _low_file_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FILE_LIMIT, FILE_LIMIT))


@contextlib.contextmanager
def daemon(world: World, *, file_limit: bool = False, **settings: str) -> Any:
    kubeconfig = world.workdir / "kubeconfig"
    world.api.write_kubeconfig(kubeconfig, ADMIN_TOKEN, namespace=NAMESPACE)
    http = f"127.0.0.1:{free_port('127.0.0.1')}"
    home = world.workdir / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "KUBERAY_"))}
    env |= {
        "HOME": str(home),
        "RAY_CLUSTER_NAME": "rc",
        "RAY_CLUSTER_NAMESPACE": NAMESPACE,
        "KUBERAY_SCALER_KUBECONFIG": str(kubeconfig),
        "KUBERAY_SCALER_GCS_ADDRESS": world.gcs_address,
        "KUBERAY_SCALER_HTTP_ADDRESS": http,
        "KUBERAY_SCALER_LOG_FORMAT": "json",
        "KUBERAY_SCALER_GCS_POLL_INTERVAL_S": "0.5",
        "KUBERAY_SCALER_RESYNC_INTERVAL_S": "5",
        **settings,
    }
    log_path = world.workdir / "daemon.log"
    with log_path.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "kuberay_scaler", "run"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=_low_file_limit if file_limit else None,
        )
    try:
        yield http, log_path
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def get(http: str, path: str, timeout: float = 1.0) -> int | str:
    try:
        with urllib.request.urlopen(f"http://{http}{path}", timeout=timeout) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as err:
        return err.code
    except OSError as err:
        return repr(err)


async def wait_for(check: Callable[[], bool], within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, f"not within {within_s} s: {what}"
        await asyncio.sleep(0.2)


def replicas(world: World) -> int:
    rc = world.api.get("rayclusters", NAMESPACE, "rc")
    assert rc is not None
    return int(rc["spec"]["workerGroupSpecs"][0].get("replicas", 0))


def slow_connections(http: str, count: int) -> list[socket.socket]:
    host, _, port = http.rpartition(":")
    held = []
    for _ in range(count):
        sock = socket.socket()
        sock.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            sock.connect((host, int(port)))
        held.append(sock)
    time.sleep(0.5)  # connected (accepted or in the backlog)
    for sock in held:
        with contextlib.suppress(OSError):
            sock.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # and nothing more
    return held


def error_lines(log_path: Path) -> list[dict[str, Any]]:
    out = []
    for line in log_path.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if record.get("level") in ("error", "critical"):
                out.append(record)
    return out


async def test_a_flood_of_slow_connections_stalls_neither_the_scale_up_nor_the_probes(
    world: World,
) -> None:
    with daemon(world, file_limit=True) as (http, log_path):
        await wait_for(lambda: get(http, "/readyz") == 200, 60, "/readyz 200")
        flood = await asyncio.to_thread(slow_connections, http, FLOOD)
        try:
            # Within the flood's first seconds (before any slow client times out).
            assert await asyncio.to_thread(get, http, "/healthz", 2.0) == 200
            world.api.faults.refuse_connections(True)  # one API-server disconnect ...
            await asyncio.sleep(1)
            world.api.faults.refuse_connections(False)  # ... and every reconnect must work
            demand = state([head_node()], [tasks({"CPU": 8}, 1)])
            world.gcs.reply = reply_of(demand)
            await wait_for(lambda: replicas(world) == 1, 60, "the due scale-up written")
            answers = [await asyncio.to_thread(get, http, "/healthz", 2.0) for _ in range(5)]
            assert answers == [200] * 5, answers
        finally:
            for sock in flood:
                sock.close()
        size = log_path.stat().st_size
        assert size < 256 * 1024, f"{size} bytes of log"
        assert len(error_lines(log_path)) <= 10, error_lines(log_path)[:3]


MALFORMED = [
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 20000 + b"\r\n\r\n",
    b"GET /healthz HTTP/9.9\r\n\r\n",
    b"\x16\x03\x01 a TLS hello\r\n\r\n",
]


async def test_malformed_requests_are_no_tracebacks_at_error(world: World) -> None:
    with daemon(world) as (http, log_path):
        await wait_for(lambda: get(http, "/readyz") == 200, 60, "/readyz 200")
        host, _, port = http.rpartition(":")
        for index in range(300):
            with socket.create_connection((host, int(port)), timeout=2) as sock:
                sock.sendall(MALFORMED[index % len(MALFORMED)])
                with contextlib.suppress(OSError):
                    sock.recv(1024)
        assert get(http, "/healthz") == 200
        errors = error_lines(log_path)
        assert not [e for e in errors if "exception" in e or "Traceback" in json.dumps(e)], errors[
            :2
        ]
        assert len(errors) <= 10, errors[:3]
