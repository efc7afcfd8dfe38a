"""Record: one reconcile's report into metrics, logs, Events and the status the probes read.

`Recorder.record` takes the `ReconcileReport` each reconcile returns (loop/reconcile_report.py)
and says all of it, in the order it happened: so the loop's steps stay free of metrics, logging
and Events, and a test can hand a recorder a report built by hand. The metrics are the
recorder's own (`runtime.metrics.Metrics`, made by the composition root). Events are sent in the
background (they never hold up a reconcile); the Events port never raises.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import structlog

from kuberay_scaler.core.decision import Decision, Drain, RecordIntent, Write
from kuberay_scaler.core.model.availability import Availability, AvailabilityChange, ChangeKind
from kuberay_scaler.core.model.plan import DeleteKind, GroupDecision, Plan
from kuberay_scaler.core.model.reasons import Action
from kuberay_scaler.core.model.slices import SliceState
from kuberay_scaler.core.patch.ops import ops_json
from kuberay_scaler.core.planner.gate import Blocked
from kuberay_scaler.loop.execute import Executed, WriteStep
from kuberay_scaler.loop.handsoff import Overridden
from kuberay_scaler.loop.health import LoopStatus, Outcome, Progress, Step, Want, judge_wants
from kuberay_scaler.loop.ports import Events
from kuberay_scaler.loop.reconcile_report import Attempt, Carried, ReconcileReport, Seen
from kuberay_scaler.runtime.metrics import Metrics

log = structlog.get_logger("kuberay_scaler.loop.reconciler")

_EVENT_REASONS = {Action.SCALE_UP: "ScaledUp", Action.SCALE_DOWN: "ScaledDown"}
# How a reconcile's step counts in kuberay_scaler_reconciles_total.
_RECONCILE_OUTCOME = {
    Step.DONE: "ok",
    Step.DRY_RUN: "ok",
    Step.BLIND: "held",
    Step.BACKOFF: "held",
    Step.FAILED: "error",
    Step.ERROR: "error",
}


def say_carrying_out(decision: Decision) -> None:
    """The one line said before a reconcile ends: the writes about to go, logged before the
    first of them (a drain may take a while), so the log reads in the order things happen."""
    log.info(
        "decided",
        groups=[
            f"{d.group}: {d.action.value} {d.current}->{d.target}"
            + (f" ({'; '.join(map(str, d.reasons))})" if d.reasons else "")
            for d in decision.plan.groups
            if d.changes
        ],
        writes=[_write_text(w) for w in decision.writes],
    )


class Recorder:
    """Says each reconcile's report; keeps the status the probes and /debug pages read."""

    def __init__(
        self,
        events: Events,
        progress: Progress,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        *,
        metrics: Metrics,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._events = events
        self._wall, self._monotonic = wall, monotonic
        self.metrics = metrics
        self.status = LoopStatus(progress)
        self._background: set[asyncio.Task[None]] = set()
        self._outdated: frozenset[tuple[str, str]] = frozenset()  # outdated slices said
        self._queued: frozenset[tuple[str, str]] = frozenset()  # (group, slice) queued last

    def health(self) -> tuple[bool, str]:
        """/healthz: judged by progress and the unmet wants (health.Progress.health)."""
        return self.status.progress.health(self._monotonic())

    def document(self) -> dict[str, Any] | None:
        """/debug/plan and /debug/slices: the last decision and what became of it."""
        return self.status.document(self._monotonic())

    def record(self, report: ReconcileReport) -> None:
        """Say one reconcile: each pass in order, then how it ended and what health reads."""
        for attempt in report.attempts:
            self._attempt(attempt)
        if report.crashed is not None:
            log.error("reconcile failed", exc_info=report.crashed)
        if report.reading is not None:
            previous = self.status.progress.wants
            self._wanted(judge_wants(previous, report.reading, report.ended), report.ended)
        self._reconciled(report.outcome, seconds=report.seconds, now=report.ended)

    async def settle(self) -> None:
        """Wait for the Events sent so far (tests; the daemon never waits on them)."""
        while self._background:
            await asyncio.gather(*list(self._background))

    def _attempt(self, attempt: Attempt) -> None:
        self._seen(attempt.seen)
        decision = attempt.decision
        if decision is None:
            return
        self._published(decision)
        if attempt.carried is Carried.REPLAN:
            log.info("plan no longer fits the RayCluster: replanning", error=decision.error)
        elif attempt.carried is Carried.NOT_WRITTEN and decision.plan.changes:
            self._decisions(decision.plan, dry_run=True)
        elif attempt.executed is not None:
            self._executed(attempt.executed)
        if attempt.refresh_failed is not None:
            log.warning("RayCluster refresh failed", error=attempt.refresh_failed)

    def _seen(self, seen: Seen) -> None:
        for source, value in seen.blind.items():
            self.metrics.blind_seconds.labels(source).set(value)
        if seen.recreated is not None:
            old, uid = seen.recreated.old_uid, seen.recreated.uid
            log.warning("RayCluster recreated: dropping memory", old_uid=old, uid=uid)
        for notice in seen.overridden:
            self._overridden(notice)

    def _published(self, decision: Decision) -> None:
        self.status.last_decision = decision
        self._blocked(decision.blocked)
        result = decision.plan
        for d in result.groups:
            self.metrics.target_replicas.labels(d.group).set(d.target)
        self._availability(result)
        if result.slice_map is None:
            return
        for name, gs in result.slice_map.groups.items():
            for state in SliceState:
                self.metrics.slices.labels(name, state.value).set(len(gs.by_state(state)))
        self._say_outdated(result)
        self._queue_transitions(result)

    def _executed(self, executed: Executed) -> None:
        """What became of the writes: the patch sent, then as it ended."""
        self._blocked(executed.blocked)
        if executed.step is WriteStep.PATCH and executed.sent:
            self.status.last_patch = ops_json(executed.sent)
        outcome = executed.outcome
        if executed.replan:
            return
        if outcome is None:  # nothing patched: slices drained for preemption say so
            self._drains_only(executed.plan)
        elif executed.applied:
            self._applied(executed.plan)
        elif outcome.kind == "forbidden":
            log.error("not allowed to patch the RayCluster", error=outcome.message)

    def _say_outdated(self, result: Plan) -> None:
        """A spec edit that left slices built to the older spec is said at once, once per
        slice: a warning line and an Event (the plan's reasons and /debug/slices say it too)."""
        assert result.slice_map is not None
        found = {
            (name, sl.key): sl
            for name, gs in result.slice_map.groups.items()
            for sl in gs.by_state(SliceState.OUTDATED)
        }
        for name, key in sorted(found.keys() - self._outdated):
            reason = found[(name, key)].reason
            log.warning("slice outdated by a spec edit", group=name, slice=key, why=reason)
            self._event("SliceOutdated", f"group {name}: slice {key} {reason}")
        self._outdated = frozenset(found)

    def _availability(self, result: Plan) -> None:
        """Each group's availability as a gauge; each transition said once (log and Event)."""
        if result.held is None:
            # A group's cause label changes: no stale series left.
            self.metrics.group_available.clear()
            for d in result.groups:
                a = result.memory.availability.get(d.group)
                cause = _cause_label(
                    a.state.value if a else "", a.cause.value if a and a.cause else ""
                )
                up = a is None or a.state is not Availability.UNAVAILABLE
                self.metrics.group_available.labels(d.group, cause).set(1 if up else 0)
        for line, change in capacity_lines(result):
            # Suspect comes with every new TPU slice (Unschedulable until its node exists).
            said = log.warning if change.kind in _LOSSES else log.info
            said("capacity", group=change.group, change=change.kind.value, text=line)
            reason = _CHANGE_EVENTS.get(change.kind)
            if reason is not None:
                self._event(reason, line)

    def _queue_transitions(self, result: Plan) -> None:
        """A log line when a slice enters a queue (Kueue's gate) and when it leaves it."""
        assert result.slice_map is not None
        slices = {
            (name, sl.key): sl for name, gs in result.slice_map.groups.items() for sl in gs.slices
        }
        queued = frozenset(k for k, sl in slices.items() if sl.state is SliceState.QUEUED)
        for group, key in sorted(queued - self._queued):
            log.info("slice queued", group=group, slice=key, reason=slices[(group, key)].reason)
        for group, key in sorted(self._queued - queued):
            now = slices.get((group, key))
            state = now.state.value if now is not None else "gone"
            log.info("slice left the queue", group=group, slice=key, state=state)
        self._queued = queued

    def _blocked(self, blocked: Sequence[Blocked]) -> None:
        """The gate dropped a deletion a planner path made: a planner bug, said loudly."""
        for b in blocked:
            self.metrics.deletions_blocked.labels(b.path).inc()
            log.error(
                "deletion gate dropped a slice a planner path chose",
                group=b.group,
                slice=b.slice_key,
                pod=b.pod,
                kind=b.kind.value,
                path=b.path,
            )

    def _applied(self, result: Plan) -> None:
        self._decisions(result, dry_run=False)
        for f in result.fallbacks:
            self.metrics.fallbacks.labels(f.from_group, f.to_group, f.cause).inc(f.slices)
        for d in result.groups:
            if d.changes:
                self._event(_event_reason(d), _event_text(d))

    def _drains_only(self, result: Plan) -> None:
        """Nothing to patch, but slices were drained for preemption: said as an Event too."""
        for d in result.groups:
            if d.preempt:
                self._event(_event_reason(d), _event_text(d))

    def _overridden(self, notice: Overridden) -> None:
        managers = notice.managers
        self.metrics.overrides.labels(notice.group).inc()
        log.warning(
            "replicas overridden by another writer",
            group=notice.group,
            ours=notice.ours,
            theirs=notice.theirs,
            field_managers=list(managers),
            overrides=notice.count,
            hands_off_s=notice.hands_off_s,
        )
        self._event(
            "OverriddenByAnotherWriter",
            f"group {notice.group}: replicas {notice.ours} (ours) reset to {notice.theirs} by"
            f" another writer ({', '.join(managers) or 'unknown field manager'}); kuberay-scaler"
            f" leaves the group alone for {notice.hands_off_s:.0f} s (override {notice.count})",
        )

    def _wanted(self, wants: Mapping[str, Want], now: float) -> None:
        """The unmet wants judged after a reconcile (health.judge_wants): kept for the probes,
        their ages as a metric (a group whose want is met reads 0)."""
        progress = self.status.progress
        for group in set(progress.wants) - set(wants):
            self.metrics.oldest_unmet_want.labels(group).set(0)
        for group, want in wants.items():
            self.metrics.oldest_unmet_want.labels(group).set(want.age(now))
        progress.wants = dict(wants)

    def _reconciled(self, outcome: Outcome, *, seconds: float, now: float) -> None:
        status, metrics = self.status, self.metrics
        status.reconciles += 1
        metrics.reconcile_seconds.observe(seconds)
        for group, want in status.progress.wants.items():  # ages grow on skipped ones too
            metrics.oldest_unmet_want.labels(group).set(want.age(now))
        if outcome.step is Step.SKIPPED:
            return
        metrics.reconciles.labels(_RECONCILE_OUTCOME[outcome.step]).inc()
        status.last_outcome = outcome.text
        if outcome.failed:
            metrics.reconcile_failures.labels(outcome.cause or outcome.step.value).inc()
        status.progress.record(outcome, now)
        if outcome.achieved:
            metrics.last_successful_reconcile.set(self._wall().timestamp())

    # --- the target, watched by the composition root (not a reconcile) -------------------------

    def not_served(self, problem: str, *, event: bool) -> None:
        """The target does not exist or is not served (said once a minute by the caller)."""
        log.error("target not served", problem=problem)
        if event:
            self._event("TargetNotServed", problem)

    def giving_up(self, problem: str, after_s: float) -> None:
        log.error("giving up: target not served", problem=problem, after_s=after_s)

    # --- the parts ------------------------------------------------------------------------------

    def _decisions(self, result: Plan, *, dry_run: bool) -> None:
        for d in result.groups:
            if not d.changes:
                continue
            self.metrics.decisions.labels(d.group, d.action.value, d.reason_code).inc()
            self.status.recent.append(
                {
                    "at": self._wall().isoformat(timespec="seconds"),
                    "group": d.group,
                    "action": d.action.value,
                    "replicas": f"{d.current}->{d.target}",
                    "slices": [x.slice_key for x in (*d.deletions, *d.preempt)],
                    "reasons": [str(r) for r in d.reasons],
                    "dry_run": dry_run,
                }
            )
            log.info(
                "decision",
                group=d.group,
                action=d.action.value,
                reason_code=d.reason_code,
                replicas=f"{d.current}->{d.target}",
                slices=[x.slice_key for x in d.deletions],
                reason="; ".join(map(str, d.reasons)),
                dry_run=dry_run,
            )

    def _event(self, reason: str, message: str) -> None:
        task = asyncio.get_running_loop().create_task(self._events.record(reason, message))
        self._background.add(task)
        task.add_done_callback(self._background.discard)


_LOSSES = (ChangeKind.MARKED, ChangeKind.PROBE_FAILED)
_CHANGE_EVENTS = {
    ChangeKind.MARKED: "GroupUnavailable",
    ChangeKind.PROBE_FAILED: "GroupUnavailable",
    ChangeKind.PROBE: "GroupProbing",
    ChangeKind.RECOVERED: "GroupAvailable",
}


def _cause_label(state: str, cause: str) -> str:
    if cause:
        return cause
    return "suspect" if state == Availability.SUSPECT.value else "none"


def capacity_lines(result: Plan) -> list[tuple[str, AvailabilityChange]]:
    """One sentence per availability transition, as the morning log should read it: "v6e
    unavailable (stockout): GCE out of resources (cluster-autoscaler, 12:03:10); 1 pending
    slice cancelled; demand → v5e; v6e probed again at 12:06:10"."""
    out = []
    for change in result.availability_changes:
        text = str(change)
        if change.kind in (ChangeKind.MARKED, ChangeKind.PROBE_FAILED):
            decision = result.group(change.group)
            cancelled = [
                x for x in (decision.deletions if decision else ()) if x.kind is DeleteKind.CANCEL
            ]
            if cancelled:
                text += f"; {len(cancelled)} pending slice(s) cancelled"
            to = sorted({f.to_group for f in result.fallbacks if f.from_group == change.group})
            if to:
                text += f"; demand → {', '.join(to)}"
            probe_s = result.next_probe_s.get(change.group)
            if probe_s is not None:
                at = datetime.fromtimestamp(result.wall_ms / 1000 + probe_s, UTC)
                text += (
                    f"; {change.group} probed again at {at.strftime('%H:%M:%S')}"
                    f" (in {change.backoff_s:.0f} s)"
                )
        out.append((text, change))
    return out


def _event_reason(d: GroupDecision) -> str:
    if d.preempt and not d.spec_changes:
        return "DrainingForPreemption"
    return _EVENT_REASONS.get(d.action, "Updated")


def _event_text(d: GroupDecision) -> str:
    slices = ", ".join(x.slice_key for x in d.deletions)
    message = f"group {d.group}: replicas {d.current}->{d.target}" + (
        f"; slices {slices}" if slices else ""
    )
    return message + f" ({'; '.join(map(str, d.reasons))[:500]})"


def _write_text(write: Write) -> str:
    if isinstance(write, RecordIntent):
        return f"record draining {dict(write.draining)}"
    if isinstance(write, Drain):
        why = "preemption" if write.preempt else "idle termination"
        return f"drain {write.group}/{write.slice_key} ({len(write.node_ids)} hosts, {why})"
    return f"patch ({len(write.ops)} ops)"
