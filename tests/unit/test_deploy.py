"""Every manifest in deploy/ is valid: RayClusters against the v1.7.0 CRD schema, RBAC minimal."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CRD = ROOT.parent / "shared" / "kuberay" / "v1.7.0" / "ray.io_rayclusters.yaml"


def _documents() -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for path in sorted(DEPLOY.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((path, doc))
    return out


@functools.cache
def _raycluster_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


DOCS = _documents()


def test_deploy_has_both_modes() -> None:
    kinds = {(p.relative_to(DEPLOY).parts[0], d["kind"]) for p, d in DOCS}
    assert ("drop-in", "RayCluster") in kinds
    assert {
        ("sidecar", k) for k in ("Role", "RoleBinding", "ServiceAccount", "Kustomization")
    } <= kinds


@pytest.mark.parametrize(
    "path,doc", [(p, d) for p, d in DOCS if d["kind"] == "RayCluster"], ids=lambda x: str(x)
)
def test_rayclusters_match_the_crd_schema(path: Path, doc: dict[str, Any]) -> None:
    jsonschema.validate(doc, _raycluster_schema())
    assert doc["apiVersion"] == "ray.io/v1"


def test_drop_in_runs_us_as_kuberays_autoscaler() -> None:
    [doc] = [d for p, d in DOCS if "drop-in" in p.parts]
    spec = doc["spec"]
    assert spec["enableInTreeAutoscaling"] is True
    opts = spec["autoscalerOptions"]
    assert opts["image"].startswith("kuberay-scaler")
    assert opts["command"] == ["kuberay-scaler"] and opts["args"] == ["run"]
    # Under KubeRay's Role there is no extra RBAC: the drop-in directory ships none.
    assert not [d for p, d in DOCS if "drop-in" in p.parts and d["kind"] != "RayCluster"]


def test_sidecar_role_is_minimal() -> None:
    [role] = [d for _, d in DOCS if d["kind"] == "Role"]
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): set(r["verbs"]) for r in role["rules"]}
    assert rules == {
        (("",), ("pods",)): {"get", "list", "watch"},
        (("ray.io",), ("rayclusters",)): {"get", "list", "watch", "patch"},
        (("",), ("events",)): {"create"},
    }


def test_kustomizations_list_existing_files() -> None:
    for path, doc in DOCS:
        if doc["kind"] != "Kustomization":
            continue
        for resource in doc["resources"]:
            assert (path.parent / resource).exists(), f"{path}: {resource} missing"


def test_sidecar_example_runs_the_daemon_in_the_head_pod() -> None:
    [doc] = [d for p, d in DOCS if d["kind"] == "RayCluster" and "sidecar" in p.parts]
    head = doc["spec"]["headGroupSpec"]["template"]["spec"]
    assert head["serviceAccountName"] == "kuberay-scaler"
    sidecar = next(c for c in head["containers"] if c["name"] == "kuberay-scaler")
    env = {e["name"] for e in sidecar["env"]}
    assert {"RAY_CLUSTER_NAME", "RAY_CLUSTER_NAMESPACE"} <= env
    assert doc["spec"]["workerGroupSpecs"][0]["numOfHosts"] == 4
