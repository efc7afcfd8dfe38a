"""The plan of a frame that decides nothing (not synced, suspended, demand unknown): every
group held, with its rules shown and a workersToDelete clean-up still written."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from kuberay_scaler.core.model.cluster import ClusterSpec, WorkerGroup
from kuberay_scaler.core.model.plan import GroupDecision, Memory, Plan
from kuberay_scaler.core.model.reasons import Hold, PlanProblem
from kuberay_scaler.core.model.slices import SliceMap
from kuberay_scaler.core.planner.disruption import in_flight_of, shown_rules
from kuberay_scaler.core.planner.groups import GroupNotes, Notes
from kuberay_scaler.core.planner.policy import Policy


def held_plan(
    spec: ClusterSpec,
    slice_map: SliceMap | None,
    memory: Memory,
    problems: Sequence[PlanProblem],
    why: Hold,
    groups: Notes | None = None,
    policy: Policy | None = None,
) -> Plan:
    decisions = tuple(
        _held(group, slice_map, memory, why, groups.get(group.name) if groups else None, policy)
        for group in spec.groups
    )
    return Plan(
        cluster=spec.name,
        uid=spec.uid,
        resource_version=spec.resource_version,
        groups=decisions,
        infeasible=(),
        problems=tuple(problems),
        slice_map=slice_map,
        memory=memory,
        held=why,
    )


def _held(
    group: WorkerGroup,
    slice_map: SliceMap | None,
    memory: Memory,
    why: Hold,
    note: GroupNotes | None,
    policy: Policy | None,
) -> GroupDecision:
    gs = slice_map.groups.get(group.name) if slice_map else None
    rules = (  # configuration: shown even when nothing is planned
        shown_rules(policy.disruption_rules(group), in_flight_of(gs, memory) if gs else 0)
        if policy
        else None
    )
    clear = bool(note and note.clear_wtd and not note.hold_all)
    return replace(
        GroupDecision.unchanged(group, why),
        clear_workers_to_delete=clear,
        reasons=(*(note.reasons if clear and note else ()), why),
        rules=rules,
    )
