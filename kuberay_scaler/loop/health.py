"""Health judged by progress, and whether the target is served at all. Pure; time passed in.

A reconcile ends in one `Step` (loop/reconciler.py says which). Progress is achieved when
the inputs were fresh and every planned write was done (or there was nothing to write, or dry
run). Work is outstanding from a reconcile that planned writes it did not get done (a failed or
backed-off write, a refused step, an exception), or that was blind (an input unknown or stale)
while the last thing it knew was demand or work. The loop is unhealthy when work is outstanding
and nothing was achieved for `unhealthy_after_s`, or after `unhealthy_after_failures` failed
attempts since the last achievement, whatever the cause.

Health is also judged by outcome: `judge_wants` keeps, per group, the oldest *want*
the plan has had that the cluster does not show yet (replicas to reach, pods to delete), and a
want of the whole cluster while an input is unknown (what is wanted cannot be evaluated). The
loop is unhealthy when the oldest unmet want is older than `unhealthy_after_s`, whatever the
reconciles in between returned: a write that fails and then sits in a backoff (plans that write
nothing) does not hide it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from kuberay_scaler.core.decision import Decision
from kuberay_scaler.core.model.outcome import PatchOutcome
from kuberay_scaler.core.model.plan import GroupDecision, Plan
from kuberay_scaler.core.model.reasons import HoldKind
from kuberay_scaler.core.model.slices import SliceMap
from kuberay_scaler.core.planner.gate import SliceRef

# Asked to wait / nothing to scale: not a failed write.
_NOT_FAULTS = ("throttled", "gone")


class Step(StrEnum):
    """How one reconcile ended."""

    DONE = "done"  # fresh inputs, every planned write done (or none planned)
    DRY_RUN = "dry_run"  # fresh inputs, planned and not written on purpose
    SKIPPED = "skipped"  # nothing the plan reads changed since a settled reconcile
    BLIND = "blind"  # an input unknown or stale: the plan held
    BACKOFF = "backoff"  # writes planned, not tried (write backoff, Retry-After)
    FAILED = "failed"  # a write failed, or still stale after the replans
    ERROR = "error"  # the reconcile raised


@dataclass(frozen=True)
class Outcome:
    """One reconcile as health and the records see it."""

    step: Step
    text: str  # what /debug/plan shows as the last outcome
    cause: str | None = None  # failures: the metric's cause label (exception type, patch_<kind>)
    demand: bool = False  # the Ray state it last knew had demand pending

    @property
    def achieved(self) -> bool:
        return self.step in (Step.DONE, Step.DRY_RUN)

    @classmethod
    def done(cls, text: str) -> Outcome:
        return cls(Step.DONE, text)

    @classmethod
    def blind(cls, unknown: Collection[str], demand: bool) -> Outcome | None:
        """Held because an input is unknown or stale: not progress, whatever else went through."""
        if not unknown:
            return None
        return cls(Step.BLIND, f"blind: {', '.join(sorted(unknown))} not fresh", demand=demand)

    @classmethod
    def write_failed(cls, outcome: PatchOutcome, step: str) -> Outcome:
        """A write (`step`: "record" or "patch") that was not applied: waiting on a 429 is
        backoff, a RayCluster gone is blind, anything else failed."""
        text = f"{step} {outcome.kind}: {outcome.message}"
        if outcome.kind == "throttled":
            return cls(Step.BACKOFF, text, demand=True)
        if outcome.kind == "gone":
            return cls(Step.BLIND, text)
        return cls(Step.FAILED, text, f"patch_{outcome.kind}")

    @classmethod
    def step_failed(
        cls, record_failed: PatchOutcome | None, drain_errors: Collection[SliceRef]
    ) -> Outcome | None:
        """A step before the patch that failed while the rest went (never a success)."""
        if record_failed is not None and record_failed.kind not in _NOT_FAULTS:
            kind, message = record_failed.kind, record_failed.message
            return cls(Step.FAILED, f"record {kind}: {message}", f"record_{kind}")
        if drain_errors:
            failing = ", ".join(f"{g}/{k}" for g, k in sorted(drain_errors))
            return cls(Step.FAILED, f"drain failed for {failing}", "drain_error")
        return None

    @property
    def failed(self) -> bool:
        return self.step in (Step.FAILED, Step.ERROR)


class DrainErrors:
    """Slices whose drain erred (not refused: failed). Such a slice stays work not done until a
    drain of it answers or it leaves the plan's refusal backoff (gone, or retried)."""

    def __init__(self) -> None:
        self._erring: set[SliceRef] = set()

    def answered(self, answered: Collection[SliceRef], erred: Collection[SliceRef]) -> None:
        """The slices drained this time, and those of them a host of which erred."""
        self._erring -= set(answered) - set(erred)
        self._erring |= set(erred)

    def judge(self, outcome: Outcome | None, refused: Collection[str]) -> Outcome | None:
        """`outcome`, unless a drain is still failing: then the reconcile did not achieve it.
        `refused`: the slice keys in the plan's refusal backoff."""
        self._erring = {ref for ref in self._erring if ref[1] in refused}
        if outcome is None or not outcome.achieved or not self._erring:
            return outcome
        failing = ", ".join(f"{g}/{k}" for g, k in sorted(self._erring))
        return Outcome(Step.BACKOFF, f"drain failing for {failing}", demand=True)


