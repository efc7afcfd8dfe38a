"""The stand-in API server's write log feeds the invariant checker: a bad write over HTTP by the
daemon's identity is caught with its request and the world it landed in; others' writes are
logged but not judged."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from kuberay_standins.apiserver import (
    ADMIN_TOKEN,
    DIRECT_WRITER,
    RESTRICTED_TOKEN,
    ApiServerStandIn,
)
from tests.contract.test_standin_apiserver import RAYCLUSTERS, bearer, pod, raycluster
from tests.invariants import watch_writes

NS = "default"
JSON_PATCH = {"Content-Type": "application/json-patch+json"}


@pytest.fixture
async def api() -> AsyncIterator[ApiServerStandIn]:
    server = ApiServerStandIn()
    await server.start()
    server.create("rayclusters", NS, raycluster(replicas=1))
    for host in (0, 1):
        labels = {
            "ray.io/cluster": "rc",
            "ray.io/group": "g",
            "ray.io/node-type": "worker",
            "ray.io/worker-group-replica-name": "g-abc",
        }
        server.create("pods", NS, pod(f"g-abc-{host}", labels, node="n1"))
    try:
        yield server
    finally:
        await server.stop()


async def _patch(api: ApiServerStandIn, token: str, ops: list[dict[str, Any]]) -> int:
    async with (
        aiohttp.ClientSession() as http,
        http.patch(
            f"{api.url}{RAYCLUSTERS}/rc",
            data=json.dumps(ops),
            headers={**bearer(token), **JSON_PATCH},
        ) as reply,
    ):
        return reply.status


PARTIAL = [
    {
        "op": "add",
        "path": "/spec/workerGroupSpecs/0/scaleStrategy",
        "value": {"workersToDelete": ["g-abc-0"]},
    }
]


async def test_a_partial_slice_written_by_the_daemon_is_caught(api: ApiServerStandIn) -> None:
    daemon = api.user_of(RESTRICTED_TOKEN)
    feed = watch_writes(api, NS, "rc", daemon, None)
    try:
        assert await _patch(api, RESTRICTED_TOKEN, PARTIAL) == 200
        await feed.drain()
    finally:
        await feed.close()
    [violation] = feed.checker.violations
    assert violation.rule == "partial-slice" and "g-abc-1" in violation.message
    assert violation.write.by == daemon and "PATCH" in violation.write.request
    assert "g-abc-1: None" in str(violation)  # the pods as they were (no status: never started)


async def test_other_writers_are_logged_not_judged(api: ApiServerStandIn) -> None:
    seen: list[str] = []
    unsubscribe = api.subscribe_writes(lambda w: seen.append(w.user))
    feed = watch_writes(api, NS, "rc", api.user_of(RESTRICTED_TOKEN), None)
    try:
        assert await _patch(api, ADMIN_TOKEN, PARTIAL) == 200
        api.json_patch(
            "rayclusters",
            NS,
            "rc",
            [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 9}],
        )
        await feed.drain()
    finally:
        await feed.close()
        unsubscribe()
    assert feed.checker.violations == [] and feed.checker.writes_seen == 2
    assert seen == [api.user_of(ADMIN_TOKEN), DIRECT_WRITER]
