"""Disruption under the user's control: one stage over a group's decision.

The earlier paths decide what could leave; this stage decides what may leave *now*, and moves
first for a slice that is going anyway. In order (docs/planner.md, "Disruption"):

1. a slice a host of which has the pod condition DisruptionTarget is going: its live hosts are
   drained for preemption now (never deleted here: the eviction removes the pod, the gate
   removes the rest), and its work gets a home: an idle slice of the group is kept for it, else
   one slice is added ahead (room permitting), once per going slice;
2. do-not-disrupt: an idle slice with a pod annotated `karpenter.sh/do-not-disrupt: "true"` or
   `cluster-autoscaler.kubernetes.io/safe-to-evict: "false"` is not scaled down (replacing a
   broken slice and honouring maxReplicas go on: the surplus path takes such slices last of
   their kind, and the plan says so);
3. the scale-down delay: a group that added a slice within its delay removes no idle slice;
4. the budget: at most N (or N %) of the group's slices leave at once; slices already leaving
   (terminating, recorded as draining, drained for preemption, deleted by this plan for any
   other reason) count, and only the idle scale-downs beyond it wait.

Only idle scale-down (`ScaleDownKind.IDLE`) is voluntary disruption here; a rollover of
outdated slices, where present, joins `VOLUNTARY`.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from types import MappingProxyType

from kuberay_scaler.core.model.cluster import Budget
from kuberay_scaler.core.model.plan import (
    DeleteKind,
    GroupDecision,
    GroupRules,
    Memory,
    SliceDeletion,
)
from kuberay_scaler.core.model.reasons import (
    Disruption,
    DisruptionKind,
    HoldKind,
    Reason,
    Replace,
    ScaleDown,
    ScaleDownKind,
)
from kuberay_scaler.core.model.slices import GroupSlices, Slice, SliceState

SliceRef = tuple[str | None, str | None]
# Removals the budget, the delay and do-not-disrupt govern (the user's or our choice to remove).
VOLUNTARY = frozenset({ScaleDownKind.IDLE, ScaleDownKind.GANG_DEADLINE})
_SURPLUS = frozenset({ScaleDownKind.ABOVE_MAX, ScaleDownKind.PREEMPT, ScaleDownKind.PREEMPTED})


@dataclass(frozen=True)
class DisruptionRules:
    """One group's rules: its annotations, else the daemon's defaults."""

    budget: Budget
    delay_s: float
    preempt_deadline_s: float
    budget_from_group: bool = False
    delay_from_group: bool = False


@dataclass(frozen=True)
class Disrupted:
    """The stage's result for one group: the decision, and what the planner remembers."""

    decision: GroupDecision
    scaled_up_at: float | None  # when the group last added a slice (monotonic); None: forget
    replaced_ahead: tuple[str, ...]  # going slices that have their replacement
    preempting: Mapping[str, datetime]  # going slices drained for preemption → deadline
    disrupted: tuple[str, ...] = ()  # going slices drained for preemption (this plan or before)


@dataclass(frozen=True)
class _Step:
    decision: GroupDecision
    reasons: tuple[Reason, ...] = ()


def disruption_stage(
    decision: GroupDecision,
    slices: GroupSlices,
    rules: DisruptionRules,
    memory: Memory,
    needed: Set[SliceRef],
    now: datetime,
    mono_s: float,
    *,
    wall_shift: timedelta = timedelta(0),
) -> Disrupted:
    """Apply the disruption rules to one group's decision (see the module docstring). `now` is
    the monotonic tick (`tick_of`): preemption deadlines are kept on it (Memory.preempting);
    `now + wall_shift` is the wall clock the reasons show them on."""
    name = decision.group
    if decision.held is not None and decision.held.kind is not HoldKind.WORKERS_TO_DELETE_PENDING:
        # Held (e.g. our last write unseen): nothing decided, nothing forgotten.
        keys = {s.key for s in slices.slices}
        kept = tuple(k for k, g in memory.disrupted.items() if g == name and k in keys)
        shown = replace(decision, rules=shown_rules(rules, in_flight_of(slices, memory)))
        return Disrupted(
            shown, memory.scaled_up_at.get(name), _ahead_kept(memory, slices), {}, kept
        )
    going = _going(decision, slices, rules, memory, needed, now, wall_shift)
    step = _do_not_disrupt(going.step.decision, slices)
    # A slice added ahead for a going one is no growth: it does not start the delay (the going
    # slice's replica comes back once its pods are gone; the idle one of them leaves as usual).
    added = decision.new_hosts > 0
    last_add = mono_s if added else memory.scaled_up_at.get(name)
    delay_step = _delay(step.decision, last_add, rules.delay_s, mono_s, _going_keys(slices))
    budget_step = _budget(delay_step.decision, slices, rules.budget, memory)
    surplus = _surplus_despite(budget_step.decision, slices)
    reasons = (
        *going.step.reasons,
        *step.reasons,
        *delay_step.reasons,
        *budget_step.reasons,
        *surplus,
    )
    out = replace(
        budget_step.decision,
        reasons=(*budget_step.decision.reasons, *reasons),
        rules=shown_rules(rules, in_flight(budget_step.decision, slices, memory)),
    )
    remembered = last_add if last_add is not None and mono_s - last_add < rules.delay_s else None
    return Disrupted(out, remembered, going.ahead, going.preempting, going.drained)


