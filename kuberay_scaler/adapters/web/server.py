"""aiohttp server embedded next to the other tasks (AppRunner, no web.run_app)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kuberay_scaler.adapters.web.slices_page import render_slices
from kuberay_scaler.runtime.metrics import REGISTRY


@dataclass(frozen=True)
class Probes:
    """Callbacks the composition root wires in; each returns (ok, detail)."""

    healthy: Callable[[], tuple[bool, str]]
    ready: Callable[[], tuple[bool, str]]
    plan: Callable[[], dict[str, Any] | None]


def make_app(probes: Probes) -> web.Application:
    app = web.Application()
    app.router.add_get("/healthz", _probe(probes.healthy))
    app.router.add_get("/readyz", _probe(probes.ready))
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/debug/plan", _plan(probes.plan))
    app.router.add_get("/debug/slices", _slices(probes.plan))
    return app


def _probe(check: Callable[[], tuple[bool, str]]) -> Any:
    async def handler(_: web.Request) -> web.Response:
        ok, detail = check()
        return web.Response(status=200 if ok else 503, text=("ok: " if ok else "not ok: ") + detail)

    return handler


async def _metrics(_: web.Request) -> web.Response:
    body = generate_latest(REGISTRY)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


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


async def start_server(app: web.Application, address: str) -> web.AppRunner:
    host, _, port = address.rpartition(":")
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host.strip("[]") or "0.0.0.0", int(port)).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner
