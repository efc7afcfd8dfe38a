"""The deploy/ manifests against the real API server (CRD validation with unknown fields refused)
and what the real operator builds from the two RayClusters."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.controlplane import REPO, ControlPlane
from tests.e2e.kube import Kube
from tests.e2e.test_drop_in import KUBERAY_ARGS, KUBERAY_COMMANDS
from tests.kustomize import render

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]
DEPLOY = REPO / "deploy"
DROP_IN = DEPLOY / "drop-in" / "raycluster-tpu-v6e-16.yaml"
NETWORK_POLICY = DEPLOY / "monitoring" / "networkpolicy.yaml"
SIDECAR_EXAMPLE = DEPLOY / "sidecar" / "examples" / "tpu-v6e-16"
SIDECAR_CLUSTER = SIDECAR_EXAMPLE / "raycluster.yaml"
SIDECAR_NAME = "tpu-v6e-16"
STRICT = {"fieldValidation": "Strict"}
DRY_RUN = {"dryRun": "All", **STRICT}
_namespaces = itertools.count(1)
_created: list[str] = []  # namespaces of the running test, cleaned up by the admin fixture

PATHS = {
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    "RayCluster": "/apis/ray.io/v1/namespaces/{ns}/rayclusters",
    "NetworkPolicy": "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
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
        await _clean_up(kube)
        await kube.close()


async def _clean_up(admin: Kube) -> None:
    """No controller-manager here (no garbage collector, no namespace controller): delete the
    RayClusters and their pods by hand, so later tests get the kwok nodes' capacity back."""
    while _created:
        ns = _created.pop()
        with contextlib.suppress(Exception):
            await admin.request("DELETE", PATHS["RayCluster"].format(ns=ns))
        with contextlib.suppress(Exception):
            await admin.request(
                "DELETE", f"/api/v1/namespaces/{ns}/pods", query={"gracePeriodSeconds": "0"}
            )


async def _namespace(admin: Kube, labels: dict[str, str] | None = None) -> str:
    name = f"deploy-{next(_namespaces)}"
    metadata: dict[str, Any] = {"name": name, "labels": labels or {}}
    await admin.ok("POST", "/api/v1/namespaces", {"metadata": metadata})
    _created.append(name)
    return name


async def _create(admin: Kube, ns: str, obj: dict[str, Any], query: dict[str, str]) -> None:
    reply = await admin.request("POST", PATHS[obj["kind"]].format(ns=ns), obj, query=query)
    assert reply.status == 201, f"{obj['kind']} {obj['metadata']['name']}: {reply.body}"


async def test_manifests_pass_strict_validation(plane: ControlPlane, admin: Kube) -> None:
    """Dry-run creates with unknown fields refused (kubectl's default), on this operator's CRD:
    the drop-in sets no autoscalerOptions.command/args (CRDs before v1.7.0 refuse them), so the
    same manifest applies on every KubeRay from 1.1."""
    ns = await _namespace(admin)
    manifests = [*render(SIDECAR_EXAMPLE), _load(DROP_IN), _load(NETWORK_POLICY)]
    optional = [*render(DEPLOY / "capacity-events"), *render(DEPLOY / "node-maintenance")]
    for obj in [*manifests, *optional]:
        await _create(admin, ns, obj, DRY_RUN)
    listed = await admin.ok("GET", PATHS["RayCluster"].format(ns=ns))
    assert listed["items"] == [], "dry run stored nothing"


async def test_drop_in_cluster_gets_our_daemon_as_its_autoscaler(
    plane: ControlPlane, admin: Kube
) -> None:
    """KubeRay builds the autoscaler container from autoscalerOptions: our image, env,
    resources and securityContext plus the variables it injects, its own command line, and the
    Role of contract §3."""
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
    # No command/args of ours: KubeRay's own, which our image's `ray` turns into
    # `kuberay-scaler run` (tests/e2e/test_drop_in.py runs exactly this command line).
    assert autoscaler["command"] in KUBERAY_COMMANDS
    assert autoscaler["args"] == KUBERAY_ARGS


async def test_sidecar_role_grants_the_service_account_what_the_daemon_uses(
    admin: Kube,
) -> None:
    """Everything the daemon uses on its own RayCluster, nothing on another one."""
    ns = await _namespace(admin)
    for obj in render(SIDECAR_EXAMPLE):
        if obj["kind"] != "RayCluster":
            await _create(admin, ns, obj, STRICT)
    wanted = [
        ("", "pods", "list", ""),
        ("", "pods", "watch", ""),
        ("ray.io", "rayclusters", "get", SIDECAR_NAME),
        ("ray.io", "rayclusters", "list", SIDECAR_NAME),
        ("ray.io", "rayclusters", "watch", SIDECAR_NAME),
        ("ray.io", "rayclusters", "patch", SIDECAR_NAME),
        ("", "events", "create", ""),
    ]
    await _authorizer_sees(admin, ns, *wanted[0])
    for group, resource, verb, name in wanted:
        answer = await _review(admin, ns, verb, group, resource, name)
        assert answer.get("allowed"), f"{verb} {resource} {name}: {answer}"
    for verb in ("get", "list", "watch", "patch"):
        answer = await _review(admin, ns, verb, "ray.io", "rayclusters", "someone-elses")
        assert not answer.get("allowed"), f"{verb} another RayCluster: {answer}"
    answer = await _review(admin, ns, "list", "ray.io", "rayclusters", "")
    assert not answer.get("allowed"), "listing every RayCluster of the namespace"


