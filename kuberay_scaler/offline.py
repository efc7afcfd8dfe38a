"""The `plan` command: the planner on files, for what-if questions before trusting the daemon."""

from __future__ import annotations

import json
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


def load_document(path: Path, what: str) -> Any:
    try:
        text = path.read_text()
    except OSError as err:
        raise InputError(f"{what} {path}: {err.strerror}") from None
    try:
        return yaml.safe_load(text)  # YAML is a superset of JSON
    except yaml.YAMLError as err:
        raise InputError(f"{what} {path}: not YAML or JSON ({err.__class__.__name__})") from None


def plan_files(
    raycluster: Path,
    pods: Path | None,
    ray_state: Path,
    policy: Policy,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Plan once from files and return the document the `plan` command prints."""
    rc = load_document(raycluster, "RayCluster")
    if not isinstance(rc, dict) or rc.get("kind", "RayCluster") != "RayCluster":
        raise InputError(f"RayCluster {raycluster}: not a RayCluster object")
    spec = parse_raycluster(rc)
    pod_list = load_document(pods, "PodList") if pods else []
    hosts, pod_problems = parse_pods(pod_items(pod_list), spec)
    try:
        state = parse_ray_state(ray_state.read_text())
    except OSError as err:
        raise InputError(f"Ray state {ray_state}: {err.strerror}") from None
    except RayStateError as err:
        raise InputError(f"Ray state {ray_state}: {err}") from None
    snapshot = Snapshot(spec=spec, hosts=tuple(hosts), problems=tuple(map(str, pod_problems)))
    result = plan(snapshot, state, Memory(), policy, now or datetime.now(UTC))
    try:
        ops = build_patch(rc, result)
    except PatchError as err:  # cannot happen for a plan made from this very object
        raise InputError(str(err)) from None
    return {"cluster": result.cluster, "patch": ops, **_without_cluster(result.summary())}


def _without_cluster(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if k != "cluster"}


def print_plan(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, ensure_ascii=False)
