"""What a plan carries to the next frame: Memory folded from the stage results (backoffs,
preemption deadlines, the broken-busy bound, refused drains, availability), the timers the
loop wakes for, and the plan-wide notes (join settling, infeasible demand merged)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from kuberay_scaler.core.model.availability import GroupAvailability
from kuberay_scaler.core.model.cluster import ClusterSpec
from kuberay_scaler.core.model.plan import (
    GroupDecision,
    Infeasible,
    Memory,
    ReplaceBackoff,
    seconds_until,
)
from kuberay_scaler.core.model.reasons import (
    Demand,
    Hold,
    HoldKind,
    PlanProblem,
    ProblemKind,
    ScaleDown,
    ScaleDownKind,
)
from kuberay_scaler.core.model.slices import SliceMap
from kuberay_scaler.core.planner.availability import AvailabilityResult
from kuberay_scaler.core.planner.capacity import Capacity
from kuberay_scaler.core.planner.disruption import Disrupted
from kuberay_scaler.core.planner.gang_deadline import GangDeadlines
from kuberay_scaler.core.planner.group_decision import GroupOutcome
from kuberay_scaler.core.planner.policy import Policy
from kuberay_scaler.core.planner.queues import Queues
from kuberay_scaler.core.planner.replace import FORGET_AFTER_S, live_backoff
from kuberay_scaler.core.planner.rooms import Fitted


@dataclass(frozen=True)
class StageResults:
    """The results of one frame's stages, for the plan and the memory it carries."""

    judged: AvailabilityResult
    gangs: GangDeadlines
    capacity: Capacity
    fitted: Fitted
    queues: Queues
    outcomes: Sequence[GroupOutcome]
    disrupted: Sequence[Disrupted]


def memory_after(
    memory: Memory, stages: StageResults, slice_map: SliceMap, spec: ClusterSpec, mono_s: float
) -> Memory:
    """Memory after this plan: each stage's delta folded into last plan's."""
    outcomes, disrupted = stages.outcomes, stages.disrupted
    return replace(
        memory,
        backoff=backoff_after(memory, outcomes, mono_s),
        preempting=preempting_after(memory, outcomes, disrupted, slice_map),
        broken_busy_since=broken_busy_after(outcomes),
        refused=MappingProxyType(live_refused(memory, slice_map, mono_s)),
        availability=kept_availability(stages.judged, memory, spec),
        scaled_up_at=MappingProxyType(
            {x.decision.group: x.scaled_up_at for x in disrupted if x.scaled_up_at is not None}
        ),
        queued_unneeded_since=stages.queues.unneeded_since,
        reservations=stages.queues.marks,
        replaced_ahead=MappingProxyType(
            {key: x.decision.group for x in disrupted for key in x.replaced_ahead}
        ),
        disrupted=MappingProxyType(
            {key: x.decision.group for x in disrupted for key in x.disrupted}
        ),
    )


def next_deadline_s(memory: Memory, policy: Policy, mono_s: float) -> float | None:
    """Seconds from `mono_s` until the first timer in `memory` runs out (preemption notices, the
    broken-busy bound, replace and refused-drain backoffs); None when none is ahead. Each is a
    decision time alone brings, so the loop wakes for it (`Plan.next_wake_s`)."""
    ends = [
        *memory.preempting.values(),
        *(
            since + policy.deadlines.broken_busy_max_s
            for since in memory.broken_busy_since.values()
        ),
        *(b.until for b in memory.backoff.values()),
        *(r.until for r in memory.refused.values()),
    ]
    ahead = [seconds_until(end, mono_s) for end in ends if end > mono_s]
    return min(ahead) if ahead else None


def backoff_after(
    memory: Memory, outcomes: Sequence[GroupOutcome], mono_s: float
) -> Mapping[str, ReplaceBackoff]:
    """Last plan's replace backoffs with each group's new one (still live)."""
    backoff = dict(memory.backoff)
    for o in outcomes:
        if o.replaced.backoff is not None:
            backoff[o.decision.group] = o.replaced.backoff
    return MappingProxyType(live_backoff(backoff, mono_s))


def broken_busy_after(outcomes: Sequence[GroupOutcome]) -> Mapping[str, float]:
    """Broken-busy slices kept this plan, slice key → since (the bound runs from then)."""
    return MappingProxyType(
        {k: v for o in outcomes for k, v in o.replaced.broken_busy_since.items()}
    )


