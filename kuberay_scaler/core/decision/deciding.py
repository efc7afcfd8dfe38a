"""decide(): one observation → the plan past the gate (every drain assumed accepted) and every
write that carries it out, in order (the package's docstring says which). Pure."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from types import MappingProxyType

from kuberay_scaler.core.decision.document import Decision
from kuberay_scaler.core.decision.observation import Observation
from kuberay_scaler.core.decision.writes import writes_for
from kuberay_scaler.core.liveness import HostClock
from kuberay_scaler.core.model.plan import Memory, Snapshot, mono_of
from kuberay_scaler.core.model.ray import RayObservation, RayState
from kuberay_scaler.core.model.reasons import PlanProblem, ProblemKind
from kuberay_scaler.core.patch.ops import PatchError
from kuberay_scaler.core.planner.gate import evidence_for
from kuberay_scaler.core.planner.memo import FrameMemo
from kuberay_scaler.core.planner.pipeline import plan
from kuberay_scaler.core.planner.policy import Policy


def decide(
    observed: Observation,
    memory: Memory,
    policy: Policy,
    now: datetime,
    *,
    mono_s: float | None = None,
    memo: FrameMemo | None = None,
) -> Decision:
    """Plan from `observed` at `now` (wall clock) and `mono_s` (monotonic: every timer that
    licenses a deletion; None: `now` stands in) and list the writes that carry the plan out
    (the drain deadline Ray is handed: `policy.deadlines.drain_deadline_s`). `memo`: the
    caller's frame memo, carried across its frames (None: a cold one); the decision is the
    same either way."""
    mono = mono_of(mono_s, now)
    spec, hosts, pod_problems = observed.spec, observed.hosts, observed.pod_problems
    ray, ray_problem = _ray_state(observed.gcs)
    # One liveness clock and one gate evidence per frame: the slice map, the planner's deletion
    # paths and the gate below all judge by the same ones (without a daemon clock, one built
    # from the pods' timestamps, as each of them would build it).
    clock = observed.clock
    if clock is None:
        clock = HostClock.from_timestamps(hosts, ray.node_by_instance() if ray else {}, now)
    snapshot = Snapshot(spec, tuple(hosts), observed.synced, tuple(pod_problems), clock)
    memory = replace(
        memory,
        awaiting_write=MappingProxyType(dict(observed.awaiting_write)),
        draining=spec.draining,
    )
    grace_s = policy.deadlines.missing_node_grace_s
    ev = evidence_for(snapshot.hosts, ray, clock, grace_s, now, memory.preempting)
    events = observed.capacity_events
    nodes = observed.node_maintenance
    result = plan(
        snapshot,
        ray,
        memory,
        policy,
        now,
        ev,
        mono_s=mono_s,
        events=events,
        maintenance=nodes,
        memo=memo,
    )
    if ray_problem is not None:
        result = replace(result, problems=(*result.problems, ray_problem))
    # The gate also honours deadlines this plan set (preemptions it starts).
    deadlines = {**memory.preempting, **result.memory.preempting}
    ev = replace(ev, deadlines=MappingProxyType(deadlines))
    try:
        result, writes, blocked = writes_for(
            spec, result, observed.gcs, now, policy.deadlines.drain_deadline_s, ev, mono_s=mono
        )
    except PatchError as err:
        return Decision(
            result, (), spec, observed.gcs, error=str(err), now=now, mono_s=mono, evidence=ev
        )
    return Decision(
        result, writes, spec, observed.gcs, now=now, mono_s=mono, evidence=ev, blocked=blocked
    )


def _ray_state(gcs: RayObservation | None) -> tuple[RayState | None, PlanProblem | None]:
    if gcs is None or gcs.state is not None or not gcs.unusable:
        return (gcs.state if gcs else None), None
    return None, PlanProblem(ProblemKind.RAY_STATE, gcs.error or "unusable GCS reply")
