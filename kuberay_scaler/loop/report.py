"""Plan + slice map → what we tell Ray we are doing (pure)."""

from __future__ import annotations

from kuberay_scaler.core.decision import Decision
from kuberay_scaler.core.model.availability import Availability
from kuberay_scaler.core.model.hosts import Host, HostPhase
from kuberay_scaler.core.model.plan import DeleteKind, GroupDecision, Plan
from kuberay_scaler.core.model.ray import Bundle, GangDemand, TaskDemand
from kuberay_scaler.core.model.reasons import DemandKind, Keep, KeepKind, ScaleDown, ScaleDownKind
from kuberay_scaler.core.model.report import (
    AutoscalingReport,
    FailedRequest,
    LaunchingGroup,
    PendingPod,
)
from kuberay_scaler.core.model.slices import Slice, SliceState

# Ray ungroups counts into one request per task; a cap keeps one report small whatever the load.
MAX_INFEASIBLE_REQUESTS = 1_000


def report_for(decision: Decision, now_s: int, *, launches_asked: bool) -> AutoscalingReport | None:
    """What to tell Ray of `decision`; None when it was made without Ray's state to report on.
    `launches_asked`: see `report_from_plan`."""
    gcs = decision.gcs
    if gcs is None or decision.plan.slice_map is None:
        return None
    return report_from_plan(decision.plan, now_s, gcs.version, launches_asked=launches_asked)


def report_from_plan(
    plan: Plan, now_s: int, observed_version: int = 0, *, launches_asked: bool = True
) -> AutoscalingReport:
    """Launching hosts, pods without Ray nodes, replaced slices and demand nothing can serve.

    `launches_asked` is False when this plan's own scale-up is not written (dry run, write
    backoff): then only hosts already asked for show as launching, never the ones it would add.
    """
    pending: list[PendingPod] = []
    launching: list[LaunchingGroup] = []
    failed: list[FailedRequest] = []
    slice_map = plan.slice_map
    for decision in plan.groups:
        gang = "; ".join(str(x) for x in plan.gangs if x.group == decision.group)
        pods_waiting = 0
        if slice_map and decision.group in slice_map.groups:
            cancelled = {x.slice_key for x in decision.deletions if x.kind is DeleteKind.CANCEL}
            for sl in slice_map.groups[decision.group].arriving:  # the others wait for none
                if sl.key in cancelled:
                    continue  # cancelled: said under failed, not as launching
                waiting = _waiting_pods(sl, decision.group, now_s, gang)
                pods_waiting += len(waiting)
                pending.extend(waiting)
        without_pods = _launching(decision, launches_asked) - pods_waiting
        if without_pods > 0:
            launching.append(LaunchingGroup(decision.group, without_pods, requested_at_s=now_s))
        replaced = [d for d in decision.deletions if d.kind is DeleteKind.REPLACE]
        if replaced:
            failed.append(
                FailedRequest(
                    group=decision.group,
                    count=sum(len(d.pods) for d in replaced),
                    reason="; ".join(str(d.reason) for d in replaced),
                    started_at_s=now_s,
                    failed_at_s=now_s,
                )
            )
        failed.extend(_broken_but_busy(decision, now_s))
        failed.extend(_gangs_released(plan, decision, now_s))
        failed.extend(_unavailable(plan, decision, now_s))
    tasks, gangs, constraints = _infeasible(plan)
    return AutoscalingReport(
        launching=tuple(launching),
        pending_pods=tuple(pending),
        failed=tuple(failed),
        infeasible=tuple(tasks),
        infeasible_gangs=tuple(gangs),
        infeasible_constraints=tuple(constraints),
        observed_state_version=observed_version,
    )


def _broken_but_busy(decision: GroupDecision, now_s: int) -> list[FailedRequest]:
    """Broken slices kept over busy hosts: for how long at most, or until when they drain for
    preemption before their replacement (said in `ray status` too)."""
    return [
        FailedRequest(
            group=decision.group,
            count=decision.num_of_hosts,
            reason=str(r),
            started_at_s=now_s,
            failed_at_s=now_s,
        )
        for r in decision.reasons
        if isinstance(r, Keep) and r.kind is KeepKind.BROKEN_BUT_BUSY
    ]


