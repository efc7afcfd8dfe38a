"""Issue 20, promise 2: a target that does not exist or is not served is never silent.

The real `run` subprocess against the API-server stand-in and a real Ray head: RAY_CLUSTER_NAME
naming no RayCluster, or KUBERAY_CRD_VER naming a version the CRD does not serve. Each is not
ready (saying why), says so in an error line, and exits non-zero after
KUBERAY_SCALER_GIVE_UP_AFTER_S, so drop-in mode (no probes) shows restarts. Nothing is written
to the real RayCluster meanwhile.
"""

from __future__ import annotations

import asyncio

import pytest

from kuberay_standins.harness import DaemonProcess, LocalCluster
from tests.integration.test_daemon import _get

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

GIVE_UP_AFTER_S = 12.0
EXIT_TARGET_NOT_SERVED = 3


def _errors(daemon: DaemonProcess) -> list[str]:
    return [
        str(line.get("problem"))
        for line in daemon.lines()
        if line.get("level") == "error" and line.get("event") == "target not served"
    ]


async def _not_served(cluster: LocalCluster, daemon: DaemonProcess, says: str) -> None:
    await cluster.wait_for(lambda: _get(daemon, "/readyz")[0] == 503, 60, "not ready")
    await cluster.wait_for(lambda: bool(_errors(daemon)), 30, "an error line")
    status, text = _get(daemon, "/readyz")
    assert status == 503 and says in text, text
    assert says in _errors(daemon)[0]
    await cluster.wait_for(lambda: daemon.process.poll() is not None, 90, "the daemon to give up")
    assert daemon.process.returncode == EXIT_TARGET_NOT_SERVED
    assert any(line.get("event") == "giving up: target not served" for line in daemon.lines())


async def test_a_cluster_name_naming_nothing_and_a_crd_version_not_served_give_up(
    cluster: LocalCluster,
) -> None:
    give_up = {"KUBERAY_SCALER_GIVE_UP_AFTER_S": str(GIVE_UP_AFTER_S)}
    misnamed = cluster.start_daemon(RAY_CLUSTER_NAME="no-such-cluster", **give_up)
    unserved = cluster.start_daemon(KUBERAY_CRD_VER="v2", **give_up)
    seen = len(cluster.api.requests)
    await asyncio.gather(
        _not_served(cluster, misnamed, "no-such-cluster not found"),
        _not_served(cluster, unserved, "KUBERAY_CRD_VER"),
    )
    assert [r for r in cluster.api.requests[seen:] if r.method == "PATCH"] == []
    assert not cluster.violations
