"""plan(snapshot, ray, memory, policy, now) -> Plan: the one place scaling is decided.

The stages, in their fixed order (each a function from values to a frozen result, folded here;
docs/planner.md): the slice map; the groups' analysis; availability; gang deadlines;
capacity; rooms; the demand fitted; the deletion gate's evidence; the queues; each group's
decision (surplus, cancellations, released, replacements, idle; its target); disruption;
the plan and the memory it carries; recorded drains finished. One bad group never stops the
others (isolation.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from types import MappingProxyType

from kuberay_scaler.core.model.plan import At, Memory, Plan, Snapshot, mono_of
from kuberay_scaler.core.model.ray import RayState, epoch_ms
from kuberay_scaler.core.model.reasons import Hold, HoldKind, PlanProblem, ProblemKind
from kuberay_scaler.core.model.signals import CapacityEvent, NodeMaintenance
from kuberay_scaler.core.model.slices import SliceMap
from kuberay_scaler.core.planner.availability import AvailabilityResult
from kuberay_scaler.core.planner.capacity import Capacity, CapacityMemo, build_capacity
from kuberay_scaler.core.planner.carried import (
    StageResults,
    first,
    memory_after,
    merge_infeasible,
    next_deadline_s,
    next_probes,
    settling,
    waits_on_existing,
)
from kuberay_scaler.core.planner.disruption import Disrupted, disruption_stage
from kuberay_scaler.core.planner.frame import News, problems_of
from kuberay_scaler.core.planner.gang_deadline import GangDeadlines
from kuberay_scaler.core.planner.gate import Evidence, evidence_for
from kuberay_scaler.core.planner.group_decision import GroupOutcome, Judging, decide_group
from kuberay_scaler.core.planner.groups import (
    Notes,
    analyse_groups,
    availability_stage,
    changes_by_group,
    gang_stage,
    replacing,
    shapes_of,
    with_availability,
    with_gangs,
    with_reasons,
    without_released,
)
from kuberay_scaler.core.planner.held import held_plan
from kuberay_scaler.core.planner.isolation import isolated
from kuberay_scaler.core.planner.memo import FrameMemo
from kuberay_scaler.core.planner.policy import Policy
from kuberay_scaler.core.planner.queues import Queues, queue_stage
from kuberay_scaler.core.planner.replace import BrokenBusy
from kuberay_scaler.core.planner.rooms import Fitted, fallbacks, fit_demand, room_limit
from kuberay_scaler.core.planner.scale_down import finish_recorded_drains
from kuberay_scaler.core.planner.stuck_gangs import gang_stuck_slices
from kuberay_scaler.core.slicemap import build_slice_map

__all__ = ["Policy", "next_deadline_s", "plan"]


def plan(
    snapshot: Snapshot,
    ray: RayState | None,
    memory: Memory,
    policy: Policy,
    now: datetime,
    evidence: Evidence | None = None,
    *,
    mono_s: float | None = None,
    events: tuple[CapacityEvent, ...] = (),
    maintenance: Mapping[str, NodeMaintenance] | None = None,
    memo: FrameMemo | None = None,
) -> Plan:
    """The plan for every group; a group whose planning raises is held with a named problem
    and the others are planned without it (one bad group never stops the others).

    `now`: the wall clock, for what Ray and Kubernetes read and people see. `mono_s`: the
    monotonic clock, for every duration that licenses a deletion (`mono_of`; None: `now`).
    `evidence`: the deletion gate's evidence for exactly these inputs, when the caller already
    built it (`decide()` does, so it is built once per frame); otherwise built here.
    `events`: capacity Events, oldest first (availability backoffs run on `mono_s` too).
    `maintenance`: GKE maintenance announced on nodes (node name → window), where readable.
    `memo`: the caller's frame memo (FrameMemo, carried across its frames); None: a cold one.
    The plan is the same either way."""
    mono = mono_of(mono_s, now)
    at = At(now, mono)
    news = News(events, MappingProxyType(dict(maintenance or {})))

    def frame(shot: Snapshot, ev: Evidence | None) -> Plan:
        # The memo's views are of the whole cluster: a frame without a failed group plans cold.
        warm = memo if shot is snapshot else None
        return _frame(shot, ray, memory, policy, at, ev, news, warm)

    result = isolated(frame, snapshot, evidence)
    return replace(result, now_ms=at.mono_ms, wall_ms=epoch_ms(at.now))


def _frame(
    snapshot: Snapshot,
    ray: RayState | None,
    memory: Memory,
    policy: Policy,
    at: At,
    evidence: Evidence | None,
    news: News,
    memo: FrameMemo | None = None,
) -> Plan:
    """The slice map and the groups' analysis; held whole when nothing can be decided."""
    spec = snapshot.spec
    problems = problems_of(ProblemKind.SPEC, spec.problems)
    problems += problems_of(ProblemKind.POD, snapshot.problems)
    if not snapshot.synced:
        return held_plan(spec, None, memory, problems, Hold(HoldKind.NOT_SYNCED), policy=policy)
    memo = memo or FrameMemo()  # None: a cold memo, this frame's alone
    slice_map = build_slice_map(
        spec,
        snapshot.hosts,
        ray,
        at.now,
        policy.deadlines.slice_timeouts,
        snapshot.clock,
        memo.slices,
    )
    analysed = analyse_groups(slice_map, memory)
    problems += problems_of(ProblemKind.SLICE_MAP, slice_map.problems) + analysed.problems
    if spec.suspended or ray is None:
        why = Hold(HoldKind.CLUSTER_SUSPENDED if spec.suspended else HoldKind.DEMAND_UNKNOWN)
        return held_plan(spec, slice_map, memory, problems, why, analysed.groups, policy)
    frame = _Frame(snapshot, slice_map, ray, memory, policy, at, news, memo.capacity)
    return frame.planned(analysed.groups, evidence, problems)


