"""Guarded JSON patches for the RayCluster.

Every touched group is pinned with a `test` on its groupName (a reordered list must not make us
write the wrong group) and on the values the plan was computed from; `add` is used where the
key may be absent, because `replace` on a missing key fails.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace
from typing import Any

from kuberay_scaler.model.plan import DeleteKind, GroupDecision, Plan

Op = dict[str, Any]


class PatchError(ValueError):
    """The RayCluster no longer matches the plan (group moved or vanished): replan."""


def build_patch(raycluster: Mapping[str, Any], plan: Plan) -> list[Op]:
    ops: list[Op] = []
    groups = raycluster.get("spec", {}).get("workerGroupSpecs") or []
    for decision in plan.groups:
        if decision.changes:
            ops += _group_ops(groups, decision)
    if ops and plan.uid:
        ops.insert(0, {"op": "test", "path": "/metadata/uid", "value": plan.uid})
    return ops


def _group_ops(groups: list[Any], d: GroupDecision) -> list[Op]:
    if d.index >= len(groups) or groups[d.index].get("groupName") != d.group:
        raise PatchError(f"group {d.group!r} is no longer at workerGroupSpecs[{d.index}]")
    raw = groups[d.index]
    base = f"/spec/workerGroupSpecs/{d.index}"
    ops: list[Op] = [{"op": "test", "path": f"{base}/groupName", "value": d.group}]
    if d.target != d.current or "replicas" not in raw:
        if "replicas" in raw:
            ops.append({"op": "test", "path": f"{base}/replicas", "value": raw["replicas"]})
            ops.append({"op": "replace", "path": f"{base}/replicas", "value": d.target})
        else:
            ops.append({"op": "add", "path": f"{base}/replicas", "value": d.target})
    pods = [p for deletion in d.deletions for p in deletion.pods]
    if pods or d.clear_workers_to_delete:
        ops += _workers_to_delete_ops(raw, base, pods)
    return ops


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


def drop_deletions(plan: Plan, slice_keys: Collection[tuple[str, str]]) -> Plan:
    """The plan without some slice deletions (their drain was refused); targets adjusted."""
    if not slice_keys:
        return plan
    groups = []
    for d in plan.groups:
        dropped = [x for x in d.deletions if (d.group, x.slice_key) in slice_keys]
        if not dropped:
            groups.append(d)
            continue
        kept = tuple(x for x in d.deletions if x not in dropped)
        back = sum(1 for x in dropped if x.kind is DeleteKind.IDLE)
        reasons = (*d.reasons, *(f"keep slice {x.slice_key}: drain refused" for x in dropped))
        target = d.target + back
        if not kept and target == d.current:
            target = d.current
        groups.append(replace(d, deletions=kept, target=target, reasons=reasons))
    return replace(plan, groups=tuple(groups))
