"""One reconcile: observe → decide (pure) → execute the writes → record.

Each step is its own room: `observe.Observer.snapshot` reads every input once,
`decision.decide` plans, `execute.execute` carries the writes out, and the `Sink`
(`record.Recorder`) says what happened in metrics, logs, Events and the status the probes read.
Per reconcile there is one GCS observation (the one the poller last pushed) and one `now` (wall
clock for the planner, monotonic for freshness and expectations); a replan after a stale patch
re-reads only the RayCluster. Every collaborator is a Protocol (loop/ports.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from types import MappingProxyType

from kuberay_scaler.core import defaults as D
from kuberay_scaler.core.backoff import Backoff
from kuberay_scaler.core.decision import Decision, decide
from kuberay_scaler.core.model.outcome import PatchOutcome
from kuberay_scaler.core.model.plan import Memory, Plan
from kuberay_scaler.core.model.ray import RayObservation
from kuberay_scaler.core.planner.core import Policy
from kuberay_scaler.loop.execute import Executed, execute, say_blocked
from kuberay_scaler.loop.handsoff import OverrideBackoff
from kuberay_scaler.loop.health import LoopStatus, Outcome, Progress, Step
from kuberay_scaler.loop.observe import Instant, ObserveConfig, Observer, Snapshot
from kuberay_scaler.loop.ports import ClusterView, Events, Gcs, GcsFeed, PodStore, Sink, Writer
from kuberay_scaler.loop.record import Recorder
from kuberay_scaler.loop.report import report_from_plan

__all__ = ["Instant", "LoopConfig", "Reconciler"]

MAX_REPLANS = 3  # a stale patch is refreshed and replanned at most this often per reconcile
# An idle slice reaches its timeout a little after the plan's idle clock says (the GCS reply
# is some way behind); waking never sooner than MIN_WAKE_S keeps a near-zero wait from spinning.
WAKE_MARGIN_S = 0.5
MIN_WAKE_S = 0.5
_NOT_FAULTS = ("throttled", "gone")  # asked to wait / nothing to scale: not a failed write


@dataclass(frozen=True)
class LoopConfig:
    dry_run: bool = False
    gcs_stale_after_s: float = D.GCS_STALE_AFTER_S
    drain_deadline_s: float = D.DRAIN_DEADLINE_S
    expectation_timeout_s: float = D.WRITE_EXPECTATION_TIMEOUT_S
    unhealthy_after_failures: int = D.UNHEALTHY_AFTER_FAILURES
    unhealthy_after_s: float = D.UNHEALTHY_AFTER_S
    override: OverrideBackoff = field(default_factory=OverrideBackoff)


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
        events: Events,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        monotonic: Callable[[], float] = time.monotonic,
        sink: Sink | None = None,
    ) -> None:
        self._config, self._policy = config, policy
        self._cluster, self._feed, self._gcs, self._writer = cluster, feed, gcs, writer
        self._wall, self._monotonic = wall, monotonic
        self.observer = Observer(
            pods,
            cluster,
            ObserveConfig(
                gcs_stale_after_s=config.gcs_stale_after_s,
                missing_node_grace_s=policy.timeouts.missing_node_grace_s,
                expectation_timeout_s=config.expectation_timeout_s,
                override=config.override,
            ),
        )
        progress = Progress(monotonic(), config.unhealthy_after_s, config.unhealthy_after_failures)
        self.sink: Sink = sink or Recorder(events, progress, wall)
        self.memory = Memory()
        self._write_backoff = Backoff(initial=1.0, cap=60.0)
        self._not_before = 0.0
        self._settled: tuple[object, ...] | None = None  # inputs of the last settled reconcile
        self._wake_at: float | None = None  # monotonic: a time-driven decision is due then
        self._drain_errors: dict[tuple[str, str], str] = {}  # slices whose drain erred: why
        self.skipped = 0  # reconciles skipped because nothing the plan reads had changed

    @property
    def status(self) -> LoopStatus:
        return self.sink.status

    def observe_gcs(self, observation: RayObservation) -> None:
        """The poller pushes every observation here; a reconcile uses the latest one."""
        self.observer.see_ray(observation)

    def gcs_changed(self, _: object = None) -> None:
        """The poller saw new content (the `on_change` callback): the next reconcile plans."""
        self.observer.ray_changed()

    def health(self) -> tuple[bool, str]:
        return self.status.progress.health(self._monotonic())

    def seconds_to_wake(self) -> float | None:
        """How long until a decision that time alone brings is due (an idle slice reaching its
        timeout); the loop waits no longer than this for a change. None: nothing is due."""
        return None if self._wake_at is None else max(0.0, self._wake_at - self._monotonic())

    async def reconcile(self, reasons: set[str] | None = None) -> Plan | None:
        """Run one reconcile; errors are recorded, never raised.

        `reasons` are what woke it (see Trigger). Woken by a change alone, it is skipped when
        nothing the plan reads differs from the last settled reconcile; the timer (or no
        reasons) always plans: idle clocks and deadlines move with time alone.
        """
        now = Instant(self._wall(), self._monotonic())
        try:
            outcome, result = await self._reconcile(now, timer=not reasons or "timer" in reasons)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            self.sink.crashed(err)
            self._not_before = self._monotonic() + self._write_backoff.next_delay()
            outcome = Outcome(Step.ERROR, f"{type(err).__name__}: {err}", type(err).__name__)
            result = None
        if outcome.step is Step.SKIPPED:
            self.skipped += 1
        self.sink.reconciled(outcome, seconds=self._monotonic() - now.mono, now=self._monotonic())
        return result

    async def _reconcile(self, now: Instant, *, timer: bool) -> tuple[Outcome, Plan | None]:
        seen = self._observe(now)
        if seen is None:
            return Outcome(Step.BLIND, "RayCluster not found: nothing to scale"), None
        if not timer and self._unchanged(seen, now):
            return Outcome(Step.SKIPPED, "skipped"), self.status.last_plan
        for _ in range(MAX_REPLANS):
            # In a worker thread: however long planning takes, probes and watches keep running.
            decision = await asyncio.to_thread(self.decide, seen, now)
            self._publish(decision, now)
            outcome = self._unless_drains_fail(await self._act(decision, seen, now))
            await self._report(decision, now)
            if outcome is not None:
                # Nothing written: the same inputs would give the same plan.
                quiet = not decision.writes or self._config.dry_run
                self._settled = seen.inputs if quiet and not outcome.failed else None
                return outcome, decision.plan
            await self._refresh()
            seen = self._observe(now)
            if seen is None:
                return Outcome(Step.BLIND, "RayCluster not found: nothing to scale"), None
        self._settled = None
        return Outcome(Step.FAILED, f"still stale after {MAX_REPLANS} replans", "stale"), None

    # --- observe ---------------------------------------------------------------------------------

    def _observe(self, now: Instant) -> Snapshot | None:
        seen = self.observer.snapshot(now)
        if seen is None:
            self.sink.blind(self.observer.blindness(now.mono, found=False)[0])
            return None
        self.sink.blind(seen.blind)
        if seen.recreated is not None:
            uid = seen.observation.spec.uid if seen.observation.spec else ""
            self.sink.recreated(seen.recreated, uid)
            self.memory = Memory()
        for notice in seen.overridden:
            self.sink.overridden(notice)
        return seen

    def _unchanged(self, seen: Snapshot, now: Instant) -> bool:
        if self._wake_at is not None and now.mono >= self._wake_at:
            return False
        return self._settled is not None and seen.inputs == self._settled

    # --- decide ----------------------------------------------------------------------------------

    def decide(self, seen: Snapshot, now: Instant) -> Decision:
        return decide(
            seen.observation, self.memory, self._policy, now.wall, self._config.drain_deadline_s
        )

    def _publish(self, decision: Decision, now: Instant) -> None:
        self.sink.published(decision)
        say_blocked(decision.blocked)
        # Memory that time alone moves is kept from every decision, written or not.
        self.memory = replace(
            self.memory,
            broken_busy_since=decision.plan.memory.broken_busy_since,
            joining=decision.plan.memory.joining,
        )
        expiry = decision.plan.next_idle_expiry_s
        self._wake_at = (
            None if expiry is None else now.mono + max(MIN_WAKE_S, expiry + WAKE_MARGIN_S)
        )

    # --- execute ---------------------------------------------------------------------------------

    async def _act(self, decision: Decision, seen: Snapshot, now: Instant) -> Outcome | None:
        """Carry the decision out; None when the RayCluster changed under it (replan)."""
        if decision.error is not None:
            self.sink.replanning(decision.error)
            return None
        blind = _blind_outcome(seen, self.observer.demand_pending())
        if not decision.writes or self._config.dry_run:
            self.sink.not_written(decision.plan)
            if blind is not None:
                return blind
            return Outcome(Step.DRY_RUN, "dry run") if self._config.dry_run else _done("no change")
        if now.mono < self._not_before:
            return Outcome(Step.BACKOFF, "write backoff", demand=True)
        self.sink.carrying_out(decision)
        done = await execute(
            decision, writer=self._writer, gcs=self._gcs, feed=self._feed, view=self._cluster
        )
        return self._executed(decision, done, blind)

    def _unless_drains_fail(self, outcome: Outcome | None) -> Outcome | None:
        """A slice whose drain erred (not refused: failed) stays work not done until a drain of
        it answers or it leaves the plan's refusal backoff (gone, or retried)."""
        refused = self.memory.refused
        self._drain_errors = {r: e for r, e in self._drain_errors.items() if r[1] in refused}
        if outcome is None or not outcome.achieved or not self._drain_errors:
            return outcome
        failing = ", ".join(f"{g}/{k}" for g, k in sorted(self._drain_errors))
        return Outcome(Step.BACKOFF, f"drain failing for {failing}", demand=True)

    def _executed(
        self, decision: Decision, done: Executed, blind: Outcome | None
    ) -> Outcome | None:
        self._keep_preemptions(done)
        if done.step == "patch" and done.sent:
            self.sink.sent(done.sent)
        if done.replan:
            return None
        for ref in done.answered - done.drain_errors:
            self._drain_errors.pop(ref, None)
        self._drain_errors.update({ref: "drain error" for ref in done.drain_errors})
        failed = self._failed_step(done)
        if done.outcome is None:  # every slice kept and nothing else to write
            self.sink.drains_only(done.plan)
            return failed or blind or _done("nothing to patch")
        if not done.applied:
            return self._failed_write(done.outcome, done.step)
        self.observer.wrote(done.plan, self._monotonic())
        if done.outcome.obj is not None:
            self._cluster.observe(done.outcome.obj)
        self.memory = replace(done.plan.memory, awaiting_write={}, draining={})
        self._write_backoff.reset()
        self.sink.applied(done.plan)
        return failed or blind or _done("applied")

    def _failed_step(self, done: Executed) -> Outcome | None:
        """A step before the patch that failed while the rest went (never a success)."""
        record = done.record_failed
        if record is not None and record.kind not in _NOT_FAULTS:
            return Outcome(
                Step.FAILED, f"record {record.kind}: {record.message}", f"record_{record.kind}"
            )
        if done.drain_errors:
            failing = ", ".join(f"{g}/{k}" for g, k in sorted(done.drain_errors))
            return Outcome(Step.FAILED, f"drain failed for {failing}", "drain_error")
        return None

    def _failed_write(self, outcome: PatchOutcome, step: str) -> Outcome:
        now = self._monotonic()
        text = f"{step} {outcome.kind}: {outcome.message}"
        if outcome.kind == "throttled":
            # Honoured, but never longer than the transport's cap (a fake or a proxy may say more).
            self._not_before = now + min(outcome.retry_after or 1.0, D.MAX_RETRY_AFTER_S)
            return Outcome(Step.BACKOFF, text, demand=True)
        if outcome.kind == "gone":
            return Outcome(Step.BLIND, text)
        self._not_before = now + self._write_backoff.next_delay()
        if outcome.kind == "forbidden":
            self.sink.forbidden(outcome.message)
        return Outcome(Step.FAILED, text, f"patch_{outcome.kind}")

    def _keep_preemptions(self, done: Executed) -> None:
        """Remember the deadlines of slices drained for preemption (a refused one is retried)
        and the drain backoff of refused slices, whatever became of the patch."""
        keep = {
            key: deadline
            for key, deadline in done.plan.memory.preempting.items()
            if not any(key == s for _, s in done.refused)
        }
        self.memory = replace(
            self.memory, preempting=MappingProxyType(keep), refused=done.plan.memory.refused
        )

    async def _refresh(self) -> None:
        try:
            await self._cluster.refresh()
        except Exception as err:  # the view's own errors: the next reconcile retries
            self.sink.refresh_failed(str(err))

    # --- report to Ray ---------------------------------------------------------------------------

    async def _report(self, decision: Decision, now: Instant) -> None:
        """Tell Ray what we are doing, so `ray status` shows it. Launches this plan adds are
        reported only when they are about to be written (not in dry run or write backoff)."""
        gcs = decision.gcs
        if gcs is None or decision.plan.slice_map is None:
            return
        asked = not self._config.dry_run and now.mono >= self._not_before
        report = report_from_plan(
            decision.plan, int(now.wall.timestamp()), gcs.version, launches_asked=asked
        )
        await self._gcs.report(report)


def _done(text: str) -> Outcome:
    return Outcome(Step.DONE, text)


def _blind_outcome(seen: Snapshot, demand: bool) -> Outcome | None:
    """Held because an input is unknown or stale: not progress, whatever else went through."""
    if seen.fresh:
        return None
    return Outcome(Step.BLIND, f"blind: {', '.join(sorted(seen.unknown))} not fresh", demand=demand)
