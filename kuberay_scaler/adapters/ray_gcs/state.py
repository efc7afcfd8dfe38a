"""GetClusterResourceStateReply (protobuf or its proto3 JSON form) → the core's `RayState`.

The one place a GCS reply is read: the poller parses each reply here once, and `plan
--ray-state` / `plan --capture` read a captured reply through the same function, so the core
only ever sees plain data. Node ids leave as hex strings (and go back to bytes only on the wire,
in drain.py).

Idle clocks leave as points in time: a node Ray reports IDLE for `idle_duration_ms` at the
moment the reply was read (`read_at_ms`: ms on the daemon's monotonic clock, the one of the
planner's `mono_s`; epoch ms in one-shot use) has been idle since `read_at_ms - idle_duration_ms`
(`RayNode.idle_since_ms`); the planner derives durations from its own reading of that clock, so
an idle node is the same value from one reply to the next and a wall-clock step changes no
idle age.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from google.protobuf import json_format
from ray.core.generated import autoscaler_pb2

from kuberay_scaler.core.model.cluster import frozen_map
from kuberay_scaler.core.model.ray import (
    HEAD_RESOURCE,
    Bundle,
    GangDemand,
    GangStrategy,
    LabelConstraint,
    LabelSelector,
    NodeStatus,
    RayNode,
    RayState,
    TaskDemand,
)

# Placement-group bookkeeping resources ("CPU_group_<pg>", "bundle_group_<i>_<pg>") mirror the
# plain ones on the same host; counting them would double capacity.
_PG_RESOURCE_MARK = "_group_"
_OP_NOT_IN = 2  # LabelSelectorOperator.LABEL_OPERATOR_NOT_IN
# proto3 JSON uses lowerCamelCase; ParseDict also takes the proto's own snake_case names.
_REPLY_KEYS = ("clusterResourceState", "cluster_resource_state")
_STATE_KEYS = ("nodeStates", "node_states")


class RayStateError(ValueError):
    """The input is not a GetClusterResourceStateReply in any form we know."""


def parse_ray_state(reply: object, *, read_at_ms: int) -> RayState:
    """Accept the reply message, a ClusterResourceState, or either in proto3 JSON (dict or text).
    `read_at_ms`: when the reply was read (epoch ms), the moment its idle durations end.

    Raises RayStateError, and nothing else, when the input is not one of those. There is no
    tolerant fallback on purpose: an empty RayState would read as "no demand", and unknown demand
    must never look like zero (the caller holds instead).
    """
    state = _as_state(reply)
    tasks, gangs, constraint = parse_demand(state)
    return RayState(
        nodes=tuple(_node(n, read_at_ms) for n in state.node_states),
        tasks=tasks,
        gangs=gangs,
        constraint=constraint,
    )


Demand = tuple[tuple[TaskDemand, ...], tuple[GangDemand, ...], tuple[TaskDemand, ...]]


def parse_demand(state: Any) -> Demand:
    """A ClusterResourceState message's demand: tasks, gangs and the request_resources floor
    (what `parse_ray_state` puts beside the nodes; unchanged.py re-reads it alone)."""
    bundles: dict[bytes, Bundle] = {}  # the GCS lists a shape once per raylet: parse it once
    tasks = tuple(
        TaskDemand(bundle=_shared_bundle(r.request, bundles), count=int(r.count))
        for r in state.pending_resource_requests
        if r.count > 0
    )
    gangs = tuple(g for g in (_gang(g) for g in state.pending_gang_resource_requests) if g)
    return tasks, gangs, _constraint(state.cluster_resource_constraints)


def parse_node(node: Any, read_at_ms: int) -> RayNode:
    """One NodeState message, read at `read_at_ms` (what `parse_ray_state` makes of each)."""
    return _node(node, read_at_ms)


def alive_instance_ids(reply: object) -> list[str] | None:
    """Instance ids of the nodes not DEAD, straight off a reply message (what
    `parse_ray_state(reply).node_by_instance()` keys, in a fraction of the time); None when
    `reply` is not a reply message (parse it instead)."""
    if not isinstance(reply, autoscaler_pb2.GetClusterResourceStateReply):
        return None
    nodes = reply.cluster_resource_state.node_states
    return list(dict.fromkeys(n.instance_id for n in nodes if n.instance_id and n.status != _DEAD))


def _as_state(reply: object) -> Any:
    if isinstance(reply, autoscaler_pb2.GetClusterResourceStateReply):
        return reply.cluster_resource_state
    if isinstance(reply, autoscaler_pb2.ClusterResourceState):
        return reply
    if isinstance(reply, str | bytes):
        try:
            reply = json.loads(reply)
        except ValueError as err:
            raise RayStateError(f"not JSON: {err}") from None
    if not isinstance(reply, Mapping):
        raise RayStateError(f"expected a GetClusterResourceStateReply, got {type(reply).__name__}")
    return _state_from_json(reply)


def _state_from_json(reply: Mapping[Any, Any]) -> Any:
    # Unknown fields are ignored (newer Ray versions add some), so insist on the one field that
    # makes this a reply: otherwise any JSON object, a RayCluster say, would parse as empty.
    if any(k in reply for k in _REPLY_KEYS):
        message: Any = autoscaler_pb2.GetClusterResourceStateReply()
    elif any(k in reply for k in _STATE_KEYS):
        message = autoscaler_pb2.ClusterResourceState()
    else:
        raise RayStateError("not a GetClusterResourceStateReply: no clusterResourceState field")
    try:
        json_format.ParseDict(dict(reply), message, ignore_unknown_fields=True)
    except (json_format.ParseError, TypeError, ValueError) as err:
        raise RayStateError(f"not a GetClusterResourceStateReply: {err}") from None
    if isinstance(message, autoscaler_pb2.GetClusterResourceStateReply):
        return message.cluster_resource_state
    return message


def _node(node: Any, read_at_ms: int) -> RayNode:
    total = _plain_resources(node.total_resources)
    available = _clamped(_plain_resources(node.available_resources), total)
    labels = dict(node.labels)
    if node.dynamic_labels:
        labels.update(node.dynamic_labels)
    status = _status(node.status)
    return RayNode(
        node_id=bytes(node.node_id).hex(),
        instance_id=node.instance_id,
        node_type=node.ray_node_type_name,
        status=status,
        total=frozen_map(total),
        available=frozen_map(available),
        labels=frozen_map(labels),
        idle_since_ms=(
            read_at_ms - int(node.idle_duration_ms) if status is NodeStatus.IDLE else None
        ),
        ip=node.node_ip_address,
        is_head=HEAD_RESOURCE in node.total_resources,
    )


def _status_table() -> dict[int, NodeStatus]:
    table = {}
    for name, number in autoscaler_pb2.NodeStatus.items():
        try:
            table[number] = NodeStatus(name)
        except ValueError:
            table[number] = NodeStatus.UNKNOWN
    return table


_STATUS = _status_table()
_DEAD = autoscaler_pb2.NodeStatus.Value("DEAD")


def _status(value: int) -> NodeStatus:
    return _STATUS.get(value, NodeStatus.UNKNOWN)


def _plain_resources(resources: Mapping[str, float]) -> dict[str, float]:
    # dict() first: one C-level copy of the protobuf map beats iterating it from Python.
    return {
        k: v for k, v in dict(resources).items() if _PG_RESOURCE_MARK not in k and math.isfinite(v)
    }


def _clamped(available: Mapping[str, float], total: Mapping[str, float]) -> dict[str, float]:
    """Available within [0, total]: a node reporting more free than it has (a GCS accounting
    glitch) would otherwise absorb other groups' demand; a resource it has none of is not free."""
    return {k: min(max(v, 0.0), total[k]) for k, v in available.items() if k in total}


