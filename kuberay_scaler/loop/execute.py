"""Carry out a Decision's writes in order: record intent → drains → guarded patch.

Nothing here decides anything: which drains go (`decision.drains_to_send`, from a fresh GCS
read made right before them) and what the patch is once they answered (`decision.after_drains`:
kept slices, partly drained ones, the deletion gate) are pure (core/decision/after.py). This
module only does the I/O and hands each step's outcome back to the loop (replan on stale, back
off on the rest; what the gate dropped, in `Executed.blocked`, for the recorder to count and say).

One failing write never takes the others with it: a record write that fails (not stale) keeps
the slices it was for, undrained, and the rest of the patch still goes; a drain that raises
(any exception, e.g. a deadline that overflows the request) counts as that slice's refusal and
the other slices' drains and the patch still go.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType

import structlog

from kuberay_scaler.core import defaults as D
from kuberay_scaler.core.backoff import Backoff
from kuberay_scaler.core.decision import (
    Decision,
    Drain,
    DrainResults,
    LastRead,
    Writes,
    after_drains,
    drains_to_send,
)
from kuberay_scaler.core.model.cluster import ClusterSpec
from kuberay_scaler.core.model.drains import DrainReason, HostDrain, SliceDrainResult
from kuberay_scaler.core.model.outcome import PatchOutcome
from kuberay_scaler.core.model.plan import Memory, Plan
from kuberay_scaler.core.model.ray import RayState
from kuberay_scaler.core.model.reasons import Keep, KeepKind
from kuberay_scaler.core.parse.raycluster import parse_raycluster
from kuberay_scaler.core.patch.ops import Op, PatchError
from kuberay_scaler.core.planner.gate import Blocked, SliceRef
from kuberay_scaler.loop.ports import ClusterView, Gcs, GcsFeed, PodStore, Writer

log = structlog.get_logger(__name__)


class WriteStep(StrEnum):
    """The writes that get an outcome of their own (the drains answer per slice)."""

    RECORD = "record"  # the draining-intent record
    PATCH = "patch"  # the guarded patch


@dataclass(frozen=True)
class Executed:
    """How far a decision's writes got."""

    plan: Plan  # as carried out: slices whose drain was refused are kept
    outcome: PatchOutcome | None = None  # of the last write sent; None when nothing was sent
    step: WriteStep = WriteStep.PATCH  # which write `outcome` belongs to
    sent: tuple[Op, ...] = ()  # the patch ops sent
    refused: frozenset[SliceRef] = field(default_factory=frozenset)
    replan: bool = False  # the RayCluster changed under the plan: plan again
    record_failed: PatchOutcome | None = None  # the record write failed; the patch still went
    answered: frozenset[SliceRef] = field(default_factory=frozenset)  # slices drained this time
    drain_errors: frozenset[SliceRef] = field(default_factory=frozenset)  # of those: a host erred
    blocked: tuple[Blocked, ...] = ()  # deletions the gate dropped after the drains answered

    @property
    def applied(self) -> bool:
        return self.outcome is not None and self.outcome.kind == "applied"

    def remembered(self, memory: Memory) -> Memory:
        """The loop's memory after these writes. Applied: the plan's memory (less what each
        reconcile reads afresh). Otherwise, whatever became of the patch: the deadlines of
        slices drained for preemption (a refused one is retried) and the drain backoff of
        refused slices."""
        if self.applied:
            return replace(self.plan.memory, awaiting_write={}, draining={})
        keep = {
            key: deadline
            for key, deadline in self.plan.memory.preempting.items()
            if not any(key == s for _, s in self.refused)
        }
        return replace(
            memory,
            preempting=MappingProxyType(keep),
            refused=self.plan.memory.refused,
            disrupted=self.plan.memory.disrupted,  # going slices drained (a drain-only plan)
        )


