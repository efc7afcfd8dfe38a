"""Event recorder against the stand-in: Events on the RayCluster where RBAC allows, logging only
(said once) where it does not, and never an exception."""

from __future__ import annotations

from typing import Any

import pytest
from structlog.testing import capture_logs

from kuberay_scaler.adapters.kube.events import EventRecorder
from kuberay_standins.apiserver import RESTRICTED_TOKEN, SIDECAR_TOKEN, ApiServerStandIn
from tests.contract.conftest import CLUSTER, NAMESPACE, Connect, raycluster

pytestmark = pytest.mark.contract


def events(server: ApiServerStandIn) -> list[dict[str, Any]]:
    return server.list("events", NAMESPACE)


async def test_event_on_the_raycluster_when_allowed(
    apiserver: ApiServerStandIn, connect: Connect
) -> None:
    cluster = apiserver.create("rayclusters", NAMESPACE, raycluster())
    recorder = EventRecorder(
        await connect(SIDECAR_TOKEN),
        namespace=NAMESPACE,
        enabled=True,
        involved=lambda: cluster,
        instance="head-pod",
    )
    await recorder.record("ScaledUp", "tpu-group: 1 -> 2 slices (demand for 8 TPU hosts)")
    await recorder.record("ScaledUp", "tpu-group: 1 -> 2 slices (demand for 8 TPU hosts)")
    await recorder.record("SliceUnhealthy", "tpu-group-abcde: host 2 failed", type="Warning")
    stored = events(apiserver)
    assert sorted((e["reason"], e["type"]) for e in stored) == [
        ("ScaledUp", "Normal"),
        ("SliceUnhealthy", "Warning"),
    ]  # the repeated event within the dedupe window was sent once
    first = next(e for e in stored if e["reason"] == "ScaledUp")
    assert first["involvedObject"]["uid"] == cluster["metadata"]["uid"]
    assert first["involvedObject"]["kind"] == "RayCluster"
    assert first["involvedObject"]["name"] == CLUSTER
    assert first["source"] == {"component": "kuberay-scaler"}
    assert first["reportingComponent"] == "kuberay-scaler"
    assert first["reportingInstance"] == "head-pod"


async def test_restricted_token_only_logs_and_says_so_once(
    apiserver: ApiServerStandIn, connect: Connect
) -> None:
    cluster = apiserver.create("rayclusters", NAMESPACE, raycluster())
    with capture_logs() as logs:
        recorder = EventRecorder(
            await connect(RESTRICTED_TOKEN),
            namespace=NAMESPACE,
            enabled=False,
            involved=lambda: cluster,
        )
        await recorder.record("ScaledUp", "one")
        await recorder.record("ScaledDown", "two")
    assert events(apiserver) == []
    assert not [r for r in apiserver.requests if "events" in r.path]
    disabled = [e for e in logs if "events disabled" in e["event"]]
    assert len(disabled) == 1
    assert [e["reason"] for e in logs if e["event"] == "event"] == ["ScaledUp", "ScaledDown"]


async def test_403_disables_events_without_raising(
    apiserver: ApiServerStandIn, connect: Connect
) -> None:
    cluster = apiserver.create("rayclusters", NAMESPACE, raycluster())
    apiserver.add_token("no-events", [(["get"], ["rayclusters"])])
    recorder = EventRecorder(
        await connect("no-events"), namespace=NAMESPACE, enabled=True, involved=lambda: cluster
    )
    await recorder.record("ScaledUp", "one")
    assert not recorder.enabled
    await recorder.record("ScaledUp", "two")
    assert len([r for r in apiserver.requests if r.path.endswith("/events")]) == 1
    assert events(apiserver) == []


async def test_server_trouble_and_missing_raycluster_never_raise(
    apiserver: ApiServerStandIn, connect: Connect
) -> None:
    cluster = apiserver.create("rayclusters", NAMESPACE, raycluster())
    current: list[dict[str, Any] | None] = [None]
    recorder = EventRecorder(
        await connect(SIDECAR_TOKEN), namespace=NAMESPACE, enabled=True, involved=lambda: current[0]
    )
    await recorder.record("ScaledUp", "no RayCluster yet: nothing to attach to")
    current[0] = cluster
    apiserver.faults.fail_next("POST", "events", 500)
    await recorder.record("ScaledUp", "server error")
    apiserver.faults.refuse_connections(True)
    await recorder.record("ScaledUp", "server down")
    apiserver.faults.refuse_connections(False)
    await recorder.record("ScaledUp", "back")
    assert recorder.enabled
    assert [e["message"] for e in events(apiserver)] == ["back"]