# Whole-plan holds under which no want can be judged (a suspended cluster wants nothing).
_CANNOT_JUDGE = (HoldKind.NOT_SYNCED, HoldKind.DEMAND_UNKNOWN)

# The key of the want every group shares: inputs fresh enough to know what is wanted at all.
INPUTS = "*"


@dataclass(frozen=True)
class Want:
    """What the plan wants of one group that the cluster does not show yet, since when."""

    group: str
    what: str  # for /healthz and /debug/plan
    since: float  # monotonic: when this want (or an older unmet one of the group) began
    target: int | None = None  # replicas wanted; None: the inputs want (INPUTS)
    deleted: frozenset[str] = frozenset()  # pods wanted gone
    failing: bool = False  # a write for it failed: a plan that drops it is retrying, not done

    def age(self, now: float) -> float:
        return max(0.0, now - self.since)

    def shown_by(self, view: GroupView) -> bool:
        return view.current == self.target and not self.deleted & view.present


@dataclass(frozen=True)
class GroupView:
    """One group as this reconcile's plan saw it and what it wanted of it."""

    current: int  # replicas in the spec
    target: int
    deleted: frozenset[str]  # pods the plan deletes
    present: frozenset[str]  # the group's pods that exist and are not named in workersToDelete
    retrying: bool  # a slice of it is in a refused-drain backoff still running (retried later)

    @property
    def wants(self) -> bool:
        return self.target != self.current or bool(self.deleted)

    def text(self) -> str:
        gone = f", delete {', '.join(sorted(self.deleted))}" if self.deleted else ""
        return f"replicas {self.current}->{self.target}{gone}"


@dataclass(frozen=True)
class Reading:
    """One reconcile as the want judgement reads it."""

    groups: Mapping[str, GroupView] | None  # None: no plan to judge by (error, held, not found)
    unknown: Mapping[str, float]  # sources not fresh → seconds they have been so
    failed: bool = False  # writes were planned and not carried out (failed or backed off)


def reading_of(
    plan: Plan | None, unknown: Mapping[str, float], *, failed: bool, refused: Collection[str]
) -> Reading:
    """The judgement's view of one reconcile (`refused`: slice keys whose refused-drain backoff
    is still running: the plan retries them later)."""
    if plan is None or plan.slice_map is None:
        return Reading(None, unknown, failed)
    if plan.held is not None and plan.held.kind in _CANNOT_JUDGE:
        return Reading(None, unknown, failed)
    slice_map = plan.slice_map
    return Reading(
        {d.group: _group_view(slice_map, d, refused) for d in plan.groups}, unknown, failed
    )


