"""Guarded JSON patches for the RayCluster.

Every touched group is pinned with a `test` on its groupName (a reordered list must not make us
write the wrong group) and on the values the plan was computed from; `add` is used where the
key may be absent, because `replace` on a missing key fails.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kuberay_scaler.core.model.cluster import ClusterSpec, WorkerGroup
from kuberay_scaler.core.model.plan import GroupDecision, Plan


@dataclass(frozen=True)
class Test:
    """RFC 6902 `test`: the patch applies only if `path` holds `value`."""

    __test__ = False  # not a pytest test class (tests import it)
    path: str
    value: Any  # a JSON value

    def to_json(self) -> dict[str, Any]:
        return {"op": "test", "path": self.path, "value": self.value}


@dataclass(frozen=True)
class Replace:
    """RFC 6902 `replace`: `path` must exist."""

    path: str
    value: Any

    def to_json(self) -> dict[str, Any]:
        return {"op": "replace", "path": self.path, "value": self.value}


@dataclass(frozen=True)
class Add:
    """RFC 6902 `add`: creates `path` (its parent must exist) or sets it."""

    path: str
    value: Any

    def to_json(self) -> dict[str, Any]:
        return {"op": "add", "path": self.path, "value": self.value}


@dataclass(frozen=True)
class Remove:
    """RFC 6902 `remove`: `path` must exist."""

    path: str

    def to_json(self) -> dict[str, Any]:
        return {"op": "remove", "path": self.path}


Op = Test | Replace | Add | Remove


def ops_json(ops: Iterable[Op]) -> list[dict[str, Any]]:
    """The JSON-patch document: what is sent (adapters/kube) and printed (`plan`, /debug)."""
    return [op.to_json() for op in ops]


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
        ops.insert(0, Test("/metadata/uid", plan.uid))
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
    ops: list[Op] = [Test(f"{base}/groupName", d.group)]
    if stored.num_of_hosts_present:
        # Slices are numOfHosts pods: a changed value would make our deletions partial.
        ops.append(Test(f"{base}/numOfHosts", stored.num_of_hosts))
    if d.target != d.current or not stored.replicas_present:
        if stored.replicas_present:
            ops.append(Test(f"{base}/replicas", d.current))
            ops.append(Replace(f"{base}/replicas", d.target))
        else:
            ops.append(Add(f"{base}/replicas", d.target))
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
        return [Add(f"{base}/scaleStrategy", {"workersToDelete": pods})]
    path = f"{base}/scaleStrategy/workersToDelete"
    if not stored.workers_to_delete_present:
        return [Add(path, pods)]
    was = None if stored.workers_to_delete_null else list(stored.workers_to_delete)
    return [
        Test(path, was),
        Replace(path, pods),
    ]
