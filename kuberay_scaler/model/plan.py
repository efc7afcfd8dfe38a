"""What the planner decided, with a reason a person can read for every decision."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from kuberay_scaler.model.cluster import ClusterSpec
from kuberay_scaler.model.hosts import Host
from kuberay_scaler.model.ray import GangDemand, TaskDemand
from kuberay_scaler.model.slices import SliceMap


class DeleteKind(StrEnum):
    IDLE = "idle"  # drain every host first; delete only if every drain is accepted
    REPLACE = "replace"  # broken: delete as a unit, KubeRay creates a fresh replica


@dataclass(frozen=True)
class SliceDeletion:
    slice_key: str
    pods: tuple[str, ...]
    node_ids: tuple[str, ...]  # Ray nodes to drain (hex ids)
    kind: DeleteKind
    reason: str


@dataclass(frozen=True)
class GroupDecision:
    group: str
    index: int
    num_of_hosts: int
    current: int  # replicas as stored in the spec
    target: int
    deletions: tuple[SliceDeletion, ...] = ()
    clear_workers_to_delete: bool = False
    held: str | None = None  # why nothing (or only part) was decided for this group
    reasons: tuple[str, ...] = ()
    launching_hosts: int = 0  # hosts asked for and not yet in Ray, for the report to Ray
    new_hosts: int = 0  # of those, the hosts of slices this very plan adds (not yet written)

    @property
    def changes(self) -> bool:
        return self.target != self.current or bool(self.deletions) or self.clear_workers_to_delete


@dataclass(frozen=True)
class Infeasible:
    demand: str
    reason: str
    count: int = 1
    certain: bool = True  # no group of this cluster can ever serve it, whatever the replicas
    # What Ray asked for, so the report can name it back (ReportAutoscalingState).
    request: TaskDemand | GangDemand | None = None
    constraint: bool = False  # part of the request_resources floor


@dataclass(frozen=True)
class Backoff:
    until: datetime
    failures: int
    reason: str


@dataclass(frozen=True)
class Memory:
    """What the planner carries between loops. The loop keeps it; the planner returns a new one."""

    backoff: Mapping[str, Backoff] = field(default_factory=lambda: MappingProxyType({}))
    # Groups with a write not yet observed (expectations, kept by the loop): plan nothing for them.
    awaiting_write: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # Slices recorded on the RayCluster as being drained (group → slice keys): a restart in the
    # middle of a scale-down finishes it instead of forgetting it.
    draining: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class Snapshot:
    """The cluster as the Kubernetes side sees it right now."""

    spec: ClusterSpec
    hosts: tuple[Host, ...]
    synced: bool = True  # False while the pod cache or the RayCluster view is not trustworthy
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class Plan:
    cluster: str
    uid: str
    resource_version: str
    groups: tuple[GroupDecision, ...]
    infeasible: tuple[Infeasible, ...]
    problems: tuple[str, ...]
    slice_map: SliceMap | None
    memory: Memory
    held: str | None = None  # the whole plan held (unsynced view, unknown demand)

    @property
    def changes(self) -> bool:
        return any(g.changes for g in self.groups)

    def group(self, name: str) -> GroupDecision | None:
        return next((g for g in self.groups if g.group == name), None)

    def summary(self) -> dict[str, Any]:
        """The plan as the `plan` command and /debug/plan print it (without the patch)."""
        return {
            "cluster": self.cluster,
            "held": self.held,
            "groups": [
                {
                    "name": g.group,
                    "num_of_hosts": g.num_of_hosts,
                    "replicas": {"current": g.current, "target": g.target},
                    "delete": [
                        {"slice": d.slice_key, "pods": list(d.pods), "kind": d.kind.value}
                        for d in g.deletions
                    ],
                    "drain": [n for d in g.deletions for n in d.node_ids],
                    "clear_workers_to_delete": g.clear_workers_to_delete,
                    "held": g.held,
                    "reasons": list(g.reasons),
                }
                for g in self.groups
            ],
            "infeasible": [
                {"demand": i.demand, "count": i.count, "reason": i.reason, "certain": i.certain}
                for i in self.infeasible
            ],
            "problems": list(self.problems),
        }
