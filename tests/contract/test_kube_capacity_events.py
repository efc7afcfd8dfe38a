"""The capacity Events reader against the stand-in: it reads the cluster-autoscaler's Events on
our pods and KubeRay's on our RayCluster where RBAC allows (selected on the server), keeps the
newest per (pod, reason) of pods we have, says which signals it runs with once, and is off (said
once, nothing requested) under KubeRay's Role or after a 403."""

from __future__ import annotations

import asyncio
import itertools
import os
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from kuberay_scaler.adapters.kube.access import detect_access
from kuberay_scaler.adapters.kube.capacity import ALWAYS, CapacityEventsReader
from kuberay_scaler.cli.main import main
from kuberay_scaler.core.model.signals import CapacitySignal
from kuberay_standins.apiserver import RESTRICTED_TOKEN, ApiServerStandIn
from kuberay_standins.ca_standin import failed_scale_up, not_triggered, triggered
from tests.contract.conftest import CLUSTER, GROUP, NAMESPACE, Connect, eventually, running

pytestmark = pytest.mark.contract

EVENTS_READER = "events-reader"
_names = itertools.count()


def pod_ref(name: str) -> dict[str, Any]:
    return {"kind": "Pod", "name": name, "namespace": NAMESPACE, "uid": f"uid-{name}"}


def post(server: ApiServerStandIn, body: dict[str, Any]) -> None:
    body["metadata"]["name"] = f"{body['metadata']['name']}.{next(_names)}"
    server.create("events", NAMESPACE, body)


def ours(suffix: str) -> str:
    return f"{CLUSTER}-{GROUP}-worker-{suffix}"


def with_events_role(server: ApiServerStandIn) -> str:
    server.add_token(
        EVENTS_READER,
        [
            (["get", "list", "watch", "patch"], ["pods"]),
            (["get", "patch"], ["rayclusters"]),
            (["get", "list", "watch"], ["events"]),
        ],
    )
    return EVENTS_READER


async def test_reads_the_autoscalers_events_on_our_pods_and_kuberays_on_our_raycluster(
    apiserver: ApiServerStandIn, connect: Connect
) -> None:
    api = await connect(with_events_role(apiserver))
    access = await detect_access(api, NAMESPACE, name=CLUSTER)
    assert access.read_events
    assert "capacity Events read" in access.description
    pods = {ours("aaaaa"): {}, ours("bbbbb"): {}}
    woken: list[int] = []
    reader = CapacityEventsReader(
        api,
        namespace=NAMESPACE,
        cluster=CLUSTER,
        enabled=access.read_events,
        pods=lambda: pods,
        groups=lambda: (GROUP,),
        on_change=lambda: woken.append(1),
    )
    post(
        apiserver,
        triggered(pod_ref(ours("aaaaa")), "gke-pool-grp", 0, 4, 4, at="2026-12-04T12:00:00Z"),
    )
    post(
        apiserver, failed_scale_up(pod_ref(ours("aaaaa")), "us-east5-b", at="2026-12-04T12:01:00Z")
    )
    post(
        apiserver, failed_scale_up(pod_ref(ours("aaaaa")), "us-east5-b", at="2026-12-04T12:02:00Z")
    )
    post(apiserver, not_triggered(pod_ref(ours("bbbbb")), at="2026-12-04T12:01:30Z"))
    post(
        apiserver,
        failed_scale_up(pod_ref("another-cluster-g-worker-x"), "z", at="2026-12-04T12:03:00Z"),
    )
    post(apiserver, failed_scale_up(pod_ref(ours("gone00")), "z", at="2026-12-04T12:03:00Z"))
    scheduler = not_triggered(pod_ref(ours("aaaaa")), at="2026-12-04T12:03:00Z")
    scheduler["source"] = {"component": "default-scheduler"}
    scheduler["reason"] = "FailedScheduling"
    post(apiserver, scheduler)
    post(
        apiserver,
        {
            "metadata": {"name": CLUSTER},
            "involvedObject": {"kind": "RayCluster", "name": CLUSTER, "namespace": NAMESPACE},
            "reason": "FailedToCreateWorkerPod",
            "message": f"Failed to create worker Pod for the cluster {NAMESPACE}/{CLUSTER}, pods"
            f' "{CLUSTER}-{GROUP}-worker-" is forbidden: exceeded quota: tpu, requested:'
            " google.com/tpu=4, used: google.com/tpu=16, limited: google.com/tpu=16",
            "source": {"component": "raycluster-controller"},
            "lastTimestamp": "2026-12-04T12:04:00Z",
            "type": "Warning",
        },
    )
    async with running(reader.run()):
        await eventually(lambda: len(reader.events()) == 4, "the events read")
        seen = [(e.pod, e.group, e.reason, e.signal) for e in reader.events()]
        assert seen == [
            (ours("aaaaa"), None, "TriggeredScaleUp", CapacitySignal.SCALE_UP_TRIGGERED),
            (ours("bbbbb"), None, "NotTriggerScaleUp", CapacitySignal.NO_SCALE_UP),
            (ours("aaaaa"), None, "FailedScaleUp", CapacitySignal.STOCKOUT),  # the newest
            (None, GROUP, "FailedToCreateWorkerPod", CapacitySignal.QUOTA),
        ]
        assert woken
        del pods[ours("bbbbb")]  # a pod gone: its news with it
        assert [e.pod for e in reader.events()].count(ours("bbbbb")) == 0
        document = reader.document()
        assert document["events"] == "read" and document["synced"] is True
        assert len(document["capacity_events"]) == 3
    # Selected on the server: only the two field selectors, never all events.
    selectors = {
        r.query.get("fieldSelector") for r in apiserver.requests if r.path.endswith("/events")
    }
    assert selectors == {
        "involvedObject.kind=Pod,source=cluster-autoscaler",
        f"involvedObject.kind=RayCluster,involvedObject.name={CLUSTER}",
    }


