"""Issue 30, promise 2, through the real `run`: every PATCH answers 500 for 60 s while an idle
slice is due to go (`UNHEALTHY_AFTER_S=20`). The reconciles between attempts write nothing (the
slice sits in its retry backoff): /healthz must still fail within the bound, say which group
and what want, and recover once the API server does. The API-server stand-in and a scripted GCS
(tests/integration/test_port_flood.py), no Ray."""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request

import pytest

from tests.control.fakes import reply_of
from tests.factories import cpu_nodes, head_node, pod, state
from tests.integration.test_port_flood import NAMESPACE, World, daemon, get, wait_for, world

__all__ = ["world"]  # the fixture
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
UNHEALTHY_AFTER_S = 20.0


def healthz(http: str) -> tuple[int | str, str]:
    try:
        with urllib.request.urlopen(f"http://{http}/healthz", timeout=2) as reply:
            return int(reply.status), reply.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError as err:
        return repr(err), ""


def replicas(world: World) -> int:
    rc = world.api.get("rayclusters", NAMESPACE, "rc")
    assert rc is not None
    return int(rc["spec"]["workerGroupSpecs"][0].get("replicas", 0))


async def test_60_s_of_patch_500s_fail_healthz_within_the_bound_and_it_recovers(
    world: World,
) -> None:
    rc = world.api.get("rayclusters", NAMESPACE, "rc")
    assert rc is not None
    world.api.json_patch(
        "rayclusters",
        NAMESPACE,
        "rc",
        [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 1}],
    )
    world.api.create("pods", NAMESPACE, pod("cpu-0", "cpu"))
    world.gcs.reply = reply_of(state([head_node(), *cpu_nodes(["cpu-0"], idle_s=900)]))
    world.api.faults.fail_next("PATCH", r"rayclusters", 500, count=1_000_000)
    with daemon(world, KUBERAY_SCALER_UNHEALTHY_AFTER_S=str(UNHEALTHY_AFTER_S)) as (http, _):
        await wait_for(lambda: get(http, "/readyz") == 200, 60, "/readyz 200")
        started = time.monotonic()
        probes: list[tuple[float, int | str, str]] = []
        while time.monotonic() - started < 60:
            code, text = await asyncio.to_thread(healthz, http)
            probes.append((time.monotonic() - started, code, text))
            await asyncio.sleep(0.5)
        patches = [r for r in world.api.requests if r.method == "PATCH"]
        assert patches, "no PATCH was tried"
        assert replicas(world) == 1  # nothing applied
        failing = [(at, text) for at, code, text in probes if code == 503]
        assert failing, f"/healthz 200 on all {len(probes)} probes: {probes[-1]}"
        # Failing within the bound (plus a resync), then saying which group and what want.
        assert failing[0][0] <= UNHEALTHY_AFTER_S + 10, failing[0]
        text = failing[-1][1]
        assert "group cpu" in text and "replicas 1->0" in text, text
        assert all(code == 503 for at, code, _ in probes if at > failing[0][0]), "flapped"

        world.api.faults.clear()  # the API server is back
        await wait_for(lambda: replicas(world) == 0, 90, "the scale-down written")
        await wait_for(lambda: healthz(http)[0] == 200, 30, "/healthz 200 again")
