"""Guarded JSON patches for the RayCluster.

Every touched group is pinned with a `test` on its groupName (a reordered list must not make us
write the wrong group) and on the values the plan was computed from; `add` is used where the
key may be absent, because `replace` on a missing key fails.
"""

from __future__ import annotations

from typing import Any

from kuberay_scaler.core.model.cluster import ClusterSpec, WorkerGroup
from kuberay_scaler.core.model.plan import GroupDecision, Plan

Op = dict[str, Any]


class PatchError(ValueError):
    """The RayCluster no longer matches the plan (group moved or vanished): replan."""


def build_patch(spec: ClusterSpec, plan: Plan) -> list[Op]:
    """JSON-patch ops that turn the RayCluster `spec` was parsed from (the object planned from,
    or the one our record write left) into the planned spec. The guards come from the parsed
    entries (WorkerGroup's stored-key fields), never from the raw object."""
    ops: list[Op] = []
    at = {g.index: g for g in spec.groups}
    for decision in plan.groups:
        if decision.spec_changes:
            ops += _group_ops(at.get(decision.index), decision, _planned_from(plan, decision.group))
    if ops and plan.uid:
        ops.insert(0, {"op": "test", "path": "/metadata/uid", "value": plan.uid})
    return ops


def _planned_from(plan: Plan, name: str) -> WorkerGroup | None:
    gs = plan.slice_map.groups.get(name) if plan.slice_map else None
    return gs.group if gs else None


def _group_ops(
    stored: WorkerGroup | None, d: GroupDecision, planned: WorkerGroup | None
) -> list[Op]:
    if stored is None or stored.name != d.group:
        raise PatchError(f"group {d.group!r} is no longer at workerGroupSpecs[{d.index}]")
    if planned is not None and not _unchanged(stored, planned):
        raise PatchError(f"group {d.group!r} changed since the plan was made")
    base = f"/spec/workerGroupSpecs/{d.index}"
    ops: list[Op] = [{"op": "test", "path": f"{base}/groupName", "value": d.group}]
    if stored.num_of_hosts_present:
        # Slices are numOfHosts pods: a changed value would make our deletions partial.
        ops.append({"op": "test", "path": f"{base}/numOfHosts", "value": stored.num_of_hosts})
    if d.target != d.current or not stored.replicas_present:
        if stored.replicas_present:
            ops.append({"op": "test", "path": f"{base}/replicas", "value": d.current})
            ops.append({"op": "replace", "path": f"{base}/replicas", "value": d.target})
        else:
            ops.append({"op": "add", "path": f"{base}/replicas", "value": d.target})
    pods = [p for deletion in d.deletions for p in deletion.pods]
    if pods or d.clear_workers_to_delete:
        ops += _workers_to_delete_ops(stored, base, pods)
    return ops


def _unchanged(stored: WorkerGroup, planned: WorkerGroup) -> bool:
    """The entry still holds the values the plan was made from."""
    if stored.replicas_present != planned.replicas_present:
        return False
    if planned.replicas_present and stored.replicas != planned.replicas:
        return False
    return stored.workers_to_delete == planned.workers_to_delete


def _workers_to_delete_ops(stored: WorkerGroup, base: str, pods: list[str]) -> list[Op]:
    if not stored.scale_strategy_present:
        return [{"op": "add", "path": f"{base}/scaleStrategy", "value": {"workersToDelete": pods}}]
    path = f"{base}/scaleStrategy/workersToDelete"
    if not stored.workers_to_delete_present:
        return [{"op": "add", "path": path, "value": pods}]
    was = None if stored.workers_to_delete_null else list(stored.workers_to_delete)
    return [
        {"op": "test", "path": path, "value": was},
        {"op": "replace", "path": path, "value": pods},
    ]
