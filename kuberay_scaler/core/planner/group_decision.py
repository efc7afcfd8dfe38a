"""One group's decision: a fold of its stage results (surplus above maxReplicas, or the
cancellations, the gang's released slices, the replacements and the idle slices), then its
target. `decide_group` returns the decision with its memory delta; nothing is written into."""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass, field, replace

from kuberay_scaler.core.model.cluster import ClusterSpec
from kuberay_scaler.core.model.plan import (
    At,
    DeleteKind,
    GroupDecision,
    RefusedDrain,
    ReplaceBackoff,
    SliceDeletion,
)
from kuberay_scaler.core.model.reasons import (
    Reason,
    RunsMaxReplicas,
    RunsMinReplicas,
)
from kuberay_scaler.core.model.slices import GroupSlices
from kuberay_scaler.core.planner.cancel import Cancelled
from kuberay_scaler.core.planner.explain import why_unchanged
from kuberay_scaler.core.planner.gate import Evidence
from kuberay_scaler.core.planner.group_cancels import Cancellations, group_cancellations
from kuberay_scaler.core.planner.groups import GroupNotes
from kuberay_scaler.core.planner.policy import Policy
from kuberay_scaler.core.planner.queues import GroupQueue
from kuberay_scaler.core.planner.replace import BrokenBusy, Replaced, replacements
from kuberay_scaler.core.planner.rooms import GroupFit, SliceRef
from kuberay_scaler.core.planner.scale_down import (
    IdleDeletions,
    idle_deletions,
    idle_timeout,
    outdated_kept,
)
from kuberay_scaler.core.planner.surplus import Surplus, surplus_removals


@dataclass(frozen=True)
class Judging:
    """What every group's decision is judged by besides its own notes: this frame's demand,
    the gate's evidence, the broken-but-busy bound, and what memory says."""

    needed: Set[SliceRef]
    spec: ClusterSpec
    policy: Policy
    at: At
    ev: Evidence
    busy: BrokenBusy
    backoff: Mapping[str, ReplaceBackoff]
    preempting: Mapping[str, float]  # preemption deadlines known (Memory.preempting)
    refused: Mapping[str, RefusedDrain]


@dataclass(frozen=True)
class GroupOutcome:
    """One group's decision and its memory delta (preemption deadlines; replacements)."""

    decision: GroupDecision
    surplus_preempting: Mapping[str, float] = field(default_factory=dict)
    replaced: Replaced = field(default_factory=Replaced)


@dataclass(frozen=True)
class Removals:
    """The group's deletions below maxReplicas, in the order they are said, and why."""

    deletions: tuple[SliceDeletion, ...] = ()
    reasons: tuple[Reason, ...] = ()
    cancels: Cancellations = field(default_factory=Cancellations)
    replaced: Replaced = field(default_factory=Replaced)


def decide_group(
    g: GroupNotes, fit: GroupFit, virtual: int, judging: Judging, queue: GroupQueue | None
) -> GroupOutcome:
    """Held whole; else above maxReplicas (surplus); else held down or the removals; then the
    target (`_settled`)."""
    base = _base(g)
    if g.hold_all:
        return GroupOutcome(replace(base, held=g.hold_all, reasons=(*g.reasons, g.hold_all)))
    said = (*g.reasons, *fit.reasons)
    if g.hold_down:
        removals = Removals(reasons=(g.hold_down,))
    elif (surplus := _above_max(g, judging)) is not None:
        decision = _surplus_decision(g, base, virtual, (*said, *surplus.reasons), surplus)
        return GroupOutcome(decision, surplus_preempting=surplus.preempting)
    else:
        removals = _removals(g, fit, virtual, judging, queue or GroupQueue())
    decision = _settled(g, fit, virtual, judging, base, (*said, *removals.reasons), removals)
    return GroupOutcome(decision, replaced=removals.replaced)


def _base(g: GroupNotes) -> GroupDecision:
    return GroupDecision.unchanged(g.slices.group)


def _above_max(g: GroupNotes, judging: Judging) -> Surplus | None:
    """The surplus removals of a group running more slices than maxReplicas, else None."""
    surplus = surplus_removals(
        g.slices,
        judging.preempting,
        judging.policy.deadlines.preempt_deadline_s,
        judging.at,
        judging.ev,
    )
    return surplus if surplus.running > g.slices.group.max_replicas else None


def _surplus_decision(
    g: GroupNotes, base: GroupDecision, virtual: int, said: tuple[Reason, ...], surplus: Surplus
) -> GroupDecision:
    # Above maxReplicas: whole surplus slices leave and the target is maxReplicas. KubeRay
    # already clamps replicas to maxReplicas, so writing it changes nothing for slices that
    # stay (busy ones being drained); a plan that only drains writes nothing.
    group = g.slices.group
    return replace(
        base,
        target=group.max_replicas if surplus.deletions else group.replicas,
        deletions=surplus.deletions,
        preempt=surplus.preempt,
        clear_workers_to_delete=g.clear_wtd and not surplus.deletions,
        reasons=said,
        launching_hosts=_launching_hosts(g, virtual),
    )


