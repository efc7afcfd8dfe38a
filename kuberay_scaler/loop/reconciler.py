"""One reconcile: observe → decide (pure) → execute the writes → record.

The Reconciler only sequences the steps; each lives in its own room and is tested alone:
`observe.Observer.snapshot` reads every input once, `decision.decide` plans, `execute.execute`
carries the writes out, and `_remember` keeps what became of them (the loop's memory,
expectations, the write backoff). Each step returns a value; the reconcile folds them into one
`ReconcileReport` (loop/reconcile_report.py) and hands it to the one `record.Recorder` at its end
(metrics, logs, Events, the status the probes read); `health` names how the reconcile ended. Per
reconcile there is one GCS observation (the one the poller last pushed) and one `now` (wall clock
for the planner, monotonic for freshness and expectations); a replan after a stale patch re-reads
only the RayCluster. Every collaborator is a Protocol (loop/ports.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from kuberay_scaler.core.decision import Decision, decide
from kuberay_scaler.core.model.plan import Memory, Plan, mono_of
from kuberay_scaler.core.model.ray import RayObservation
from kuberay_scaler.core.planner.policy import Policy
from kuberay_scaler.loop.config import LoopConfig
from kuberay_scaler.loop.execute import Executed, WriteBackoff, execute
from kuberay_scaler.loop.health import (
    DrainErrors,
    LoopStatus,
    Outcome,
    Progress,
    Reading,
    Step,
    reading_of,
)
from kuberay_scaler.loop.observe import Instant, Observer, Snapshot
from kuberay_scaler.loop.ports import (
    CapacityFeed,
    ClusterView,
    Events,
    Gcs,
    GcsFeed,
    NodeFeed,
    PodStore,
    Writer,
)
from kuberay_scaler.loop.reconcile_report import (
    Attempt,
    Carried,
    ReconcileReport,
    Recreated,
    Seen,
)
from kuberay_scaler.loop.record import Recorder, say_carrying_out
from kuberay_scaler.loop.report import report_for
from kuberay_scaler.loop.trigger import Schedule
from kuberay_scaler.runtime.metrics import Metrics

__all__ = ["Instant", "Reconciler"]

MAX_REPLANS = 3  # a stale patch is refreshed and replanned at most this often per reconcile
_NOT_FOUND = "RayCluster not found: nothing to scale"


class Reconciler:
    def __init__(
        self,
        *,
        config: LoopConfig,
        policy: Policy,
        pods: PodStore,
        cluster: ClusterView,
        feed: GcsFeed,
        gcs: Gcs,
        writer: Writer,
        events: Events | None = None,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        monotonic: Callable[[], float] = time.monotonic,
        recorder: Recorder | None = None,
        metrics: Metrics | None = None,
        capacity: CapacityFeed | None = None,
        nodes: NodeFeed | None = None,
    ) -> None:
        """`recorder` says every reconcile (app.py builds it); without one, a recorder of its
        own is made from `events` and `metrics` (a fresh `Metrics` when none is given)."""
        self._config, self._policy = config, policy
        self._cluster, self._feed, self._gcs, self._writer = cluster, feed, gcs, writer
        self._wall, self._monotonic = wall, monotonic
        self._pods = pods
        self.observer = Observer(pods, cluster, config.observing(policy), capacity, nodes)
        if recorder is None:
            if events is None:
                raise TypeError("a Reconciler needs a recorder, or the Events to make one")
            progress = Progress(
                monotonic(), config.unhealthy_after_s, config.unhealthy_after_failures
            )
            recorder = Recorder(
                events, progress, wall, metrics=metrics or Metrics(), monotonic=monotonic
            )
        self.recorder = recorder
        self.memory = Memory()
        self._backoff = WriteBackoff()
        self._drain_errors = DrainErrors()
        self.schedule = Schedule()  # when time alone asks for a plan; what settled last
        self.skipped = 0  # reconciles skipped because nothing the plan reads had changed
        self._unknown: dict[str, float] = {}  # this reconcile's sources not fresh → seconds
        self._last_plan: Plan | None = None  # the last decision's plan (a skip settles on it)

    @property
    def status(self) -> LoopStatus:
        return self.recorder.status

    @property
    def metrics(self) -> Metrics:
        return self.recorder.metrics

    def observe_gcs(self, observation: RayObservation) -> None:
        """The poller pushes every observation here; a reconcile uses the latest one."""
        self.observer.see_ray(observation)

    def gcs_changed(self, _: object = None) -> None:
        """The poller saw new content (the `on_change` callback): the next reconcile plans."""
        self.observer.ray_changed()

    def health(self) -> tuple[bool, str]:
        return self.recorder.health()

    def document(self) -> dict[str, Any] | None:
        """/debug/plan."""
        return self.recorder.document()

    def seconds_to_wake(self) -> float | None:
        """How long until a decision that time alone brings is due (an idle slice reaching its
        timeout, any deadline the plan holds passing); the loop waits no longer than this for a
        change. None: nothing is due."""
        return self.schedule.seconds_to_wake(self._monotonic())

    async def reconcile(self, reasons: set[str] | None = None) -> Plan | None:
        """Run one reconcile and say it (the recorder); errors are recorded, never raised."""
        report = await self.run(reasons)
        self.recorder.record(report)
        return report.plan

    async def run(self, reasons: set[str] | None = None) -> ReconcileReport:
        """One reconcile, as its report (not yet said); errors are reported, never raised.

        `reasons` are what woke it (see Trigger). Woken by a change alone, it is skipped when
        nothing the plan reads differs from the last settled reconcile; the timer (or no
        reasons) always plans: idle clocks and deadlines move with time alone.
        """
        now = Instant(self._wall(), self._monotonic())
        report = await self._reconcile(now, timer=not reasons or "timer" in reasons)
        if report.crashed is not None:
            self._backoff.crashed(self._monotonic())
        if report.skipped:
            self.skipped += 1
            return replace(report, ended=self._monotonic())
        reading = self._reading(report.outcome, report.plan, now)
        return replace(report, reading=reading, ended=self._monotonic())

    def _reading(self, outcome: Outcome, result: Plan | None, now: Instant) -> Reading:
        """What health judges the unmet wants by after this reconcile (health.judge_wants)."""
        failed = outcome.failed or outcome.step is Step.BACKOFF
        # A dry run wants nothing of the cluster: only its inputs can be unmet.
        plan = replace(result, groups=()) if result and self._config.dry_run else result
        # Slices the plan will retry: their refused-drain backoff (monotonic) is still running.
        mono = mono_of(now.mono, now.wall)
        retried = {k for k, v in self.memory.refused.items() if v.until > mono}
        return reading_of(plan, self._unknown, failed=failed, refused=retried)

    async def _reconcile(self, now: Instant, *, timer: bool) -> ReconcileReport:
        done: tuple[Attempt, ...] = ()  # the passes finished (a replan starts another)
        attempt: Attempt | None = None  # the pass under way

        def ended(outcome: Outcome, plan: Plan | None = None) -> ReconcileReport:
            so_far = (*done, attempt) if attempt is not None else done
            return ReconcileReport(outcome, so_far, plan, began=now.mono)

        try:
            seen, attempt = self._observe(now)
            if seen is None:
                return ended(Outcome(Step.BLIND, _NOT_FOUND))
            if not timer and self.schedule.unchanged(seen.inputs, now.mono):
                return ended(Outcome(Step.SKIPPED, "skipped"), self._last_plan)
            for _ in range(MAX_REPLANS):
                # In a worker thread: however long planning takes, probes and watches keep running.
                decision = await asyncio.to_thread(self.decide, seen, now)
                attempt = replace(attempt, decision=decision)
                self._publish(decision, now)
                attempt, outcome = await self._execute(attempt, decision, seen, now)
                outcome = self._drain_errors.judge(outcome, self.memory.refused)
                await self._report(decision, now)
                if outcome is not None:
                    # Nothing written: the same inputs would give the same plan.
                    quiet = not decision.writes or self._config.dry_run
                    self.schedule.settled(seen.inputs if quiet and not outcome.failed else None)
                    return ended(outcome, decision.plan)
                refresh_failed = await self._refresh()
                done, attempt = (*done, replace(attempt, refresh_failed=refresh_failed)), None
                seen, attempt = self._observe(now)
                if seen is None:
                    return ended(Outcome(Step.BLIND, _NOT_FOUND))
            self.schedule.settled(None)
            failed = Outcome(Step.FAILED, f"still stale after {MAX_REPLANS} replans", "stale")
            return ended(failed)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            error = Outcome(Step.ERROR, f"{type(err).__name__}: {err}", type(err).__name__)
            return replace(ended(error), crashed=err)

    # --- observe ---------------------------------------------------------------------------------

    def _observe(self, now: Instant) -> tuple[Snapshot | None, Attempt]:
        seen = self.observer.snapshot(now)
        if seen is None:
            blind, unknown = self.observer.blindness(now.mono, found=False)
            self._unknown = {s: blind[s] for s in unknown}
            return None, Attempt(Seen(blind))
        self._unknown = {s: seen.blind[s] for s in seen.unknown}
        recreated = None
        if seen.recreated is not None:
            uid = seen.observation.spec.uid if seen.observation.spec else ""
            recreated = Recreated(seen.recreated, uid)
            self.memory = Memory()
        return seen, Attempt(Seen(seen.blind, recreated, tuple(seen.overridden)))

    # --- decide ----------------------------------------------------------------------------------

    def decide(self, seen: Snapshot, now: Instant) -> Decision:
        return decide(
            seen.observation,
            self.memory,
            self._policy,
            now.wall,
            mono_s=now.mono,  # every timer that licenses a deletion (the GCS replies too)
            memo=self.observer.memo,  # the observer's, carried across frames
        )

    def _publish(self, decision: Decision, now: Instant) -> None:
        self._last_plan = decision.plan
        # Memory that time alone moves is kept from every decision, written or not.
        kept = decision.plan.memory
        self.memory = replace(
            self.memory,
            broken_busy_since=kept.broken_busy_since,
            availability=kept.availability,
            queued_unneeded_since=kept.queued_unneeded_since,
            reservations=kept.reservations,
        )
        self.schedule.planned(decision.plan.next_wake_s, now.mono)

    # --- execute ---------------------------------------------------------------------------------

    async def _execute(
        self, attempt: Attempt, decision: Decision, seen: Snapshot, now: Instant
    ) -> tuple[Attempt, Outcome | None]:
        """Carry the decision out; the outcome is None when the RayCluster changed under it
        (replan)."""
        if decision.error is not None:
            return replace(attempt, carried=Carried.REPLAN), None
        held = Outcome.blind(seen.unknown, self.observer.demand_pending())
        if not decision.writes or self._config.dry_run:
            attempt = replace(attempt, carried=Carried.NOT_WRITTEN)
            if self._config.dry_run:
                return attempt, held or Outcome(Step.DRY_RUN, "dry run")
            return attempt, held or Outcome.done("no change")
        if not self._backoff.open(now.mono):
            return replace(attempt, carried=Carried.BACKOFF), Outcome(
                Step.BACKOFF, "write backoff", demand=True
            )
        # Said before the first write: a drain may take a while, and the log reads in order.
        say_carrying_out(decision)
        executed = await execute(
            decision,
            writer=self._writer,
            gcs=self._gcs,
            feed=self._feed,
            view=self._cluster,
            pods=self._pods,
        )
        attempt = replace(attempt, carried=Carried.SENT, executed=executed)
        return attempt, self._remember(executed, held, planned_at=now.mono)

    # --- remember --------------------------------------------------------------------------------

    def _remember(
        self, executed: Executed, held: Outcome | None, *, planned_at: float
    ) -> Outcome | None:
        """What became of the writes, remembered (memory, schedule, backoff); None: replan."""
        self.memory = executed.remembered(self.memory)
        # Deadlines set once the drains answered (a partly drained slice) wake the loop too.
        self.schedule.planned(executed.plan.next_wake_s, planned_at)
        if executed.replan:
            return None
        self._drain_errors.answered(executed.answered, executed.drain_errors)
        failed = Outcome.step_failed(executed.record_failed, executed.drain_errors)
        outcome = executed.outcome
        if outcome is None:  # every slice kept and nothing else to write
            return failed or held or Outcome.done("nothing to patch")
        if not executed.applied:
            self._backoff.failed(outcome, self._monotonic())
            return Outcome.write_failed(outcome, executed.step)
        self.observer.wrote(executed.plan, self._monotonic())
        if outcome.obj is not None:
            self._cluster.observe(outcome.obj)
        self._backoff.applied()
        return failed or held or Outcome.done("applied")

    async def _refresh(self) -> str | None:
        """Re-read the RayCluster before a replan; the error, when the read failed."""
        try:
            await self._cluster.refresh()
        except Exception as err:  # the view's own errors: the next reconcile retries
            return str(err)
        return None

    # --- report to Ray ---------------------------------------------------------------------------

    async def _report(self, decision: Decision, now: Instant) -> None:
        """Tell Ray what we are doing, so `ray status` shows it. Launches this plan adds are
        reported only when they are about to be written (not in dry run or write backoff)."""
        asked = not self._config.dry_run and self._backoff.open(now.mono)
        report = report_for(decision, int(now.wall.timestamp()), launches_asked=asked)
        if report is not None:
            await self._gcs.report(report)