def preempting_after(
    memory: Memory,
    outcomes: Sequence[GroupOutcome],
    disrupted: Sequence[Disrupted],
    slice_map: SliceMap,
) -> Mapping[str, float]:
    """The preemption deadlines after this plan: the surplus path's, the broken-busy bound's,
    the disruption stage's; and last plan's of slices still there the surplus path did not judge."""
    preempting: dict[str, float] = {}
    for o in outcomes:
        preempting.update(o.surplus_preempting)
    for o in outcomes:
        preempting.update(o.replaced.preempting)
    for x in disrupted:
        preempting.update(x.preempting)
    # Deadlines set after the drains (a partly drained slice) outlive the plans between.
    alive = slice_keys(slice_map) if memory.preempting else set()
    judged = _surplus_keys(x.decision for x in disrupted)
    for key, deadline in memory.preempting.items():
        if key in alive and key not in judged:
            preempting.setdefault(key, deadline)
    return MappingProxyType(preempting)


def _surplus_keys(decisions: Iterable[GroupDecision]) -> set[str]:
    """Slices the surplus path judged (it alone decides whether their deadline stays)."""
    return {
        r.slice
        for d in decisions
        for r in d.reasons
        if isinstance(r, ScaleDown) and r.kind in _SURPLUS_KINDS
    }


_SURPLUS_KINDS = (ScaleDownKind.ABOVE_MAX, ScaleDownKind.PREEMPT, ScaleDownKind.PREEMPTED)


def slice_keys(slice_map: SliceMap) -> set[str]:
    return {s.key for gs in slice_map.groups.values() for s in gs.slices}


def live_refused(memory: Memory, slice_map: SliceMap, mono_s: float) -> dict[str, Any]:
    """Refused-drain backoffs of slices that still exist (forgotten a while after they end)."""
    if not memory.refused:
        return {}
    keys = slice_keys(slice_map)
    return {
        k: v for k, v in memory.refused.items() if k in keys and v.until + FORGET_AFTER_S > mono_s
    }


def kept_availability(
    judged: AvailabilityResult, memory: Memory, spec: ClusterSpec
) -> Mapping[str, GroupAvailability]:
    """This frame's availability, and last frame's of groups skipped this frame (a group whose
    planning raised keeps its backoff)."""
    skipped = [n for n in spec.skipped_groups if n in memory.availability]
    if not skipped:
        return judged.groups
    kept = {n: memory.availability[n] for n in skipped}
    return MappingProxyType({**kept, **judged.groups})


def next_probes(groups: Mapping[str, GroupAvailability], mono_s: float) -> dict[str, float]:
    return {
        name: max(0.0, a.until_mono - mono_s)
        for name, a in groups.items()
        if a.blocks_launch and a.until_mono is not None
    }


def settling(
    decisions: list[GroupDecision], cap: Capacity, policy: Policy
) -> tuple[list[GroupDecision], float | None]:
    """Name the demand that hosts just joined held (`Hold(JOIN_SETTLING)` in their group's
    reasons), and the seconds until the first of them stops settling (the loop plans again
    then: the same reply may need a slice by that time)."""
    used = [(b, left) for b, left in cap.settling if b.used]
    if not used:
        return decisions, None
    hosts = Counter(b.group for b, _ in used)
    detail = f"{policy.deadlines.join_settle_s:g}s"
    out = [
        replace(
            d, reasons=(*d.reasons, Hold(HoldKind.JOIN_SETTLING, d.group, detail, hosts[d.group]))
        )
        if d.group in hosts
        else d
        for d in decisions
    ]
    return out, min(left for _, left in used)


def waits_on_existing(waiting: Iterable[tuple[Demand, int]]) -> tuple[PlanProblem, ...]:
    return tuple(
        PlanProblem(
            ProblemKind.WAITS_ON_EXISTING_NODE,
            f"{n}× {demand} waits for an existing node (never launched for)",
            demand=demand,
            count=n,
        )
        for demand, n in waiting
    )


def merge_infeasible(items: Iterable[Infeasible]) -> tuple[Infeasible, ...]:
    # Keyed without `request` (its mappings do not hash); the first request stands for all.
    merged: Counter[tuple[object, ...]] = Counter()
    first: dict[tuple[object, ...], Infeasible] = {}
    for item in items:
        key = (item.demand, item.kind, item.missing, item.certain)
        merged[key] += item.count
        first.setdefault(key, item)
    return tuple(replace(first[key], count=n) for key, n in merged.items())


def first(*waits: float | None) -> float | None:
    ahead = [w for w in waits if w is not None]
    return min(ahead) if ahead else None