def _finite(resources: Mapping[str, float]) -> dict[str, float]:
    # NaN compares false with everything and would slip through every fit check.
    return {k: v for k, v in dict(resources).items() if math.isfinite(v)}


def _bundle(request: Any) -> Bundle:
    return Bundle(
        resources=frozen_map(_finite(request.resources_bundle)),
        selectors=tuple(_selector(s) for s in request.label_selectors if s.label_constraints),
    )


def _shared_bundle(request: Any, seen: dict[bytes, Bundle]) -> Bundle:
    """Equal requests parse to one shared Bundle (equal serializations: equal messages, so
    equal Bundles; 10^5 entries of 10^3 shapes parse in a quarter of the time)."""
    key = request.SerializeToString(deterministic=True)
    found = seen.get(key)
    if found is None:
        found = seen[key] = _bundle(request)
    return found


def _selector(selector: Any) -> LabelSelector:
    return LabelSelector(
        tuple(
            LabelConstraint(
                key=c.label_key,
                values=frozenset(c.label_values),
                negated=c.operator == _OP_NOT_IN,
            )
            for c in selector.label_constraints
        )
    )


def _task(by_count: Any) -> TaskDemand:
    return TaskDemand(bundle=_bundle(by_count.request), count=int(by_count.count))


def _gang(gang: Any) -> GangDemand | None:
    # Label selectors only appear under bundle_selectors; the first non-empty one is current.
    requests: Iterable[Any] = next(
        (s.resource_requests for s in gang.bundle_selectors if s.resource_requests),
        gang.requests,
    )
    requests = list(requests)
    if not requests:
        return None
    return GangDemand(
        bundles=tuple(_bundle(r) for r in requests),
        strategy=_strategy(requests, gang.details),
        details=gang.details,
    )


def _strategy(requests: list[Any], details: str) -> GangStrategy:
    constraints = [c for r in requests for c in r.placement_constraints]
    if any(c.HasField("anti_affinity") for c in constraints):
        return GangStrategy.STRICT_SPREAD
    if any(c.HasField("affinity") for c in constraints):
        return GangStrategy.STRICT_PACK
    # details look like "<pg id>:PACK|PENDING".
    token = details.partition(":")[2].partition("|")[0]
    try:
        return GangStrategy(token)
    except ValueError:
        return GangStrategy.PACK


def _constraint(constraints: Any) -> tuple[TaskDemand, ...]:
    # request_resources keeps at most one constraint; each call replaces the previous one.
    out: list[TaskDemand] = []
    for constraint in constraints:
        out.extend(_task(r) for r in constraint.resource_requests if r.count > 0)
    return tuple(out)
