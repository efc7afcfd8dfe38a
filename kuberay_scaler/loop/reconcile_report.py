"""One reconcile as one value: what it saw, decided, wrote, what was refused or failed, how long
it took and what health judges it by.

The Reconciler builds a `ReconcileReport` from the values its steps return (no I/O here, nothing
filled in place) and hands it to the one `record.Recorder`, which turns it into metrics, logs,
Events and the status the probes read. A reconcile may plan more than once (a stale patch is
refreshed and replanned): each pass is one `Attempt`, in order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from kuberay_scaler.core.decision import Decision
from kuberay_scaler.core.model.plan import Plan
from kuberay_scaler.core.planner.gate import Blocked
from kuberay_scaler.loop.execute import Executed
from kuberay_scaler.loop.handsoff import Overridden
from kuberay_scaler.loop.health import Outcome, Reading, Step


@dataclass(frozen=True)
class Recreated:
    """The RayCluster was deleted and created again under the same name: memory dropped."""

    old_uid: str
    uid: str


@dataclass(frozen=True)
class Seen:
    """One observation of the inputs."""

    # Source → seconds it has been unknown or stale (0 while fresh).
    blind: Mapping[str, float] = field(default_factory=dict)
    recreated: Recreated | None = None
    overridden: tuple[Overridden, ...] = ()  # another writer reset a group's replicas


class Carried(StrEnum):
    """What became of a decision's writes."""

    REPLAN = "replan"  # the plan no longer fits the RayCluster (Decision.error): refresh, replan
    NOT_WRITTEN = "not_written"  # nothing to write, or dry run
    BACKOFF = "backoff"  # writes planned, held by the write backoff
    SENT = "sent"  # carried out: `Attempt.executed` says how far they got


@dataclass(frozen=True)
class Attempt:
    """One observe → decide → execute pass."""

    seen: Seen
    decision: Decision | None = None  # None: nothing planned (not found, skipped, or re-observed)
    carried: Carried | None = None  # None: not got that far
    executed: Executed | None = None  # Carried.SENT: how far the writes got
    refresh_failed: str | None = None  # the RayCluster re-read before the replan failed

    @property
    def blocked(self) -> tuple[Blocked, ...]:
        """Deletions the gate dropped: when planned, and after the drains answered."""
        planned = self.decision.blocked if self.decision is not None else ()
        return (*planned, *(self.executed.blocked if self.executed is not None else ()))


@dataclass(frozen=True)
class ReconcileReport:
    """Everything one reconcile has to say, said once at its end."""

    outcome: Outcome
    attempts: tuple[Attempt, ...] = ()
    plan: Plan | None = None  # what the reconcile settled on (the last one, when skipped)
    reading: Reading | None = None  # what health judges the wants by; None: not judged (skip)
    began: float = 0.0  # monotonic
    ended: float = 0.0  # monotonic
    crashed: Exception | None = field(default=None, compare=False)  # the reconcile raised

    @property
    def seconds(self) -> float:
        return self.ended - self.began

    @property
    def skipped(self) -> bool:
        return self.outcome.step is Step.SKIPPED

    @property
    def decisions(self) -> tuple[Decision, ...]:
        return tuple(a.decision for a in self.attempts if a.decision is not None)

    @property
    def blocked(self) -> tuple[Blocked, ...]:
        return tuple(b for a in self.attempts for b in a.blocked)
