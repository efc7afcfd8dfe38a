"""Shared plumbing of the live benchmarks: process stats, a counting proxy, TLS, the API server.

Every autoscaler talks to the same API-server stand-in through its own counting TCP proxy, so
requests and bytes are measured on the wire the same way for all of them (plaintext bytes, both
directions). Ray's KubeRay client insists on HTTPS and reads its credentials from files; it gets
a TLS-terminating proxy and the client-certificate settings Ray documents
(`RAY_KUBERAY_CLIENT_CERT_PATH`/`_KEY_PATH`, `RAY_KUBERAY_CA_CERT_PATH`) — the "authenticating
proxy" case — and the stand-in maps such a request, which carries no token, to KubeRay's own
autoscaler Role.
"""

from __future__ import annotations

import asyncio
import os
import platform
import re
import ssl
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from kuberay_standins.apiserver import RESTRICTED_TOKEN, ApiServerStandIn

_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


# ---- process stats from /proc (no psutil) -------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU of `pid` and its reaped children, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return (utime + stime + cutime + cstime) / _CLK_TCK


def rss_mb(pid: int) -> float:
    pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    return pages * _PAGE / 2**20


def loadavg() -> tuple[float, float, float]:
    one, five, fifteen = os.getloadavg()
    return round(one, 2), round(five, 2), round(fifteen, 2)


def machine() -> dict[str, Any]:
    cpu = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem_kb = int(re.findall(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text())[0])
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gb": round(mem_kb / 2**20, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


# ---- TLS for Ray's client ----------------------------------------------------------------


@dataclass(frozen=True)
class Tls:
    cert: Path
    key: Path

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert, self.key)
        return ctx


def make_tls(workdir: Path) -> Tls:
    """A self-signed certificate for 127.0.0.1 (it is also its own CA)."""
    cert, key = workdir / "apiserver.crt", workdir / "apiserver.key"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
            "-addext", "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return Tls(cert, key)


# ---- counting proxy ------------------------------------------------------------------------


@dataclass
class Counter:
    """Connections, bytes up/down and HTTP requests (counted from request lines) so far."""

    requests: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    connections: int = 0

    def snapshot(self) -> tuple[int, int]:
        return self.requests, self.bytes_up + self.bytes_down


_REQUEST_LINE = re.compile(rb"(?:^|\r\n)(GET|POST|PUT|PATCH|DELETE) /")


@dataclass
class CountingProxy:
    """TCP proxy to `upstream` (host, port), optionally terminating TLS; counts what it carries."""

    upstream: tuple[str, int]
    tls: Tls | None = None
    counter: Counter = field(default_factory=Counter)
    port: int = 0
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self) -> str:
        ctx = self.tls.server_context() if self.tls else None
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=ctx)
        self.port = self._server.sockets[0].getsockname()[1]
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.counter.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        up = asyncio.ensure_future(self._pump(reader, up_writer, upstream=True))
        down = asyncio.ensure_future(self._pump(up_reader, writer, upstream=False))
        self._tasks |= {up, down}
        await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        for task in (up, down):
            task.cancel()
            self._tasks.discard(task)
        for w in (writer, up_writer):
            w.close()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, upstream: bool
    ) -> None:
        while chunk := await reader.read(65536):
            if upstream:
                self.counter.bytes_up += len(chunk)
                self.counter.requests += len(_REQUEST_LINE.findall(chunk))
            else:
                self.counter.bytes_down += len(chunk)
            writer.write(chunk)
            await writer.drain()


# ---- the API server ------------------------------------------------------------------------


class BenchApiServer(ApiServerStandIn):
    """The stand-in, plus: a request without a token (Ray's client-certificate mode behind the
    TLS proxy) is KubeRay's autoscaler Role, and store writes can be observed with a timestamp."""

    def _authenticate(self, request: web.Request) -> Any:
        if "Authorization" not in request.headers:
            return self._subjects[RESTRICTED_TOKEN]
        return super()._authenticate(request)

    def on_replicas(self, callback: Callable[[str, str, int, float], None]) -> Callable[[], None]:
        """`callback(cluster, group, replicas, monotonic)` on every change of a group's replicas."""

        def listener(event: Any) -> None:
            if event.store != "rayclusters" or event.prev is None:
                return
            before = {g["groupName"]: g for g in event.prev["spec"].get("workerGroupSpecs", [])}
            for group in event.obj["spec"].get("workerGroupSpecs", []):
                old = before.get(group["groupName"], {}).get("replicas")
                if group.get("replicas") != old:
                    name = event.obj["metadata"]["name"]
                    callback(name, group["groupName"], int(group["replicas"]), time.monotonic())

        return self.subscribe(listener)
