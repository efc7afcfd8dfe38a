"""The whole daemon as a subprocess against the stand-ins and a real Ray head (integration tier)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import urllib.request
from collections.abc import AsyncIterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kuberay_standins.demo import Scenario, demo_raycluster, run_demo
from kuberay_standins.harness import PATCH_CONDITION, DaemonProcess, LocalCluster
from kuberay_standins.ray_local import RayDriver
from tests.invariants import InvariantChecker, finish_local_cluster, watch_local_cluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

RESERVE_SLICE = """
from ray.util.tpu import SlicePlacementGroup
handle = SlicePlacementGroup(topology="4x4", accelerator_version="v6e",
                             head_reservation_timeout_s=600)
ray.get(handle.placement_group.ready(), timeout=600)
print("SLICE_READY", flush=True)
"""


def _get(daemon: DaemonProcess, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{daemon.http}{path}", timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError as err:
        return 0, str(err)


def _sample(text: str, name: str, **labels: str) -> float:
    """The sum of `name`'s samples in a /metrics text whose labels include `labels`."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


def _replicas(cluster: LocalCluster, group: str) -> int:
    spec = cluster.current()["spec"]["workerGroupSpecs"]
    return int(next(g for g in spec if g["groupName"] == group).get("replicas", 0))


@pytest.fixture
def judge_writes() -> bool:
    """Every RayCluster write the daemon makes in `cluster` is judged (tests/invariants)."""
    return True


def _driver(cluster: LocalCluster, body: str) -> RayDriver:
    assert cluster.head is not None
    return RayDriver.start(
        cluster.head.gcs_address,
        body,
        node_ip=cluster.head.ip,
        env=cluster.head.client_env(),
        wait_ready=False,
    )


async def test_slice_reservation_scales_up_one_whole_slice_and_serves(
    cluster: LocalCluster,
) -> None:
    daemon = cluster.start_daemon()
    driver = await asyncio.to_thread(_driver, cluster, RESERVE_SLICE)
    try:
        await cluster.wait_for(lambda: "SLICE_READY" in driver.output(), 240, "the slice")
        pods = cluster.worker_pods("tpu-group")
        assert len(pods) == 4
        assert len({p["metadata"]["labels"]["ray.io/worker-group-replica-name"] for p in pods}) == 1
        assert _replicas(cluster, "tpu-group") == 1
        assert _replicas(cluster, "cpu-group") == 0  # no accelerator slice for nothing, no CPU pod
        status, body = _get(daemon, "/debug/plan")
        assert status == 200
        plan = json.loads(body)
        assert {g["name"] for g in plan["groups"]} == {"tpu-group", "cpu-group"}
        status, _ = _get(daemon, "/readyz")
        assert status == 200
    finally:
        await asyncio.to_thread(driver.stop)
    code, took = await asyncio.to_thread(daemon.stop)
    assert code == 0
    assert took < 30
    assert not cluster.violations


async def test_dry_run_plans_but_writes_nothing(cluster: LocalCluster) -> None:
    daemon = cluster.start_daemon(KUBERAY_SCALER_DRY_RUN="true")
    driver = await asyncio.to_thread(_driver, cluster, RESERVE_SLICE)
    try:
        await cluster.wait_for(
            lambda: any(line.get("event") == "decision" for line in daemon.lines()),
            120,
            "a dry-run decision",
        )
        decision = next(line for line in daemon.lines() if line.get("event") == "decision")
        assert decision["dry_run"] is True and decision["group"] == "tpu-group"
        await asyncio.sleep(2)
        assert _replicas(cluster, "tpu-group") == 0
        assert not cluster.worker_pods()
        patches = [r for r in cluster.api.requests if r.method == "PATCH"]
        assert patches == []
        # KubeRay's Role (the harness's token): capacity Events are not read, and it says so.
        status, text = await asyncio.to_thread(_get, daemon, "/debug/plan")
        signals = json.loads(text)["capacity_signals"]
        assert status == 200 and signals["events"].startswith("not read"), signals
        assert signals["capacity_events"] == []
        assert not [r for r in cluster.api.requests if r.path.endswith("/events")]
    finally:
        await asyncio.to_thread(driver.stop)
    assert (await asyncio.to_thread(daemon.stop))[0] == 0


async def test_metrics_parse_and_readyz_follows_the_gcs(cluster: LocalCluster) -> None:
    daemon = cluster.start_daemon(KUBERAY_SCALER_GCS_STALE_AFTER_S="3")
    await cluster.wait_for(lambda: _get(daemon, "/readyz")[0] == 200, 60, "readiness")
    status, text = _get(daemon, "/metrics")
    assert status == 200
    names = {family.name for family in text_string_to_metric_families(text)}
    assert {"kuberay_scaler_reconcile_duration_seconds", "kuberay_scaler_slices"} <= names
    # The adapters count into the daemon's own Metrics (app.py hands them their counters).
    assert _sample(text, "kuberay_scaler_api_requests_total", resource="pods", code="200") >= 1
    assert _sample(text, "kuberay_scaler_gcs_rpc_duration_seconds_count") >= 1
    assert _sample(text, "kuberay_scaler_gcs_connected") == 1.0
    assert _get(daemon, "/healthz")[0] == 200
    assert cluster.head is not None
    await asyncio.to_thread(cluster.head.kill_gcs)
    await cluster.wait_for(lambda: _get(daemon, "/readyz")[0] == 503, 60, "not ready")
    assert "GCS" in _get(daemon, "/readyz")[1]
    await cluster.wait_for(
        lambda: _sample(_get(daemon, "/metrics")[1], "kuberay_scaler_gcs_connected") == 0.0,
        60,
        "gcs_connected 0 once the GCS is gone",
    )
    assert (await asyncio.to_thread(daemon.stop))[0] == 0


