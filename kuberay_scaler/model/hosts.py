"""Pods of the cluster, reduced to what scaling decisions need."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum


class HostPhase(StrEnum):
    """Our classification of a pod, derived from phase, container state and deletion."""

    PENDING = "pending"  # not yet running: unscheduled, pulling, container waiting to start
    RUNNING = "running"  # Ray container running
    FAILED = "failed"  # Failed/Succeeded/Unknown phase or the Ray container terminated
    TERMINATING = "terminating"  # deletionTimestamp set: not capacity any more


@dataclass(frozen=True)
class Host:
    """One Ray pod (head or worker)."""

    pod_name: str
    group: str
    is_head: bool
    phase: HostPhase
    detail: str  # why it is in that phase, e.g. "Unschedulable", "CrashLoopBackOff"
    labels: Mapping[str, str]
    node_name: str | None
    created_at: datetime | None
    slice_key: str  # replica name, legacy replicaIndex, or the pod name for single-host groups
    replica_index: int | None
    host_index: int | None
    running_since: datetime | None = None  # when the Ray container started
    uid: str = ""

    @property
    def is_capacity(self) -> bool:
        """Only running, not-terminating hosts can serve work."""
        return self.phase is HostPhase.RUNNING
