"""One reconcile: snapshot → plan → drain (all-or-nothing per slice) → guarded patch → record."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import structlog

from kuberay_scaler.backoff import Backoff
from kuberay_scaler.control.intent import clear_ops, read_draining, record_ops
from kuberay_scaler.control.report import report_from_plan
from kuberay_scaler.kube.events import EventRecorder
from kuberay_scaler.kube.expectations import Expectations
from kuberay_scaler.kube.informer import Informer
from kuberay_scaler.kube.raycluster import RayClusterView
from kuberay_scaler.kube.transport import ApiError, NoResponse
from kuberay_scaler.kube.writer import PatchOutcome, RayClusterWriter
from kuberay_scaler.metrics import (
    DECISIONS,
    RECONCILE_SECONDS,
    RECONCILES,
    SLICES,
    TARGET_REPLICAS,
)
from kuberay_scaler.model.plan import DeleteKind, GroupDecision, Memory, Plan, Snapshot
from kuberay_scaler.model.reasons import Action
from kuberay_scaler.model.slices import SliceState
from kuberay_scaler.parse.pods import parse_pods
from kuberay_scaler.parse.ray_state import RayStateError, parse_ray_state
from kuberay_scaler.parse.raycluster import parse_raycluster
from kuberay_scaler.patch.ops import PatchError, build_patch, drop_deletions
from kuberay_scaler.planner.core import Policy, plan
from kuberay_scaler.ray_gcs.client import GcsClient
from kuberay_scaler.ray_gcs.drain import deadline_in, drain_slice
from kuberay_scaler.ray_gcs.errors import GcsError
from kuberay_scaler.ray_gcs.poller import GcsPoller
from kuberay_scaler.ray_gcs.report import build_autoscaling_state

log = structlog.get_logger(__name__)

MAX_REPLANS = 3  # a stale patch is refreshed and replanned at most this often per reconcile


@dataclass(frozen=True)
class LoopConfig:
    dry_run: bool = False
    gcs_stale_after_s: float = 15.0
    drain_deadline_s: float = 30.0
    expectation_timeout_s: float = 60.0


@dataclass
class LoopStatus:
    """What /healthz, /readyz and /debug/plan read."""

    last_progress: float = field(default_factory=time.monotonic)
    last_plan: Plan | None = None
    last_patch: list[dict[str, Any]] = field(default_factory=list)
    last_outcome: str = "not run yet"
    reconciles: int = 0


class Reconciler:
    def __init__(
        self,
        *,
        config: LoopConfig,
        policy: Policy,
        pods: Informer,
        cluster: RayClusterView,
        poller: GcsPoller,
        gcs: GcsClient,
        writer: RayClusterWriter,
        events: EventRecorder,
    ) -> None:
        self._config = config
        self._policy = policy
        self._pods = pods
        self._cluster = cluster
        self._poller = poller
        self._gcs = gcs
        self._writer = writer
        self._events = events
        self.expectations = Expectations(timeout=config.expectation_timeout_s)
        self.memory = Memory()
        self.status = LoopStatus()
        self._uid: str | None = None
        self._write_backoff = Backoff(initial=1.0, cap=60.0)
        self._not_before = 0.0

    async def reconcile(self) -> Plan | None:
        """Run one reconcile; errors are logged and counted, never raised."""
        started = time.monotonic()
        try:
            result = await self._reconcile()
            RECONCILES.labels("held" if result is None or result.held else "ok").inc()
            return result
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("reconcile failed")
            RECONCILES.labels("error").inc()
            self._not_before = time.monotonic() + self._write_backoff.next_delay()
            return None
        finally:
            RECONCILE_SECONDS.observe(time.monotonic() - started)
            self.status.last_progress = time.monotonic()
            self.status.reconciles += 1

    async def _reconcile(self) -> Plan | None:
        for _ in range(MAX_REPLANS):
            raw = self._cluster.current()
            if raw is None:
                self.status.last_outcome = "RayCluster not found: nothing to scale"
                return None
            self._notice_recreation(raw)
            result = self._plan(raw)
            self._publish(result)
            await self._report(result)
            if not result.changes or self._config.dry_run:
                self.status.last_outcome = "dry run" if self._config.dry_run else "no change"
                if result.changes:
                    self._log_decisions(result, dry_run=True)
                return result
            if time.monotonic() < self._not_before:
                self.status.last_outcome = "write backoff"
                return result
            if await self._execute(raw, result):
                return result
            await self._refresh_quietly()
        self.status.last_outcome = f"still stale after {MAX_REPLANS} replans"
        return None

    def _plan(self, raw: Mapping[str, Any]) -> Plan:
        spec = parse_raycluster(raw)
        hosts, pod_problems = parse_pods(list(self._pods.store.values()), spec)
        synced = self._pods.synced and self._cluster.synced
        snapshot = Snapshot(spec, tuple(hosts), synced, tuple(pod_problems))
        memory = replace(
            self.memory,
            awaiting_write=self._awaiting(raw),
            draining=read_draining(raw),
        )
        return plan(snapshot, self._ray_state(), memory, self._policy, datetime.now(UTC))

    def _ray_state(self) -> Any:
        observation = self._poller.latest
        if not observation.fresh(time.monotonic(), self._config.gcs_stale_after_s):
            return None
        try:
            return parse_ray_state(observation.reply)
        except RayStateError as err:
            log.warning("unusable GCS reply: holding", error=str(err))
            return None

    def _awaiting(self, raw: Mapping[str, Any]) -> dict[str, str]:
        groups = {
            g.get("groupName"): g
            for g in raw.get("spec", {}).get("workerGroupSpecs") or []
            if isinstance(g, Mapping)
        }
        now = time.monotonic()
        return {
            name: "waiting to observe our last write to this group"
            for name in self.expectations.groups()
            if self.expectations.pending(name, groups.get(name), now)
        }

    def _notice_recreation(self, raw: Mapping[str, Any]) -> None:
        uid = raw.get("metadata", {}).get("uid")
        if self._uid is not None and uid != self._uid:
            log.warning("RayCluster recreated: dropping memory", old_uid=self._uid, uid=uid)
            self.memory = Memory()
            self.expectations.forget()
        self._uid = uid

    async def _execute(self, raw: Mapping[str, Any], result: Plan) -> bool:
        """Drain and patch. True when done (applied or given up), False to replan."""
        draining = {
            d.group: [x.slice_key for x in d.deletions if x.kind is DeleteKind.IDLE]
            for d in result.groups
            if any(x.kind is DeleteKind.IDLE for x in d.deletions)
        }
        if draining:
            outcome = await self._writer.apply(record_ops(raw, draining), expected_uid=result.uid)
            if outcome.kind != "applied":
                return self._handle_failure(outcome)
            assert outcome.obj is not None
            raw = outcome.obj
            self._cluster.observe(raw)
            result = await self._drain(result)
        try:
            ops = build_patch(raw, result) + clear_ops(raw)
        except PatchError as err:
            log.info("plan no longer fits the RayCluster: replanning", error=str(err))
            return False
        if not ops:
            return True
        outcome = await self._writer.apply(ops, expected_uid=result.uid)
        self.status.last_patch = ops
        if outcome.kind == "applied":
            self._applied(result, outcome)
            return True
        return self._handle_failure(outcome)

    async def _drain(self, result: Plan) -> Plan:
        deadline = deadline_in(self._config.drain_deadline_s)
        # Pin the GCS the plan was made from: a replaced GCS accepts drains of unknown nodes.
        cluster_id = self._poller.latest.cluster_id
        jobs = {
            (d.group, x.slice_key): drain_slice(
                self._gcs,
                [bytes.fromhex(n) for n in x.node_ids],
                reason_message=f"kuberay-scaler: slice {x.slice_key} idle",
                deadline_ms=deadline,
                cluster_id=cluster_id,
            )
            for d in result.groups
            for x in d.deletions
            if x.kind is DeleteKind.IDLE and x.node_ids
        }
        outcomes = await asyncio.gather(*jobs.values())
        refused = set()
        for key, drained in zip(jobs, outcomes, strict=True):
            if not drained.may_delete:
                refused.add(key)
                log.warning(
                    "slice kept: drain refused",
                    group=key[0],
                    slice=key[1],
                    reason=drained.reason,
                    hosts_already_drained=[n.hex() for n in drained.drained_node_ids],
                )
        self._poller.poll_soon()
        return drop_deletions(result, refused)

    def _applied(self, result: Plan, outcome: PatchOutcome) -> None:
        now = time.monotonic()
        for d in result.groups:
            if not d.changes:
                continue
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
        if outcome.kind == "stale":
            return False
        if outcome.kind == "throttled":
            self._not_before = time.monotonic() + (outcome.retry_after or 1.0)
        elif outcome.kind != "gone":
            self._not_before = time.monotonic() + self._write_backoff.next_delay()
        if outcome.kind == "forbidden":
            log.error("not allowed to patch the RayCluster", error=outcome.message)
        return True

    async def _refresh_quietly(self) -> None:
        try:
            await self._cluster.refresh()
        except (ApiError, NoResponse) as err:
            log.warning("RayCluster refresh failed", error=str(err))

    async def _report(self, result: Plan) -> None:
        """Tell Ray what we are doing, so `ray status` shows it."""
        observation = self._poller.latest
        if not observation.known or result.slice_map is None:
            return
        version = observation.reply.cluster_resource_state.cluster_resource_state_version
        report = report_from_plan(result, int(time.time()), observed_version=version)
        try:
            await self._gcs.report(build_autoscaling_state(report))
            self._poller.mark_reported(observation.gcs_epoch)
        except GcsError as err:
            log.debug("report to GCS failed", error=str(err))

    def _publish(self, result: Plan) -> None:
        self.status.last_plan = result
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
        task = asyncio.get_running_loop().create_task(self._events.record(reason, message))
        _background.add(task)
        task.add_done_callback(_background.discard)


_background: set[asyncio.Task[None]] = set()
_EVENT_REASONS = {Action.SCALE_UP: "ScaledUp", Action.SCALE_DOWN: "ScaledDown"}