class WriteBackoff:
    """When the loop may write again: after a failed write (jittered, exponential), after a 429
    (its Retry-After, capped), after a reconcile that raised; open again once a write applied."""

    def __init__(self, backoff: Backoff | None = None) -> None:
        self._backoff = backoff or Backoff(initial=1.0, cap=60.0)
        self.not_before = 0.0  # monotonic

    def open(self, now: float) -> bool:
        return now >= self.not_before

    def failed(self, outcome: PatchOutcome, now: float) -> None:
        if outcome.kind == "throttled":
            # Honoured, but never longer than the transport's cap (a fake or a proxy may say more).
            self.not_before = now + min(outcome.retry_after or 1.0, D.MAX_RETRY_AFTER_S)
        elif outcome.kind != "gone":  # nothing to write to: no backoff
            self.crashed(now)

    def crashed(self, now: float) -> None:
        self.not_before = now + self._backoff.next_delay()

    def applied(self) -> None:
        self._backoff.reset()


async def execute(
    decision: Decision,
    *,
    writer: Writer,
    gcs: Gcs,
    feed: GcsFeed,
    view: ClusterView,
    pods: PodStore | None = None,
) -> Executed:
    """Send the decision's writes; a failed write keeps only what depended on it.

    The deletion gate judges the last read before the patch: once every drain answered, Ray is
    read again and the pod cache's uids taken (`_last_read`), so a raylet replaced or a pod
    recreated while a host answered late is never named."""
    uid = decision.plan.uid
    base: ClusterSpec = decision.spec
    record, record_failed = decision.record, None
    drains: tuple[Drain, ...] = tuple(d for d in decision.drains if d.preempt)
    not_sent: dict[SliceRef, Keep] = {}
    fresh: RayState | None = None
    if record is not None:
        outcome = await writer.apply(record.ops, expected_uid=uid)
        if outcome.kind == "stale":
            return Executed(decision.plan, outcome, WriteStep.RECORD, replan=True)
        if outcome.kind == "applied" and outcome.obj is not None:
            view.observe(outcome.obj)
            base = parse_raycluster(outcome.obj)  # the patch's guards: the object as now stored
        else:  # the slices it was for are not drained; everything else still goes
            record_failed = outcome
            not_sent = {
                (d.group, d.slice_key): Keep(KeepKind.RECORD_FAILED, slice=d.slice_key)
                for d in decision.drains
                if not d.preempt
            }
    if not not_sent:
        fresh = await _fresh_read(decision, gcs)
        drains, not_sent = drains_to_send(decision, fresh, gcs.cluster_id)
    for (group, key), why in not_sent.items():
        log.info("slice kept, not drained", group=group, slice=key, why=str(why))
    answers = await drain_all(drains, gcs)
    if decision.drains:
        feed.poll_soon()
    last = await _last_read(decision, gcs, pods, fresh if not answers else None)
    results = replace(_results(answers, not_sent, fresh, base), last=last)
    try:
        writes = after_drains(decision, results)
    except PatchError as err:
        log.info("plan no longer fits the RayCluster: replanning", error=str(err))
        return Executed(decision.plan, refused=frozenset(results.refused), replan=True)
    await drain_all(writes.drains, gcs)  # partly drained slices: the rest for preemption
    # Kept because no host took the drain (a partly drained slice is not: it leaves later).
    refused = frozenset(not_sent) | frozenset(
        ref for ref, r in answers.items() if not r.may_delete and not r.drained_node_ids
    )
    done = await _send_patch(writes, writer, uid, refused)
    # What the loop's health reads: a drain that errs (not one Ray refuses) is work not done.
    answered = frozenset(answers)
    erred = frozenset(
        ref for ref, r in answers.items() if any(h.outcome == "error" for h in r.hosts)
    )
    if record_failed is not None and done.outcome is None:
        return Executed(
            done.plan,
            record_failed,
            WriteStep.RECORD,
            refused=refused,
            answered=answered,
            drain_errors=erred,
            blocked=writes.blocked,
        )
    return Executed(
        done.plan,
        done.outcome,
        done.step,
        done.sent,
        refused,
        done.replan,
        record_failed=record_failed,
        answered=answered,
        drain_errors=erred,
        blocked=writes.blocked,
    )


