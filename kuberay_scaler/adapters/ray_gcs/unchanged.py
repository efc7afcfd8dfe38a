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
seen from `now` in the planner, as with a full parse.

The body is kept in two parts: each node's bytes on their own, and the rest (the demand). A reply
whose body differs is not parsed in full either (`reparsed`): a node whose bytes the last reply
had is that node of the last parse (with its idle clock), only the others are parsed, and the
demand only when the rest changed. New demand on a 10k-node cluster is then read in a few ms, not
the 200 ms of a full `parse_ray_state`. At 10k nodes the body costs about 19 ms (zero, serialize,
restore); the parts, only for a reply whose body changed, some 12 ms more.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ray.core.generated import autoscaler_pb2

from kuberay_scaler.adapters.ray_gcs.state import parse_demand, parse_node
from kuberay_scaler.core.model.ray import RayNode, RayState


@dataclass(frozen=True)
class Parts:
    """A body in two parts, to tell what changed: each node on its own, and the rest."""

    rest: bytes  # the reply without its nodes (the demand), versions zeroed
    nodes: tuple[bytes, ...]  # each node, its version and idle clock zeroed


@dataclass(frozen=True)
class ReplyBody:
    """A reply without what moves on every call, and the idle clocks it carried."""

    body: bytes  # deterministic serialization, versions and idle clocks zeroed
    idle_ms: tuple[int, ...]  # each node's idle_duration_ms, in reply order
    parts: Parts | None = None  # computed when the body differs from the last one


def reply_body(reply: Any, last: bytes | None = None, *, restore: bool = True) -> ReplyBody | None:
    """The body of a reply message; None for anything else (JSON forms: parse those). When the
    body differs from `last` (or there is none), its parts too (what `reparsed` compares): an
    unchanged reply costs one serialization, a changed one a second, per node.

    The reply is changed while it is serialized and restored before returning; with
    `restore=False` a reply whose body equals `last` is left with its versions and idle clocks
    zeroed (the poller drops such a reply: the idle clocks are in the result), which saves a
    pass over every node.
    """
    if not isinstance(reply, autoscaler_pb2.GetClusterResourceStateReply):
        return None
    state = reply.cluster_resource_state
    nodes = state.node_states
    idle = tuple([n.idle_duration_ms for n in nodes])
    node_versions = tuple([n.node_state_version for n in nodes])
    versions = (state.cluster_resource_state_version, state.last_seen_autoscaler_state_version)
    parts = None
    try:
        state.cluster_resource_state_version = 0
        state.last_seen_autoscaler_state_version = 0
        for node, ms, nv in zip(nodes, idle, node_versions, strict=True):
            if ms:
                node.idle_duration_ms = 0
            if nv:
                node.node_state_version = 0
        body = reply.SerializeToString(deterministic=True)
        if body != last:
            each = tuple(n.SerializeToString(deterministic=True) for n in nodes)
            parts = Parts(_without_nodes(reply).SerializeToString(deterministic=True), each)
    except BaseException:
        _restore(state, versions, idle, node_versions)
        raise
    if restore or parts is not None:  # a changed reply is parsed next: it needs its clocks
        _restore(state, versions, idle, node_versions)
    return ReplyBody(body, idle, parts)


def _restore(
    state: Any, versions: tuple[int, int], idle: tuple[int, ...], node_versions: tuple[int, ...]
) -> None:
    state.cluster_resource_state_version, state.last_seen_autoscaler_state_version = versions
    for node, ms, nv in zip(state.node_states, idle, node_versions, strict=True):
        if ms:
            node.idle_duration_ms = ms
        if nv:
            node.node_state_version = nv


def _without_nodes(reply: Any) -> Any:
    """A copy of the reply with every field but the node list (those are small: the demand)."""
    out = type(reply)()
    for field, value in reply.ListFields():
        if field.name == "cluster_resource_state":
            state = out.cluster_resource_state
            state.SetInParent()
            for inner, inner_value in value.ListFields():
                if inner.name != "node_states":
                    _copy_field(state, inner, inner_value)
        else:
            _copy_field(out, field, value)
    return out


def _copy_field(into: Any, field: Any, value: Any) -> None:
    if field.is_repeated:
        target = getattr(into, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            target.update(value)
        else:
            target.extend(value)
    elif field.message_type is not None:
        getattr(into, field.name).CopyFrom(value)
    else:
        setattr(into, field.name, value)


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


def reparsed(
    previous: RayState, before: ReplyBody, reply: Any, body: ReplyBody, read: ReadWindow
) -> RayState:
    """The parse of `reply` (whose body is `body`), re-reading only what differs from the reply
    `previous` was parsed from (body `before`): each node whose bytes are new, and the demand
    when the rest is. A node whose bytes `before` had is that node of `previous`, with this
    reply's idle clock (`with_idle_clocks`' rule). Equal to
    `with_nodes_of(previous, parse_ray_state(reply, read_at_ms=read.received_ms), read)`."""
    old, new = before.parts, body.parts
    if old is None or new is None:
        raise ValueError("reparsed needs the parts of both bodies")
    if len(old.nodes) != len(previous.nodes):
        raise ValueError(f"{len(old.nodes)} node bodies for {len(previous.nodes)} nodes")
    at = {raw: i for i, raw in enumerate(old.nodes)}
    messages = reply.cluster_resource_state.node_states
    by_id: dict[str, RayNode] | None = None
    nodes: list[RayNode] = []
    for k, (raw, ms) in enumerate(zip(new.nodes, body.idle_ms, strict=True)):
        i = at.get(raw)
        if i is not None:
            node = previous.nodes[i]
            since = node.idle_since_ms
            if since is not None and not agrees(since, read.received_ms - ms, read):
                node = _with_idle_since(node, read.received_ms - ms)
            nodes.append(node)
            continue
        if by_id is None:
            by_id = {n.node_id: n for n in previous.nodes}
        fresh = parse_node(messages[k], read.received_ms)
        nodes.append(_kept(by_id.get(fresh.node_id), fresh, read))
    if new.rest == old.rest:
        tasks, gangs, constraint = previous.tasks, previous.gangs, previous.constraint
    else:
        tasks, gangs, constraint = parse_demand(reply.cluster_resource_state)
    return RayState(nodes=tuple(nodes), tasks=tasks, gangs=gangs, constraint=constraint)


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
