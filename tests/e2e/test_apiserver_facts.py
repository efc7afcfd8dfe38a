"""What the real kube-apiserver says in the situations the daemon's Kubernetes layer classifies:
a JSON patch that does not apply, a validation failure, a watch or list from a resourceVersion
that is too old or too new, and the bookmark that ends a watch's initial events.

Where the API-server stand-in (kuberay_standins) must say the same, the test compares against
it directly; the other facts are written down in docs/e2e.md.
"""

from __future__ import annotations

import json
import re
import urllib.request
from typing import Any

import pytest

from kuberay_scaler.adapters.kube.transport import ApiError, Target
from kuberay_scaler.adapters.kube.writer import classify
from kuberay_standins._k8s_errors import patch_not_applied
from tests.e2e.kube import JSON_PATCH
from tests.e2e.world import World, tpu_raycluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]
ACTION = "patch rayclusters.ray.io ns/e2e"


def _api_error(status: int, body: dict[str, Any]) -> ApiError:
    return ApiError(
        status=status,
        reason=str(body.get("reason", "")),
        message=str(body.get("message", "")),
        target=Target("patch", "rayclusters"),
        body=body,
    )


async def test_a_patch_that_does_not_apply_is_a_bare_422(bare_world: World) -> None:
    world = bare_world
    await world.create_raycluster(tpu_raycluster())
    failures = {
        "failed test": [
            {"op": "test", "path": "/spec/workerGroupSpecs/0/groupName", "value": "other"}
        ],
        "test of a missing index": [
            {"op": "test", "path": "/spec/workerGroupSpecs/7/groupName", "value": "x"}
        ],
        "replace of a missing key": [
            {
                "op": "replace",
                "path": "/spec/workerGroupSpecs/0/scaleStrategy/workersToDelete",
                "value": [],
            }
        ],
        "remove of a missing key": [{"op": "remove", "path": "/metadata/annotations/x"}],
    }
    for why, ops in failures.items():
        reply = await world.admin.request(
            "PATCH", world.raycluster_path, ops, content_type=JSON_PATCH
        )
        assert reply.status == 422, why
        assert reply.body == patch_not_applied().status, f"{why}: stand-in says otherwise"
        assert classify(_api_error(422, reply.body), ACTION).kind == "stale", why

    invalid = [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": "x"}]
    reply = await world.admin.request(
        "PATCH", world.raycluster_path, invalid, content_type=JSON_PATCH
    )
    assert reply.status == 422
    assert reply.body["message"].startswith('RayCluster.ray.io "e2e" is invalid: ')
    assert reply.body["details"]["causes"][0]["field"] == "spec.workerGroupSpecs[0].replicas"
    assert classify(_api_error(422, reply.body), ACTION).kind == "invalid"

    # The CRD sets no minimum on replicas: a negative value is stored as is.
    negative = [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": -1}]
    stored = await world.admin.ok("PATCH", world.raycluster_path, negative, content_type=JSON_PATCH)
    assert stored["spec"]["workerGroupSpecs"][0]["replicas"] == -1


async def test_too_old_and_too_new_resource_versions(bare_world: World) -> None:
    world = bare_world
    await world.create_raycluster(tpu_raycluster())
    collection = f"/apis/ray.io/v1/namespaces/{world.namespace}/rayclusters"

    # A watch from before the watch cache's window: HTTP 200, then one ERROR event, then EOF.
    lines = [e async for e in world.admin.watch(collection, {"resourceVersion": "1"})]
    assert [e["type"] for e in lines] == ["ERROR"]
    status = lines[0]["object"]
    assert (status["code"], status["reason"], status["kind"]) == (410, "Expired", "Status")
    assert re.fullmatch(r"too old resource version: 1 \(\d+\)", status["message"])

    # A list at an exact resourceVersion that etcd has compacted away: HTTP 410.
    current = (await world.admin.ok("GET", collection))["metadata"]["resourceVersion"]
    _compact_etcd(world.plane.etcd_url)
    reply = await world.admin.request(
        "GET", collection, query={"resourceVersion": "2", "resourceVersionMatch": "Exact"}
    )
    assert reply.status == 410
    assert reply.body["reason"] == "Expired"
    assert reply.body["message"] == "The resourceVersion for the provided list is too old."

    # From the future: the server waits ~3 s for it, then answers 504 with a retry hint.
    ahead = str(int(current) + 1_000_000)
    reply = await world.admin.request("GET", collection, query={"resourceVersion": ahead})
    assert reply.status == 504
    assert reply.body["reason"] == "Timeout"
    assert reply.body["message"].startswith(f"Timeout: Too large resource version: {ahead}, ")
    assert reply.body["details"]["retryAfterSeconds"] == 1


async def test_initial_events_end_with_an_annotated_bookmark(bare_world: World) -> None:
    world = bare_world
    await world.create_raycluster(tpu_raycluster())
    await world.wait_for(lambda: world.observer.head_pod() is not None, 30, "the head pod")
    query = {
        "sendInitialEvents": "true",
        "resourceVersionMatch": "NotOlderThan",
        "allowWatchBookmarks": "true",
        "timeoutSeconds": "2",
    }
    path = f"/api/v1/namespaces/{world.namespace}/pods"
    events = [e async for e in world.admin.watch(path, query)]
    kinds = [e["type"] for e in events]
    assert kinds[0] == "ADDED" and "BOOKMARK" in kinds
    bookmark = events[kinds.index("BOOKMARK")]["object"]
    assert bookmark["kind"] == "Pod" and bookmark["apiVersion"] == "v1"
    assert bookmark["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert int(bookmark["metadata"]["resourceVersion"]) > 0
    # A pod bookmark carries empty spec/status stubs besides the resourceVersion.
    assert bookmark["spec"] == {"containers": None} and bookmark["status"] == {}


def _compact_etcd(etcd_url: str) -> None:
    """Compact etcd to its current revision through its JSON gateway (loopback)."""
    revision = _etcd_post(etcd_url, "/v3/kv/range", {"key": "AA=="})["header"]["revision"]
    _etcd_post(etcd_url, "/v3/kv/compaction", {"revision": revision, "physical": True})


def _etcd_post(etcd_url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(etcd_url + path, data=json.dumps(body).encode())
    with urllib.request.urlopen(request, timeout=10) as reply:
        decoded: dict[str, Any] = json.loads(reply.read())
    return decoded
