"""The rules around the drains: which go (`drains_to_send`, after a fresh read) and the patch
once they answered (`after_drains`). Pure and typed, so `plan` and tests see them; the shell
(loop/execute.py) only does the I/O."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from types import MappingProxyType

from kuberay_scaler.core.backoff import exponential_delay
from kuberay_scaler.core.decision.document import Decision
from kuberay_scaler.core.decision.writes import Drain, Patch, assumed_accepted
from kuberay_scaler.core.defaults import DRAIN_RETRY_S, MAX_DRAIN_RETRY_S
from kuberay_scaler.core.model.cluster import ClusterSpec
from kuberay_scaler.core.model.plan import Memory, Plan, RefusedDrain, mono_of, seconds_until
from kuberay_scaler.core.model.ray import RayState
from kuberay_scaler.core.model.reasons import Keep, KeepKind, Reason, ScaleDown, ScaleDownKind
from kuberay_scaler.core.patch.intent import clear_ops
from kuberay_scaler.core.patch.ops import build_patch
from kuberay_scaler.core.planner.gate import Blocked, SliceRef, gate, quiet, without


@dataclass(frozen=True)
class LastRead:
    """What the shell read once every drain answered, right before the patch: the gate's
    evidence must be newer than every drain answer."""

    ray: RayState | None  # Ray's state then; None: the read failed (only the gate's (d) goes)
    uids: Mapping[str, str]  # the pod cache then: pod name → uid


@dataclass(frozen=True)
class DrainResults:
    """What happened to a decision's drains (the shell fills it in; `after_drains` judges it)."""

    accepted: frozenset[str] = frozenset()  # node ids (hex) whose drain was accepted now
    refused: Mapping[SliceRef, str] = field(default_factory=lambda: MappingProxyType({}))
    not_sent: Mapping[SliceRef, Keep] = field(default_factory=lambda: MappingProxyType({}))
    fresh: RayState | None = None  # the read made right before draining
    base: ClusterSpec | None = None  # the RayCluster the record write left, parsed (patch base)
    last: LastRead | None = None  # the read after the drains (None: `plan`'s assumed answers)

    @classmethod
    def assumed(cls, drains: Sequence[Drain]) -> DrainResults:
        """Every drain accepted: the patch `plan` and /debug/plan show."""
        return cls(accepted=assumed_accepted(drains))


@dataclass(frozen=True)
class Writes:
    """The patch to send once the drains answered, and what was decided on the way."""

    plan: Plan  # as carried out: kept slices put back, each with its typed reason
    patch: Patch | None
    drains: tuple[Drain, ...] = ()  # follow-up preemption drains (partly drained slices)
    blocked: tuple[Blocked, ...] = ()  # dropped by the deletion gate


def drains_to_send(
    decision: Decision, fresh: RayState | None, cluster_id: str | None
) -> tuple[tuple[Drain, ...], dict[SliceRef, Keep]]:
    """The drains to send given a fresh GCS read made right before (None: it failed), and the
    slices kept, each with why. Idle-termination drains need the fresh read: a host turned busy
    (or gone, or another GCS) keeps its slice whole, undrained. Preemption drains go regardless
    (Ray moves the work). A deletion with nothing to drain is kept if the read shows one of its
    Ray nodes back (or cannot be made)."""
    send: list[Drain] = []
    kept: dict[SliceRef, Keep] = {}
    idle_now = {n.node_id for n in fresh.nodes if quiet(n)} if fresh is not None else set()
    busy_now = fresh.node_by_instance() if fresh is not None else {}
    for d in decision.drains:
        ref = (d.group, d.slice_key)
        if d.preempt:
            send.append(d)
        elif fresh is None:
            kept[ref] = Keep(KeepKind.DRAIN_NOT_SENT, slice=d.slice_key)
        elif d.cluster_id != cluster_id:
            kept[ref] = Keep(KeepKind.NO_LONGER_IDLE, slice=d.slice_key, detail="another GCS")
        elif not set(d.node_ids) <= idle_now or any(
            p in busy_now and busy_now[p].node_id not in d.node_ids for p in d.pods
        ):
            busy = sorted(p for p in d.pods if p in busy_now and not quiet(busy_now[p]))
            detail = f"busy or gone: {', '.join(busy) or 'a host'}"
            kept[ref] = Keep(KeepKind.NO_LONGER_IDLE, slice=d.slice_key, detail=detail)
        else:
            send.append(d)
    kept.update(_back_in_ray(decision, fresh))
    return tuple(send), kept


def _back_in_ray(decision: Decision, fresh: RayState | None) -> dict[SliceRef, Keep]:
    """Deletions with nothing to drain (hosts DEAD or long absent) confirmed by the fresh read:
    a Ray node that is back keeps its slice (never deleted over a node just seen alive)."""
    drained = {(d.group, d.slice_key) for d in decision.drains}
    deadlines = decision.evidence.deadlines if decision.evidence else {}
    now = _mono(decision)
    alive = fresh.node_by_instance() if fresh is not None else {}
    kept: dict[SliceRef, Keep] = {}
    for g in decision.plan.groups:
        for x in g.deletions:
            ref = (g.group, x.slice_key)
            deadline = deadlines.get(x.slice_key)
            if ref in drained or (deadline is not None and deadline <= now):
                continue
            if fresh is None:
                kept[ref] = Keep(KeepKind.DRAIN_NOT_SENT, slice=x.slice_key)
            elif back := [p for p in x.pods if p in alive]:
                kept[ref] = Keep(KeepKind.RAY_NODE_BACK, slice=x.slice_key, detail=back[0])
    return kept


