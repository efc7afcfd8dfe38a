"""Contract tests of the API-server stand-in, over real HTTP on loopback."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kuberay_standins.apiserver import (
    ADMIN_TOKEN,
    RESTRICTED_TOKEN,
    SIDECAR_TOKEN,
    ApiServerStandIn,
    Conflict,
)

pytestmark = pytest.mark.contract

NS = "default"
PODS = f"/api/v1/namespaces/{NS}/pods"
RAYCLUSTERS = f"/apis/ray.io/v1/namespaces/{NS}/rayclusters"
EVENTS = f"/api/v1/namespaces/{NS}/events"
JSON_PATCH = {"Content-Type": "application/json-patch+json"}
MERGE_PATCH = {"Content-Type": "application/merge-patch+json"}


def pod(name: str, labels: dict[str, str] | None = None, node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "ray-worker", "image": "ray"}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def raycluster(name: str = "rc", replicas: int = 1) -> dict[str, Any]:
    template = {"spec": {"containers": [{"name": "ray", "image": "ray"}]}}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name},
        "spec": {
            "headGroupSpec": {"rayStartParams": {}, "template": template},
            "workerGroupSpecs": [
                {
                    "groupName": "g",
                    "replicas": replicas,
                    "minReplicas": 0,
                    "maxReplicas": 4,
                    "numOfHosts": 2,
                    "template": template,
                }
            ],
        },
    }


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def api() -> AsyncIterator[ApiServerStandIn]:
    server = ApiServerStandIn(history_limit=50, bookmark_interval=0.05)
    await server.start()
    yield server
    await server.stop()


async def _session(api: ApiServerStandIn, token: str) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(base_url=api.url, headers=bearer(token))


@pytest.fixture
async def admin(api: ApiServerStandIn) -> AsyncIterator[aiohttp.ClientSession]:
    async with await _session(api, ADMIN_TOKEN) as session:
        yield session


@pytest.fixture
async def restricted(api: ApiServerStandIn) -> AsyncIterator[aiohttp.ClientSession]:
    async with await _session(api, RESTRICTED_TOKEN) as session:
        yield session


async def read_events(response: aiohttp.ClientResponse, count: int | None = None) -> list[Any]:
    """Read watch events until ``count`` arrived or the stream ends (guarded by a timeout)."""
    events: list[Any] = []
    async with asyncio.timeout(10):
        while count is None or len(events) < count:
            line = await response.content.readline()
            if not line:
                break
            events.append(json.loads(line))
    return events


def rv_of(obj: dict[str, Any]) -> int:
    return int(obj["metadata"]["resourceVersion"])


# -- resourceVersion, list and watch --------------------------------------------------------------


async def test_resource_version_is_one_counter_across_kinds(
    api: ApiServerStandIn, admin: aiohttp.ClientSession
) -> None:
    created = []
    for path, body in (
        (PODS, pod("a")),
        (RAYCLUSTERS, raycluster()),
        (EVENTS, {"metadata": {"name": "e1"}, "reason": "Test"}),
        (PODS, pod("b")),
    ):
        response = await admin.post(path, json=body)
        assert response.status == 201
        created.append(rv_of(await response.json()))
    assert created == sorted(created) and len(set(created)) == 4
    listing = await (await admin.get(PODS)).json()
    assert int(listing["metadata"]["resourceVersion"]) == api.resource_version == created[-1]
    assert [item["metadata"]["name"] for item in listing["items"]] == ["a", "b"]
    assert listing["kind"] == "PodList"


async def test_created_objects_get_server_metadata(admin: aiohttp.ClientSession) -> None:
    response = await admin.post(PODS, json={"metadata": {"generateName": "w-"}, "spec": {}})
    meta = (await response.json())["metadata"]
    assert meta["name"].startswith("w-") and len(meta["name"]) == len("w-") + 5
    assert meta["uid"] and meta["creationTimestamp"] and meta["namespace"] == NS
    assert meta["generation"] == 1
    duplicate = await admin.post(PODS, json={"metadata": {"name": meta["name"]}})
    assert duplicate.status == 409
    assert (await duplicate.json())["reason"] == "AlreadyExists"


async def test_list_then_watch_resumes_without_loss(
    api: ApiServerStandIn, admin: aiohttp.ClientSession
) -> None:
    api.create("pods", NS, pod("p0"))
    listing = await (await admin.get(PODS)).json()
    list_rv = listing["metadata"]["resourceVersion"]
    api.create("pods", NS, pod("p1"))
    api.json_patch("pods", NS, "p0", [{"op": "add", "path": "/metadata/labels/x", "value": "1"}])
    api.delete("pods", NS, "p1")
    params = {"watch": "true", "resourceVersion": list_rv}
    async with admin.get(PODS, params=params) as response:
        first = await read_events(response, 3)
        api.create("pods", NS, pod("p2"))  # a live event after the backlog
        live = await read_events(response, 1)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in first + live] == [
        ("ADDED", "p1"),
        ("MODIFIED", "p0"),
        ("DELETED", "p1"),
        ("ADDED", "p2"),
    ]
    revisions = [rv_of(e["object"]) for e in first + live]
    assert revisions == sorted(revisions)
    # resuming from the middle delivers exactly what came after
    params = {"watch": "true", "resourceVersion": str(revisions[1]), "timeoutSeconds": "1"}
    async with admin.get(PODS, params=params) as response:
        resumed = await read_events(response, 2)
    assert [rv_of(e["object"]) for e in resumed] == revisions[2:]


async def test_watch_without_resource_version_starts_with_synthetic_added(
    api: ApiServerStandIn, admin: aiohttp.ClientSession
) -> None:
    api.create("pods", NS, pod("a"))
    api.create("pods", NS, pod("b"))
    for rv in (None, "0"):
        params = {"watch": "1", "timeoutSeconds": "1"} | ({"resourceVersion": rv} if rv else {})
        async with admin.get(PODS, params=params) as response:
            events = await read_events(response, 2)
        assert {(e["type"], e["object"]["metadata"]["name"]) for e in events} == {
            ("ADDED", "a"),
            ("ADDED", "b"),
        }


async def test_bookmarks_carry_the_current_resource_version(
    api: ApiServerStandIn, admin: aiohttp.ClientSession
) -> None:
    api.create("rayclusters", NS, raycluster())
    api.create("pods", NS, pod("later"))  # another kind moves the global revision
    params = {
        "watch": "true",
        "resourceVersion": str(api.resource_version),
        "allowWatchBookmarks": "true",
    }
    async with admin.get(RAYCLUSTERS, params=params) as response:
        (bookmark,) = await read_events(response, 1)
    assert bookmark["type"] == "BOOKMARK"
    assert bookmark["object"]["kind"] == "RayCluster"
    assert rv_of(bookmark["object"]) == api.resource_version


async def test_watch_timeout_seconds_ends_the_stream_cleanly(
    admin: aiohttp.ClientSession,
) -> None:
    async with admin.get(PODS, params={"watch": "true", "timeoutSeconds": "1"}) as response:
        assert response.status == 200
        events = await read_events(response)  # returns at end of stream
    assert events == []


async def test_watch_from_compacted_revision_gets_410_event(
    api: ApiServerStandIn, admin: aiohttp.ClientSession
) -> None:
    old_rv = api.create("pods", NS, pod("a"))["metadata"]["resourceVersion"]
    api.create("pods", NS, pod("b"))
    api.compact()
    async with admin.get(PODS, params={"watch": "true", "resourceVersion": old_rv}) as response:
        assert response.status == 200
        events = await read_events(response)
    assert len(events) == 1 and events[0]["type"] == "ERROR"
    assert events[0]["object"]["code"] == 410
    assert events[0]["object"]["reason"] == "Expired"


async def test_history_limit_expires_old_revisions(admin: aiohttp.ClientSession) -> None:
    server = ApiServerStandIn(history_limit=3)
    await server.start()
    try:
        first_rv = server.create("pods", NS, pod("p0"))["metadata"]["resourceVersion"]
        for i in range(1, 6):
            server.create("pods", NS, pod(f"p{i}"))
        async with aiohttp.ClientSession(base_url=server.url, headers=bearer(ADMIN_TOKEN)) as s:
            params = {"watch": "true", "resourceVersion": first_rv}
            async with s.get(PODS, params=params) as response:
                (event,) = await read_events(response)
    finally:
        await server.stop()
    assert event["type"] == "ERROR" and event["object"]["code"] == 410


async def test_exact_list_at_old_revision_and_its_410(
    api: ApiServerStandIn, admin: aiohttp.ClientSession
) -> None:
    old_rv = api.create("pods", NS, pod("a"))["metadata"]["resourceVersion"]
    api.create("pods", NS, pod("b"))
    params = {"resourceVersion": old_rv, "resourceVersionMatch": "Exact"}
    snapshot = await (await admin.get(PODS, params=params)).json()
    assert [i["metadata"]["name"] for i in snapshot["items"]] == ["a"]
    assert snapshot["metadata"]["resourceVersion"] == old_rv
    api.compact()
    gone = await admin.get(PODS, params=params)
    assert gone.status == 410
    body = await gone.json()
    assert body["kind"] == "Status" and body["reason"] == "Expired" and body["code"] == 410
    not_older = await admin.get(
        PODS, params={"resourceVersion": old_rv, "resourceVersionMatch": "NotOlderThan"}
    )
    assert not_older.status == 200


async def test_paged_list_is_a_consistent_snapshot(
    api: ApiServerStandIn, admin: aiohttp.ClientSession
) -> None:
    for i in range(5):
        api.create("pods", NS, pod(f"p{i}"))
    first = await (await admin.get(PODS, params={"limit": "2"})).json()
    assert first["metadata"]["remainingItemCount"] == 3
    api.create("pods", NS, pod("p9"))  # after the snapshot: not part of this list
    api.delete("pods", NS, "p4")
    names = [i["metadata"]["name"] for i in first["items"]]
    token = first["metadata"]["continue"]
    while token:
        page = await (await admin.get(PODS, params={"limit": "2", "continue": token})).json()
        names += [i["metadata"]["name"] for i in page["items"]]
        token = page["metadata"].get("continue")
    assert names == ["p0", "p1", "p2", "p3", "p4"]


# -- selectors ------------------------------------------------------------------------------------


async def test_label_and_field_selectors(
    api: ApiServerStandIn, admin: aiohttp.ClientSession
) -> None:
    api.create("pods", NS, pod("h", {"ray.io/node-type": "head", "ray.io/cluster": "rc"}))
    api.create("pods", NS, pod("w1", {"ray.io/node-type": "worker", "ray.io/cluster": "rc"}))
    api.create("pods", NS, pod("w2", {"ray.io/node-type": "worker", "ray.io/cluster": "other"}))
    api.create("pods", NS, pod("bare"))

    async def names(**params: str) -> list[str]:
        body = await (await admin.get(PODS, params=params)).json()
        return [i["metadata"]["name"] for i in body["items"]]

    assert await names(labelSelector="ray.io/cluster=rc") == ["h", "w1"]
    assert await names(labelSelector="ray.io/cluster==rc,ray.io/node-type!=head") == ["w1"]
    assert await names(labelSelector="ray.io/cluster in (rc, other)") == ["h", "w1", "w2"]
    assert await names(labelSelector="ray.io/cluster notin (rc)") == ["bare", "w2"]
    assert await names(labelSelector="ray.io/cluster") == ["h", "w1", "w2"]
    assert await names(labelSelector="!ray.io/cluster") == ["bare"]
    assert await names(fieldSelector="metadata.name=w2") == ["w2"]
    bad = await admin.get(PODS, params={"labelSelector": "a in (b"})
    assert bad.status == 400


async def test_selector_watch_sees_objects_leave_and_get_deleted(
    api: ApiServerStandIn, admin: aiohttp.ClientSession
) -> None:
    api.create("pods", NS, pod("stay", {"ray.io/cluster": "rc"}))
    api.create("pods", NS, pod("leave", {"ray.io/cluster": "rc"}))
    api.create("pods", NS, pod("foreign", {"ray.io/cluster": "x"}))
    params = {
        "watch": "true",
        "resourceVersion": str(api.resource_version),
        "labelSelector": "ray.io/cluster=rc",
    }
    async with admin.get(PODS, params=params) as response:
        api.delete("pods", NS, "foreign")  # never matched: invisible
        api.delete("pods", NS, "stay")
        api.json_patch(
            "pods",
            NS,
            "leave",
            [{"op": "replace", "path": "/metadata/labels/ray.io~1cluster", "value": "x"}],
        )
        api.json_patch(
            "pods",
            NS,
            "leave",
            [{"op": "replace", "path": "/metadata/labels/ray.io~1cluster", "value": "rc"}],
        )
        events = await read_events(response, 3)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("DELETED", "stay"),
        ("DELETED", "leave"),
        ("ADDED", "leave"),
    ]


# -- writes: conflicts, patches, validation, status -----------------------------------------------


async def test_stale_put_conflicts_and_fresh_put_succeeds(
    api: ApiServerStandIn, admin: aiohttp.ClientSession
) -> None:
    current = api.create("rayclusters", NS, raycluster())
    api.json_patch(
        "rayclusters",
        NS,
        "rc",
        [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 2}],
    )
    stale = await admin.put(f"{RAYCLUSTERS}/rc", json=current)
    assert stale.status == 409
    body = await stale.json()
    assert body["reason"] == "Conflict" and "the object has been modified" in body["message"]
    fresh = api.get("rayclusters", NS, "rc")
    assert fresh is not None
    fresh["spec"]["workerGroupSpecs"][0]["replicas"] = 3
    ok = await admin.put(f"{RAYCLUSTERS}/rc", json=fresh)
    assert ok.status == 200
    assert (await ok.json())["spec"]["workerGroupSpecs"][0]["replicas"] == 3
    del fresh["metadata"]["resourceVersion"]
    unconditional = await admin.put(f"{RAYCLUSTERS}/rc", json=fresh)
    assert unconditional.status == 422  # custom resources need a resourceVersion on update
    with pytest.raises(Conflict):
        api.replace("rayclusters", NS, current)


async def test_json_patch_test_failure_is_a_generic_422(
    api: ApiServerStandIn, admin: aiohttp.ClientSession
) -> None:
    api.create("rayclusters", NS, raycluster())
    ops = [
        {"op": "test", "path": "/spec/workerGroupSpecs/0/groupName", "value": "other"},
        {"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 2},
    ]
    failed = await admin.patch(f"{RAYCLUSTERS}/rc", data=json.dumps(ops), headers=JSON_PATCH)
    assert failed.status == 422
    body = await failed.json()
    assert body["kind"] == "Status" and body["reason"] == "Invalid"
    assert body["message"] == "the server rejected our request due to an error in our request"
    assert not body["details"].get("causes")  # unlike a validation 422
    stored = api.get("rayclusters", NS, "rc")
    assert stored is not None and stored["spec"]["workerGroupSpecs"][0]["replicas"] == 1
    missing = [{"op": "replace", "path": "/spec/workerGroupSpecs/0/scaleStrategy", "value": {}}]
    response = await admin.patch(f"{RAYCLUSTERS}/rc", data=json.dumps(missing), headers=JSON_PATCH)
    assert response.status == 422


async def test_guarded_json_patch_applies_and_bumps_generation(
    api: ApiServerStandIn, admin: aiohttp.ClientSession
) -> None:
    api.create("rayclusters", NS, raycluster())
    ops = [
        {"op": "test", "path": "/spec/workerGroupSpecs/0/groupName", "value": "g"},
        {"op": "test", "path": "/spec/workerGroupSpecs/0/replicas", "value": 1},
        {"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 2},
        {
            "op": "add",
            "path": "/spec/workerGroupSpecs/0/scaleStrategy",
            "value": {"workersToDelete": ["p1"]},
        },
    ]
    response = await admin.patch(f"{RAYCLUSTERS}/rc", data=json.dumps(ops), headers=JSON_PATCH)
    assert response.status == 200
    patched = await response.json()
    group = patched["spec"]["workerGroupSpecs"][0]
    assert group["replicas"] == 2 and group["scaleStrategy"] == {"workersToDelete": ["p1"]}
    assert patched["metadata"]["generation"] == 2


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("/spec/workerGroupSpecs/0/replicas", "2", "spec.workerGroupSpecs[0].replicas"),
        (
            "/spec/workerGroupSpecs/0/scaleStrategy",
            {"workersToDelete": "p"},
            "spec.workerGroupSpecs[0].scaleStrategy.workersToDelete",
        ),
        (
            "/spec/workerGroupSpecs/0/scaleStrategy",
            {"workersToDelete": [3]},
            "spec.workerGroupSpecs[0].scaleStrategy.workersToDelete[0]",
        ),
    ],
)
async def test_validation_rejects_bad_values_with_field_causes(
    api: ApiServerStandIn, admin: aiohttp.ClientSession, path: str, value: Any, field: str
) -> None:
    api.create("rayclusters", NS, raycluster())
    ops = [{"op": "add", "path": path, "value": value}]
    response = await admin.patch(f"{RAYCLUSTERS}/rc", data=json.dumps(ops), headers=JSON_PATCH)
    assert response.status == 422
    body = await response.json()
    assert body["reason"] == "Invalid"
    assert body["message"].startswith('RayCluster.ray.io "rc" is invalid')
    assert [cause["field"] for cause in body["details"]["causes"]] == [field]


async def test_crd_defaults_fill_missing_group_fields(admin: aiohttp.ClientSession) -> None:
    cluster = raycluster()
    for key in ("replicas", "numOfHosts", "maxReplicas"):
        del cluster["spec"]["workerGroupSpecs"][0][key]
    created = await (await admin.post(RAYCLUSTERS, json=cluster)).json()
    group = created["spec"]["workerGroupSpecs"][0]
    assert (group["replicas"], group["numOfHosts"], group["maxReplicas"]) == (0, 1, 2**31 - 1)


async def test_status_is_a_subresource(api: ApiServerStandIn, admin: aiohttp.ClientSession) -> None:
    created = await (
        await admin.post(
            RAYCLUSTERS, json=raycluster() | {"status": {"state": "ignored-on-create"}}
        )
    ).json()
    assert "status" not in created
    status_put = await admin.put(
        f"{RAYCLUSTERS}/rc/status",
        json=created | {"status": {"desiredWorkerReplicas": 2}, "spec": {"ignored": True}},
    )
    assert status_put.status == 200
    ops = [
        {"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 0},
        {"op": "add", "path": "/status", "value": {"desiredWorkerReplicas": 99}},
    ]
    response = await admin.patch(f"{RAYCLUSTERS}/rc", data=json.dumps(ops), headers=JSON_PATCH)
    assert response.status == 200
    stored = api.get("rayclusters", NS, "rc")
    assert stored is not None
    assert stored["status"] == {"desiredWorkerReplicas": 2}
    assert stored["spec"]["workerGroupSpecs"][0]["replicas"] == 0
    assert stored["metadata"]["generation"] == 2  # status writes do not bump it


async def test_merge_patch_and_no_op_write_keeps_revision(
    api: ApiServerStandIn, admin: aiohttp.ClientSession
) -> None:
    api.create("pods", NS, pod("p", {"a": "1", "b": "2"}))
    patch = {"metadata": {"labels": {"a": None, "c": "3"}}}
    response = await admin.patch(f"{PODS}/p", data=json.dumps(patch), headers=MERGE_PATCH)
    patched = await response.json()
    assert patched["metadata"]["labels"] == {"b": "2", "c": "3"}
    again = await (
        await admin.patch(f"{PODS}/p", data=json.dumps(patch), headers=MERGE_PATCH)
    ).json()
    assert rv_of(again) == rv_of(patched) == api.resource_version
    stale = {"metadata": {"resourceVersion": "1", "labels": {"d": "4"}}}
    conflict = await admin.patch(f"{PODS}/p", data=json.dumps(stale), headers=MERGE_PATCH)
    assert conflict.status == 409


async def test_pod_deletion_is_graceful_only_when_scheduled(
    api: ApiServerStandIn, admin: aiohttp.ClientSession
) -> None:
    api.create("pods", NS, pod("pending"))
    api.create("pods", NS, pod("running", node="node-1"))
    assert (await admin.delete(f"{PODS}/pending")).status == 200
    assert api.get("pods", NS, "pending") is None
    response = await admin.delete(f"{PODS}/running")
    body = await response.json()
    assert body["metadata"]["deletionTimestamp"]
    assert body["metadata"]["deletionGracePeriodSeconds"] == 30
    assert api.get("pods", NS, "running") is not None
    forced = await admin.delete(f"{PODS}/running", json={"gracePeriodSeconds": 0})
    assert forced.status == 200 and api.get("pods", NS, "running") is None
    missing = await admin.delete(f"{PODS}/running")
    assert missing.status == 404 and (await missing.json())["reason"] == "NotFound"


async def test_raycluster_delete_answers_success_status(
    api: ApiServerStandIn, admin: aiohttp.ClientSession
) -> None:
    uid = api.create("rayclusters", NS, raycluster())["metadata"]["uid"]
    wrong = await admin.delete(f"{RAYCLUSTERS}/rc", json={"preconditions": {"uid": "nope"}})
    assert wrong.status == 409
    body = await (await admin.delete(f"{RAYCLUSTERS}/rc")).json()
    assert body["status"] == "Success" and body["details"]["uid"] == uid


# -- auth -----------------------------------------------------------------------------------------


async def test_unknown_token_is_401(api: ApiServerStandIn) -> None:
    async with await _session(api, "nope") as session:
        response = await session.get(PODS)
        assert response.status == 401
        assert (await response.json())["reason"] == "Unauthorized"
    async with aiohttp.ClientSession(base_url=api.url) as anonymous:
        assert (await anonymous.get(PODS)).status == 401


async def test_restricted_token_has_exactly_the_kuberay_autoscaler_role(
    api: ApiServerStandIn, restricted: aiohttp.ClientSession
) -> None:
    api.create("rayclusters", NS, raycluster())
    denied = await restricted.get(RAYCLUSTERS, params={"watch": "true"})
    assert denied.status == 403
    body = await denied.json()
    assert body["reason"] == "Forbidden"
    assert 'cannot watch resource "rayclusters" in API group "ray.io"' in body["message"]
    assert "system:serviceaccount:default:raycluster-autoscaler" in body["message"]
    assert (await restricted.get(RAYCLUSTERS)).status == 403  # no list either
    event = await restricted.post(EVENTS, json={"metadata": {"name": "e"}})
    assert event.status == 403 and "cannot create resource" in (await event.json())["message"]
    assert (await restricted.get(f"{RAYCLUSTERS}/rc")).status == 200
    ops = [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 2}]
    patched = await restricted.patch(f"{RAYCLUSTERS}/rc", data=json.dumps(ops), headers=JSON_PATCH)
    assert patched.status == 200
    async with restricted.get(PODS, params={"watch": "true", "timeoutSeconds": "1"}) as watch:
        assert watch.status == 200
    assert (await restricted.delete(f"{PODS}/x")).status == 403


async def test_sidecar_token_may_watch_rayclusters_and_create_events(api: ApiServerStandIn) -> None:
    async with await _session(api, SIDECAR_TOKEN) as sidecar:
        created = await sidecar.post(
            f"/apis/events.k8s.io/v1/namespaces/{NS}/events",
            json={"metadata": {"name": "e"}, "reason": "Scaled", "note": "hi"},
        )
        assert created.status == 201
        params = {"watch": "true", "timeoutSeconds": "1"}
        async with sidecar.get(RAYCLUSTERS, params=params) as watch:
            assert watch.status == 200
        assert (await sidecar.delete(f"{RAYCLUSTERS}/rc")).status == 403
    stored = api.list("events", NS)
    assert [(e["metadata"]["name"], e["apiVersion"]) for e in stored] == [("e", "events.k8s.io/v1")]


async def test_self_subject_access_review_answers_from_the_token_rules(
    restricted: aiohttp.ClientSession,
) -> None:
    async def allowed(verb: str, resource: str, group: str = "", sub: str = "") -> bool:
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {
                "resourceAttributes": {
                    "namespace": NS,
                    "verb": verb,
                    "group": group,
                    "resource": resource,
                    "subresource": sub,
                }
            },
        }
        response = await restricted.post(
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", json=review
        )
        assert response.status == 201
        return bool((await response.json())["status"]["allowed"])

    assert await allowed("watch", "pods")
    assert await allowed("patch", "rayclusters", "ray.io")
    assert await allowed("patch", "pods", sub="resize")
    assert not await allowed("watch", "rayclusters", "ray.io")
    assert not await allowed("create", "events")


# -- faults ---------------------------------------------------------------------------------------


async def test_fail_next_injects_errors_then_recovers(
    api: ApiServerStandIn, admin: aiohttp.ClientSession
) -> None:
    api.faults.fail_next("GET", r"/pods$", 500, count=2)
    api.faults.fail_next("PATCH", r"/rayclusters/", 429, headers={"Retry-After": "3"})
    assert [(await admin.get(PODS)).status for _ in range(3)] == [500, 500, 200]
    throttled = await admin.patch(f"{RAYCLUSTERS}/rc", data="[]", headers=JSON_PATCH)
    assert throttled.status == 429 and throttled.headers["Retry-After"] == "3"
    assert (await throttled.json())["reason"] == "TooManyRequests"
    api.faults.fail_next(
        "*",
        "watch=true",
        403,
        body={"kind": "Status", "code": 403, "reason": "Forbidden", "message": "x"},
    )
    assert (await admin.get(PODS, params={"watch": "true"})).status == 403
    assert (await admin.get(PODS)).status == 200


async def test_delay_still_answers_and_clear_removes_it(
    api: ApiServerStandIn, admin: aiohttp.ClientSession
) -> None:
    api.faults.delay(r"/pods$", 0.05)
    assert (await admin.get(PODS)).status == 200
    api.faults.clear()
    api.faults.fail_next("GET", r"/pods$", 500)
    api.faults.clear()
    assert (await admin.get(PODS)).status == 200


async def test_drop_watches_ends_streams_cleanly(
    api: ApiServerStandIn, admin: aiohttp.ClientSession
) -> None:
    async with (
        admin.get(PODS, params={"watch": "true"}) as pods_watch,
        admin.get(RAYCLUSTERS, params={"watch": "true"}) as rc_watch,
    ):
        api.create("pods", NS, pod("a"))
        assert len(await read_events(pods_watch, 1)) == 1
        assert api.faults.drop_watches("pods") == 1
        assert await read_events(pods_watch) == []  # clean end of stream
        assert api.faults.drop_watches() == 1
        assert await read_events(rc_watch) == []


async def test_stalled_watch_sends_nothing_more(
    api: ApiServerStandIn, admin: aiohttp.ClientSession
) -> None:
    params = {
        "watch": "true",
        "resourceVersion": str(api.resource_version),
        "allowWatchBookmarks": "true",
    }
    async with admin.get(PODS, params=params) as response:
        api.create("pods", NS, pod("before"))
        (seen,) = await read_events(response, 1)
        while seen["type"] == "BOOKMARK":
            (seen,) = await read_events(response, 1)
        assert api.faults.stall_watches("pods") == 1
        stalled_at = api.resource_version
        api.create("pods", NS, pod("after"))
        await asyncio.sleep(0.2)  # several bookmark intervals pass in silence
        api.faults.drop_watches("pods")
        rest = await read_events(response)
    assert seen["object"]["metadata"]["name"] == "before"
    # Only bookmarks already on the wire before the stall may still be read.
    assert all(e["type"] == "BOOKMARK" and rv_of(e["object"]) <= stalled_at for e in rest)


async def test_expire_watches_sends_410_then_closes(
    api: ApiServerStandIn, admin: aiohttp.ClientSession
) -> None:
    async with admin.get(RAYCLUSTERS, params={"watch": "true"}) as response:
        # headers arrived, so the server has registered this watch already
        assert api.faults.expire_watches("rayclusters") == 1
        events = await read_events(response)
    assert [(e["type"], e["object"]["code"], e["object"]["reason"]) for e in events] == [
        ("ERROR", 410, "Expired")
    ]


async def test_refused_connections_then_recovery(
    api: ApiServerStandIn, admin: aiohttp.ClientSession
) -> None:
    async with admin.get(PODS, params={"watch": "true"}) as response:
        api.faults.refuse_connections(True)
        with pytest.raises(aiohttp.ClientError):
            await admin.get(PODS)
        with pytest.raises((aiohttp.ClientError, ConnectionError)):
            await read_events(response, 1)
    api.faults.refuse_connections(False)
    assert (await admin.get(PODS)).status == 200


async def test_requests_are_recorded(api: ApiServerStandIn, admin: aiohttp.ClientSession) -> None:
    api.create("rayclusters", NS, raycluster())
    ops = [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 2}]
    await admin.patch(f"{RAYCLUSTERS}/rc", data=json.dumps(ops), headers=JSON_PATCH)
    await admin.get(PODS, params={"labelSelector": "a=b"})
    patch, listing = api.requests[-2:]
    assert (patch.method, patch.path, patch.content_type, patch.body, patch.status) == (
        "PATCH",
        f"{RAYCLUSTERS}/rc",
        "application/json-patch+json",
        ops,
        200,
    )
    assert patch.user == "kubernetes-admin"
    assert (listing.method, listing.query, listing.status) == ("GET", {"labelSelector": "a=b"}, 200)


# -- a real client --------------------------------------------------------------------------------


async def test_kubernetes_asyncio_lists_and_watches_via_kubeconfig(
    api: ApiServerStandIn, tmp_path: Path
) -> None:
    from kubernetes_asyncio import client, config, watch

    api.create("pods", NS, pod("w1", {"ray.io/cluster": "rc"}))
    kubeconfig = tmp_path / "kubeconfig"
    api.write_kubeconfig(kubeconfig, token=RESTRICTED_TOKEN)
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    async with client.ApiClient(configuration) as api_client:
        core = client.CoreV1Api(api_client)
        pods = await core.list_namespaced_pod(NS, label_selector="ray.io/cluster=rc")
        assert [p.metadata.name for p in pods.items] == ["w1"]
        api.create("pods", NS, pod("w2", {"ray.io/cluster": "rc"}))
        seen = []
        async with watch.Watch().stream(
            core.list_namespaced_pod,
            NS,
            label_selector="ray.io/cluster=rc",
            resource_version=pods.metadata.resource_version,
            timeout_seconds=1,
            allow_watch_bookmarks=True,
        ) as stream:
            async for event in stream:
                seen.append((event["type"], event["raw_object"]["metadata"].get("name")))
                if event["type"] == "ADDED":
                    break
    assert ("ADDED", "w2") in seen
    assert api.requests[-1].user == "system:serviceaccount:default:raycluster-autoscaler"


async def test_negative_replicas_are_stored_as_the_real_crd_allows(
    api: ApiServerStandIn, admin: aiohttp.ClientSession
) -> None:
    # The v1.7.0 CRD sets no minimum on replicas; kube-apiserver stores -1 (seen in the e2e tier).
    api.create("rayclusters", NS, raycluster())
    ops = [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": -1}]
    response = await admin.patch(f"{RAYCLUSTERS}/rc", data=json.dumps(ops), headers=JSON_PATCH)
    assert response.status == 200
    assert (await response.json())["spec"]["workerGroupSpecs"][0]["replicas"] == -1
