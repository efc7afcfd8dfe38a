"""The decision, and the document `plan` prints and /debug/plan shows."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kuberay_scaler.core.decision.writes import Drain, Patch, RecordIntent, Write
from kuberay_scaler.core.model.cluster import ClusterSpec
from kuberay_scaler.core.model.plan import Plan
from kuberay_scaler.core.model.ray import RayObservation
from kuberay_scaler.core.patch.ops import ops_json
from kuberay_scaler.core.planner.gate import Blocked, Evidence


@dataclass(frozen=True)
class Decision:
    plan: Plan  # already past the gate, every drain assumed accepted (what `plan` shows)
    writes: tuple[Write, ...]
    spec: ClusterSpec  # the RayCluster planned from, parsed (the patch's base)
    gcs: RayObservation | None = None
    error: str | None = None  # the plan no longer fits the object (replan)
    now: datetime | None = None  # when it was decided, wall clock (what Ray reads, people see)
    # ... and on the monotonic clock (seconds, `mono_of`): what timers are judged by.
    mono_s: float | None = None
    evidence: Evidence | None = None  # what the deletion gate judges pods by
    # Deletions the gate dropped from the plan a planner path made: non-zero is a planner bug.
    blocked: tuple[Blocked, ...] = ()

    @property
    def drains(self) -> tuple[Drain, ...]:
        return tuple(w for w in self.writes if isinstance(w, Drain))

    @property
    def record(self) -> RecordIntent | None:
        return next((w for w in self.writes if isinstance(w, RecordIntent)), None)

    @property
    def patch(self) -> Patch | None:
        return next((w for w in self.writes if isinstance(w, Patch)), None)

    def document(self) -> dict[str, Any]:
        """The plan and its writes as `plan` prints them and /debug/plan shows them."""
        patch = self.patch
        return {
            **self.plan.summary(),
            "writes": [write_document(w) for w in self.writes],
            "patch": ops_json(patch.ops) if patch else [],
            "deletions_blocked": [_blocked_doc(b) for b in self.blocked],
        }


def write_document(write: Write) -> dict[str, Any]:
    if isinstance(write, RecordIntent):
        return {
            "write": "record_intent",
            "draining": {g: list(k) for g, k in write.draining.items()},
            "ops": ops_json(write.ops),
        }
    if isinstance(write, Drain):
        return {
            "write": "drain",
            "group": write.group,
            "slice": write.slice_key,
            "node_ids": list(write.node_ids),
            "cluster_id": write.cluster_id,
            "reason": "preemption" if write.preempt else "idle_termination",
            "deadline_ms": write.deadline_ms,
            "message": write.message,
        }
    return {"write": "patch", "ops": ops_json(write.ops)}


def _blocked_doc(b: Blocked) -> dict[str, Any]:
    return {
        "group": b.group,
        "slice": b.slice_key,
        "pod": b.pod,
        "kind": b.kind.value,
        "path": b.path,
    }
