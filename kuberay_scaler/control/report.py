"""Plan + slice map → what we tell Ray we are doing (pure)."""

from __future__ import annotations

from kuberay_scaler.model.plan import DeleteKind, Plan
from kuberay_scaler.model.slices import SliceState
from kuberay_scaler.ray_gcs.report import (
    AutoscalingReport,
    FailedRequest,
    LaunchingGroup,
    PendingPod,
)


def report_from_plan(plan: Plan, now_s: int, observed_version: int = 0) -> AutoscalingReport:
    """Launching hosts without pods, pods without Ray nodes, and slices we had to replace."""
    pending: list[PendingPod] = []
    launching: list[LaunchingGroup] = []
    failed: list[FailedRequest] = []
    slice_map = plan.slice_map
    for decision in plan.groups:
        pods_waiting = 0
        if slice_map and decision.group in slice_map.groups:
            for sl in slice_map.groups[decision.group].slices:
                if sl.state not in (SliceState.PENDING, SliceState.PARTIAL):
                    continue
                for host in sl.hosts:
                    if host.pod_name not in sl.nodes:
                        pods_waiting += 1
                        pending.append(PendingPod(host.pod_name, decision.group, host.detail))
        without_pods = decision.launching_hosts - pods_waiting
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
    return AutoscalingReport(
        launching=tuple(launching),
        pending_pods=tuple(pending),
        failed=tuple(failed),
        observed_state_version=observed_version,
    )