# The RBAC authorizer answers from its own watch of Roles and RoleBindings, so a binding just
# created is seen a moment later (CI-2 of 2026-12-02 asked first and got allowed: False).
# 60 s is far above any propagation seen; only a grant that never comes waits it out.
AUTHORIZER_SEES_S = 60.0


async def _authorizer_sees(
    admin: Kube, ns: str, group: str, resource: str, verb: str, name: str
) -> None:
    """Wait until the authorizer has the namespace's new Role and RoleBinding (a grant)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + AUTHORIZER_SEES_S
    while not (await _review(admin, ns, verb, group, resource, name)).get("allowed"):
        if loop.time() > deadline:
            return  # the assertions that follow say what is missing
        await asyncio.sleep(0.2)


async def _review(
    admin: Kube, ns: str, verb: str, group: str, resource: str, name: str
) -> dict[str, Any]:
    attributes = {"namespace": ns, "verb": verb, "group": group, "resource": resource}
    if name:
        attributes["name"] = name
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": f"system:serviceaccount:{ns}:kuberay-scaler",
            "resourceAttributes": attributes,
        },
    }
    path = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
    status: dict[str, Any] = (await admin.ok("POST", path, review))["status"]
    return status


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
    assert head["spec"]["automountServiceAccountToken"] is False
    containers = {c["name"]: c for c in head["spec"]["containers"]}
    assert "readinessProbe" not in containers["kuberay-scaler"]
    token_mounts = {
        c["name"]
        for c in containers.values()
        for m in c.get("volumeMounts") or []
        if m["mountPath"].startswith("/var/run/secrets/kubernetes.io")
    }
    assert token_mounts == {"kuberay-scaler"}, "the Ray container (user code) gets no token"


@pytest.mark.parametrize("mode", ["drop-in", "sidecar"])
async def test_both_modes_are_admitted_under_the_restricted_pod_security_standard(
    admin: Kube, mode: str
) -> None:
    """In a namespace enforcing `restricted`, the operator's head pod (and a worker pod) of each
    mode is admitted by the real kube-apiserver's PodSecurity admission."""
    ns = await _namespace(admin, labels={"pod-security.kubernetes.io/enforce": "restricted"})
    objects = render(SIDECAR_EXAMPLE) if mode == "sidecar" else [_load(DROP_IN)]
    for obj in objects:
        if obj["kind"] == "RayCluster":
            obj["spec"]["workerGroupSpecs"][0]["replicas"] = 1
        await _create(admin, ns, obj, STRICT)
    [cluster] = [o for o in objects if o["kind"] == "RayCluster"]
    name = cluster["metadata"]["name"]
    head = await _head_pod(admin, ns, name, refusals=True)
    ours = "autoscaler" if mode == "drop-in" else "kuberay-scaler"
    assert ours in {c["name"] for c in head["spec"]["containers"]}
    hosts = int(cluster["spec"]["workerGroupSpecs"][0].get("numOfHosts", 1))
    selector = f"ray.io/cluster={name},ray.io/node-type=worker"
    workers = await _pods(admin, ns, selector, 150, at_least=hosts)
    assert len(workers) == hosts, "the worker pods of one replica were admitted too"
    # The proof that enforcement is on: a pod without the restricted settings is refused.
    bare = {"metadata": {"name": "bare"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    reply = await admin.request("POST", f"/api/v1/namespaces/{ns}/pods", bare, query=DRY_RUN)
    assert reply.status == 403 and "restricted" in str(reply.body.get("message"))


async def _head_pod(
    admin: Kube, ns: str, cluster: str, attempts: int = 150, *, refusals: bool = False
) -> dict[str, Any]:
    selector = f"ray.io/cluster={cluster},ray.io/node-type=head"
    items = await _pods(admin, ns, selector, attempts)
    if items:
        return items[0]
    why = await _refusals(admin, ns) if refusals else ""
    raise AssertionError(f"KubeRay made no head pod for {cluster}{why}")


async def _pods(
    admin: Kube, ns: str, selector: str, attempts: int, at_least: int = 1
) -> list[dict[str, Any]]:
    path = f"/api/v1/namespaces/{ns}/pods"
    items: list[dict[str, Any]] = []
    for _ in range(attempts):
        items = (await admin.ok("GET", path, query={"labelSelector": selector}))["items"]
        if len(items) >= at_least:
            break
        await asyncio.sleep(0.2)
    return [dict(i) for i in items]


async def _refusals(admin: Kube, ns: str) -> str:
    """The operator's Events in `ns` (a PodSecurity refusal shows up there)."""
    events = (await admin.ok("GET", f"/api/v1/namespaces/{ns}/events"))["items"]
    return "".join(f"\n  {e.get('reason')}: {e.get('message')}" for e in events)
