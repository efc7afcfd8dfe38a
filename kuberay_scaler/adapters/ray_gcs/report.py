"""What the autoscaler tells the GCS it is doing, in the shape `ray status` prints.

`ray status` (v2 path) reads the last `AutoscalingState` we reported:

- each `pending_instance_requests` entry is one line count in "<group>, N launching" — Ray counts
  entries, not their `count` field — so we send one entry per host being launched;
- each `pending_instances` entry prints "<instance_id>: <group>, <details lowercased>";
- each `failed_instance_requests` entry prints "<group>: LaunchFailed (latest_attempt: HH:MM:SS)"
  from `start_ts` (epoch seconds), with `reason` under `ray status -v`;
- `infeasible_resource_requests`, `infeasible_gang_resource_requests` and
  `infeasible_cluster_resource_constraints` name demand no worker group can ever serve, as
  Ray's own autoscaler sends them (one request per task, as Ray ungroups counts). With
  RAY_enable_infeasible_task_early_exit the GCS fails such tasks instead of letting them hang;
  `ray status` 2.60 does not print these fields (its v2 formatter leaves them out).
"""

from __future__ import annotations

from ray.core.generated import autoscaler_pb2, common_pb2

from kuberay_scaler.core.model.ray import Bundle
from kuberay_scaler.core.model.report import (
    AutoscalingReport,
    FailedRequest,
    LaunchingGroup,
    PendingPod,
)

__all__ = [
    "AutoscalingReport",
    "FailedRequest",
    "LaunchingGroup",
    "PendingPod",
    "StateVersionClock",
    "build_autoscaling_state",
    "resource_request",
]

_IN = common_pb2.LabelSelectorOperator.LABEL_OPERATOR_IN
_NOT_IN = common_pb2.LabelSelectorOperator.LABEL_OPERATOR_NOT_IN


def build_autoscaling_state(
    report: AutoscalingReport, *, version: int = 0
) -> autoscaler_pb2.AutoscalingState:
    """The `AutoscalingState` message for `report`; `version` is usually set by `client.report`."""
    state = autoscaler_pb2.AutoscalingState(
        last_seen_cluster_resource_state_version=report.observed_state_version,
        autoscaler_state_version=version,
    )
    for launch in report.launching:
        for _ in range(launch.hosts):
            state.pending_instance_requests.append(_launch_entry(launch))
    for pod in report.pending_pods:
        state.pending_instances.append(
            autoscaler_pb2.PendingInstance(
                instance_type_name=pod.group,
                ray_node_type_name=pod.group,
                instance_id=pod.pod_name,
                ip_address=pod.pod_ip,
                details=pod.detail,
            )
        )
    for failure in report.failed:
        state.failed_instance_requests.append(
            autoscaler_pb2.FailedInstanceRequest(
                instance_type_name=failure.group,
                ray_node_type_name=failure.group,
                count=failure.count,
                reason=failure.reason,
                start_ts=failure.started_at_s,
                failed_ts=failure.failed_at_s,
            )
        )
    state.infeasible_resource_requests.extend(resource_request(b) for b in report.infeasible)
    for gang in report.infeasible_gangs:
        state.infeasible_gang_resource_requests.append(
            autoscaler_pb2.GangResourceRequest(
                requests=[resource_request(b) for b in gang.bundles], details=gang.details
            )
        )
    if report.infeasible_constraints:
        state.infeasible_cluster_resource_constraints.append(
            autoscaler_pb2.ClusterResourceConstraint(
                resource_requests=[
                    autoscaler_pb2.ResourceRequestByCount(
                        request=resource_request(d.bundle), count=d.count
                    )
                    for d in report.infeasible_constraints
                ]
            )
        )
    return state


def resource_request(bundle: Bundle) -> autoscaler_pb2.ResourceRequest:
    """A bundle as Ray's ResourceRequest, label selectors included (alternatives kept apart)."""
    return autoscaler_pb2.ResourceRequest(
        resources_bundle=dict(bundle.resources),
        label_selectors=[
            common_pb2.LabelSelector(
                label_constraints=[
                    common_pb2.LabelSelectorConstraint(
                        label_key=c.key,
                        operator=_NOT_IN if c.negated else _IN,
                        label_values=sorted(c.values),
                    )
                    for c in selector.constraints
                ]
            )
            for selector in bundle.selectors
        ],
    )


def _launch_entry(launch: LaunchingGroup) -> autoscaler_pb2.PendingInstanceRequest:
    return autoscaler_pb2.PendingInstanceRequest(
        instance_type_name=launch.instance_type or launch.group,
        ray_node_type_name=launch.group,
        count=1,
        request_ts=launch.requested_at_s,
    )


class StateVersionClock:
    """`autoscaler_state_version` values: epoch milliseconds, never repeating, never going back.

    The GCS silently drops a report whose version is lower than the last one it kept, so the
    value must grow across our own restarts (wall clock) and across clock steps back (never below
    the last value we sent or saw stored in the GCS).
    """

    def __init__(self) -> None:
        self._last = 0

    def next(self, now_ms: int) -> int:
        self._last = max(now_ms, self._last + 1)
        return self._last

    def observe(self, stored_version: int) -> None:
        """Raise the floor to a version the GCS already holds (e.g. from a previous run)."""
        self._last = max(self._last, stored_version)

    @property
    def last(self) -> int:
        return self._last