def shown_rules(rules: DisruptionRules, leaving: int) -> GroupRules:
    """The rules as the plan shows them (`GroupDecision.rules`)."""
    return GroupRules(
        budget=str(rules.budget),
        budget_from="group" if rules.budget_from_group else "default",
        scale_down_delay_after_add_s=rules.delay_s,
        delay_from="group" if rules.delay_from_group else "default",
        leaving=leaving,
    )


def _ahead_kept(memory: Memory, slices: GroupSlices) -> tuple[str, ...]:
    keys = {s.key for s in slices.slices}
    return tuple(
        k for k, g in memory.replaced_ahead.items() if g == slices.group.name and k in keys
    )


# --- 1. DisruptionTarget: the slice is going ------------------------------------------------


@dataclass(frozen=True)
class _Going:
    step: _Step
    ahead: tuple[str, ...]  # going slices that have their replacement (this plan or before)
    preempting: Mapping[str, datetime]
    drained: tuple[str, ...]  # going slices drained for preemption (this plan or before)


def _going(
    decision: GroupDecision,
    slices: GroupSlices,
    rules: DisruptionRules,
    memory: Memory,
    needed: Set[SliceRef],
    now: datetime,
    wall_shift: timedelta,
) -> _Going:
    handled = {x.slice_key for x in (*decision.deletions, *decision.preempt)}
    going = [
        s
        for s in slices.slices
        if s.going and s.state is not SliceState.TERMINATING and s.key not in handled
    ]
    abandoned = _abandoned(slices, memory, handled, now, wall_shift)
    drains = tuple(_drain(s, rules, memory, now, wall_shift) for s in going)
    preempt = tuple(d.drain for d in drains if d.new)
    deadlines = {
        d.drain.slice_key: d.deadline
        for d in drains
        if d.new or d.drain.slice_key in memory.preempting
    }
    said: tuple[Reason, ...] = tuple(
        d.drain.reason for d in drains if not d.new and d.drain.slice_key in deadlines
    )
    decision = replace(
        decision,
        preempt=(*decision.preempt, *preempt),
        deletions=(*decision.deletions, *abandoned.deletions),
    )
    homes = _homes(decision, slices, going, memory, needed)
    drained = {k for k, g in memory.disrupted.items() if g == slices.group.name} | set(deadlines)
    return _Going(
        _Step(homes.decision, (*said, *abandoned.reasons, *homes.reasons)),
        (*_ahead_kept(memory, slices), *homes.ahead),
        MappingProxyType(deadlines),
        tuple(sorted(drained & {s.key for s in slices.slices})),
    )


@dataclass(frozen=True)
class _Abandoned:
    deletions: tuple[SliceDeletion, ...]
    reasons: tuple[Reason, ...]


