"""The daemon's decision path on raw input, in one call, for the fuzz and agreement tests."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from kuberay_scaler.model.plan import Memory, Plan, Snapshot
from kuberay_scaler.parse.pods import parse_pods
from kuberay_scaler.parse.ray_state import parse_ray_state
from kuberay_scaler.parse.raycluster import parse_raycluster
from kuberay_scaler.patch.ops import build_patch
from kuberay_scaler.planner.core import Policy, plan


def decide_raw(
    rc: dict[str, Any], pods: list[Any], reply: bytes, now: datetime
) -> tuple[Plan, list[Any]]:
    """RayCluster dict + pod list + serialized GetClusterResourceStateReply → (plan, patch ops)."""
    spec = parse_raycluster(rc)
    hosts, problems = parse_pods(pods, spec)
    from ray.core.generated import autoscaler_pb2

    state = parse_ray_state(autoscaler_pb2.GetClusterResourceStateReply.FromString(reply))
    snapshot = Snapshot(spec=spec, hosts=tuple(hosts), problems=tuple(problems))
    result = plan(snapshot, state, Memory(), Policy(), now)
    return result, list(build_patch(rc, result))