def _unavailable(plan: Plan, decision: GroupDecision, now_s: int) -> list[FailedRequest]:
    """A group that cannot get capacity, with the cause and its next probe: `ray
    status` shows it as a failed launch, the reason under -v."""
    a = plan.memory.availability.get(decision.group)
    if a is None or a.state is not Availability.UNAVAILABLE:
        return []
    cancelled = [x for x in decision.deletions if x.kind is DeleteKind.CANCEL]
    reason = f"{decision.group} {a}"
    if cancelled:
        reason += f"; {len(cancelled)} pending slice(s) cancelled"
    to = sorted({f.to_group for f in plan.fallbacks if f.from_group == decision.group})
    if to:
        reason += f"; demand → {', '.join(to)}"
    probe_s = plan.next_probe_s.get(decision.group)
    if probe_s is not None:
        reason += f"; probed again in {probe_s:.0f} s"
    started = a.at_ms // 1000 if a.at_ms else now_s
    hosts = sum(len(x.pods) for x in cancelled) or decision.num_of_hosts
    return [FailedRequest(decision.group, hosts, reason, started, now_s)]


def _launching(decision: GroupDecision, launches_asked: bool) -> int:
    return decision.launching_hosts - (0 if launches_asked else decision.new_hosts)


def _gangs_released(plan: Plan, decision: GroupDecision, now_s: int) -> list[FailedRequest]:
    """A gang past its deadline whose slices this plan hands back: a failed launch,
    the gang line as the reason."""
    released = [
        x
        for x in decision.deletions
        if isinstance(x.reason, ScaleDown) and x.reason.kind is ScaleDownKind.GANG_DEADLINE
    ]
    lines = [str(x) for x in plan.gangs if x.group == decision.group and x.released]
    if not released or not lines:
        return []
    hosts = sum(len(x.pods) for x in released)
    return [FailedRequest(decision.group, hosts, "; ".join(lines), now_s, now_s)]


def _waiting_pods(sl: Slice, group: str, now_s: int, gang: str = "") -> list[PendingPod]:
    """Pods of a slice coming up whose Ray node has not joined, each with why (and the gang
    it comes for: "gang 4 × v6e-16: 3 up, 1 pending 4 min, deadline 15 min")."""
    if sl.state is SliceState.QUEUED:
        # `ray status`: "<pod>: <group>, queued in kueue (gate ...) for 4 min" — not launching.
        return [
            PendingPod(h.pod_name, group, sl.reason) for h in sl.hosts if h.pod_name not in sl.nodes
        ]
    if sl.state not in (SliceState.PENDING, SliceState.PARTIAL):
        return []
    extra = f"; {gang}" if gang else ""
    return [
        PendingPod(h.pod_name, group, _pending_detail(h, now_s) + extra)
        for h in sl.hosts
        if h.pod_name not in sl.nodes
    ]


def _pending_detail(host: Host, now_s: int) -> str:
    # `ray status` prints "<pod>: <group>, <detail lowercased>" under Pending.
    if host.phase is HostPhase.RUNNING:
        since = host.running_since.timestamp() if host.running_since else None
        waited = f" for {max(0, now_s - int(since))} s" if since is not None else ""
        return f"launching: pod running, Ray node not joined{waited}"
    return f"launching: pod {host.detail}" if host.detail else "launching: pod pending"


def _infeasible(
    plan: Plan,
) -> tuple[list[Bundle], list[GangDemand], list[TaskDemand]]:
    """Demand no group can ever serve, in the shapes Ray's autoscaler reports it."""
    tasks: list[Bundle] = []
    gangs: list[GangDemand] = []
    constraints: list[TaskDemand] = []
    for item in plan.infeasible:
        request = item.request
        if not item.certain or request is None:
            continue  # waiting for room is not infeasible: drivers must not be told it is
        if isinstance(request, GangDemand):
            gangs.append(request)
        elif item.demand.kind is DemandKind.REQUEST_RESOURCES:
            constraints.append(TaskDemand(request.bundle, item.count))
        else:
            room = MAX_INFEASIBLE_REQUESTS - len(tasks)
            tasks.extend([request.bundle] * max(0, min(item.count, room)))
    return tasks, gangs, constraints
