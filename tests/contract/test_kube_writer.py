"""RayCluster writer and expectations against the stand-in: catalogue rows 4-7 and 13.
Each test checks the stored RayCluster afterwards: nothing written twice, nothing lost."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient
from structlog.testing import capture_logs

from kuberay_scaler.adapters.kube.raycluster import RayClusterView
from kuberay_scaler.adapters.kube.session import open_api
from kuberay_scaler.adapters.kube.writer import PatchOutcome, RayClusterWriter
from kuberay_scaler.core.parse.raycluster import parse_raycluster
from kuberay_scaler.core.patch.ops import Op, Replace, Test
from kuberay_scaler.loop.expectations import Expectations
from kuberay_scaler.runtime.metrics import KubeCounters
from kuberay_standins.apiserver import ADMIN_TOKEN, ApiServerStandIn
from tests.contract.conftest import CLUSTER, GROUP, NAMESPACE, Connect, metric, raycluster

pytestmark = pytest.mark.contract

RC_PATH = f"/apis/ray.io/v1/namespaces/{NAMESPACE}/rayclusters/{CLUSTER}"
REPLICAS_PATH = "/spec/workerGroupSpecs/0/replicas"
PATCHES = "kuberay_scaler_patches_total"


def scale_ops(from_replicas: int, to_replicas: int) -> list[Op]:
    """What the patch builder emits: guard the group and the value the plan was made from."""
    return [
        Test("/spec/workerGroupSpecs/0/groupName", GROUP),
        Test(REPLICAS_PATH, from_replicas),
        Replace(REPLICAS_PATH, to_replicas),
    ]


def stored_replicas(server: ApiServerStandIn) -> int:
    stored = server.get("rayclusters", NAMESPACE, CLUSTER)
    assert stored is not None
    return int(stored["spec"]["workerGroupSpecs"][0]["replicas"])


def patch_requests(server: ApiServerStandIn) -> list[Any]:
    return [r for r in server.requests if r.method == "PATCH" and r.path == RC_PATH]


async def setup(
    server: ApiServerStandIn, api: ApiClient, counters: KubeCounters | None = None
) -> tuple[RayClusterWriter, str]:
    created = server.create("rayclusters", NAMESPACE, raycluster(replicas=1))
    writer = RayClusterWriter(api, namespace=NAMESPACE, name=CLUSTER, counters=counters)
    return writer, created["metadata"]["uid"]


async def test_applied_patch_returns_the_stored_object(
    apiserver: ApiServerStandIn, api: ApiClient
) -> None:
    counters = KubeCounters.new()
    writer, uid = await setup(apiserver, api, counters)
    applied_before = metric(counters, PATCHES, outcome="applied")
    outcome = await writer.apply(scale_ops(1, 2), expected_uid=uid)
    assert outcome.kind == "applied"
    assert outcome.obj is not None
    assert outcome.obj["spec"]["workerGroupSpecs"][0]["replicas"] == 2
    assert stored_replicas(apiserver) == 2
    request = patch_requests(apiserver)[0]
    assert request.content_type == "application/json-patch+json"
    assert request.body[0] == {"op": "test", "path": "/metadata/uid", "value": uid}
    assert metric(counters, PATCHES, outcome="applied") == applied_before + 1
    assert (
        metric(
            counters,
            "kuberay_scaler_api_requests_total",
            verb="patch",
            resource="rayclusters",
            code="200",
        )
        >= 1
    )


async def test_conflict_409_is_stale(apiserver: ApiServerStandIn, api: ApiClient) -> None:
    writer, uid = await setup(apiserver, api)
    apiserver.faults.fail_next("PATCH", "rayclusters", 409)
    outcome = await writer.apply(scale_ops(1, 2), expected_uid=uid)
    assert outcome.kind == "stale"
    assert stored_replicas(apiserver) == 1


async def test_failed_test_op_is_stale_and_validation_422_is_invalid(
    apiserver: ApiServerStandIn, api: ApiClient
) -> None:
    writer, uid = await setup(apiserver, api)
    stale = await writer.apply(scale_ops(3, 4), expected_uid=uid)  # plan made from replicas 3
    assert stale.kind == "stale"
    assert stored_replicas(apiserver) == 1

    bad_ops: list[Op] = [Replace(REPLICAS_PATH, "two")]
    with capture_logs() as logs:
        first = await writer.apply(bad_ops, expected_uid=uid)
        second = await writer.apply(bad_ops, expected_uid=uid)
    assert (first.kind, second.kind) == ("invalid", "invalid")
    assert "replicas" in first.message
    rejected = [e for e in logs if e["event"] == "raycluster patch rejected as invalid"]
    assert len(rejected) == 1  # logged once, with the ops
    assert rejected[0]["ops"] == [{"op": "replace", "path": REPLICAS_PATH, "value": "two"}]
    assert stored_replicas(apiserver) == 1


async def test_forbidden_names_verb_and_resource(
    apiserver: ApiServerStandIn, connect: Connect
) -> None:
    apiserver.add_token("read-only", [(["get", "list", "watch"], ["rayclusters"])])
    writer, uid = await setup(apiserver, await connect("read-only"))
    outcome = await writer.apply(scale_ops(1, 2), expected_uid=uid)
    assert outcome.kind == "forbidden"
    assert "patch" in outcome.message
    assert "rayclusters" in outcome.message
    assert stored_replicas(apiserver) == 1


async def test_throttled_carries_retry_after(apiserver: ApiServerStandIn, api: ApiClient) -> None:
    writer, uid = await setup(apiserver, api)
    apiserver.faults.fail_next("PATCH", "rayclusters", 429, headers={"Retry-After": "3"})
    outcome = await writer.apply(scale_ops(1, 2), expected_uid=uid)
    assert outcome.kind == "throttled"
    assert outcome.retry_after == 3.0
    assert stored_replicas(apiserver) == 1
    retried = await writer.apply(scale_ops(1, 2), expected_uid=uid)  # after waiting, it applies
    assert retried.kind == "applied"
    assert stored_replicas(apiserver) == 2


async def test_server_errors_and_no_connection_are_transient(
    apiserver: ApiServerStandIn, api: ApiClient
) -> None:
    writer, uid = await setup(apiserver, api)
    apiserver.faults.fail_next("PATCH", "rayclusters", 500)
    assert (await writer.apply(scale_ops(1, 2), expected_uid=uid)).kind == "transient"
    apiserver.faults.fail_next("PATCH", "rayclusters", 503)
    assert (await writer.apply(scale_ops(1, 2), expected_uid=uid)).kind == "transient"
    apiserver.faults.refuse_connections(True)
    assert (await writer.apply(scale_ops(1, 2), expected_uid=uid)).kind == "transient"
    apiserver.faults.refuse_connections(False)
    assert stored_replicas(apiserver) == 1
    assert (await writer.apply(scale_ops(1, 2), expected_uid=uid)).kind == "applied"
    assert stored_replicas(apiserver) == 2


async def test_deleted_raycluster_is_gone(apiserver: ApiServerStandIn, api: ApiClient) -> None:
    writer, uid = await setup(apiserver, api)
    apiserver.delete("rayclusters", NAMESPACE, CLUSTER)
    outcome = await writer.apply(scale_ops(1, 2), expected_uid=uid)
    assert outcome.kind == "gone"
    assert apiserver.get("rayclusters", NAMESPACE, CLUSTER) is None


async def scale_up_once(
    view: RayClusterView,
    writer: RayClusterWriter,
    expectations: Expectations,
    *,
    want: int,
    now: float,
) -> PatchOutcome | None:
    """A minimal stand-in for the loop: plan from the cached view, unless a write is pending."""
    cluster = view.current()
    assert cluster is not None
    spec = cluster["spec"]["workerGroupSpecs"][0]
    observed = parse_raycluster(cluster).group(GROUP)
    expectations.settle({GROUP: observed} if observed else {}, now)
    if expectations.pending(GROUP, observed, now) or spec["replicas"] >= want:
        return None
    outcome = await writer.apply(
        scale_ops(spec["replicas"], spec["replicas"] + 1), expected_uid=cluster["metadata"]["uid"]
    )
    if outcome.kind == "applied":
        expectations.expect(GROUP, replicas=spec["replicas"] + 1, now=now)
    return outcome


async def test_expectations_prevent_a_second_scale_up_from_a_stale_cache(
    apiserver: ApiServerStandIn, api: ApiClient
) -> None:
    writer, _ = await setup(apiserver, api)
    view = RayClusterView(api, namespace=NAMESPACE, name=CLUSTER, mode="poll")
    await view.refresh()
    expectations = Expectations(timeout=30)

    first = await scale_up_once(view, writer, expectations, want=2, now=0)
    assert first is not None and first.kind == "applied"
    # The cache has not caught up (poll mode, no GET yet): replicas still reads 1.
    assert view.current()["spec"]["workerGroupSpecs"][0]["replicas"] == 1  # type: ignore[index]
    assert await scale_up_once(view, writer, expectations, want=2, now=1) is None
    assert len(patch_requests(apiserver)) == 1
    assert stored_replicas(apiserver) == 2

    await view.refresh()  # the cache catches up: the expectation is met and dropped
    assert await scale_up_once(view, writer, expectations, want=2, now=2) is None
    assert expectations.groups() == frozenset()
    assert stored_replicas(apiserver) == 2


async def test_competing_writer_makes_the_guarded_patch_stale(
    apiserver: ApiServerStandIn, api: ApiClient
) -> None:
    writer, uid = await setup(apiserver, api)
    view = RayClusterView(api, namespace=NAMESPACE, name=CLUSTER, mode="poll")
    await view.refresh()
    apiserver.json_patch(  # e.g. GitOps resets replicas between our read and our write
        "rayclusters", NAMESPACE, CLUSTER, [{"op": "replace", "path": REPLICAS_PATH, "value": 0}]
    )
    outcome = await writer.apply(scale_ops(1, 2), expected_uid=uid)
    assert outcome.kind == "stale"
    assert stored_replicas(apiserver) == 0  # their write stands; we replan from the truth
    fresh = await view.refresh()
    assert fresh is not None
    assert fresh["spec"]["workerGroupSpecs"][0]["replicas"] == 0


async def test_a_hung_request_times_out_as_transient(
    apiserver: ApiServerStandIn, tmp_path: Path
) -> None:
    kubeconfig = tmp_path / "kubeconfig-short-timeout"
    apiserver.write_kubeconfig(kubeconfig, token=ADMIN_TOKEN, namespace=NAMESPACE)
    api = await open_api(str(kubeconfig), request_timeout=0.2)
    try:
        writer, uid = await setup(apiserver, api)
        apiserver.faults.delay("rayclusters", 2.0)  # answers long after the client gave up
        outcome = await writer.apply(scale_ops(1, 2), expected_uid=uid)
        assert outcome.kind == "transient"
        assert "timed out" in outcome.message
    finally:
        await api.close()


async def test_every_raycluster_request_uses_the_configured_crd_version(
    apiserver: ApiServerStandIn, api: ApiClient
) -> None:
    """KUBERAY_CRD_VER reaches the paths: a version the server does not serve is not found."""
    created = apiserver.create("rayclusters", NAMESPACE, raycluster(replicas=1))
    uid = created["metadata"]["uid"]
    other = "v1alpha1"
    writer = RayClusterWriter(api, namespace=NAMESPACE, name=CLUSTER, crd_version=other)
    outcome = await writer.apply(scale_ops(1, 2), expected_uid=uid)
    view = RayClusterView(api, namespace=NAMESPACE, name=CLUSTER, mode="poll", crd_version=other)
    assert await view.refresh() is None
    paths = {r.path for r in apiserver.requests if "rayclusters" in r.path}
    assert paths == {RC_PATH.replace("/v1/", f"/{other}/")}
    assert outcome.kind == "gone"
    assert stored_replicas(apiserver) == 1  # nothing written through the wrong version
