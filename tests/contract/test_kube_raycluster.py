"""RayCluster view and access detection: catalogue rows 1, 3 and 9 plus the two RBAC set-ups
(KubeRay's restricted Role -> poll mode, our sidecar Role -> watch mode)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient
from structlog.testing import capture_logs

from kuberay_scaler.adapters.kube.access import detect_access
from kuberay_scaler.adapters.kube.raycluster import Mode, RayClusterView
from kuberay_scaler.adapters.kube.writer import RayClusterWriter
from kuberay_scaler.core.backoff import Backoff
from kuberay_scaler.core.patch.ops import Replace
from kuberay_standins.apiserver import (
    ADMIN_TOKEN,
    RESTRICTED_TOKEN,
    SIDECAR_TOKEN,
    ApiServerStandIn,
)
from tests.contract.conftest import (
    CLUSTER,
    NAMESPACE,
    Connect,
    eventually,
    raycluster,
    running,
)

pytestmark = pytest.mark.contract

REPLICAS_PATH = "/spec/workerGroupSpecs/0/replicas"


def make_view(
    api: ApiClient, mode: Mode, *, refresh_interval: float = 60.0, min_get_gap: float = 1.0
) -> RayClusterView:
    return RayClusterView(
        api,
        namespace=NAMESPACE,
        name=CLUSTER,
        mode=mode,
        refresh_interval=refresh_interval,
        min_get_gap=min_get_gap,
        debounce=0.01,
        silent_timeout=5.0,
        backoff=Backoff(initial=0.02, cap=0.2),
    )


def rc_requests(server: ApiServerStandIn) -> list[tuple[str, str, dict[str, str]]]:
    return [(r.method, r.path, r.query) for r in server.requests if "/rayclusters" in r.path]


def shows(view: RayClusterView, server: ApiServerStandIn) -> bool:
    stored = server.get("rayclusters", NAMESPACE, CLUSTER)
    seen = view.current()
    if stored is None or seen is None:
        return stored is None and seen is None and view.synced
    return (
        view.synced and seen["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]
    )


def set_replicas(server: ApiServerStandIn, replicas: int) -> dict[str, Any]:
    return server.json_patch(
        "rayclusters",
        NAMESPACE,
        CLUSTER,
        [{"op": "replace", "path": REPLICAS_PATH, "value": replicas}],
    )


async def test_restricted_token_polls_with_get_and_says_so_once(
    apiserver: ApiServerStandIn, connect: Connect
) -> None:
    apiserver.create("rayclusters", NAMESPACE, raycluster())
    api = await connect(RESTRICTED_TOKEN)
    with capture_logs() as logs:
        access = await detect_access(api, NAMESPACE)
    assert not access.watch_rayclusters
    assert not access.create_events
    assert access.missing == ()
    said = [entry for entry in logs if entry["event"] == "kubernetes access"]
    assert len(said) == 1
    assert "GET" in said[0]["mode"]
    assert "Events off" in said[0]["mode"]

    view = make_view(api, "poll")
    async with running(view.run()):
        await eventually(lambda: shows(view, apiserver), "first GET")
        set_replicas(apiserver, 3)
        for _ in range(20):  # a burst of pod events
            view.nudge()
        await eventually(lambda: shows(view, apiserver), "GET after the nudges")
    assert view.current() is not None
    assert view.current()["spec"]["workerGroupSpecs"][0]["replicas"] == 3  # type: ignore[index]
    verbs = {(method, "watch" in query) for method, _, query in rc_requests(apiserver)}
    assert verbs == {("GET", False)}  # never list or watch rayclusters under this Role
    gets = [path for _, path, _ in rc_requests(apiserver)]
    assert all(path.endswith(f"/rayclusters/{CLUSTER}") for path in gets)
    assert len(gets) <= 3  # one at start, one for the whole burst (plus at most one straggler)


async def test_poll_mode_refreshes_periodically_without_pod_events(
    apiserver: ApiServerStandIn, connect: Connect
) -> None:
    apiserver.create("rayclusters", NAMESPACE, raycluster())
    view = make_view(await connect(RESTRICTED_TOKEN), "poll", refresh_interval=0.1)
    async with running(view.run()):
        await eventually(lambda: shows(view, apiserver), "first GET")
        set_replicas(apiserver, 2)
        await eventually(lambda: shows(view, apiserver), "periodic refresh")


async def test_poll_mode_pod_churn_never_gets_closer_than_the_gap(
    apiserver: ApiServerStandIn, connect: Connect
) -> None:
    """Pod events bring GETs sooner, but a storm of them cannot raise the GET rate
    above one per `min_get_gap` (an edit is still seen: the GETs keep coming)."""
    apiserver.create("rayclusters", NAMESPACE, raycluster())
    gap = 0.2
    view = make_view(
        await connect(RESTRICTED_TOKEN), "poll", refresh_interval=60.0, min_get_gap=gap
    )
    async with running(view.run()):
        await eventually(lambda: shows(view, apiserver), "first GET")
        before = len(rc_requests(apiserver))
        started = asyncio.get_running_loop().time()
        set_replicas(apiserver, 7)
        while not shows(view, apiserver) or len(rc_requests(apiserver)) < before + 5:
            view.nudge()  # a pod event every 5 ms
            await asyncio.sleep(0.005)
        elapsed = asyncio.get_running_loop().time() - started
        gets = len(rc_requests(apiserver)) - before
    # Slower machines make fewer GETs, never more: the bound holds under any load.
    assert gets <= elapsed / gap + 1, (gets, elapsed)


async def test_sidecar_token_watches_the_one_raycluster(
    apiserver: ApiServerStandIn, connect: Connect
) -> None:
    apiserver.create("rayclusters", NAMESPACE, raycluster())
    apiserver.create("rayclusters", NAMESPACE, raycluster("another"))
    api = await connect(SIDECAR_TOKEN)
    access = await detect_access(api, NAMESPACE)
    assert access.watch_rayclusters
    assert access.create_events
    assert "watch" in access.description
    view = make_view(api, "watch")
    async with running(view.run()):
        await eventually(lambda: shows(view, apiserver), "listed")
        set_replicas(apiserver, 4)  # no nudge: the watch must bring it
        await eventually(lambda: shows(view, apiserver), "watched change")
    watches = [q for _, _, q in rc_requests(apiserver) if "watch" in q]
    assert watches
    assert watches[0]["fieldSelector"] == f"metadata.name={CLUSTER}"


async def test_missing_required_permissions_are_named(
    apiserver: ApiServerStandIn, connect: Connect
) -> None:
    apiserver.add_token("read-only", [(["get", "list", "watch"], ["pods", "rayclusters"])])
    access = await detect_access(await connect("read-only"), NAMESPACE)
    assert access.watch_rayclusters
    assert access.missing == ("patch rayclusters.ray.io",)
    assert "MISSING: patch rayclusters.ray.io" in access.description


async def test_access_review_retries_while_server_is_down(
    apiserver: ApiServerStandIn, connect: Connect
) -> None:
    api = await connect(SIDECAR_TOKEN)
    apiserver.faults.fail_next("POST", "selfsubjectaccessreviews", 503, count=2)
    access = await detect_access(api, NAMESPACE, backoff=Backoff(initial=0.01, cap=0.05))
    assert access.watch_rayclusters  # the outage did not degrade the decision


@pytest.mark.parametrize("mode", ["poll", "watch"])
async def test_deleted_then_recreated_stops_writes_and_signals_uid_change(
    apiserver: ApiServerStandIn, connect: Connect, mode: Mode
) -> None:
    apiserver.create("rayclusters", NAMESPACE, raycluster())
    api = await connect(ADMIN_TOKEN)
    view = make_view(api, mode)
    writer = RayClusterWriter(api, namespace=NAMESPACE, name=CLUSTER)
    async with running(view.run()):
        await eventually(lambda: shows(view, apiserver), "first sight")
        old_uid = view.uid
        assert old_uid is not None

        apiserver.delete("rayclusters", NAMESPACE, CLUSTER)
        view.nudge()  # poll mode learns from pod events (the operator deletes the pods)
        await eventually(lambda: view.current() is None, "deletion seen")
        assert not view.uid_changed.is_set()
        outcome = await writer.apply([Replace(REPLICAS_PATH, 2)], expected_uid=old_uid)
        assert outcome.kind == "gone"

        apiserver.create("rayclusters", NAMESPACE, raycluster(replicas=1))
        view.nudge()
        await eventually(lambda: view.uid_changed.is_set(), "new UID signalled")
        assert view.uid != old_uid
        outcome = await writer.apply([Replace(REPLICAS_PATH, 2)], expected_uid=old_uid)
        assert outcome.kind == "stale"  # never patch the namesake with the old plan
        await eventually(lambda: shows(view, apiserver), "view equals the recreated object")
    stored = apiserver.get("rayclusters", NAMESPACE, CLUSTER)
    assert stored is not None
    assert stored["spec"]["workerGroupSpecs"][0]["replicas"] == 1


async def test_poll_mode_unsynced_while_server_down_then_recovers(
    apiserver: ApiServerStandIn, connect: Connect
) -> None:
    apiserver.create("rayclusters", NAMESPACE, raycluster())
    view = make_view(await connect(RESTRICTED_TOKEN), "poll", refresh_interval=0.05)
    async with running(view.run()):
        await eventually(lambda: shows(view, apiserver), "first GET")
        apiserver.faults.refuse_connections(True)
        await eventually(lambda: not view.synced, "GET failures unsync the view")
        set_replicas(apiserver, 5)
        apiserver.faults.refuse_connections(False)
        await eventually(lambda: shows(view, apiserver), "back in sync with the truth")


async def test_refresh_and_observe_bring_a_fresher_copy(
    apiserver: ApiServerStandIn, connect: Connect
) -> None:
    apiserver.create("rayclusters", NAMESPACE, raycluster())
    view = make_view(await connect(RESTRICTED_TOKEN), "poll")
    refreshed = await view.refresh()
    assert refreshed is not None
    newer = set_replicas(apiserver, 6)
    view.observe(newer)
    assert view.current() == newer
    view.observe(refreshed)  # an older copy arriving late never wins
    assert view.current() == newer


async def test_poll_mode_after_25_s_of_refused_connections_is_synced_within_2_s_of_the_server(
    apiserver: ApiServerStandIn, connect: Connect
) -> None:
    """Issue 30: /readyz came back 20.1 s after the API server (drop-in mode polls the RayCluster
    by GET, and its error backoff had grown to 16-30 s while the server refused connections).
    The view's sleeps are virtual (the largest jitter every time): the server comes back from
    inside them, and each change of `synced` is recorded with its virtual time."""
    apiserver.create("rayclusters", NAMESPACE, raycluster())
    api = await connect(RESTRICTED_TOKEN)
    now = [1000.0]
    seen: list[tuple[float, bool]] = []
    back_at = now[0] + 25.0

    async def sleep(delay: float) -> None:
        now[0] += delay
        if apiserver.faults.refusing and now[0] >= back_at:
            apiserver.faults.refuse_connections(False)
        await asyncio.sleep(0)

    view = RayClusterView(
        api,
        namespace=NAMESPACE,
        name=CLUSTER,
        mode="poll",
        refresh_interval=0.05,
        min_get_gap=0.05,
        backoff=Backoff(uniform=lambda _, most: most),
        on_change=lambda: seen.append((now[0], view.synced)),
        sleep=sleep,
    )
    async with running(view.run()):
        await eventually(lambda: view.synced, "synced")
        seen.clear()
        apiserver.faults.refuse_connections(True)
        await eventually(lambda: any(synced for _, synced in seen), "synced again", limit=60)
    assert seen[0][1] is False, seen[:3]  # the outage is noticed
    synced_again_at = next(at for at, synced in seen if synced)
    assert back_at <= synced_again_at <= back_at + 2.0, (synced_again_at - back_at, seen)