def _group_view(slice_map: SliceMap, d: GroupDecision, refused: Collection[str]) -> GroupView:
    gs = slice_map.groups.get(d.group)
    named = set(gs.group.workers_to_delete) if gs is not None else set()
    slices = gs.slices if gs is not None else ()
    return GroupView(
        current=d.current,
        target=d.target,
        deleted=frozenset(p for x in d.deletions for p in x.pods),
        present=frozenset(p for s in slices for p in s.pod_names if p not in named),
        retrying=any(s.key in refused for s in slices),
    )


def judge_wants(previous: Mapping[str, Want], reading: Reading, now: float) -> dict[str, Want]:
    """The unmet wants after one reconcile (pure; `now` monotonic).

    A group's want ends when the cluster shows it, or when a plan on fresh inputs no longer
    wants anything of the group and nothing is being retried for it (a failed want whose slice
    sits in a running refused-drain backoff is kept; once the backoff ends the plan retries it,
    and a plan that no longer wants it then, the slice busy say, withdraws it). A new want of a
    group whose older want is unmet keeps the older one's age. While an input is unknown nothing
    can be judged: every want is kept, and the INPUTS want counts from when the blindness began.
    """
    if reading.unknown:
        sources = ", ".join(sorted(reading.unknown))
        began = now - max(reading.unknown.values())
        since = previous[INPUTS].since if INPUTS in previous else began
        blind = Want(INPUTS, f"know what is wanted: {sources} not fresh", since)
        return {**previous, INPUTS: blind}
    kept = {g: w for g, w in previous.items() if g != INPUTS}
    if reading.groups is None:
        return kept
    out: dict[str, Want] = {}
    for group, view in reading.groups.items():
        before = kept.get(group)
        if before is not None and before.shown_by(view):
            before = None
        if view.wants:
            out[group] = Want(
                group,
                view.text(),
                before.since if before else now,
                view.target,
                view.deleted,
                reading.failed or (before is not None and before.failing),
            )
        elif before is not None and before.failing and view.retrying:
            out[group] = before
    return out


def oldest_want(wants: Mapping[str, Want]) -> Want | None:
    return min(wants.values(), key=lambda w: w.since, default=None)


@dataclass
class Progress:
    """When the loop last achieved what it planned, and what it is failing at since."""

    started: float
    unhealthy_after_s: float
    unhealthy_after_failures: int
    last_achieved: float | None = None
    work: str | None = None  # what is outstanding since the last achievement
    failures: int = 0  # failed attempts since the last achievement
    last_error: str | None = None  # kept after a success, for /debug/plan
    wants: Mapping[str, Want] = field(default_factory=dict)  # unmet, by group (judge_wants)

    def record(self, outcome: Outcome, now: float) -> None:
        if outcome.achieved:
            self.last_achieved, self.work, self.failures = now, None, 0
            return
        if outcome.failed:
            self.failures += 1
            self.last_error = outcome.text
            self.work = outcome.text
        elif outcome.step is Step.BACKOFF:
            self.work = self.work or outcome.text
        elif outcome.step is Step.BLIND and (outcome.demand or self.work):
            self.work = f"{outcome.text}" + (f" (and before: {self.work})" if self.work else "")
            self.work = self.work[:500]

    def health(self, now: float) -> tuple[bool, str]:
        """Unhealthy for any of: the oldest unmet want too old (said first: which group, what),
        too many failures in a row, no achievement for too long while there is work."""
        quiet = now - (self.last_achieved if self.last_achieved is not None else self.started)
        why = []
        oldest = oldest_want(self.wants)
        if oldest is not None and oldest.age(now) > self.unhealthy_after_s:
            why.append(
                f"group {oldest.group}: wanted for {oldest.age(now):.0f} s and not shown by the"
                f" cluster: {oldest.what}"
            )
        if self.failures >= self.unhealthy_after_failures:
            why.append(f"{self.failures} reconciles failed in a row: {self.last_error}")
        elif self.work is not None and quiet > self.unhealthy_after_s:
            why.append(
                f"no successful reconcile for {quiet:.0f} s while there is work: {self.work}"
            )
        elif why and self.last_error:
            why.append(f"last error: {self.last_error}")
        if why:
            return False, "; ".join(why)
        if self.last_achieved is None:
            return True, f"no reconcile achieved yet ({quiet:.0f} s since start)"
        return True, f"last successful reconcile {quiet:.1f} s ago"


