"""One reconcile: observe once → decide (pure) → report to Ray → execute the writes → record.

Per reconcile there is one GCS observation (the one the poller last pushed) and one `now`
(wall clock for the planner, monotonic for freshness and expectations); a replan after a stale
patch re-reads only the RayCluster and the pods. Every collaborator is a Protocol
(control/ports.py), so the loop runs against fakes in tests.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

import structlog

from kuberay_scaler import defaults as D
from kuberay_scaler.backoff import Backoff
from kuberay_scaler.control.execute import Executed, execute
from kuberay_scaler.control.ports import ClusterView, Events, Gcs, GcsFeed, PodStore, Writer
from kuberay_scaler.control.report import report_from_plan
from kuberay_scaler.decision import (
    Decision,
    Drain,
    Observation,
    RecordIntent,
    Write,
    decide,
)
from kuberay_scaler.kube.expectations import Expectations
from kuberay_scaler.kube.transport import MAX_RETRY_AFTER_S
from kuberay_scaler.liveness import HostClock, LivenessTracker
from kuberay_scaler.metrics import (
    DECISIONS,
    LAST_SUCCESSFUL_RECONCILE,
    OVERRIDES,
    RECONCILE_FAILURES,
    RECONCILE_SECONDS,
    RECONCILES,
    SLICES,
    TARGET_REPLICAS,
)
from kuberay_scaler.model.hosts import Host
from kuberay_scaler.model.outcome import PatchOutcome
from kuberay_scaler.model.plan import GroupDecision, Memory, Plan
from kuberay_scaler.model.ray import RayObservation
from kuberay_scaler.model.reasons import Action
from kuberay_scaler.model.slices import SliceState
from kuberay_scaler.parse.pod_cache import PodCache
from kuberay_scaler.parse.raycluster import parse_raycluster
from kuberay_scaler.planner.core import Policy

log = structlog.get_logger(__name__)

RECENT_DECISIONS = 20  # kept for /debug/slices
MAX_REPLANS = 3  # a stale patch is refreshed and replanned at most this often per reconcile
# Another writer (GitOps, kubectl scale, an in-tree autoscaler) reset a group's replicas: leave
# that group alone for this long, doubling with each override, instead of fighting it.
OVERRIDE_BACKOFF_S = 120.0
MAX_OVERRIDE_BACKOFF_S = 1800.0
OVERRIDE_MEMORY_S = 3600.0  # an override older than this no longer counts toward the backoff
# An idle slice reaches its timeout a little after the plan's idle clock says (the GCS reply
# is some way behind); waking never sooner than MIN_WAKE_S keeps a near-zero wait from spinning.
WAKE_MARGIN_S = 0.5
MIN_WAKE_S = 0.5
_SETTLED = ("no change", "dry run")  # outcomes after which the same inputs give the same plan


@dataclass(frozen=True)
class LoopConfig:
    dry_run: bool = False
    gcs_stale_after_s: float = D.GCS_STALE_AFTER_S
    drain_deadline_s: float = D.DRAIN_DEADLINE_S
    expectation_timeout_s: float = D.WRITE_EXPECTATION_TIMEOUT_S
    unhealthy_after_failures: int = D.UNHEALTHY_AFTER_FAILURES
    unhealthy_after_s: float = D.UNHEALTHY_AFTER_S


@dataclass
class LoopStatus:
    """What /healthz, /readyz and /debug/plan read."""

    last_progress: float = field(default_factory=time.monotonic)
    last_decision: Decision | None = None
    last_patch: list[dict[str, Any]] = field(default_factory=list)
    last_outcome: str = "not run yet"
    reconciles: int = 0
    # The last decisions that changed something (newest last), for /debug/slices.
    recent: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=RECENT_DECISIONS))
    last_success: float = field(default_factory=time.monotonic)  # or the start
    consecutive_failures: int = 0
    last_error: str | None = None  # of the latest failed reconcile (kept after a success)

    def health(self, now: float, config: LoopConfig) -> tuple[bool, str]:
        """Alive unless reconciles keep failing (N in a row) or none succeeded for T seconds."""
        if self.consecutive_failures >= config.unhealthy_after_failures:
            return (
                False,
                f"{self.consecutive_failures} reconciles failed in a row: {self.last_error}",
            )
        quiet = now - self.last_success
        if quiet > config.unhealthy_after_s:
            why = f"; last error: {self.last_error}" if self.last_error else ""
            return False, f"no successful reconcile for {quiet:.0f} s{why}"
        return True, f"last successful reconcile {quiet:.1f} s ago"

    @property
    def last_plan(self) -> Plan | None:
        return self.last_decision.plan if self.last_decision else None

    def document(self) -> dict[str, Any] | None:
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
            "consecutive_failures": self.consecutive_failures,
        }


@dataclass(frozen=True)
class Instant:
    """The one `now` of a reconcile, on both clocks."""

    wall: datetime
    mono: float


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
    ) -> None:
        self._config = config
        self._policy = policy
        self._pods = pods
        self._cluster = cluster
        self._feed = feed
        self._gcs = gcs
        self._writer = writer
        self._events = events
        self._wall = wall
        self._monotonic = monotonic
        self.expectations = Expectations(timeout=config.expectation_timeout_s)
        self.memory = Memory()
        self.status = LoopStatus(last_progress=monotonic(), last_success=monotonic())
        self._write_failure: str | None = None  # why this reconcile's write failed, if it did
        self._observation: RayObservation | None = None
        # When the daemon itself last saw each Ray node and pod (slices are judged from it).
        self._liveness = LivenessTracker(
            grace_s=policy.timeouts.missing_node_grace_s,
            stale_after_s=config.gcs_stale_after_s,
        )
        self._uid: str | None = None
        self._written: dict[str, int] = {}  # group → replicas our last applied write set
        self._overrides: dict[str, tuple[int, float]] = {}  # group → (overrides, hands off until)
        self._write_backoff = Backoff(initial=1.0, cap=60.0)
        self._not_before = 0.0
        self._pod_cache = PodCache()
        self._content = 0  # rises when the GCS content (not its version) changed
        self._last_inputs: tuple[object, ...] | None = None
        self.skipped = 0  # reconciles skipped because nothing the plan reads had changed
        self._wake_at: float | None = None  # monotonic: a time-driven decision is due then

    def observe_gcs(self, observation: RayObservation) -> None:
        """The poller pushes every observation here; a reconcile uses the latest one."""
        self._observation = observation
        self._liveness.observe_ray(
            observation.observed_at,
            (observation.cluster_id, observation.epoch),
            observation.alive_instances(),
        )

    def gcs_changed(self, _: RayObservation | None = None) -> None:
        """The poller saw new content (the `on_change` callback): the next reconcile plans."""
        self._content += 1

    async def reconcile(self, reasons: set[str] | None = None) -> Plan | None:
        """Run one reconcile; errors are logged and counted, never raised.

        `reasons` are what woke it (see Trigger). Woken by a change alone, it is skipped when
        nothing the plan reads differs from the last settled reconcile: pods as parsed, the
        RayCluster's spec and annotations, the GCS content (never its version, which any client's
        call raises), sync and freshness, write expectations. The timer (or no reasons) always
        plans: idle clocks and deadlines move with time alone.
        """
        started = self._monotonic()
        self._write_failure = None
        try:
            if reasons and "timer" not in reasons and self._unchanged():
                self.skipped += 1
                return self.status.last_plan
            result = await self._reconcile()
        except asyncio.CancelledError:
            raise
        except Exception as err:
            log.exception("reconcile failed")
            RECONCILES.labels("error").inc()
            self._not_before = self._monotonic() + self._write_backoff.next_delay()
            self._failed(type(err).__name__, f"{type(err).__name__}: {err}")
            return None
        else:
            RECONCILES.labels("held" if result is None or result.held else "ok").inc()
            if self._write_failure is not None:
                self._failed(self._write_failure, self.status.last_outcome)
            else:
                self._succeeded()
            return result
        finally:
            RECONCILE_SECONDS.observe(self._monotonic() - started)
            self.status.last_progress = self._monotonic()
            self.status.reconciles += 1

    def health(self) -> tuple[bool, str]:
        return self.status.health(self._monotonic(), self._config)

    def _failed(self, cause: str, text: str) -> None:
        RECONCILE_FAILURES.labels(cause).inc()
        self.status.consecutive_failures += 1
        self.status.last_error = text

    def _succeeded(self) -> None:
        self.status.consecutive_failures = 0
        self.status.last_success = self._monotonic()
        LAST_SUCCESSFUL_RECONCILE.set(self._wall().timestamp())

    async def _reconcile(self) -> Plan | None:
        now = Instant(self._wall(), self._monotonic())
        gcs = self._gcs_view(now)
        for _ in range(MAX_REPLANS):
            observed = self.observe(gcs, now)
            if observed is None:
                self.status.last_outcome = "RayCluster not found: nothing to scale"
                return None
            # In a worker thread: however long planning takes, probes and watches keep running.
            decision = await asyncio.to_thread(self.decide, observed, now)
            self._publish(decision, now)
            # Launches this plan adds are reported only when they are about to be written.
            writes = not self._config.dry_run and now.mono >= self._not_before
            # The patch first: it is what grows the cluster; the report only informs Ray.
            done = await self._act(decision, now)
            await self._report(decision, now, launches_asked=writes)
            if done:
                return decision.plan
            await self._refresh_quietly()
        self.status.last_outcome = f"still stale after {MAX_REPLANS} replans"
        self._write_failure = "stale"
        return None

    async def _act(self, decision: Decision, now: Instant) -> bool:
        """Carry the decision out. True when done with it (written, nothing to write, dry run,
        backing off, or given up); False when the RayCluster changed under it: replan."""
        if decision.error is not None:
            log.info("plan no longer fits the RayCluster: replanning", error=decision.error)
            return False
        if not decision.writes or self._config.dry_run:
            self._without_writes(decision)
            return True
        if now.mono < self._not_before:
            self.status.last_outcome = "write backoff"
            return True
        return await self._carry_out(decision)

    # --- observe and decide (no writes) --------------------------------------------------------

    def observe(self, gcs: RayObservation | None, now: Instant) -> Observation | None:
        """Read the RayCluster and pods once; None when there is no RayCluster."""
        raw = self._cluster.current()
        if raw is None:
            return None
        self._notice_recreation(raw)
        self._notice_overrides(raw, now.mono)
        self._last_inputs = self._inputs(raw, now.mono)
        parsed = self._pod_cache.hosts(self._pods.store, parse_raycluster(raw))
        return Observation(
            raycluster=raw,
            gcs=gcs,
            synced=self._pods.synced and self._cluster.synced,
            awaiting_write=self._awaiting(raw, now.mono),
            clock=self._host_clock(parsed[0], now.mono),
            parsed_pods=parsed,
        )

    def _host_clock(self, hosts: Sequence[Host], now: float) -> HostClock:
        self._liveness.observe_pods(now, hosts)
        return self._liveness.clock(now)

    def _inputs(self, raw: Mapping[str, Any], now: float) -> tuple[object, ...]:
        """What the plan reads, by content (never by resourceVersion or GCS version)."""
        spec = parse_raycluster(raw)
        self._pod_cache.hosts(self._pods.store, spec)
        observation = self._observation
        fresh = observation is not None and observation.fresh(now, self._config.gcs_stale_after_s)
        meta = raw.get("metadata", {})
        return (
            replace(spec, resource_version=""),
            meta.get("uid"),
            meta.get("annotations"),
            self._pod_cache.version,
            self._content,
            fresh,
            self._pods.synced and self._cluster.synced,
            self._awaiting(raw, now),
        )

    def seconds_to_wake(self) -> float | None:
        """How long until a decision that time alone brings is due (an idle slice reaching its
        timeout); the loop waits no longer than this for a change. None: nothing is due."""
        if self._wake_at is None:
            return None
        return max(0.0, self._wake_at - self._monotonic())

    def _unchanged(self) -> bool:
        raw = self._cluster.current()
        if raw is None or self._last_inputs is None:
            return False
        if self._wake_at is not None and self._monotonic() >= self._wake_at:
            return False
        if self.status.last_outcome not in _SETTLED:
            return False
        return self._inputs(raw, self._monotonic()) == self._last_inputs

    def decide(self, observed: Observation, now: Instant) -> Decision:
        return decide(observed, self.memory, self._policy, now.wall, self._config.drain_deadline_s)

    def _gcs_view(self, now: Instant) -> RayObservation | None:
        """The latest observation when recent enough to plan from (or to name as unusable)."""
        observation = self._observation
        if (
            observation is None
            or now.mono - observation.observed_at > self._config.gcs_stale_after_s
        ):
            return None
        if observation.state is None and not observation.unusable:
            return None
        return observation

    def _awaiting(self, raw: Mapping[str, Any], now: float) -> dict[str, str]:
        groups = _group_specs(raw)
        awaiting = {
            name: f"another writer set its replicas ({count}× so far): left alone for"
            f" {until - now:.0f} s more instead of fighting it"
            for name, (count, until) in self._overrides.items()
            if now < until
        }
        awaiting.update(
            {
                name: "waiting to observe our last write to this group"
                for name in self.expectations.groups()
                if self.expectations.pending(name, groups.get(name), now)
            }
        )
        return awaiting

    def _notice_overrides(self, raw: Mapping[str, Any], now: float) -> None:
        """A group whose replicas differ from what we wrote, once our write was seen: overridden."""
        groups = _group_specs(raw)
        for name, ours in list(self._written.items()):
            spec = groups.get(name)
            if spec is None or self.expectations.pending(name, spec, now):
                continue
            theirs = spec.get("replicas", 0)
            if theirs == ours:
                continue
            del self._written[name]  # their value is the truth until our next write
            count, until = self._overrides.get(name, (0, 0.0))
            count = 1 if now - until > OVERRIDE_MEMORY_S else count + 1
            delay = min(MAX_OVERRIDE_BACKOFF_S, OVERRIDE_BACKOFF_S * 2 ** (count - 1))
            self._overrides[name] = (count, now + delay)
            OVERRIDES.labels(name).inc()
            managers = _recent_managers(raw)
            log.warning(
                "replicas overridden by another writer",
                group=name,
                ours=ours,
                theirs=theirs,
                field_managers=managers,
                overrides=count,
                hands_off_s=delay,
            )
            self._background_event(
                "OverriddenByAnotherWriter",
                f"group {name}: replicas {ours} (ours) reset to {theirs} by another writer"
                f" ({', '.join(managers) or 'unknown field manager'}); kuberay-scaler leaves"
                f" the group alone for {delay:.0f} s (override {count})",
            )

    def _notice_recreation(self, raw: Mapping[str, Any]) -> None:
        uid = raw.get("metadata", {}).get("uid")
        if self._uid is not None and uid != self._uid:
            log.warning("RayCluster recreated: dropping memory", old_uid=self._uid, uid=uid)
            self.memory = Memory()
            self.expectations.forget()
        self._uid = uid

    # --- writes ------------------------------------------------------------------------------

    def _without_writes(self, decision: Decision) -> None:
        self.status.last_outcome = "dry run" if self._config.dry_run else "no change"
        if decision.plan.changes:
            self._log_decisions(decision.plan, dry_run=True)

    async def _carry_out(self, decision: Decision) -> bool:
        """Execute the writes. True when done (applied or given up), False to replan."""
        # Said before the first write, so the log reads in the order things happen.
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
        done = await execute(
            decision, writer=self._writer, gcs=self._gcs, feed=self._feed, view=self._cluster
        )
        self._keep_preemptions(decision, done.refused)
        if done.step == "patch" and done.sent:
            self.status.last_patch = list(done.sent)
        if done.replan:
            self.status.last_outcome = _outcome_text(done)
            return False
        if done.applied:
            assert done.outcome is not None
            self._applied(done.plan, done.outcome)
            return True
        if done.outcome is None:  # every slice kept and nothing else to write
            self.status.last_outcome = "nothing to patch"
            return True
        return self._handle_failure(done.outcome)

    def _keep_preemptions(self, decision: Decision, refused: frozenset[tuple[str, str]]) -> None:
        """Remember the deadlines of slices drained for preemption (a refused one is retried)."""
        keep = {
            key: deadline
            for key, deadline in decision.plan.memory.preempting.items()
            if not any(key == s for _, s in refused)
        }
        self.memory = replace(self.memory, preempting=MappingProxyType(keep))

    def _applied(self, result: Plan, outcome: PatchOutcome) -> None:
        now = self._monotonic()
        for d in result.groups:
            if not d.changes:
                continue
            if d.spec_changes:
                self._written[d.group] = d.target
            pods = [p for x in d.deletions for p in x.pods]
            self.expectations.expect(
                d.group,
                replicas=d.target,
                workers_to_delete=pods if (pods or d.clear_workers_to_delete) else None,
                now=now,
            )
        if outcome.obj is not None:
            self._cluster.observe(outcome.obj)
        self.memory = replace(result.memory, awaiting_write={}, draining={})
        self._write_backoff.reset()
        self.status.last_outcome = "applied"
        self._log_decisions(result, dry_run=False)
        for d in result.groups:
            if d.changes:
                self._record_event(d)

    def _handle_failure(self, outcome: PatchOutcome) -> bool:
        self.status.last_outcome = f"patch {outcome.kind}: {outcome.message}"
        if outcome.kind not in (
            "throttled",
            "gone",
        ):  # asked to wait / nothing to scale: not a fault
            self._write_failure = f"patch_{outcome.kind}"
        now = self._monotonic()
        if outcome.kind == "throttled":
            # Honoured, but never longer than the transport's cap (a fake or a proxy may say more).
            self._not_before = now + min(outcome.retry_after or 1.0, MAX_RETRY_AFTER_S)
        elif outcome.kind != "gone":
            self._not_before = now + self._write_backoff.next_delay()
        if outcome.kind == "forbidden":
            log.error("not allowed to patch the RayCluster", error=outcome.message)
        return True

    async def _refresh_quietly(self) -> None:
        try:
            await self._cluster.refresh()
        except Exception as err:  # the view's own errors: the next reconcile retries
            log.warning("RayCluster refresh failed", error=str(err))

    # --- edges: report, metrics, logs, Events ------------------------------------------------

    async def _report(self, decision: Decision, now: Instant, *, launches_asked: bool) -> None:
        """Tell Ray what we are doing, so `ray status` shows it."""
        gcs = decision.gcs
        if gcs is None or decision.plan.slice_map is None:
            return
        report = report_from_plan(
            decision.plan, int(now.wall.timestamp()), gcs.version, launches_asked=launches_asked
        )
        await self._gcs.report(report)

    def _publish(self, decision: Decision, now: Instant) -> None:
        self.status.last_decision = decision
        result = decision.plan
        expiry = result.next_idle_expiry_s
        self._wake_at = (
            None if expiry is None else now.mono + max(MIN_WAKE_S, expiry + WAKE_MARGIN_S)
        )
        for d in result.groups:
            TARGET_REPLICAS.labels(d.group).set(d.target)
        if result.slice_map is None:
            return
        for name, gs in result.slice_map.groups.items():
            for state in SliceState:
                SLICES.labels(name, state.value).set(len(gs.by_state(state)))

    def _log_decisions(self, result: Plan, *, dry_run: bool) -> None:
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

    def _record_event(self, d: GroupDecision) -> None:
        reason = _EVENT_REASONS.get(d.action, "Updated")
        slices = ", ".join(x.slice_key for x in d.deletions)
        message = f"group {d.group}: replicas {d.current}->{d.target}" + (
            f"; slices {slices}" if slices else ""
        )
        message += f" ({'; '.join(map(str, d.reasons))[:500]})"
        self._background_event(reason, message)

    def _background_event(self, reason: str, message: str) -> None:
        task = asyncio.get_running_loop().create_task(self._events.record(reason, message))
        _background.add(task)
        task.add_done_callback(_background.discard)


def _write_text(write: Write) -> str:
    if isinstance(write, RecordIntent):
        return f"record draining {dict(write.draining)}"
    if isinstance(write, Drain):
        why = "preemption" if write.preempt else "idle termination"
        return f"drain {write.group}/{write.slice_key} ({len(write.node_ids)} hosts, {why})"
    return f"patch ({len(write.ops)} ops)"


_background: set[asyncio.Task[None]] = set()
_EVENT_REASONS = {Action.SCALE_UP: "ScaledUp", Action.SCALE_DOWN: "ScaledDown"}


def _group_specs(raw: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {
        str(g.get("groupName")): g
        for g in raw.get("spec", {}).get("workerGroupSpecs") or []
        if isinstance(g, Mapping)
    }


def _recent_managers(raw: Mapping[str, Any]) -> list[str]:
    """Field managers that last wrote the spec (metadata.managedFields), newest first."""
    entries = raw.get("metadata", {}).get("managedFields") or []
    spec_writers = [
        e for e in entries if isinstance(e, Mapping) and "f:spec" in (e.get("fieldsV1") or {})
    ]
    spec_writers.sort(key=lambda e: str(e.get("time") or ""), reverse=True)
    return [str(e.get("manager")) for e in spec_writers if e.get("manager")]


def _outcome_text(done: Executed) -> str:
    if done.outcome is None:
        return "plan no longer fits the RayCluster"
    return f"{done.step} {done.outcome.kind}: {done.outcome.message}"
