"""Ray's own v2 scheduler and our planner on one input (single-host cases where Ray is right).

The input is a RayCluster dict and a `ClusterResourceState` proto. Ray gets its node types from
its own KubeRay derivation of the RayCluster (bench/ray_side.py); we get the same proto through
`parse_ray_state` and one Running pod per Ray node. Both answers come back in worker hosts per
group and the number of infeasible requests, so tests compare like with like.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ray.core.generated import autoscaler_pb2

from kuberay_scaler.adapters.ray_gcs.state import parse_ray_state
from kuberay_scaler.core.model.plan import Plan
from tests.factories import NOW_MS, node_id_of, plan_of, pod

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import ray_side

HEAD_POD = "rc-head"


@dataclass(frozen=True)
class Answers:
    ours: dict[str, int]  # worker hosts per group after our plan
    ray: dict[str, int]  # worker hosts per group after Ray's decisions
    ours_infeasible: int
    ray_infeasible: int
    plan: Plan
    ray_reply: Any


def new_state() -> autoscaler_pb2.ClusterResourceState:
    """A state with an idle head offering no CPU (as `num-cpus: 0` heads do)."""
    state = autoscaler_pb2.ClusterResourceState(cluster_session_name="s")
    add_node(state, HEAD_POD, "headgroup", {"node:__internal_head__": 1, "memory": 2**30})
    return state


def add_node(
    state: autoscaler_pb2.ClusterResourceState,
    instance: str,
    node_type: str,
    total: Mapping[str, float],
    *,
    available: Mapping[str, float] | None = None,
    idle_ms: int | None = 0,
    labels: Mapping[str, str] | None = None,
    ip: str = "10.0.0.1",
) -> None:
    """A Ray node as the GCS reports it (with `node:<ip>`, which every real node carries)."""
    node = state.node_states.add()
    node.node_id = bytes.fromhex(node_id_of(instance))
    node.instance_id = instance
    node.ray_node_type_name = node_type
    node.node_ip_address = ip
    node.total_resources.update({**total, f"node:{ip}": 1})
    node.available_resources.update({**(available or total), f"node:{ip}": 1})
    node.labels.update({"ray.io/node-group": node_type, **(labels or {})})
    if idle_ms is None:
        node.status = autoscaler_pb2.NodeStatus.RUNNING
    else:
        node.status = autoscaler_pb2.NodeStatus.IDLE
        node.idle_duration_ms = idle_ms


def add_tasks(
    state: autoscaler_pb2.ClusterResourceState, resources: Mapping[str, float], count: int
) -> None:
    entry = state.pending_resource_requests.add()
    entry.request.resources_bundle.update(resources)
    entry.count = count


def add_gang(
    state: autoscaler_pb2.ClusterResourceState,
    bundles: Sequence[Mapping[str, float]],
    strategy: str = "PACK",
) -> None:
    gang = state.pending_gang_resource_requests.add()
    gang.details = f"pg-1:{strategy}|PENDING"
    for resources in bundles:
        gang.requests.add().resources_bundle.update(resources)


def for_ray(raycluster: Mapping[str, Any]) -> dict[str, Any]:
    """Ray's derivation needs a head with a CPU count; ours ignores the head group."""
    rc = copy.deepcopy(dict(raycluster))
    head = rc["spec"]["headGroupSpec"]
    head.setdefault("rayStartParams", {})["num-cpus"] = "0"
    return rc


def answers(
    raycluster: Mapping[str, Any],
    state: autoscaler_pb2.ClusterResourceState,
    pods: Sequence[Mapping[str, Any]] | None = None,
) -> Answers:
    rc = for_ray(raycluster)
    if pods is None:
        pods = [
            pod(n.instance_id, n.ray_node_type_name, head=n.instance_id == HEAD_POD)
            for n in state.node_states
        ]
    result = plan_of(rc, pods, parse_ray_state(state, read_at_ms=NOW_MS))
    request = ray_side.scheduling_request(rc, state)
    reply = ray_side.schedule(request)
    ours = {
        g.group: g.target * g.num_of_hosts for g in result.groups
    }  # replicas × hosts, like Ray's count
    ray_hosts = ray_side.host_targets(request, reply)
    ray = {g.group: ray_hosts.get(g.group, 0) for g in result.groups}
    return Answers(
        ours=ours,
        ray=ray,
        ours_infeasible=sum(i.count for i in result.infeasible),
        ray_infeasible=ray_side.infeasible_count(reply),
        plan=result,
        ray_reply=reply,
    )
