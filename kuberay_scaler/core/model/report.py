"""What the autoscaler tells Ray it is doing (pure data; adapters/ray_gcs/report.py makes the
message).

The loop builds an `AutoscalingReport` from the plan (loop/report.py) and hands it to the
`Gcs` port; only the ray_gcs adapter turns it into protobuf.
"""

from __future__ import annotations

from dataclasses import dataclass

from kuberay_scaler.core.model.ray import Bundle, GangDemand, TaskDemand


@dataclass(frozen=True)
class LaunchingGroup:
    """Hosts of one worker group we asked for whose pods do not exist yet."""

    group: str
    hosts: int
    requested_at_s: int = 0  # epoch seconds
    instance_type: str = ""  # defaults to the group name


@dataclass(frozen=True)
class PendingPod:
    """A pod that exists but has no Ray node yet (scheduling, pulling, starting Ray)."""

    pod_name: str
    group: str
    detail: str
    pod_ip: str = ""


@dataclass(frozen=True)
class FailedRequest:
    """Hosts of a group that could not be created, with why."""

    group: str
    count: int
    reason: str
    started_at_s: int = 0  # epoch seconds
    failed_at_s: int = 0


@dataclass(frozen=True)
class AutoscalingReport:
    """Everything one report says."""

    launching: tuple[LaunchingGroup, ...] = ()
    pending_pods: tuple[PendingPod, ...] = ()
    failed: tuple[FailedRequest, ...] = ()
    infeasible: tuple[Bundle, ...] = ()  # one per task/actor that can never be scheduled
    infeasible_gangs: tuple[GangDemand, ...] = ()
    infeasible_constraints: tuple[TaskDemand, ...] = ()  # parts of the request_resources floor
    observed_state_version: int = 0  # cluster_resource_state_version the plan was made from