def _abandoned(
    slices: GroupSlices, memory: Memory, handled: Set[str], now: datetime, wall_shift: timedelta
) -> _Abandoned:
    """Slices drained for a disruption that did not happen (DisruptionTarget cleared: the
    pod was not deleted after all). Ray has no undrain: their hosts stay DRAINING, so once
    the preemption deadline has passed (the gate's (d)) the slice is replaced whole, replicas
    unchanged, without a second drain; before it, it waits."""
    name = slices.group.name
    deletions: list[SliceDeletion] = []
    reasons: list[Reason] = []
    for sl in slices.slices:
        deadline = memory.preempting.get(sl.key)
        if memory.disrupted.get(sl.key) != name or sl.going or deadline is None:
            continue
        if sl.state is SliceState.TERMINATING or sl.key in handled:
            continue
        if deadline > now:
            at = (deadline + wall_shift).isoformat()  # kept on the tick, shown on the wall
            until = f"its hosts stay drained; replaced whole at {at}"
            wait_s = (deadline - now).total_seconds()  # the loop plans again then
            reasons.append(
                Disruption(DisruptionKind.ABANDONED, sl.key, detail=until, wait_s=wait_s)
            )
            continue
        cause = (
            "drained for a disruption that did not happen (DisruptionTarget cleared); its hosts"
            " stay drained in Ray"
        )
        why = Replace(sl.key, None, cause)
        deletions.append(SliceDeletion(sl.key, sl.pod_names, (), DeleteKind.REPLACE, why))
        reasons.append(why)
    return _Abandoned(tuple(deletions), tuple(reasons))


@dataclass(frozen=True)
class _Drain:
    drain: SliceDeletion
    deadline: datetime  # on the monotonic tick (Memory.preempting)
    new: bool  # not drained before


def _drain(
    sl: Slice, rules: DisruptionRules, memory: Memory, now: datetime, wall_shift: timedelta
) -> _Drain:
    """The preemption drain of a going slice; its reason says the deadline on the wall clock."""
    known = memory.preempting.get(sl.key)
    deadline = known or now + timedelta(seconds=rules.preempt_deadline_s)
    cause = (sl.going or "").split(": ", 1)[-1]
    on_wall = deadline + wall_shift
    why = ScaleDown(
        ScaleDownKind.DISRUPTION_TARGET, sl.key, len(sl.hosts), deadline=on_wall, cause=cause
    )
    drain = SliceDeletion(sl.key, sl.pod_names, sl.node_ids, DeleteKind.PREEMPT, why)
    return _Drain(drain, deadline, known is None and bool(sl.node_ids))


@dataclass(frozen=True)
class _Homes:
    decision: GroupDecision
    reasons: tuple[Reason, ...]
    added: bool
    ahead: tuple[str, ...]


def _homes(
    decision: GroupDecision,
    slices: GroupSlices,
    going: list[Slice],
    memory: Memory,
    needed: Set[SliceRef],
) -> _Homes:
    """A home for the work of each going slice that has work (busy, or demand placed on it):
    an idle slice of the group that nothing else needs (its idle scale-down, if planned, is
    dropped), else one slice added ahead while the group is below maxReplicas."""
    group = slices.group
    homeless = [
        s
        for s in going
        if s.key not in memory.replaced_ahead and (s.working_hosts or (group.name, s.key) in needed)
    ]
    spares = [
        s
        for _, key, s in slices.idle_by_since
        if not s.going and (group.name, key) not in needed and not s.do_not_disrupt
    ][::-1]  # the least idle first: the longest idle are the ones scale-down removes first
    reasons: list[Reason] = []
    kept: set[str] = set()
    ahead: list[str] = []
    target = decision.target
    for sl in homeless:
        detail = sl.going or ""
        if spares:
            spare = spares.pop(0)
            kept.add(spare.key)
            reasons.append(Disruption(DisruptionKind.SPARE_KEPT, spare.key, detail=detail))
        elif not group.suspend and target < group.max_replicas:
            target += 1
            ahead.append(sl.key)
            reasons.append(Disruption(DisruptionKind.REPLACED_AHEAD, sl.key, detail=detail))
        else:
            limit = f"maxReplicas {group.max_replicas}"
            reasons.append(Disruption(DisruptionKind.NO_ROOM, sl.key, detail=limit))
    dropped = [x for x in decision.deletions if x.slice_key in kept and _voluntary(x)]
    reasons += [Disruption(DisruptionKind.GOING, s.key, detail=s.going or "") for s in going]
    decision = replace(
        decision,
        target=target + len(dropped),
        deletions=tuple(x for x in decision.deletions if x not in dropped),
    )
    return _Homes(decision, tuple(reasons), bool(ahead), tuple(ahead))


# --- 2-4. what may leave now ------------------------------------------------------------------