@dataclass(frozen=True)
class _Frame:
    """One frame's givens; each method below is one stage, called by `planned` in order."""

    snapshot: Snapshot
    slice_map: SliceMap
    ray: RayState
    memory: Memory
    policy: Policy
    at: At
    news: News
    capacity_memo: CapacityMemo  # the caller's, carried across frames (FrameMemo.capacity)

    def planned(
        self, groups: Notes, evidence: Evidence | None, problems: tuple[PlanProblem, ...]
    ) -> Plan:
        """The stages in their fixed order, each result folded into the next."""
        judged = availability_stage(
            self.snapshot,
            self.slice_map,
            self.ray,
            self.memory,
            self.policy,
            self.at,
            self.news,
        )
        groups = with_availability(groups, judged)
        gangs = gang_stage(
            self.snapshot, self.slice_map, self.ray, groups, judged, self.policy, self.at.now
        )
        groups = with_gangs(groups, gangs)
        capacity = self.capacity(groups, judged, gangs)
        fitted = self.fitted(groups, capacity)
        ev = evidence or self.evidence()
        groups = with_reasons(groups, changes_by_group(judged))
        queues = self.queues(groups, fitted, ev)
        outcomes = self.decided(groups, fitted, capacity, ev, queues)
        disrupted = self.disrupted(groups, outcomes, fitted)
        stages = StageResults(judged, gangs, capacity, fitted, queues, outcomes, disrupted)
        result = self.assembled(stages, problems)
        return finish_recorded_drains(result, self.memory.draining, ev, self.at)

    def capacity(self, groups: Notes, judged: AvailabilityResult, gangs: GangDeadlines) -> Capacity:
        """What exists to serve demand (the slices a gang released count as leaving)."""
        ray = self.ray
        unavailable = {n for n, a in judged.groups.items() if a.blocks_launch}
        return build_capacity(
            without_released(self.slice_map, gangs),
            ray,
            shapes_of(groups),
            replacing(groups, self.memory, self.at.mono_s) - unavailable,
            with_total=bool(ray.constraint),
            bins=bool(ray.tasks or ray.gangs or ray.constraint),
            now=self.at.now,
            settle_s=self.policy.deadlines.join_settle_s,
            unavailable=unavailable,
            memo=self.capacity_memo,
        )

    def fitted(self, groups: Notes, capacity: Capacity) -> Fitted:
        """Each group's room, then the demand fitted onto what exists and new slices."""
        mode = self.snapshot.spec.autoscaler.upscaling_mode
        limits = {
            n: room_limit(g, capacity, self.ray, self.memory, mode, self.at)
            for n, g in groups.items()
        }
        return fit_demand(self.ray, capacity, groups, limits)

    def evidence(self) -> Evidence:
        """The deletion gate's evidence (core/planner/gate.py), when the caller has none."""
        return evidence_for(
            self.snapshot.hosts,
            self.ray,
            self.snapshot.clock,
            self.policy.deadlines.missing_node_grace_s,
            self.at.now,
            self.memory.preempting,
        )

    def queues(self, groups: Notes, fitted: Fitted, ev: Evidence) -> Queues:
        """Reservation marks and grace, queued slices to cancel (queues.py)."""
        spec, at = self.snapshot.spec, self.at
        return queue_stage(
            self.slice_map,
            groups,
            fitted.groups,
            fitted.needed,
            spec,
            self.policy,
            self.memory,
            self.ray,
            ev,
            at,
        )

    def decided(
        self, groups: Notes, fitted: Fitted, capacity: Capacity, ev: Evidence, queues: Queues
    ) -> list[GroupOutcome]:
        """Each group's decision (group_decision.py), judged by the same values."""
        memory, policy = self.memory, self.policy
        busy = BrokenBusy(
            max_s=policy.deadlines.broken_busy_max_s,
            deadline_s=policy.deadlines.preempt_deadline_s,
            since=memory.broken_busy_since,
            preempting=memory.preempting,
            stuck=gang_stuck_slices(self.slice_map, self.ray),
        )
        judging = Judging(
            fitted.needed,
            self.snapshot.spec,
            policy,
            self.at,
            ev,
            busy,
            memory.backoff,
            memory.preempting,
            memory.refused,
        )
        return [
            decide_group(
                g, fitted.groups[n], capacity.virtual.get(n, 0), judging, queues.groups.get(n)
            )
            for n, g in groups.items()
        ]

    def disrupted(
        self, groups: Notes, outcomes: Sequence[GroupOutcome], fitted: Fitted
    ) -> list[Disrupted]:
        """The disruption stage (disruption.py) over each decision."""
        at = self.at
        return [
            disruption_stage(
                o.decision,
                groups[o.decision.group].slices,
                self.policy.disruption_rules(groups[o.decision.group].slices.group),
                self.memory,
                fitted.needed,
                at,  # its deadlines join Memory.preempting (monotonic); reasons show the wall
                maintenance=self.news.maintenance,
            )
            for o in outcomes
        ]

    def assembled(self, stages: StageResults, problems: tuple[PlanProblem, ...]) -> Plan:
        """The plan from the stage results, with the memory it carries and its timers."""
        spec, judged = self.snapshot.spec, stages.judged
        ordered = sorted((x.decision for x in stages.disrupted), key=lambda d: d.index)
        decisions, settle_s = settling(ordered, stages.capacity, self.policy)
        result = Plan(
            cluster=spec.name,
            uid=spec.uid,
            resource_version=spec.resource_version,
            groups=tuple(decisions),
            infeasible=merge_infeasible(stages.fitted.infeasible),
            problems=(*problems, *waits_on_existing(stages.fitted.waiting_on_existing)),
            slice_map=self.slice_map,
            memory=memory_after(self.memory, stages, self.slice_map, spec, self.at.mono_s),
            settle_s=settle_s,
            availability_changes=judged.changes,
            fallbacks=fallbacks(stages.fitted.groups),
            next_probe_s=MappingProxyType(next_probes(judged.groups, self.at.mono_s)),
            queue_wake_s=first(stages.queues.wake_s, stages.gangs.wake_s),
            gangs=stages.gangs.lines,
        )
        timers = (
            next_deadline_s(result.memory, self.policy, self.at.mono_s),
            judged.next_deadline_s,
        )
        return replace(result, deadline_s=min((t for t in timers if t is not None), default=None))
