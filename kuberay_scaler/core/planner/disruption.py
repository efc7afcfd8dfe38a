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

GKE maintenance (where the daemon may read nodes; `maintenance`, node name → its window): a
slice on a node whose window starts within the preemption deadline (or tainted
impending-node-termination) is going like one with DisruptionTarget, its drain's deadline the
window's start; a busy one gets its home (a kept spare or a slice added ahead) once the window is
within MAINTENANCE_REPLACE_AHEAD_S; an idle one leaves in place of another idle slice the group
removes (`MAINTENANCE_FIRST`, still voluntary: do-not-disrupt, the delay and the budget apply).

Only idle scale-down (`ScaleDownKind.IDLE`, `MAINTENANCE_FIRST`) is voluntary disruption here;
a rollover of outdated slices, where present, joins `VOLUNTARY`.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass, replace
from datetime import datetime
from types import MappingProxyType

from kuberay_scaler.core.defaults import MAINTENANCE_REPLACE_AHEAD_S
from kuberay_scaler.core.model.cluster import Budget
from kuberay_scaler.core.model.plan import (
    At,
    DeleteKind,
    GroupDecision,
    GroupRules,
    Memory,
    SliceDeletion,
    seconds_until,
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
from kuberay_scaler.core.model.signals import NodeMaintenance
from kuberay_scaler.core.model.slices import GroupSlices, Slice, SliceState

SliceRef = tuple[str | None, str | None]
# Removals the budget, the delay and do-not-disrupt govern (the user's or our choice to remove).
VOLUNTARY = frozenset(
    {ScaleDownKind.IDLE, ScaleDownKind.MAINTENANCE_FIRST, ScaleDownKind.GANG_DEADLINE}
)
_NO_NODES: Mapping[str, NodeMaintenance] = MappingProxyType({})
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
    preempting: Mapping[str, float]  # going slices drained for preemption → deadline
    disrupted: tuple[str, ...] = ()  # going slices drained for preemption (this plan or before)


@dataclass(frozen=True)
class _Cause:
    """Why a slice is going: a pod's DisruptionTarget, or maintenance on one of its nodes."""

    detail: str
    window: NodeMaintenance | None = None  # maintenance; None: DisruptionTarget

    @property
    def name(self) -> str:
        return "DisruptionTarget" if self.window is None else "maintenance"


@dataclass(frozen=True)
class _Nodes:
    """The group's slices as GKE maintenance sees them, at this plan's moment."""

    windows: Mapping[str, NodeMaintenance]  # slice key → its earliest maintenance
    causes: Mapping[str, _Cause]  # going slices (DisruptionTarget or maintenance due)
    ahead: frozenset[str]  # busy slices whose window is within the replace-ahead lead
    wall: datetime  # the wall clock of this plan (windows are wall times)
    drain_lead_s: float  # a slice is going this long before its window: the preemption deadline

    @property
    def going(self) -> frozenset[str]:
        return frozenset(self.causes)


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
    at: At,
    *,
    maintenance: Mapping[str, NodeMaintenance] = _NO_NODES,
) -> Disrupted:
    """Apply the disruption rules to one group's decision (see the module docstring).

    `at.mono_s`: the monotonic clock (seconds) preemption deadlines (Memory.preempting) and the
    scale-down delay are kept on; `at.now`: the wall clock the reasons show them on and the
    maintenance windows are compared with; `maintenance`: node name → its announcement."""
    mono_s = at.mono_s
    name = decision.group
    if decision.held is not None and decision.held.kind is not HoldKind.WORKERS_TO_DELETE_PENDING:
        # Held (e.g. our last write unseen): nothing decided, nothing forgotten.
        keys = {s.key for s in slices.slices}
        kept = tuple(k for k, g in memory.disrupted.items() if g == name and k in keys)
        shown = replace(decision, rules=shown_rules(rules, in_flight_of(slices, memory)))
        return Disrupted(
            shown, memory.scaled_up_at.get(name), _ahead_kept(memory, slices), {}, kept
        )
    nodes = _nodes(slices, maintenance, rules, at.now)
    going = _going(decision, slices, rules, memory, needed, at, nodes)
    first = _maintenance_first(going.step.decision, slices, nodes, needed)
    step = _do_not_disrupt(first.decision, slices, nodes.going)
    # A slice added ahead for a going one is no growth: it does not start the delay (the going
    # slice's replica comes back once its pods are gone; the idle one of them leaves as usual).
    added = decision.new_hosts > 0
    last_add = mono_s if added else memory.scaled_up_at.get(name)
    delay_step = _delay(step.decision, last_add, rules.delay_s, mono_s, nodes.going)
    budget_step = _budget(delay_step.decision, slices, rules.budget, memory, nodes.going)
    capped = _ahead_within_max(budget_step.decision, going, slices, memory)
    going, budget_step = capped.going, replace(budget_step, decision=capped.decision)
    surplus = _surplus_despite(budget_step.decision, slices)
    reasons = (
        *going.step.reasons,
        *first.reasons,
        *step.reasons,
        *delay_step.reasons,
        *budget_step.reasons,
        *surplus,
    )
    out = replace(
        budget_step.decision,
        reasons=(*budget_step.decision.reasons, *reasons),
        rules=shown_rules(rules, in_flight(budget_step.decision, slices, memory, nodes.going)),
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
    preempting: Mapping[str, float]
    drained: tuple[str, ...]  # going slices drained for preemption (this plan or before)


def _going(
    decision: GroupDecision,
    slices: GroupSlices,
    rules: DisruptionRules,
    memory: Memory,
    needed: Set[SliceRef],
    at: At,
    nodes: _Nodes,
) -> _Going:
    handled = {x.slice_key for x in (*decision.deletions, *decision.preempt)}
    going = [
        s
        for s in slices.slices
        if s.key in nodes.causes and s.state is not SliceState.TERMINATING and s.key not in handled
    ]
    abandoned = _abandoned(slices, memory, handled, at, nodes.going)
    drains = tuple(_drain(s, rules, memory, at, nodes) for s in going)
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
    moving = [*going, *(s for s in slices.slices if s.key in nodes.ahead and s.key not in handled)]
    homes = _homes(decision, slices, moving, memory, needed, nodes)
    drained = {k for k, g in memory.disrupted.items() if g == slices.group.name} | set(deadlines)
    return _Going(
        _Step(homes.decision, (*said, *abandoned.reasons, *homes.reasons, *_announced(nodes))),
        (*_ahead_kept(memory, slices), *homes.ahead),
        MappingProxyType(deadlines),
        tuple(sorted(drained & {s.key for s in slices.slices})),
    )


@dataclass(frozen=True)
class _Abandoned:
    deletions: tuple[SliceDeletion, ...]
    reasons: tuple[Reason, ...]


def _abandoned(
    slices: GroupSlices,
    memory: Memory,
    handled: Set[str],
    at: At,
    going: Set[str],
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
        if memory.disrupted.get(sl.key) != name or sl.key in going or deadline is None:
            continue
        if sl.state is SliceState.TERMINATING or sl.key in handled:
            continue
        if deadline > at.mono_s:
            on_wall = at.shown(deadline).isoformat()  # kept monotonic, shown on the wall
            until = f"its hosts stay drained; replaced whole at {on_wall}"
            wait_s = seconds_until(deadline, at.mono_s)  # the loop plans again then
            reasons.append(
                Disruption(DisruptionKind.ABANDONED, sl.key, detail=until, wait_s=wait_s)
            )
            continue
        cause = (
            "drained for a disruption that did not happen (DisruptionTarget or maintenance"
            " cleared); its hosts"
            " stay drained in Ray"
        )
        why = Replace(sl.key, None, cause)
        deletions.append(SliceDeletion(sl.key, sl.pod_names, (), DeleteKind.REPLACE, why))
        reasons.append(why)
    return _Abandoned(tuple(deletions), tuple(reasons))


@dataclass(frozen=True)
class _Drain:
    drain: SliceDeletion
    deadline: float  # monotonic seconds (Memory.preempting)
    new: bool  # not drained before


def _drain(
    sl: Slice,
    rules: DisruptionRules,
    memory: Memory,
    at: At,
    nodes: _Nodes,
) -> _Drain:
    """The preemption drain of a going slice; its reason says the deadline on the wall clock.
    For maintenance the deadline is the window's start (on the monotonic clock), at most the
    preemption deadline away; for a tainted node, the preemption deadline."""
    known = memory.preempting.get(sl.key)
    cause = nodes.causes[sl.key]
    window = cause.window
    lead_s = rules.preempt_deadline_s
    if window is not None and not window.impending and window.window_start_ms is not None:
        lead_s = min(lead_s, max(0.0, window.window_start_ms / 1000 - nodes.wall.timestamp()))
    deadline = at.mono_s + lead_s if known is None else known
    on_wall = at.shown(deadline)
    if window is not None:
        why = ScaleDown(
            ScaleDownKind.MAINTENANCE, sl.key, len(sl.hosts), deadline=on_wall, detail=cause.detail
        )
    else:
        reason = cause.detail.split(": ", 1)[-1]
        why = ScaleDown(
            ScaleDownKind.DISRUPTION_TARGET, sl.key, len(sl.hosts), deadline=on_wall, cause=reason
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
    nodes: _Nodes,
) -> _Homes:
    """A home for the work of each going slice that has work (busy, or demand placed on it):
    an idle slice of the group that nothing else needs (its idle scale-down, if planned, is
    dropped), else one slice added ahead while the group is below maxReplicas."""
    group = slices.group
    working = [s for s in going if s.working_hosts or (group.name, s.key) in needed]
    homeless = [s for s in working if s.key not in memory.replaced_ahead]
    # A slice replaced ahead of a maintenance window (up to MAINTENANCE_REPLACE_AHEAD_S before
    # it) keeps an idle slice until it goes: else its replacement would idle out first.
    housed = [s for s in working if s.key in memory.replaced_ahead and s.key in nodes.windows]
    spares = [
        s
        for _, key, s in slices.idle_by_since
        if key not in nodes.going
        and key not in nodes.windows
        and (group.name, key) not in needed
        and not s.do_not_disrupt
    ][::-1]  # the least idle first: the longest idle are the ones scale-down removes first
    reasons: list[Reason] = []
    kept: set[str] = set()
    ahead: list[str] = []
    target = decision.target
    for sl in homeless:
        cause = nodes.causes.get(sl.key) or _Cause(
            nodes.windows[sl.key].describe(), nodes.windows[sl.key]
        )
        detail = cause.detail
        if spares:
            spare = spares.pop(0)
            kept.add(spare.key)
            reasons.append(Disruption(DisruptionKind.SPARE_KEPT, spare.key, detail=detail))
        elif not group.suspend and target < group.max_replicas:
            target += 1
            ahead.append(sl.key)
            reasons.append(
                Disruption(DisruptionKind.REPLACED_AHEAD, sl.key, detail=detail, cause=cause.name)
            )
        else:
            limit = f"maxReplicas {group.max_replicas}"
            reasons.append(Disruption(DisruptionKind.NO_ROOM, sl.key, detail=limit))
    for sl in housed:
        if spares:
            spare = spares.pop(0)
            kept.add(spare.key)
            detail = f"replaced ahead of {nodes.windows[sl.key].describe()}"
            reasons.append(Disruption(DisruptionKind.SPARE_KEPT, spare.key, detail=detail))
    dropped = [x for x in decision.deletions if x.slice_key in kept and _voluntary(x)]
    reasons += [
        Disruption(DisruptionKind.GOING, s.key, detail=c.detail, cause=c.name)
        for s in going
        if (c := nodes.causes.get(s.key)) is not None
    ]
    decision = replace(
        decision,
        target=target + len(dropped),
        deletions=tuple(x for x in decision.deletions if x not in dropped),
    )
    return _Homes(decision, tuple(reasons), bool(ahead), tuple(ahead))


@dataclass(frozen=True)
class _Capped:
    decision: GroupDecision
    going: _Going


def _ahead_within_max(
    decision: GroupDecision, going: _Going, slices: GroupSlices, memory: Memory
) -> _Capped:
    """This plan's slices added ahead, within maxReplicas once the later steps have kept their
    idle slices: a spare, do-not-disrupt, the delay and the budget each give a replica back,
    and the room an addition took may have been one of theirs. KubeRay clamps replicas to
    maxReplicas, so an addition above it would never launch: the last ones give way, each
    said (`NO_ROOM`), and their going slices are not remembered as replaced (a later plan
    tries again)."""
    limit = slices.group.max_replicas
    added = [k for k in going.ahead if k not in memory.replaced_ahead]
    over = min(max(0, decision.target - limit), len(added))
    if not over:
        return _Capped(decision, going)
    undone = frozenset(added[len(added) - over :])
    detail = f"maxReplicas {limit}; the idle slices this plan keeps fill it"
    reasons = tuple(
        Disruption(DisruptionKind.NO_ROOM, r.slice, detail=detail)
        if isinstance(r, Disruption)
        and r.kind is DisruptionKind.REPLACED_AHEAD
        and r.slice in undone
        else r
        for r in going.step.reasons
    )
    return _Capped(
        replace(decision, target=decision.target - over),
        replace(
            going,
            step=replace(going.step, reasons=reasons),
            ahead=tuple(k for k in going.ahead if k not in undone),
        ),
    )


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


def _do_not_disrupt(decision: GroupDecision, slices: GroupSlices, going: Set[str]) -> _Step:
    protected = {s.key: s.do_not_disrupt for s in slices.slices if s.do_not_disrupt}
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


def in_flight(
    decision: GroupDecision,
    slices: GroupSlices,
    memory: Memory,
    going: Set[str] | None = None,
) -> int:
    """Slices of the group already leaving: terminating, recorded as draining, drained for
    preemption, or deleted or drained by this plan for a reason other than voluntary."""
    going = _going_keys(slices) if going is None else going
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


def _budget(
    decision: GroupDecision, slices: GroupSlices, budget: Budget, memory: Memory, going: Set[str]
) -> _Step:
    chosen = [x for x in decision.deletions if _voluntary(x, going)]
    if not chosen:
        return _Step(decision)
    limit = budget.allowed(len(slices.slices))
    busy = in_flight(decision, slices, memory, going)
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


# --- GKE maintenance ----------------------------------------------------------------------------


def _nodes(
    slices: GroupSlices,
    maintenance: Mapping[str, NodeMaintenance],
    rules: DisruptionRules,
    wall: datetime,
) -> _Nodes:
    """Each slice's earliest maintenance, and which slices are going (DisruptionTarget, or a
    window within the preemption deadline, or the taint) or due a replacement ahead."""
    windows: dict[str, NodeMaintenance] = {}
    for sl in slices.slices:
        found = [maintenance[n] for h in sl.hosts if (n := h.node_name) and n in maintenance]
        if found:
            windows[sl.key] = min(found, key=_urgency)
    causes: dict[str, _Cause] = {}
    ahead: set[str] = set()
    for sl in slices.slices:
        window = windows.get(sl.key)
        left_s = _seconds_left(window, wall) if window is not None else None
        if sl.going:
            causes[sl.key] = _Cause(sl.going)
        elif window is not None and left_s is not None and left_s <= rules.preempt_deadline_s:
            causes[sl.key] = _Cause(window.describe(), window)
        elif left_s is not None and left_s <= MAINTENANCE_REPLACE_AHEAD_S and sl.working_hosts:
            ahead.add(sl.key)
    return _Nodes(
        MappingProxyType(windows),
        MappingProxyType(causes),
        frozenset(ahead),
        wall,
        rules.preempt_deadline_s,
    )


def _urgency(window: NodeMaintenance) -> float:
    return -1.0 if window.impending else float(window.window_start_ms or 0)


def _seconds_left(window: NodeMaintenance, wall: datetime) -> float | None:
    """Seconds until the window starts (0: tainted, going now); None: no start known."""
    if window.impending:
        return 0.0
    if window.window_start_ms is None:
        return None
    return window.window_start_ms / 1000 - wall.timestamp()


def _announced(nodes: _Nodes) -> tuple[Reason, ...]:
    """One reason per slice on a node with upcoming maintenance that is not going yet: it names
    the window, and wakes the loop when the window comes within the replace-ahead lead, then
    within the preemption deadline."""
    out: list[Reason] = []
    for key, window in sorted(nodes.windows.items()):
        if key in nodes.causes:
            continue
        left_s = _seconds_left(window, nodes.wall)
        wait_s = None
        if left_s is not None:  # the next moment time alone changes it: the lead, the drain
            lead = left_s - MAINTENANCE_REPLACE_AHEAD_S
            wait_s = lead if lead > 0 else max(0.0, left_s - nodes.drain_lead_s)
        out.append(
            Disruption(DisruptionKind.MAINTENANCE, key, detail=window.describe(), wait_s=wait_s)
        )
    return tuple(out)


def _maintenance_first(
    decision: GroupDecision,
    slices: GroupSlices,
    nodes: _Nodes,
    needed: Set[SliceRef],
) -> _Step:
    """An idle slice on a node with upcoming maintenance leaves before any other idle slice:
    each idle removal of a slice without maintenance is given to one with it (nothing needs
    it, no do-not-disrupt), the earliest window first; then the maintenance removals go first
    (the budget keeps the first ones). The group removes no more slices than it did."""
    name = slices.group.name
    chosen = {x.slice_key for x in (*decision.deletions, *decision.preempt)}
    candidates = sorted(
        (
            s
            for _, key, s in slices.idle_by_since
            if key in nodes.windows
            and key not in nodes.going
            and key not in chosen
            and (name, key) not in needed
            and not s.do_not_disrupt
        ),
        key=lambda s: _urgency(nodes.windows[s.key]),
    )
    swapped: list[SliceDeletion] = []
    out: list[SliceDeletion] = []
    reasons: list[Reason] = []
    for x in decision.deletions:
        idle = isinstance(x.reason, ScaleDown) and x.reason.kind is ScaleDownKind.IDLE
        if idle and x.slice_key not in nodes.windows and candidates:
            sl = candidates.pop(0)
            detail = f"{nodes.windows[sl.key].describe()} (in place of idle slice {x.slice_key})"
            why = ScaleDown(ScaleDownKind.MAINTENANCE_FIRST, sl.key, len(sl.hosts), detail=detail)
            swapped.append(SliceDeletion(sl.key, sl.pod_names, sl.node_ids, DeleteKind.IDLE, why))
            reasons.append(why)
            continue
        out.append(x)
    ordered = sorted(out, key=lambda x: x.slice_key not in nodes.windows)
    # The idle path's reasons for the slices that now stay would say they leave: dropped.
    given = {x.reason for x in decision.deletions if x not in out}
    kept_reasons = tuple(r for r in decision.reasons if r not in given)
    decision = replace(decision, deletions=(*swapped, *ordered), reasons=kept_reasons)
    return _Step(decision, tuple(reasons))
