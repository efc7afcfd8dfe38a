"""The `plan` command: the planner on files, for what-if questions before trusting the daemon."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from kuberay_scaler.model.plan import Memory, Snapshot
from kuberay_scaler.parse.pods import parse_pods, pod_items
from kuberay_scaler.parse.ray_state import RayStateError, parse_ray_state
from kuberay_scaler.parse.raycluster import parse_raycluster
from kuberay_scaler.patch.ops import PatchError, build_patch
from kuberay_scaler.planner.core import Policy, plan


class InputError(Exception):
    """A file cannot be used; the message names it."""


def load_documents(path: Path, what: str) -> list[Any]:
    """Every document of a YAML (or JSON) file; `kubectl get -o yaml` samples may hold several."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"{what} {path}: {_why(err)}") from None
    try:
        return [d for d in yaml.safe_load_all(text) if d is not None]  # JSON is YAML too
    except yaml.YAMLError as err:
        raise InputError(f"{what} {path}: not YAML or JSON ({_first_line(err)})") from None


def load_document(path: Path, what: str) -> Any:
    """The one document of a file (None when it is empty)."""
    docs = load_documents(path, what)
    if len(docs) > 1:
        raise InputError(f"{what} {path}: {len(docs)} documents, expected one")
    return docs[0] if docs else None


def load_raycluster(path: Path) -> dict[str, Any]:
    """The RayCluster among the file's documents (samples ship a ConfigMap next to it)."""
    docs = load_documents(path, "RayCluster")
    found = [d for d in docs if isinstance(d, dict) and d.get("kind", "RayCluster") == "RayCluster"]
    if len(found) != 1:
        detail = "none" if not found else f"{len(found)}"
        raise InputError(f"RayCluster {path}: expected one RayCluster object, found {detail}")
    rc = found[0]
    if not isinstance(rc.get("spec"), Mapping):
        raise InputError(f"RayCluster {path}: the RayCluster has no spec")
    return rc


def load_pods(path: Path | None) -> list[Any]:
    """A PodList, one Pod, a list of pods or a name → pod map; no file means no pods."""
    if path is None:
        return []
    doc = load_document(path, "PodList")
    if doc is None or isinstance(doc, list):
        return doc or []
    if isinstance(doc, Mapping):
        kind = doc.get("kind")
        if kind == "Pod":
            return [doc]
        if kind in ("PodList", "List") or (
            kind is None and all(isinstance(v, Mapping) for v in doc.values())
        ):
            return pod_items(doc)
    raise InputError(f"PodList {path}: expected a PodList, a Pod or a list of pods")


def plan_files(
    raycluster: Path,
    pods: Path | None,
    ray_state: Path,
    policy: Policy,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Plan once from files and return the document the `plan` command prints."""
    rc = load_raycluster(raycluster)
    spec = parse_raycluster(rc)
    hosts, pod_problems = parse_pods(load_pods(pods), spec)
    try:
        state = parse_ray_state(ray_state.read_text())
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"Ray state {ray_state}: {_why(err)}") from None
    except RayStateError as err:
        raise InputError(f"Ray state {ray_state}: {err}") from None
    snapshot = Snapshot(spec=spec, hosts=tuple(hosts), problems=tuple(pod_problems))
    result = plan(snapshot, state, Memory(), policy, now or datetime.now(UTC))
    try:
        ops = build_patch(rc, result)
    except PatchError as err:  # cannot happen for a plan made from this very object
        raise InputError(str(err)) from None
    return {"cluster": result.cluster, "patch": ops, **_without_cluster(result.summary())}


def _without_cluster(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if k != "cluster"}


def _why(err: OSError | UnicodeDecodeError) -> str:
    if isinstance(err, UnicodeDecodeError):
        return "not text (UTF-8)"
    return err.strerror or str(err)


def _first_line(err: yaml.YAMLError) -> str:
    mark = getattr(err, "problem_mark", None)
    where = f" at line {mark.line + 1}" if mark is not None else ""
    return f"{getattr(err, 'problem', None) or err.__class__.__name__}{where}"


def print_plan(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, ensure_ascii=False)
