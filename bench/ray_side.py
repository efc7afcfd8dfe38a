"""Ray's own v2 scheduler on the benchmark input, set up the way Ray's KubeRay autoscaler does.

Node type configs come from Ray's `_derive_autoscaling_config_from_ray_cr` on the same RayCluster;
instances are the running hosts (RAY_RUNNING with their `NodeState`); demand is the very
`ClusterResourceState` our planner parses. Nothing of Ray is modified.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ray.autoscaler._private.kuberay.autoscaling_config import (
    _derive_autoscaling_config_from_ray_cr,
)
from ray.autoscaler.v2.instance_manager.config import AutoscalingConfig
from ray.autoscaler.v2.scheduler import (
    ResourceDemandScheduler,
    SchedulingReply,
    SchedulingRequest,
)
from ray.autoscaler.v2.schema import AutoscalerInstance
from ray.core.generated import instance_manager_pb2


def scheduling_request(raycluster: dict[str, Any], state: Any) -> SchedulingRequest:
    config = AutoscalingConfig(_derive_autoscaling_config_from_ray_cr(raycluster))
    return SchedulingRequest(
        node_type_configs=config.get_node_type_configs(),
        max_num_nodes=config.get_max_num_nodes(),
        resource_requests=list(state.pending_resource_requests),
        gang_resource_requests=list(state.pending_gang_resource_requests),
        cluster_resource_constraints=list(state.cluster_resource_constraints),
        current_instances=[_instance(n) for n in state.node_states],
        idle_timeout_s=config.get_idle_timeout_s(),
        pending_idle_timeout_s=config.get_pending_idle_timeout_s(),
        disable_launch_config_check=True,
    )


def _instance(node: Any) -> AutoscalerInstance:
    head = node.ray_node_type_name == "headgroup"
    im = instance_manager_pb2.Instance(
        instance_id=node.instance_id,
        cloud_instance_id=node.instance_id,
        node_id=node.node_id.hex(),
        instance_type=node.ray_node_type_name,
        status=instance_manager_pb2.Instance.RAY_RUNNING,
        node_kind=instance_manager_pb2.NodeKind.HEAD if head else instance_manager_pb2.WORKER,
    )
    return AutoscalerInstance(cloud_instance_id=node.instance_id, ray_node=node, im_instance=im)


def schedule(request: SchedulingRequest) -> SchedulingReply:
    return ResourceDemandScheduler().schedule(request)


def host_targets(request: SchedulingRequest, reply: SchedulingReply) -> dict[str, int]:
    """Worker hosts per group after Ray's decisions: running + launched − terminated."""
    hosts: Counter[str] = Counter(
        i.im_instance.instance_type
        for i in request.current_instances
        if i.im_instance is not None and i.im_instance.instance_type != "headgroup"
    )
    for launch in reply.to_launch:
        hosts[launch.instance_type] += launch.count
    for stop in reply.to_terminate:
        hosts[stop.instance_type] -= 1
    return dict(hosts)


def infeasible_count(reply: SchedulingReply) -> int:
    return len(reply.infeasible_resource_requests) + len(reply.infeasible_gang_resource_requests)


def infeasible_by_group(reply: SchedulingReply, pod_types: dict[str, str]) -> Counter[str]:
    """Ray's infeasible requests per group they were meant for (their `pool` or pod type)."""
    out: Counter[str] = Counter()
    requests = list(reply.infeasible_resource_requests) + [
        (g.bundle_selectors[0].resource_requests or g.requests)[0]
        for g in reply.infeasible_gang_resource_requests
    ]
    for request in requests:
        out[_meant_for(request, pod_types)] += 1
    return out


def _meant_for(request: Any, pod_types: dict[str, str]) -> str:
    for selector in request.label_selectors:
        for c in selector.label_constraints:
            if c.label_key == "pool":
                return str(c.label_values[0])
            if c.label_key == "ray.io/tpu-pod-type":
                return pod_types.get(c.label_values[0], "?")
    return "?"