@dataclass(frozen=True)
class Access:
    """What the Kubernetes side said when the daemon last asked (from the adapters)."""

    raycluster_synced: bool
    raycluster_found: bool
    raycluster_failure: int | None = None  # HTTP status of the last failed RayCluster request
    pods_failure: int | None = None  # HTTP status of the last failed pod list/watch


def target_problem(access: Access, target: str) -> str | None:
    """Why the target is not served (not a server that is down: that has no status), or None."""
    rc = access.raycluster_failure
    if rc == 404:
        return (
            f"RayCluster {target} is not served: the API server answers 404 for its resource"
            " (is KUBERAY_CRD_VER a version the RayCluster CRD serves?)"
        )
    if rc in (401, 403):
        return f"RayCluster {target}: not allowed to read it (HTTP {rc}); check the token and RBAC"
    if access.pods_failure in (401, 403):
        return (
            f"pods of RayCluster {target}: not allowed to list/watch them"
            f" (HTTP {access.pods_failure}); check the token and RBAC"
        )
    if access.raycluster_synced and not access.raycluster_found:
        return (
            f"RayCluster {target} not found (is RAY_CLUSTER_NAME right, and KUBERAY_CRD_VER a"
            " version its CRD serves?): nothing to scale"
        )
    return None


@dataclass
class GiveUp:
    """How long the target has been not served; says so once a minute; gives up after a while."""

    after_s: float
    say_every_s: float = 60.0
    since: float | None = None
    last_said: float | None = None

    def check(self, problem: str | None, now: float) -> tuple[bool, bool]:
        """(say it now, give up now) for the problem seen at `now`."""
        if problem is None:
            self.since = self.last_said = None
            return False, False
        if self.since is None:
            self.since = now
        say = self.last_said is None or now - self.last_said >= self.say_every_s
        if say:
            self.last_said = now
        return say, now - self.since >= self.after_s


RECENT_DECISIONS = 20  # kept for /debug/slices


@dataclass
class LoopStatus:
    """What /healthz, /readyz and /debug/plan read (the Recorder keeps it)."""

    progress: Progress
    last_decision: Decision | None = None
    last_patch: list[dict[str, Any]] = field(default_factory=list)
    last_outcome: str = "not run yet"
    reconciles: int = 0
    # The last decisions that changed something (newest last), for /debug/slices.
    recent: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=RECENT_DECISIONS))

    @property
    def last_plan(self) -> Plan | None:
        return self.last_decision.plan if self.last_decision else None

    @property
    def last_error(self) -> str | None:
        return self.progress.last_error

    def document(self, now: float) -> dict[str, Any] | None:
        """/debug/plan: the last decision (plan and writes) and what became of it."""
        if self.last_decision is None and self.last_error is None:
            return None
        return {
            **(self.last_decision.document() if self.last_decision else {}),
            "last_outcome": self.last_outcome,
            "last_patch_sent": self.last_patch,
            "reconciles": self.reconciles,
            "recent_decisions": list(self.recent),
            "last_error": self.last_error,
            "consecutive_failures": self.progress.failures,
            "outstanding_work": self.progress.work,
            "unmet_wants": [
                {"group": w.group, "want": w.what, "age_s": round(w.age(now), 1)}
                for w in sorted(self.progress.wants.values(), key=lambda w: w.since)
            ],
        }
