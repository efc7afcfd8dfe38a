"""One bad group never stops the others: when planning a frame raises, each group is planned
alone to find the ones that raise; those are held with a named problem (PLAN_FAILED) and the
others planned without them. Takes the frame's planning as a function, so it sits below it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from kuberay_scaler.core.model.cluster import Problem
from kuberay_scaler.core.model.plan import GroupDecision, Plan, Snapshot
from kuberay_scaler.core.model.reasons import Hold, HoldKind, ProblemKind
from kuberay_scaler.core.planner.gate import Evidence

PlanFrame = Callable[[Snapshot, Evidence | None], Plan]


def isolated(frame: PlanFrame, snapshot: Snapshot, evidence: Evidence | None) -> Plan:
    """`frame(snapshot, evidence)`; if it raises, the plan without the groups that raise."""
    try:
        return frame(snapshot, evidence)
    except Exception:  # a planner bug reached by one group's numbers: find the group
        failed = failing_groups(frame, snapshot)
        if not failed:
            raise  # not one group's doing: the loop counts it (and /healthz says so)
        return without_groups(frame, snapshot, failed)


def failing_groups(frame: PlanFrame, snapshot: Snapshot) -> dict[str, str]:
    """Each group planned alone; the ones that raise, with what they raised."""
    failed: dict[str, str] = {}
    for group in snapshot.spec.groups:
        others = tuple(g.name for g in snapshot.spec.groups if g is not group)
        try:
            frame(skip_groups(snapshot, others, ()), None)
        except Exception as err:
            failed[group.name] = f"{type(err).__name__}: {err}"
    return failed


def without_groups(frame: PlanFrame, snapshot: Snapshot, failed: Mapping[str, str]) -> Plan:
    """The plan of the other groups, the failed ones held (PLAN_FAILED) in spec order."""
    problems = tuple(
        Problem(f"planning failed ({why}); group skipped, the others planned", name)
        for name, why in failed.items()
    )
    result = frame(skip_groups(snapshot, tuple(failed), problems), None)
    held = [
        GroupDecision.unchanged(g, Hold(HoldKind.PLAN_FAILED, g.name, detail=failed[g.name]))
        for g in snapshot.spec.groups
        if g.name in failed
    ]
    said = {q.message for q in problems}
    tagged = tuple(
        replace(p, kind=ProblemKind.PLAN_FAILED) if p.message in said else p
        for p in result.problems
    )
    groups = tuple(sorted((*result.groups, *held), key=lambda d: d.index))
    return replace(result, groups=groups, problems=tagged)


def skip_groups(
    snapshot: Snapshot, names: tuple[str, ...], problems: tuple[Problem, ...]
) -> Snapshot:
    spec = snapshot.spec
    kept = tuple(g for g in spec.groups if g.name not in names)
    skipped = replace(
        spec,
        groups=kept,
        skipped_groups=(*spec.skipped_groups, *names),
        problems=(*spec.problems, *problems),
    )
    return replace(snapshot, spec=skipped)
