"""aiohttp server embedded next to the other tasks (AppRunner, no web.run_app).

The port is unauthenticated (deploy/ ships a NetworkPolicy that admits only the scraper and the
kubelet), so no client that reaches it may stall the loop: every connection goes through a
`_Guard` that gives it `HEAD_TIMEOUT_S` to send a request head and `LIFETIME_S` in all, and at
most `max_connections` are open at once. At the cap, the oldest connection still waiting for its
head is dropped for the new one (a flood of slow clients cannot lock a probe out), and when none
is, the new one is refused. The loop's own connections (API server, GCS) keep the descriptors
left over: the cap stays well below the open-files limit (`connection_cap`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kuberay_scaler.adapters.web.slices_page import render_slices
from kuberay_scaler.runtime.metrics import Metrics


@dataclass(frozen=True)
class Probes:
    """Callbacks the composition root wires in; each returns (ok, detail)."""

    healthy: Callable[[], tuple[bool, str]]
    ready: Callable[[], tuple[bool, str]]
    plan: Callable[[], dict[str, Any] | None]


def make_app(probes: Probes, metrics: Metrics) -> web.Application:
    """The daemon's pages; /metrics serves `metrics` (the composition root's)."""
    app = web.Application()
    app.router.add_get("/healthz", _probe(probes.healthy))
    app.router.add_get("/readyz", _probe(probes.ready))
    app.router.add_get("/metrics", _metrics(metrics))
    app.router.add_get("/debug/plan", _plan(probes.plan))
    app.router.add_get("/debug/slices", _slices(probes.plan))
    return app


def _probe(check: Callable[[], tuple[bool, str]]) -> Any:
    async def handler(_: web.Request) -> web.Response:
        ok, detail = check()
        return web.Response(status=200 if ok else 503, text=("ok: " if ok else "not ok: ") + detail)

    return handler


def _metrics(metrics: Metrics) -> Any:
    async def handler(_: web.Request) -> web.Response:
        body = generate_latest(metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    return handler


def _plan(source: Callable[[], dict[str, Any] | None]) -> Any:
    async def handler(_: web.Request) -> web.Response:
        document = source()
        if document is None:
            return web.Response(status=404, text="no plan yet")
        return web.Response(
            text=json.dumps(document, indent=2, ensure_ascii=False, default=str),
            content_type="application/json",
        )

    return handler


def _slices(source: Callable[[], dict[str, Any] | None]) -> Any:
    async def handler(_: web.Request) -> web.Response:
        return web.Response(text=render_slices(source()), content_type="text/html")

    return handler


HEAD_TIMEOUT_S = 10.0  # to send a whole request head once connected
LIFETIME_S = 60.0  # a connection's whole life (a client that never reads its answer)
KEEPALIVE_S = 5.0  # idle between two requests on one connection
MAX_CONNECTIONS = 64
BACKLOG = 16  # accepted per loop turn at most: a burst costs few descriptors at once
_HEAD_END = b"\r\n\r\n"
_MAX_HEAD = 16 * 1024  # beyond this the parser answers 400 anyway: stop looking for the end


def connection_cap(open_files_limit: int, most: int = MAX_CONNECTIONS) -> int:
    """Web connections allowed at once: a quarter of the open-files limit at most, so the loop's
    own connections (API server watches and requests, GCS) always find a descriptor."""
    return max(4, min(most, open_files_limit // 4))


@dataclass
class Connections:
    """The open web connections, oldest first (the guards register and leave)."""

    cap: int
    open: dict[_Guard, float] = field(default_factory=dict)  # guard -> when it connected
    refused: int = 0
    dropped: int = 0

    def admit(self, guard: _Guard, now: float) -> bool:
        if len(self.open) >= self.cap:
            waiting = next((g for g in self.open if not g.head_seen), None)
            if waiting is None:
                self.refused += 1
                return False
            self.dropped += 1
            waiting.drop()
        self.open[guard] = now
        return True

    def leave(self, guard: _Guard) -> None:
        self.open.pop(guard, None)


class _Guard(asyncio.Protocol):
    """Wraps aiohttp's protocol for one connection with the deadlines and the cap."""

    def __init__(self, inner: asyncio.Protocol, connections: Connections) -> None:
        self._inner = inner
        self._connections = connections
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._head = bytearray()
        self._admitted = False
        self.head_seen = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        if not self._connections.admit(self, time.monotonic()):
            transport.abort()
            return
        self._admitted = True
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(HEAD_TIMEOUT_S, self.drop)
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self._admitted:
            return
        if not self.head_seen:
            self._head += data[:_MAX_HEAD]
            if _HEAD_END in self._head or len(self._head) >= _MAX_HEAD:
                self.head_seen = True
                self._head = bytearray()
                self._rearm(LIFETIME_S - HEAD_TIMEOUT_S)
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._admitted else None

    def pause_writing(self) -> None:
        if self._admitted:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._admitted:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._connections.leave(self)
        if self._admitted:
            self._inner.connection_lost(exc)

    def drop(self) -> None:
        """Too slow (or dropped for a newer connection at the cap): closed, nothing logged."""
        self._connections.leave(self)
        if self._transport is not None:
            self._transport.abort()

    def _rearm(self, seconds: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(max(1.0, seconds), self.drop)


@dataclass
class Serving:
    """What `start_server` started: `cleanup()` stops it."""

    runner: web.AppRunner
    server: asyncio.Server
    connections: Connections

    @property
    def addresses(self) -> list[Any]:
        return [sock.getsockname() for sock in self.server.sockets]

    async def cleanup(self) -> None:
        self.server.close()
        for guard in list(self.connections.open):
            guard.drop()
        await self.runner.cleanup()


async def start_server(
    app: web.Application, address: str, max_connections: int = MAX_CONNECTIONS
) -> Serving:
    host, _, port = address.rpartition(":")
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=KEEPALIVE_S)
    await runner.setup()
    connections = Connections(max_connections)
    handler = runner.server
    assert handler is not None

    def guarded() -> asyncio.Protocol:
        return _Guard(handler(), connections)

    try:
        server = await asyncio.get_running_loop().create_server(
            guarded, host.strip("[]") or "0.0.0.0", int(port), backlog=BACKLOG
        )
    except BaseException:
        await runner.cleanup()
        raise
    return Serving(runner, server, connections)
