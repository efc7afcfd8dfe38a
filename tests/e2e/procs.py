"""The daemon under test as a child process, a GCS probe, and the loopback-only check.

`Daemon` runs `kuberay-scaler run` configured by env vars only, logs JSON lines to a file and
serves its HTTP endpoints on 127.0.0.1. `RayProbe` reads `GetClusterResourceState` straight from
the GCS with Ray's own stubs (not the daemon's client). `foreign_connections` lists TCP
connections of given process groups to anything outside 127.0.0.0/8.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from ray.core.generated import autoscaler_pb2, autoscaler_pb2_grpc

from tests.e2e.controlplane import free_port

DAEMON = str(Path(sys.executable).parent / "kuberay-scaler")
DEAD = autoscaler_pb2.NodeStatus.Value("DEAD")
RUNNING = autoscaler_pb2.NodeStatus.Value("RUNNING")
HEAD_RESOURCE = "node:__internal_head__"


@dataclass
class Daemon:
    process: subprocess.Popen[bytes]
    log_path: Path
    http: str
    env: dict[str, str]
    stopped: bool = False  # stop() was called: an exit from now on is expected

    @classmethod
    def start(
        cls, settings: Mapping[str, str], log_path: Path, argv: Sequence[str] = (DAEMON, "run")
    ) -> Daemon:
        """`argv` (default `kuberay-scaler run`) with our settings over a clean environment;
        an HTTP address in `settings` is used as is, else one on a free loopback port."""
        # Only our own variables: nothing of the developer's RAY_* / KUBERAY_* leaks in.
        base = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("RAY_", "KUBERAY_", "KUBECONFIG"))
        }
        http = settings.get("KUBERAY_SCALER_HTTP_ADDRESS") or f"127.0.0.1:{free_port()}"
        env = {
            **base,
            "KUBERAY_SCALER_HTTP_ADDRESS": http,
            "KUBERAY_SCALER_LOG_FORMAT": "json",
            **settings,
        }
        with log_path.open("ab") as out:
            process = subprocess.Popen(
                list(argv),
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return cls(process, log_path, http, dict(settings))

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def lines(self) -> list[dict[str, Any]]:
        """The JSON log lines (anything else, e.g. a traceback, is skipped)."""
        out = []
        for line in self.text().splitlines():
            with contextlib.suppress(ValueError):
                decoded = json.loads(line)
                if isinstance(decoded, dict):
                    out.append(decoded)
        return out

    def events(self, name: str) -> list[dict[str, Any]]:
        return [line for line in self.lines() if line.get("event") == name]

    async def get(self, path: str) -> tuple[int, str]:
        timeout = aiohttp.ClientTimeout(total=5)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(f"http://{self.http}{path}") as response,
        ):
            return response.status, await response.text()

    async def plan(self) -> dict[str, Any] | None:
        try:
            status, text = await self.get("/debug/plan")
        except (aiohttp.ClientError, TimeoutError):
            return None
        if status != 200:
            return None
        decoded = json.loads(text)
        return decoded if isinstance(decoded, dict) else None

    async def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include `labels` (0 if none)."""
        _, text = await self.get("/metrics")
        total = 0.0
        for line in text.splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            head, _, value = line.rpartition(" ")
            if all(f'{k}="{v}"' in head for k, v in labels.items()):
                total += float(value)
        return total

    def stop(self, grace_s: float = 20.0) -> int:
        """SIGTERM, wait, then SIGKILL our process group; returns the exit code."""
        self.stopped = True
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        return int(self.process.returncode)


class RayProbe:
    """Reads the GCS's view of the cluster, as the tests' independent source of truth."""

    def __init__(self, gcs_address: str) -> None:
        self._channel = grpc.aio.insecure_channel(
            gcs_address, options=[("grpc.enable_http_proxy", 0)]
        )
        self._stub = autoscaler_pb2_grpc.AutoscalerStateServiceStub(self._channel)

    async def state(self) -> Any:
        # Version 0 always: a higher one than the GCS's counter crashes it (contract §4).
        request = autoscaler_pb2.GetClusterResourceStateRequest(
            last_seen_cluster_resource_state_version=0
        )
        reply = await self._stub.GetClusterResourceState(request, timeout=10)
        return reply.cluster_resource_state

    async def workers(self) -> list[Any]:
        """Live (not DEAD) nodes other than the head."""
        state = await self.state()
        return [
            n
            for n in state.node_states
            if n.status != DEAD and HEAD_RESOURCE not in n.total_resources
        ]

    async def busy(self, instance_ids: Iterable[str]) -> list[str]:
        """Which of these pods' Ray nodes are busy (RUNNING: not idle, not draining, alive)."""
        wanted = set(instance_ids)
        state = await self.state()
        return sorted(
            n.instance_id
            for n in state.node_states
            if n.instance_id in wanted and n.status == RUNNING
        )

    async def close(self) -> None:
        await self._channel.close()


def process_group_members(pgids: Iterable[int]) -> list[int]:
    wanted = set(pgids)
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) in wanted:
            members.append(int(entry.name))
    return members


def foreign_connections(pgids: Iterable[int]) -> list[str]:
    """TCP connections (not listeners) of these process groups to non-loopback addresses."""
    inodes: dict[str, int] = {}
    for pid in process_group_members(pgids):
        with contextlib.suppress(OSError):
            for fd in os.scandir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(fd.path)
                    if target.startswith("socket:["):
                        inodes[target[8:-1]] = pid
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                parts = line.split()
                remote, state, inode = parts[2], parts[3], parts[9]
                if inode in inodes and state != "0A" and not _loopback_or_any(remote):
                    found.append(f"pid {inodes[inode]} -> {_address(remote)} (state {state})")
    return found


def _ip(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address from /proc/net/tcp{,6}: 32-bit words in host (little-endian) order."""
    raw = bytes.fromhex(hex_address.split(":")[0])
    if len(raw) == 4:
        return ipaddress.IPv4Address(raw[::-1])
    ip = ipaddress.IPv6Address(b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))
    return ip.ipv4_mapped or ip


def _address(hex_address: str) -> str:
    return f"{_ip(hex_address)}:{int(hex_address.split(':')[1], 16)}"


def _loopback_or_any(hex_address: str) -> bool:
    ip = _ip(hex_address)
    return ip.is_loopback or ip.is_unspecified


def wait_gone(pids: Iterable[int], timeout_s: float = 10.0) -> list[int]:
    """PIDs among `pids` still alive after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    left = list(pids)
    while left and time.monotonic() < deadline:
        left = [p for p in left if Path(f"/proc/{p}").exists()]
        time.sleep(0.1)
    return left
