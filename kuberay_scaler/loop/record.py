"""Record: what the loop did, into metrics, logs, Events and the status the probes read.

`Recorder` is the daemon's `Sink` (loop/ports.py): the reconciler calls it and nothing else
to say what happened, so the loop's steps stay free of metrics, logging and Events. Events are
sent in the background (they never hold up a reconcile); the Events port never raises.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import structlog

from kuberay_scaler.core.decision import Decision, Drain, RecordIntent, Write
from kuberay_scaler.core.model.availability import Availability, AvailabilityChange, ChangeKind
from kuberay_scaler.core.model.plan import DeleteKind, GroupDecision, Plan
from kuberay_scaler.core.model.reasons import Action
from kuberay_scaler.core.model.slices import SliceState
from kuberay_scaler.core.planner.gate import Blocked
from kuberay_scaler.loop.handsoff import Overridden
from kuberay_scaler.loop.health import LoopStatus, Outcome, Progress, Step, Want
from kuberay_scaler.loop.ports import Events
from kuberay_scaler.runtime.metrics import (
    BLIND_SECONDS,
    DECISIONS,
    DELETIONS_BLOCKED,
    FALLBACKS,
    GROUP_AVAILABLE,
    LAST_SUCCESSFUL_RECONCILE,
    OLDEST_UNMET_WANT,
    OVERRIDES,
    RECONCILE_FAILURES,
    RECONCILE_SECONDS,
    RECONCILES,
    SLICES,
    TARGET_REPLICAS,
)

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


class Recorder:
    """Implements `control.ports.Sink`."""

    def __init__(
        self,
        events: Events,
        progress: Progress,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._events = events
        self._wall = wall
        self.status = LoopStatus(progress)
        self._background: set[asyncio.Task[None]] = set()
        self._outdated: frozenset[tuple[str, str]] = frozenset()  # outdated slices said
        self._queued: frozenset[tuple[str, str]] = frozenset()  # (group, slice) queued last

    def published(self, decision: Decision) -> None:
        self.status.last_decision = decision
        self.blocked(decision.blocked)
        result = decision.plan
        for d in result.groups:
            TARGET_REPLICAS.labels(d.group).set(d.target)
        self._availability(result)
        if result.slice_map is None:
            return
        for name, gs in result.slice_map.groups.items():
            for state in SliceState:
                SLICES.labels(name, state.value).set(len(gs.by_state(state)))
        self._say_outdated(result)
        self._queue_transitions(result)

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
            GROUP_AVAILABLE.clear()  # a group's cause label changes: no stale series left
            for d in result.groups:
                a = result.memory.availability.get(d.group)
                cause = _cause_label(
                    a.state.value if a else "", a.cause.value if a and a.cause else ""
                )
                up = a is None or a.state is not Availability.UNAVAILABLE
                GROUP_AVAILABLE.labels(d.group, cause).set(1 if up else 0)
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

    def blocked(self, blocked: Sequence[Blocked]) -> None:
        """The gate dropped a deletion a planner path made: a planner bug, said loudly."""
        for b in blocked:
            DELETIONS_BLOCKED.labels(b.path).inc()
            log.error(
                "deletion gate dropped a slice a planner path chose",
                group=b.group,
                slice=b.slice_key,
                pod=b.pod,
                kind=b.kind.value,
                path=b.path,
            )

    def carrying_out(self, decision: Decision) -> None:
        """Said before the first write, so the log reads in the order things happen."""
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

    def sent(self, ops: Sequence[Mapping[str, Any]]) -> None:
        self.status.last_patch = [dict(op) for op in ops]

    def applied(self, result: Plan) -> None:
        self._decisions(result, dry_run=False)
        for f in result.fallbacks:
            FALLBACKS.labels(f.from_group, f.to_group, f.cause).inc(f.slices)
        for d in result.groups:
            if d.changes:
                self._event(_event_reason(d), _event_text(d))

    def drains_only(self, result: Plan) -> None:
        """Nothing to patch, but slices were drained for preemption: said as an Event too."""
        for d in result.groups:
            if d.preempt:
                self._event(_event_reason(d), _event_text(d))

    def not_written(self, result: Plan) -> None:
        if result.changes:
            self._decisions(result, dry_run=True)

    def replanning(self, error: str) -> None:
        log.info("plan no longer fits the RayCluster: replanning", error=error)

    def refresh_failed(self, error: str) -> None:
        log.warning("RayCluster refresh failed", error=error)

    def forbidden(self, message: str) -> None:
        log.error("not allowed to patch the RayCluster", error=message)

    def overridden(self, notice: Overridden) -> None:
        managers = notice.managers
        OVERRIDES.labels(notice.group).inc()
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

    def recreated(self, old_uid: str, uid: str) -> None:
        log.warning("RayCluster recreated: dropping memory", old_uid=old_uid, uid=uid)

    def crashed(self, error: BaseException) -> None:
        log.error("reconcile failed", exc_info=error)

    def not_served(self, problem: str, *, event: bool) -> None:
        """The target does not exist or is not served (said once a minute by the caller)."""
        log.error("target not served", problem=problem)
        if event:
            self._event("TargetNotServed", problem)

    def giving_up(self, problem: str, after_s: float) -> None:
        log.error("giving up: target not served", problem=problem, after_s=after_s)

    def blind(self, seconds: Mapping[str, float]) -> None:
        for source, value in seconds.items():
            BLIND_SECONDS.labels(source).set(value)

    def wanted(self, wants: Mapping[str, Want], now: float) -> None:
        """The unmet wants judged after a reconcile (health.judge_wants): kept for the probes,
        their ages as a metric (a group whose want is met reads 0)."""
        progress = self.status.progress
        for group in set(progress.wants) - set(wants):
            OLDEST_UNMET_WANT.labels(group).set(0)
        for group, want in wants.items():
            OLDEST_UNMET_WANT.labels(group).set(want.age(now))
        progress.wants = dict(wants)

    def reconciled(self, outcome: Outcome, *, seconds: float, now: float) -> None:
        status = self.status
        status.reconciles += 1
        RECONCILE_SECONDS.observe(seconds)
        for group, want in status.progress.wants.items():  # ages grow on skipped ones too
            OLDEST_UNMET_WANT.labels(group).set(want.age(now))
        if outcome.step is Step.SKIPPED:
            return
        RECONCILES.labels(_RECONCILE_OUTCOME[outcome.step]).inc()
        status.last_outcome = outcome.text
        if outcome.failed:
            RECONCILE_FAILURES.labels(outcome.cause or outcome.step.value).inc()
        status.progress.record(outcome, now)
        if outcome.achieved:
            LAST_SUCCESSFUL_RECONCILE.set(self._wall().timestamp())

    # --- the parts ------------------------------------------------------------------------------

    def _decisions(self, result: Plan, *, dry_run: bool) -> None:
        for d in result.groups:
            if not d.changes:
                continue
            DECISIONS.labels(d.group, d.action.value, d.reason_code).inc()
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