def _voluntary(x: SliceDeletion, going: Set[str] = frozenset()) -> bool:
    """A removal we choose: a going slice's (DisruptionTarget) is not ours to hold back, its
    slice leaves anyway and its work must move now."""
    return (
        isinstance(x.reason, ScaleDown) and x.reason.kind in VOLUNTARY and x.slice_key not in going
    )


def _going_keys(slices: GroupSlices) -> frozenset[str]:
    return frozenset(s.key for s in slices.slices if s.going)


def _keep(decision: GroupDecision, kept: list[SliceDeletion]) -> GroupDecision:
    """The decision without the voluntary removals `kept`: each gives its replica back."""
    if not kept:
        return decision
    return replace(
        decision,
        target=decision.target + len(kept),
        deletions=tuple(x for x in decision.deletions if x not in kept),
    )


def _do_not_disrupt(decision: GroupDecision, slices: GroupSlices) -> _Step:
    protected = {s.key: s.do_not_disrupt for s in slices.slices if s.do_not_disrupt}
    going = _going_keys(slices)
    kept = [x for x in decision.deletions if _voluntary(x, going) and x.slice_key in protected]
    reasons = tuple(
        Disruption(DisruptionKind.DO_NOT_DISRUPT, x.slice_key, detail=protected[x.slice_key] or "")
        for x in kept
    )
    return _Step(_keep(decision, kept), reasons)


def _delay(
    decision: GroupDecision,
    last_add: float | None,
    delay_s: float,
    mono_s: float,
    going: Set[str] = frozenset(),
) -> _Step:
    kept = [x for x in decision.deletions if _voluntary(x, going)]
    if last_add is None or not kept or mono_s - last_add >= delay_s:
        return _Step(decision)
    left = delay_s - max(0.0, mono_s - last_add)
    why = Disruption(
        DisruptionKind.SCALE_DOWN_DELAY, count=len(kept), detail=f"{delay_s:g} s", wait_s=left
    )
    return _Step(_keep(decision, kept), (why,))


def in_flight(decision: GroupDecision, slices: GroupSlices, memory: Memory) -> int:
    """Slices of the group already leaving: terminating, recorded as draining, drained for
    preemption, or deleted or drained by this plan for a reason other than voluntary."""
    going = _going_keys(slices)
    planned = {
        x.slice_key for x in (*decision.deletions, *decision.preempt) if not _voluntary(x, going)
    }
    return len(_leaving(slices, memory) | planned)


def in_flight_of(slices: GroupSlices, memory: Memory) -> int:
    """Slices of the group already leaving, before any plan of this round."""
    return len(_leaving(slices, memory))


def _leaving(slices: GroupSlices, memory: Memory) -> set[str]:
    keys = {s.key for s in slices.slices}
    leaving = {s.key for s in slices.by_state(SliceState.TERMINATING)}
    leaving |= keys & set(memory.draining.get(slices.group.name, ()))
    return leaving | (keys & set(memory.preempting))


def _budget(decision: GroupDecision, slices: GroupSlices, budget: Budget, memory: Memory) -> _Step:
    chosen = [x for x in decision.deletions if _voluntary(x, _going_keys(slices))]
    if not chosen:
        return _Step(decision)
    limit = budget.allowed(len(slices.slices))
    busy = in_flight(decision, slices, memory)
    kept = chosen[max(0, limit - busy) :]  # the first ones are the longest idle
    if not kept:
        return _Step(decision)
    why = Disruption(
        DisruptionKind.BUDGET, count=len(kept), detail=str(budget), limit=limit, in_flight=busy
    )
    return _Step(_keep(decision, kept), (why,))


def _surplus_despite(decision: GroupDecision, slices: GroupSlices) -> tuple[Reason, ...]:
    """Say so when honouring maxReplicas removes a do-not-disrupt slice."""
    protected = {s.key: s.do_not_disrupt for s in slices.slices if s.do_not_disrupt}
    return tuple(
        Disruption(
            DisruptionKind.ABOVE_MAX_DESPITE, x.slice_key, detail=protected[x.slice_key] or ""
        )
        for x in (*decision.deletions, *decision.preempt)
        if x.slice_key in protected
        and isinstance(x.reason, ScaleDown)
        and x.reason.kind in _SURPLUS
    )