async def test_sigterm_mid_reconcile_leaves_nothing_half_written(cluster: LocalCluster) -> None:
    # Patches answer slowly, so SIGTERM lands while a reconcile waits on its patch.
    cluster.api.faults.delay(r"/rayclusters/", 2.0)
    daemon = cluster.start_daemon()
    driver = await asyncio.to_thread(_driver, cluster, RESERVE_SLICE)
    try:
        await cluster.wait_for(
            lambda: any(r.method == "PATCH" for r in cluster.api.requests),
            120,
            "a patch in flight",
            step=0.05,
        )
        code, took = await asyncio.to_thread(daemon.stop)
    finally:
        await asyncio.to_thread(driver.stop)
    assert code == 0
    assert took < 30
    group = next(
        g for g in cluster.current()["spec"]["workerGroupSpecs"] if g["groupName"] == "tpu-group"
    )
    assert group.get("replicas") in (0, 1)  # either the whole patch or none of it
    assert not (group.get("scaleStrategy") or {}).get("workersToDelete")


async def test_demo_scenario_invariants() -> None:
    """The `make demo` scenario: up in whole slices, work on every host, idle, down whole.

    Every RayCluster write is judged against the real pods and Ray nodes (tests/invariants), and
    the printed story must show, for each delete patch, its own slices' drains before it. The
    two groups go idle at nearly the same moment: which one scales down first is not asserted.
    """
    import io

    judged: list[InvariantChecker] = []

    @contextlib.asynccontextmanager
    async def judge(local: LocalCluster) -> AsyncIterator[None]:
        feed = watch_local_cluster(local)
        try:
            yield
        finally:
            judged.append(await finish_local_cluster(feed, local))

    out = io.StringIO()
    code = await run_demo(Scenario(), out, judge=judge)
    text = out.getvalue()
    assert code == 0, text
    [checker] = judged
    checker.assert_clean()
    assert checker.judged > 0, text
    partial = re.search(r"partial slices ever requested\s+(\d+)", text)
    assert partial is not None and partial.group(1) == "0", text
    deleted = re.search(r"TPU pods deleted\s+(\d+)", text)
    assert deleted is not None and int(deleted.group(1)) % 4 == 0 and int(deleted.group(1)) > 0
    assert "WORK_DONE" in text
    assert "scenario completed" in text
    _assert_story(text)


GROUPS = [g["groupName"] for g in demo_raycluster(Scenario())["spec"]["workerGroupSpecs"]]


def _assert_story(text: str) -> None:
    """Issue 12 item 9 / issue 19: the story as printed, in the order it happened."""
    lines = text.splitlines()
    kinds = [line[11:27].strip() if line.startswith("[") else "" for line in lines]
    stamps = [float(line[1:8]) for line in lines if line.startswith("[")]
    assert stamps == sorted(stamps), "moments printed out of order"
    # Which slice each pod belongs to (a single-host group's slice is the pod itself).
    slice_of: dict[str, tuple[str, str]] = {}
    for line in lines:
        created = re.search(r"pod (\S+) created \((\S+)(?: slice (\S+) host \d+)?\)", line)
        if created:
            pod, group, key = created.groups()
            slice_of[pod] = (group, key or pod)
    members: dict[tuple[str, str], set[str]] = {}
    for pod, key in slice_of.items():
        members.setdefault(key, set()).add(pod)
    deletes = [
        (i, d) for i, line in enumerate(lines) if kinds[i] == "patch" for d in _deletions(line)
    ]
    assert {group for _, (group, _) in deletes} == set(GROUPS), text
    for index, (group, named) in deletes:
        slices = {slice_of[pod] for pod in named}
        assert {g for g, _ in slices} == {group}, f"pods of another group named\n{text}"
        for key in slices:
            assert members[key] <= set(named), f"partial slice {key} in line {index}\n{text}"
            drained = [
                i
                for i, line in enumerate(lines[:index])
                if kinds[i] == "drain" and f"slice_drained: {key[0]}/{key[1]}:" in line
            ]
            assert drained, f"slice {key} deleted without its drain before line {index}\n{text}"
            planned = [
                i
                for i, line in enumerate(lines[: drained[0]])
                if kinds[i] == "plan"
                and f"remove slice {key[1]}" in line
                and "remove slice(s), replicas" in line
            ]
            assert planned, f"slice {key} drained before a plan to remove it\n{text}"


def _deletions(line: str) -> list[tuple[str, list[str]]]:
    """(group, pods) for every op of a printed PATCH that names pods to delete (not clearing)."""
    body = line.split(": ", 1)[1].rsplit(PATCH_CONDITION, 1)[0]
    out = []
    for op in json.loads(body):
        path, value = op.get("path", ""), op.get("value")
        match = re.match(r"/spec/workerGroupSpecs/(\d+)/scaleStrategy(/workersToDelete)?$", path)
        if not match or op.get("op") not in ("add", "replace"):
            continue
        names = value if match.group(2) else (value or {}).get("workersToDelete", [])
        if names:
            out.append((GROUPS[int(match.group(1))], list(names)))
    return out