async def test_under_kuberays_role_it_is_off_says_so_once_and_asks_nothing(
    apiserver: ApiServerStandIn, connect: Connect
) -> None:
    api = await connect(RESTRICTED_TOKEN)
    access = await detect_access(api, NAMESPACE, name=CLUSTER)
    assert not access.read_events
    assert "capacity Events not read" in access.description
    with capture_logs() as logs:
        reader = CapacityEventsReader(
            api, namespace=NAMESPACE, cluster=CLUSTER, enabled=access.read_events, pods=dict
        )
        await reader.run()  # returns at once
    said = [e for e in logs if e["event"] == "capacity signals"]
    assert len(said) == 1 and "not read" in said[0]["events"]
    assert said[0]["signals"] == list(ALWAYS)
    assert reader.events() == ()
    assert reader.document()["signals"] == list(ALWAYS)
    assert not [r for r in apiserver.requests if r.path.endswith("/events")]


async def test_a_403_turns_it_off_for_good(apiserver: ApiServerStandIn, connect: Connect) -> None:
    post(apiserver, failed_scale_up(pod_ref(ours("aaaaa")), "z", at="2026-12-04T12:03:00Z"))
    woken: list[int] = []
    with capture_logs() as logs:
        reader = CapacityEventsReader(
            await connect(RESTRICTED_TOKEN),  # told it may read (a Role changed since the check)
            namespace=NAMESPACE,
            cluster=CLUSTER,
            enabled=True,
            pods=lambda: {ours("aaaaa"): {}},
            on_change=lambda: woken.append(1),
        )
        await reader.run()  # returns once the 403 turned it off
    assert not reader.reading
    assert reader.events() == ()
    assert woken  # the loop is told: it replans without Events
    warned = [e for e in logs if e["event"] == "capacity signals" and e["log_level"] == "warning"]
    assert len(warned) == 1 and "403" in warned[0]["events"]


@pytest.mark.parametrize("allowed", [True, False], ids=["events-role", "kuberays-role"])
async def test_check_config_access_says_which_signals_run_would_use(
    apiserver: ApiServerStandIn,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    allowed: bool,
) -> None:
    for key in list(os.environ):
        if key.startswith(("KUBERAY_SCALER_", "RAY_")):
            monkeypatch.delenv(key)
    token = with_events_role(apiserver) if allowed else RESTRICTED_TOKEN
    kubeconfig = tmp_path / "kubeconfig"
    apiserver.write_kubeconfig(kubeconfig, token=token, namespace=NAMESPACE)
    monkeypatch.setenv("RAY_CLUSTER_NAME", CLUSTER)
    monkeypatch.setenv("RAY_CLUSTER_NAMESPACE", NAMESPACE)
    monkeypatch.setenv("KUBERAY_SCALER_KUBECONFIG", str(kubeconfig))
    code = await asyncio.to_thread(main, ["check-config", "--access"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "capacity signals: pod conditions and the provisioning deadline always" in err
    [line] = [x for x in err.splitlines() if x.startswith("kuberay-scaler: access: ")]
    assert ("capacity Events read" in line) is allowed
    assert ("capacity Events not read" in line) is not allowed
