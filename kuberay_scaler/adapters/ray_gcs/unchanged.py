"""Tell a `GetClusterResourceState` reply that says nothing new, before the full parse.

A GCS never sends the same bytes twice: it raises `cluster_resource_state_version` on every
call, and every idle node's `idle_duration_ms` grows with time. So neither the version nor a
hash of the raw reply says "nothing changed". `reply_body` serializes the reply with exactly the
fields the parse does not read or that move with time alone zeroed (the versions, each node's
`node_state_version` and idle clock) and keeps the idle clocks aside; two replies with equal
bodies parse alike except for those clocks, so `with_idle_clocks` puts the new clocks into the
previous parse and the result equals a full parse of the new reply, value for value (up to the
read's own uncertainty, below).

Idle clocks are kept as idle-since times (state.py): the reply's duration subtracted from when
it arrived. The GCS measured that duration somewhere between our request and its reply, so one
read places the true idle-since within `[received - d - (received - sent), received - d]`. An
earlier read's idle-since that lies within that window (give or take `SLOP_MS` of Ray's own
noise) is kept, node object and all: an idle node is then the very same object poll after poll,
which is what the slice map's memo knows it by. One outside it is replaced: the node was busy in
between (its idle-since moved later) or this read is tighter (earlier). Idle clocks are never
guessed: they come from the reply itself, so an idle clock crossing a group's idle timeout is
seen from `now` in the planner, as with a full parse. At 10k nodes the body costs about 14 ms
(zero, serialize, restore) against 100-250 ms for `parse_ray_state`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ray.core.generated import autoscaler_pb2

from kuberay_scaler.core.model.ray import RayNode, RayState


@dataclass(frozen=True)
class ReplyBody:
    """A reply without what moves on every call, and the idle clocks it carried."""

    body: bytes  # deterministic serialization, versions and idle clocks zeroed
    idle_ms: tuple[int, ...]  # each node's idle_duration_ms, in reply order


def reply_body(reply: Any) -> ReplyBody | None:
    """The body of a reply message; None for anything else (JSON forms: parse those).

    The reply is changed while it is serialized and restored before returning.
    """
    if not isinstance(reply, autoscaler_pb2.GetClusterResourceStateReply):
        return None
    state = reply.cluster_resource_state
    nodes = state.node_states
    idle = tuple(n.idle_duration_ms for n in nodes)
    node_versions = tuple(n.node_state_version for n in nodes)
    versions = (state.cluster_resource_state_version, state.last_seen_autoscaler_state_version)
    try:
        state.cluster_resource_state_version = 0
        state.last_seen_autoscaler_state_version = 0
        for node, ms, nv in zip(nodes, idle, node_versions, strict=True):
            if ms:
                node.idle_duration_ms = 0
            if nv:
                node.node_state_version = 0
        body = reply.SerializeToString(deterministic=True)
    finally:
        state.cluster_resource_state_version, state.last_seen_autoscaler_state_version = versions
        for node, ms, nv in zip(nodes, idle, node_versions, strict=True):
            if ms:
                node.idle_duration_ms = ms
            if nv:
                node.node_state_version = nv
    return ReplyBody(body, idle)


SLOP_MS = 50  # Ray's own noise on an idle duration (each raylet report re-bases it; ms rounding)


@dataclass(frozen=True)
class ReadWindow:
    """When a reply was asked for and when it arrived (epoch ms, the daemon's wall clock)."""

    sent_ms: int
    received_ms: int

    @classmethod
    def at(cls, ms: int) -> ReadWindow:
        return cls(ms, ms)


def agrees(before_since: int, since: int, read: ReadWindow) -> bool:
    """An earlier idle-since of a node agrees with `since`, this read's (received minus the
    reply's duration): the true one lies within the read's window, give or take SLOP_MS."""
    return since - (read.received_ms - read.sent_ms) - SLOP_MS <= before_since <= since + SLOP_MS


def with_idle_clocks(state: RayState, idle_ms: tuple[int, ...], read: ReadWindow) -> RayState:
    """`state` (the parse of a reply with an equal body) with the new reply's idle clocks.

    Nodes whose idle-since agrees with the new reply's are kept as they are (the same objects);
    `state` itself when every node is."""
    if len(idle_ms) != len(state.nodes):
        raise ValueError(f"{len(idle_ms)} idle clocks for {len(state.nodes)} nodes")
    nodes: list[RayNode] | None = None
    for i, (node, ms) in enumerate(zip(state.nodes, idle_ms, strict=True)):
        before = node.idle_since_ms
        if before is None:  # not IDLE (an equal body: the same status as before)
            continue
        since = read.received_ms - ms
        if agrees(before, since, read):
            continue
        if nodes is None:
            nodes = list(state.nodes)
        nodes[i] = _with_idle_since(node, since)
    if nodes is None:
        return state
    return RayState(
        nodes=tuple(nodes), tasks=state.tasks, gangs=state.gangs, constraint=state.constraint
    )


def _with_idle_since(node: RayNode, since: int | None) -> RayNode:
    # `dataclasses.replace` re-runs __init__ (a setattr per field): 4x slower, 10k times a poll.
    copy = object.__new__(RayNode)
    copy.__dict__.update(node.__dict__)
    copy.__dict__["idle_since_ms"] = since
    return copy


def with_nodes_of(previous: RayState | None, state: RayState, read: ReadWindow) -> RayState:
    """`state` with every node equal to one of `previous` (by value, same node id; an idle-since
    that agrees with this read counts as equal) replaced by that very object: the slice map's
    memo knows an unchanged node by identity, and a full parse makes all of them anew."""
    if previous is None or not previous.nodes:
        return state
    before = {n.node_id: n for n in previous.nodes}
    nodes = tuple(_kept(before.get(n.node_id), n, read) for n in state.nodes)
    return RayState(nodes=nodes, tasks=state.tasks, gangs=state.gangs, constraint=state.constraint)


def _kept(before: RayNode | None, now: RayNode, read: ReadWindow) -> RayNode:
    if before is None:
        return now
    if before == now:
        return before
    was, since = before.idle_since_ms, now.idle_since_ms
    if was is None or since is None or not agrees(was, since, read):
        return now
    return before if before == _with_idle_since(now, was) else now
