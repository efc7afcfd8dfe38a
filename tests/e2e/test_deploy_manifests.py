"""The deploy/ manifests against the real API server (CRD validation with unknown fields refused)
and what the real operator builds from the two RayClusters."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.controlplane import REPO, ControlPlane
from tests.e2e.kube import Kube

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]
DEPLOY = REPO / "deploy"
DROP_IN = DEPLOY / "drop-in" / "raycluster-tpu-v6e-16.yaml"
SIDECAR_BASE = DEPLOY / "sidecar" / "base"
SIDECAR_CLUSTER = DEPLOY / "sidecar" / "examples" / "tpu-v6e-16" / "raycluster.yaml"
STRICT = {"fieldValidation": "Strict"}
DRY_RUN = {"dryRun": "All", **STRICT}
_namespaces = itertools.count(1)

PATHS = {
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    "RayCluster": "/apis/ray.io/v1/namespaces/{ns}/rayclusters",
}


def _load(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(path.read_text())
    return loaded


@pytest.fixture
async def admin(plane: ControlPlane) -> AsyncIterator[Kube]:
    kube = Kube(plane.apiserver_url, plane.ca_file, plane.admin.token)
    try:
        yield kube
    finally:
        await kube.close()


async def _namespace(admin: Kube) -> str:
    name = f"deploy-{next(_namespaces)}"
    await admin.ok("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    return name


async def _create(admin: Kube, ns: str, obj: dict[str, Any], query: dict[str, str]) -> None:
    reply = await admin.request("POST", PATHS[obj["kind"]].format(ns=ns), obj, query=query)
    assert reply.status == 201, f"{obj['kind']} {obj['metadata']['name']}: {reply.body}"


def _kuberay_at_least(plane: ControlPlane, major: int, minor: int) -> bool:
    version = plane.built.versions["KUBERAY_VERSION"].lstrip("v").split(".")
    return (int(version[0]), int(version[1])) >= (major, minor)


async def test_manifests_pass_strict_validation(plane: ControlPlane, admin: Kube) -> None:
    """Dry-run creates with unknown fields refused. `autoscalerOptions.command/args` exist in
    the RayCluster CRD from KubeRay v1.7.0 only: older CRDs refuse (strict) or silently drop
    them (the default), so the drop-in manifest needs KubeRay >= 1.7.0."""
    ns = await _namespace(admin)
    sidecar_base = [_load(SIDECAR_BASE / f) for f in _kustomization_resources(SIDECAR_BASE)]
    for obj in [*sidecar_base, _load(SIDECAR_CLUSTER)]:
        await _create(admin, ns, obj, DRY_RUN)
    drop_in = _load(DROP_IN)
    if _kuberay_at_least(plane, 1, 7):
        await _create(admin, ns, drop_in, DRY_RUN)
    else:
        reply = await admin.request(
            "POST", PATHS["RayCluster"].format(ns=ns), drop_in, query=DRY_RUN
        )
        assert reply.status == 400
        assert 'unknown field "spec.autoscalerOptions.args"' in reply.body["message"]
        assert 'unknown field "spec.autoscalerOptions.command"' in reply.body["message"]
    listed = await admin.ok("GET", PATHS["RayCluster"].format(ns=ns))
    assert listed["items"] == [], "dry run stored nothing"


async def test_drop_in_cluster_gets_our_daemon_as_its_autoscaler(
    plane: ControlPlane, admin: Kube
) -> None:
    """KubeRay builds the autoscaler container from autoscalerOptions: our image, env,
    resources and securityContext plus the variables it injects, and the Role of contract §3;
    from v1.7.0 also our command and args."""
    ns = await _namespace(admin)
    cluster = _load(DROP_IN)
    await _create(admin, ns, cluster, {})  # default field validation, as kubectl create would
    head = await _head_pod(admin, ns, cluster["metadata"]["name"])
    containers = {c["name"]: c for c in head["spec"]["containers"]}
    options = cluster["spec"]["autoscalerOptions"]
    autoscaler = containers["autoscaler"]
    assert autoscaler["image"] == options["image"]
    assert autoscaler["resources"] == options["resources"]
    assert autoscaler["securityContext"] == options["securityContext"]
    env = {e["name"] for e in autoscaler["env"]}
    assert {"RAY_CLUSTER_NAME", "RAY_CLUSTER_NAMESPACE", "RAY_HEAD_POD_NAME"} <= env
    assert {e["name"] for e in options["env"]} <= env
    ray_env = {e["name"]: e.get("value") for e in containers["ray-head"]["env"]}
    assert ray_env.get("RAY_enable_autoscaler_v2") == "true"
    assert head["spec"]["serviceAccountName"] == cluster["metadata"]["name"]
    role = await admin.ok(
        "GET",
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles/{cluster['metadata']['name']}",
    )
    assert {(tuple(r["resources"]), tuple(r["verbs"])) for r in role["rules"]} == {
        (("pods",), ("get", "list", "watch", "patch")),
        (("pods/resize",), ("patch",)),
        (("rayclusters",), ("get", "patch")),
    }
    if not _kuberay_at_least(plane, 1, 7):
        pytest.xfail(
            f"KubeRay {plane.built.versions['KUBERAY_VERSION']} drops autoscalerOptions."
            f"command/args: the container runs {autoscaler.get('args')}, not kuberay-scaler"
        )
    assert autoscaler["command"] == options["command"]
    assert autoscaler["args"] == options["args"]


async def test_sidecar_role_grants_the_service_account_what_the_daemon_uses(
    admin: Kube,
) -> None:
    ns = await _namespace(admin)
    for name in _kustomization_resources(SIDECAR_BASE):
        await _create(admin, ns, _load(SIDECAR_BASE / name), STRICT)
    wanted = [
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("ray.io", "rayclusters", "get"),
        ("ray.io", "rayclusters", "watch"),
        ("ray.io", "rayclusters", "patch"),
        ("", "events", "create"),
    ]
    for group, resource, verb in wanted:
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": f"system:serviceaccount:{ns}:kuberay-scaler",
                "resourceAttributes": {
                    "namespace": ns,
                    "verb": verb,
                    "group": group,
                    "resource": resource,
                },
            },
        }
        path = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
        answer = await admin.ok("POST", path, review)
        assert answer["status"].get("allowed"), f"{verb} {resource}: {answer['status']}"


async def test_sidecar_cluster_runs_our_container_under_our_service_account(
    admin: Kube,
) -> None:
    ns = await _namespace(admin)
    cluster = _load(SIDECAR_CLUSTER)
    await _create(admin, ns, cluster, STRICT)
    head = await _head_pod(admin, ns, cluster["metadata"]["name"], attempts=50)
    names = [c["name"] for c in head["spec"]["containers"]]
    assert names == ["ray-head", "kuberay-scaler"], "no autoscaler container added by KubeRay"
    assert head["spec"]["serviceAccountName"] == "kuberay-scaler"


def _kustomization_resources(folder: Path) -> list[str]:
    return list(_load(folder / "kustomization.yaml")["resources"])


async def _head_pod(admin: Kube, ns: str, cluster: str, attempts: int = 150) -> dict[str, Any]:
    path = f"/api/v1/namespaces/{ns}/pods"
    query = {"labelSelector": f"ray.io/cluster={cluster},ray.io/node-type=head"}
    for _ in range(attempts):
        items = (await admin.ok("GET", path, query=query))["items"]
        if items:
            return dict(items[0])
        await asyncio.sleep(0.2)
    raise AssertionError(f"KubeRay made no head pod for {cluster}")