def after_drains(decision: Decision, results: DrainResults) -> Writes:
    """The patch once the drains answered, decided here so `plan` and tests see every rule:

    - a slice not drained (`results.not_sent`, e.g. Keep(NO_LONGER_IDLE)) is kept whole;
    - a slice no host of which accepted is kept whole (Keep(DRAIN_REFUSED)) and its drain is
      retried only once its idle state changes or a backoff passes (Memory.refused);
    - a slice some hosts of which accepted is partly drained (ScaleDown(PARTLY_DRAINED)): those
      raylets exit, so it can no longer run slice-wide work; its refusing hosts are drained for
      preemption with the drain deadline and the slice leaves whole once it passes (gate (d)),
      through the broken-slice path; never deleted over a refusing host now;
    - then the deletion gate, with what was really accepted, judged by `results.last` (the read
      after every drain answered): a pod with a live Ray node not drained now, or recreated
      since the plan, keeps its slice (Keep(GATE_...)).

    Raises PatchError when the plan no longer fits `results.base`.
    """
    now = _mono(decision)  # the monotonic clock: timers, deadlines
    wall = decision.now or _NEVER
    result = decision.plan
    dropped: dict[SliceRef, Reason] = dict(results.not_sent)
    follow: list[Drain] = []
    preempting = dict(result.memory.preempting)
    refused = dict(result.memory.refused)
    for d in decision.drains:
        ref = (d.group, d.slice_key)
        if d.preempt or ref in dropped:
            if ref in results.not_sent:
                refused[d.slice_key] = _refused(decision, d, now)
            continue
        why = results.refused.get(ref)
        if why is None:
            refused.pop(d.slice_key, None)
            continue
        took = set(d.node_ids) & results.accepted
        if not took:
            dropped[ref] = Keep(KeepKind.DRAIN_REFUSED, slice=d.slice_key, detail=why)
            refused[d.slice_key] = _refused(decision, d, now)
            continue
        deadline = datetime.fromtimestamp(d.deadline_ms / 1000, UTC)  # what Ray was told
        preempting[d.slice_key] = now + (deadline - wall).total_seconds()  # that, monotonic
        dropped[ref] = ScaleDown(
            ScaleDownKind.PARTLY_DRAINED, d.slice_key, len(d.pods), deadline=deadline
        )
        rest = tuple(n for n in d.node_ids if n not in results.accepted)
        follow.append(replace(d, node_ids=rest, preempt=True, message=_partial_message(d, why)))
    result = without(result, dropped)
    memory = replace(
        result.memory, preempting=MappingProxyType(preempting), refused=MappingProxyType(refused)
    )
    result = replace(result, memory=memory, deadline_s=_sooner(result.deadline_s, memory, now))
    ev = decision.evidence
    if ev is not None:
        judged = ev.with_fresh(results.fresh)
        if results.last is not None:
            judged = judged.after(results.last.ray, results.last.uids)
        result, blocked = gate(result, judged, results.accepted, now)
    else:
        blocked = ()
    base = results.base if results.base is not None else decision.spec
    ops = build_patch(base, result)
    if ops or not any(k in refused for keys in base.draining.values() for k in keys):
        ops += clear_ops(base)  # a record of a slice backing off stays: no rewrite on retry
    return Writes(result, Patch(tuple(ops)) if ops else None, tuple(follow), blocked)


def _sooner(deadline_s: float | None, memory: Memory, mono_s: float) -> float | None:
    """The plan's first deadline, with the ones set after the drains (a partly drained slice's
    notice, a refused drain's backoff): each is a wake-up too."""
    ends = [*memory.preempting.values(), *(r.until for r in memory.refused.values())]
    ahead = [s for s in (seconds_until(e, mono_s) for e in ends) if s > 0]
    waits = [*ahead, *([deadline_s] if deadline_s is not None else [])]
    return min(waits) if waits else None


def _partial_message(d: Drain, why: str) -> str:
    return f"kuberay-scaler: slice {d.slice_key} partly drained ({why}): its other hosts exited"


def _refused(decision: Decision, d: Drain, mono_s: float) -> RefusedDrain:
    """The backoff entry of a slice whose drain no host accepted (or that was not sent)."""
    before = decision.plan.memory.refused.get(d.slice_key)
    failures = (before.failures if before else 0) + 1
    wait = exponential_delay(failures - 1, DRAIN_RETRY_S, MAX_DRAIN_RETRY_S)
    ev = decision.evidence
    since = {
        n.node_id: n.idle_since_ms
        for pod in d.pods
        for n in (ev.entries.get(pod, ()) if ev else ())
        if n.idle and n.idle_since_ms is not None
    }
    return RefusedDrain(mono_s + wait, MappingProxyType(since), failures)


def _mono(decision: Decision) -> float:
    """The monotonic reading the decision was made at (its wall clock standing in, as in
    one-shot use); a decision made without a time (a hand-built one in tests): no deadline
    counts as passed."""
    if decision.mono_s is not None:
        return decision.mono_s
    return -math.inf if decision.now is None else mono_of(None, decision.now)


# A decision made without a wall time (a hand-built one in tests).
_NEVER = datetime.min.replace(tzinfo=UTC)
