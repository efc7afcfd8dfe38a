"""Capacity signals: what the cluster says about whether a group's slices can come.

The one shape every source of capacity news takes before the planner reads it. The kube adapter
(Events, where the Role lets it read them) and `plan --capture` (the Events a capture holds) turn
raw `v1 Event`s into `CapacityEvent`s through `core/parse/`; pod conditions and the provisioning
deadline are read from the slice map itself. Timestamps are the Event's own (API-server wall
clock, epoch ms): they order signals and are shown to users, they never license a deletion.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum


class CapacitySignal(StrEnum):
    # cluster-autoscaler `TriggeredScaleUp` on a pending pod: a node is being added for it.
    SCALE_UP_TRIGGERED = "scale-up-triggered"
    # cluster-autoscaler `NotTriggerScaleUp`: no node group it knows could host the pod.
    NO_SCALE_UP = "no-scale-up"
    # A scale-up failed for want of capacity (GKE: GCE out of resources / stockout).
    STOCKOUT = "stockout"
    # A scale-up or a pod creation refused by quota (cloud quota, namespace ResourceQuota).
    QUOTA = "quota"
    # Any other failed scale-up the cluster-autoscaler reports.
    SCALE_UP_FAILED = "scale-up-failed"


@dataclass(frozen=True)
class CapacityEvent:
    """One Event that bears on capacity, already classified."""

    signal: CapacitySignal
    source: str  # the reporting component, e.g. "cluster-autoscaler", "raycluster-controller"
    reason: str  # the Event's reason as posted (e.g. "FailedScaleUp")
    message: str
    last_seen_ms: int  # epoch ms: the Event's lastTimestamp / series.lastObservedTime / eventTime
    pod: str | None = None  # the involved pod, when the Event is about a pod
    group: str | None = None  # the worker group, when the Event names it (else found by pod)
    count: int = 1


# GKE's upcoming-maintenance signals on nodes (docs/capacity-signals.md, "GKE maintenance"):
# a node label (Unix epoch seconds: the start of the Compute Engine maintenance window, set
# while the maintenance is scheduled but not active), and the taint GKE's maintenance handler
# puts on a node about to be terminated.
SCHEDULED_MAINTENANCE_TIME = "cloud.google.com/scheduled-maintenance-time"
IMPENDING_NODE_TERMINATION = "cloud.google.com/impending-node-termination"


@dataclass(frozen=True)
class NodeMaintenance:
    """What a node says about maintenance coming to it."""

    node: str
    window_start_ms: int | None = None  # epoch ms: the scheduled maintenance window's start
    impending: bool = False  # tainted impending-node-termination: going now

    def describe(self) -> str:
        """Names the window (for reasons, Events and /debug/slices)."""
        if self.impending:
            return f"node {self.node} tainted {IMPENDING_NODE_TERMINATION}"
        start = datetime.fromtimestamp((self.window_start_ms or 0) / 1000, UTC)
        return f"GKE maintenance on node {self.node} at {start.isoformat()}"
