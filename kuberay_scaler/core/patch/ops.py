"""Guarded JSON patches for the RayCluster.

Every touched group is pinned with a `test` on its groupName (a reordered list must not make us
write the wrong group) and on the values the plan was computed from; `add` is used where the
key may be absent, because `replace` on a missing key fails.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kuberay_scaler.core.model.cluster import WorkerGroup
from kuberay_scaler.core.model.plan import GroupDecision, Plan

Op = dict[str, Any]


class PatchError(ValueError):
    """The RayCluster no longer matches the plan (group moved or vanished): replan."""


def build_patch(raycluster: Mapping[str, Any], plan: Plan) -> list[Op]:
    """JSON-patch ops that turn `raycluster` (the object planned from) into the planned spec."""
    ops: list[Op] = []
    groups = raycluster.get("spec", {}).get("workerGroupSpecs") or []
    for decision in plan.groups:
        if decision.spec_changes:
            ops += _group_ops(groups, decision, _planned_from(plan, decision.group))
    if ops and plan.uid:
        ops.insert(0, {"op": "test", "path": "/metadata/uid", "value": plan.uid})
    return ops


def _planned_from(plan: Plan, name: str) -> WorkerGroup | None:
    gs = plan.slice_map.groups.get(name) if plan.slice_map else None
    return gs.group if gs else None


def _group_ops(groups: list[Any], d: GroupDecision, planned: WorkerGroup | None) -> list[Op]:
    if d.index >= len(groups) or groups[d.index].get("groupName") != d.group:
        raise PatchError(f"group {d.group!r} is no longer at workerGroupSpecs[{d.index}]")
    raw = groups[d.index]
    if planned is not None and not _unchanged(raw, planned):
        raise PatchError(f"group {d.group!r} changed since the plan was made")
    base = f"/spec/workerGroupSpecs/{d.index}"
    ops: list[Op] = [{"op": "test", "path": f"{base}/groupName", "value": d.group}]
    if "numOfHosts" in raw:
        # Slices are numOfHosts pods: a changed value would make our deletions partial.
        ops.append({"op": "test", "path": f"{base}/numOfHosts", "value": raw["numOfHosts"]})
    if d.target != d.current or "replicas" not in raw:
        if "replicas" in raw:
            ops.append({"op": "test", "path": f"{base}/replicas", "value": d.current})
            ops.append({"op": "replace", "path": f"{base}/replicas", "value": d.target})
        else:
            ops.append({"op": "add", "path": f"{base}/replicas", "value": d.target})
    pods = [p for deletion in d.deletions for p in deletion.pods]
    if pods or d.clear_workers_to_delete:
        ops += _workers_to_delete_ops(raw, base, pods)
    return ops


def _unchanged(raw: Mapping[str, Any], planned: WorkerGroup) -> bool:
    """The entry still holds the values the plan was made from."""
    if ("replicas" in raw) != planned.replicas_present:
        return False
    if planned.replicas_present and raw["replicas"] != planned.replicas:
        return False
    strategy = raw.get("scaleStrategy")
    current = strategy.get("workersToDelete") if isinstance(strategy, Mapping) else None
    return list(current or []) == list(planned.workers_to_delete)


def _workers_to_delete_ops(raw: Mapping[str, Any], base: str, pods: list[str]) -> list[Op]:
    strategy = raw.get("scaleStrategy")
    if not isinstance(strategy, Mapping):
        return [{"op": "add", "path": f"{base}/scaleStrategy", "value": {"workersToDelete": pods}}]
    path = f"{base}/scaleStrategy/workersToDelete"
    if "workersToDelete" not in strategy:
        return [{"op": "add", "path": path, "value": pods}]
    return [
        {"op": "test", "path": path, "value": strategy["workersToDelete"]},
        {"op": "replace", "path": path, "value": pods},
    ]