async def _fresh_read(decision: Decision, gcs: Gcs) -> RayState | None:
    """Ray's state right before idle-termination drains or any deletion; None when it cannot
    be read (or nothing needs it)."""
    deletes = any(g.deletions for g in decision.plan.groups)
    if not deletes and not any(not d.preempt for d in decision.drains):
        return None
    fresh = await gcs.fresh_state()
    if fresh.state is None:
        log.warning("fresh GCS read before draining failed: draining nothing", error=fresh.error)
    return fresh.state


async def _last_read(
    decision: Decision, gcs: Gcs, pods: PodStore | None, fresh: RayState | None
) -> LastRead | None:
    """Ray's state and the named pods' uids right before the patch; None when it names no pod.
    `fresh`: a read made before drains that were not sent (nothing answered since: reused)."""
    named = {p for g in decision.plan.groups for x in g.deletions for p in x.pods}
    if not named:
        return None
    if fresh is None:
        read = await gcs.fresh_state()
        if read.state is None:
            log.warning("GCS read after the drains failed: deleting nothing", error=read.error)
        fresh = read.state
    store = pods.store if pods is not None else {}
    uids = {p: str((store[p].get("metadata") or {}).get("uid") or "") for p in named if p in store}
    return LastRead(fresh, MappingProxyType(uids))


async def drain_all(drains: tuple[Drain, ...], gcs: Gcs) -> dict[SliceRef, SliceDrainResult]:
    """Drain every slice concurrently (each slice's hosts concurrently too); how each went. A
    slice whose drain raises counts as refused by every host: the others are not stopped."""
    results = await asyncio.gather(*(_drain(d, gcs) for d in drains), return_exceptions=True)
    out: dict[SliceRef, SliceDrainResult] = {}
    for d, result in zip(drains, results, strict=True):
        if isinstance(result, asyncio.CancelledError):
            raise result
        if isinstance(result, BaseException):
            log.error(
                "drain failed: slice kept", group=d.group, slice=d.slice_key, error=repr(result)
            )
            result = SliceDrainResult(
                tuple(HostDrain(n, "error", repr(result)) for n in d.node_ids)
            )
        out[(d.group, d.slice_key)] = result
        if not result.may_delete and not d.preempt:
            log.warning(
                "drain refused",
                group=d.group,
                slice=d.slice_key,
                reason=result.reason,
                hosts_drained=list(result.drained_node_ids),
            )
    return out


def _results(
    answers: Mapping[SliceRef, SliceDrainResult],
    not_sent: Mapping[SliceRef, Keep],
    fresh: RayState | None,
    base: ClusterSpec,
) -> DrainResults:
    accepted = frozenset(n for r in answers.values() for n in r.drained_node_ids)
    refused = {ref: r.reason for ref, r in answers.items() if not r.may_delete}
    return DrainResults(
        accepted=accepted,
        refused=MappingProxyType(refused),
        not_sent=MappingProxyType(dict(not_sent)),
        fresh=fresh,
        base=base,
    )


async def _drain(d: Drain, gcs: Gcs) -> SliceDrainResult:
    # Each drain runs in its own task (gather), so the binding names this slice's log lines only.
    with structlog.contextvars.bound_contextvars(group=d.group, slice=d.slice_key):
        return await gcs.drain(
            d.node_ids,
            reason=DrainReason.PREEMPTION if d.preempt else DrainReason.IDLE_TERMINATION,
            message=d.message,
            deadline_ms=d.deadline_ms,
            cluster_id=d.cluster_id,
        )


async def _send_patch(
    writes: Writes, writer: Writer, uid: str, refused: frozenset[SliceRef]
) -> Executed:
    if writes.patch is None:
        return Executed(writes.plan, refused=refused)
    outcome = await writer.apply(writes.patch.ops, expected_uid=uid)
    return Executed(
        writes.plan,
        outcome,
        WriteStep.PATCH,
        writes.patch.ops,
        refused=refused,
        replan=outcome.kind == "stale",
    )