def _removals(
    g: GroupNotes, fit: GroupFit, virtual: int, judging: Judging, queue: GroupQueue
) -> Removals:
    """Cancelled, released for a gang, replaced, then idle: each stage sees the slices the
    ones before it left (`_without_slices`)."""
    at, policy = judging.at, judging.policy
    cancels = group_cancellations(g, fit.added, virtual, judging.ev, queue)
    # A gang past its deadline hands its idle slices back (drained, like idle ones).
    released = frozenset(x.slice_key for x in g.released)
    replaced = replacements(
        _without_slices(g.slices, cancels.unavailable.keys | released),
        judging.backoff,
        policy.deadlines.replace_backoff_s,
        policy.deadlines.replace_max_backoff_s,
        at,
        judging.busy,
        judging.ev,
    )
    idle = _idle(g, fit, judging, queue, cancels)
    return Removals(
        (
            *cancels.unavailable.deletions,
            *g.released,
            *replaced.deletions,
            *cancels.queued.deletions,
            *idle.deletions,
        ),
        (
            *cancels.unavailable.reasons,
            *(x.reason for x in g.released),
            *replaced.reasons,
            *cancels.queued.reasons,
            *idle.reasons,
            *queue.grace.reasons,
        ),
        cancels,
        replaced,
    )


def _idle(
    g: GroupNotes, fit: GroupFit, judging: Judging, queue: GroupQueue, cancels: Cancellations
) -> IdleDeletions:
    """Idle slices past the timeout, while the group keeps its minReplicas after this plan's
    other cancels and releases; slices the reservation grace keeps count as needed."""
    # Replicas asked for but without pods are never cancelled: the operator may be rebuilding
    # them right now (e.g. after a host pod was deleted). If demand is really gone they come
    # up, turn idle and leave through the idle path, drained like any other slice.
    group = g.slices.group
    keep = group.effective_replicas + fit.added - group.min_replicas - cancels.replicas
    keep -= len(g.released)
    needed = judging.needed
    shielded = needed | queue.grace.refs if queue.grace.refs else needed
    return idle_deletions(
        _without_slices(g.slices, frozenset(x.slice_key for x in g.released)),
        keep,
        shielded,
        idle_timeout(group, judging.spec, judging.policy.deadlines.idle_timeout_override_s),
        judging.refused,
        judging.at,
    )


def _settled(
    g: GroupNotes,
    fit: GroupFit,
    virtual: int,
    judging: Judging,
    base: GroupDecision,
    said: tuple[Reason, ...],
    removals: Removals,
) -> GroupDecision:
    """The group's decision once its additions and removals are known."""
    group, deletions = g.slices.group, removals.deletions
    target, bounds = _target(g, fit, removals)
    decision = replace(
        base,
        target=target,
        deletions=deletions,
        clear_workers_to_delete=g.clear_wtd and not deletions,
        held=g.hold_down,
        reasons=(*said, *outdated_kept(g.slices, list(deletions)), *bounds),
        launching_hosts=_launching_hosts(g, virtual + fit.added, removals.cancels.unavailable),
        new_hosts=fit.added * group.num_of_hosts,
        preempt=removals.replaced.preempt,
    )
    if decision.changes or g.hold_down:
        return decision
    # Nothing changes: say why, slice kind by slice kind (busy, idle below the timeout, ...).
    timeout_s = idle_timeout(group, judging.spec, judging.policy.deadlines.idle_timeout_override_s)
    steady = why_unchanged(g.slices, judging.needed, timeout_s, judging.at.mono_ms)
    return replace(decision, reasons=(*decision.reasons, *steady))


def _target(g: GroupNotes, fit: GroupFit, removals: Removals) -> tuple[int, tuple[Reason, ...]]:
    """The target after this plan's additions, lowered once by the idle slices and by the
    group's cancellations, within what KubeRay runs; and the bound said, if one applied."""
    group = g.slices.group
    bounds: list[Reason] = []
    idle_deleted = sum(1 for d in removals.deletions if d.kind is DeleteKind.IDLE)
    below_min = not (group.suspend or g.hold_down) and group.replicas < group.min_replicas
    if below_min:
        # KubeRay runs minReplicas when replicas is lower: plan (and write) what runs.
        bounds.append(RunsMinReplicas(group.replicas, group.min_replicas))
    gone = idle_deleted + removals.cancels.replicas
    scaled = fit.added or gone or below_min
    target = group.effective_replicas + fit.added - gone if scaled else group.replicas
    if not g.hold_down and group.min_replicas <= group.max_replicas < target:
        # No more slices than maxReplicas run (else the surplus path above): the rest will
        # never run, KubeRay clamps; write what runs (sidecar mode: KubeRay deleted them).
        bounds.append(RunsMaxReplicas(target, group.max_replicas))
        target = group.max_replicas
    return target, tuple(bounds)


def _launching_hosts(
    g: GroupNotes, launching_slices: int, cancelled: Cancelled | None = None
) -> int:
    gone = cancelled.keys if cancelled else frozenset()
    pending = [
        h
        for s in g.slices.arriving  # coming up or queued
        if s.key not in gone
        for h in s.hosts
        if h.pod_name not in s.nodes
    ]
    slices = max(0, launching_slices - (cancelled.without_pods if cancelled else 0))
    return len(pending) + slices * g.slices.group.num_of_hosts


def _without_slices(gs: GroupSlices, keys: frozenset[str]) -> GroupSlices:
    """The group's slices less those already decided (cancelled)."""
    if not keys:
        return gs
    return GroupSlices(gs.group, tuple(s for s in gs.slices if s.key not in keys))
