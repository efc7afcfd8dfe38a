"""Tell a `GetClusterResourceState` reply that says nothing new, before the full parse.

A GCS never sends the same bytes twice: it raises `cluster_resource_state_version` on every
call, every idle node's `idle_duration_ms` grows with time, and it writes map entries in a new
order each time (protobuf C++ randomizes map iteration). So neither a version nor a hash of the
raw reply says "nothing changed". `zeroed` sets exactly the fields the parse does not read or
that move with time alone to 0 (the versions, each node's `node_state_version` and idle clock)
and keeps the idle clocks aside; two zeroed replies that compare equal (protobuf's equality, in
C, maps as sets) parse alike except for those clocks, so `with_idle_clocks` puts the new clocks
into the previous parse and the result equals a full parse of the new reply, value for value (up
to the read's own uncertainty, below). At 10k nodes the zeroing pass and the comparison cost
~4 + ~4 ms, against ~11 ms for the deterministic serialization used before.

Idle clocks are kept as idle-since times (state.py): the reply's duration subtracted from when
it arrived. The GCS measured that duration somewhere between our request and its reply, so one
read places the true idle-since within `[received - d - (received - sent), received - d]`. An
earlier read's idle-since that lies within that window (give or take `SLOP_MS` of Ray's own
noise) is kept, node object and all: an idle node is then the very same object poll after poll,
which is what the slice map's memo knows it by. One outside it is replaced: the node was busy in
between (its idle-since moved later) or this read is tighter (earlier). Idle clocks are never
guessed: they come from the reply itself, so an idle clock crossing a group's idle timeout is
seen from `now` in the planner, as with a full parse.

A reply that differs is not parsed in full either (`reparsed`): a node that compares equal to
the last reply's node of the same id is that node of the last parse (with its idle clock), only
the others are parsed, and the demand only when it differs. New demand on a 10k-node cluster is
then read in a few ms, not the 200 ms of a full `parse_ray_state`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ray.core.generated import autoscaler_pb2

from kuberay_scaler.adapters.ray_gcs.state import parse_demand, parse_node
from kuberay_scaler.core.model.ray import RayNode, RayState

# What a GCS raises on every call, and nothing downstream reads.
_PER_CALL = ("cluster_resource_state_version", "last_seen_autoscaler_state_version")
# The rest of a state but its nodes: the demand (and the session name).
_DEMAND_FIELDS = tuple(
    f.name
    for f in autoscaler_pb2.ClusterResourceState.DESCRIPTOR.fields
    if f.name not in ("node_states", *_PER_CALL)
)


@dataclass(frozen=True)
class Zeroed:
    """A reply message with what moves on every call zeroed, and the idle clocks it carried.

    The message is the caller's no more: it was changed in place. Two zeroed replies that
    compare equal (protobuf equality, in C: map entries as sets, whatever order a GCS sends
    them in) parse alike except for those clocks."""

    reply: Any
    idle_ms: tuple[int, ...]  # each node's idle_duration_ms, in reply order


def zeroed(reply: Any) -> Zeroed | None:
    """`reply` with its versions, each node's `node_state_version` and idle clock set to 0 (one
    pass over the nodes); None for anything but a reply message (JSON forms: parse those)."""
    if not isinstance(reply, autoscaler_pb2.GetClusterResourceStateReply):
        return None
    state = reply.cluster_resource_state
    for name in _PER_CALL:
        setattr(state, name, 0)
    idle: list[int] = []
    for node in state.node_states:
        ms = node.idle_duration_ms
        idle.append(ms)
        if ms:
            node.idle_duration_ms = 0
        if node.node_state_version:
            node.node_state_version = 0
    return Zeroed(reply, tuple(idle))


def same_demand(before: Zeroed, now: Zeroed) -> bool:
    """Everything of the two states but their nodes compares equal."""
    old, new = before.reply.cluster_resource_state, now.reply.cluster_resource_state
    return all(getattr(old, name) == getattr(new, name) for name in _DEMAND_FIELDS)


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
    for i in state.idle_positions():  # the others are not IDLE (equal replies: same status)
        node = state.nodes[i]
        before = node.idle_since_ms
        if before is None:
            continue
        since = read.received_ms - idle_ms[i]
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


def reparsed(previous: RayState, before: Zeroed, now: Zeroed, read: ReadWindow) -> RayState:
    """The parse of `now`, re-reading only what differs from `before` (the reply `previous` was
    parsed from): each node that is new or compares unequal to the node of the same id, and the
    demand when it differs. An equal node is that node of `previous`, with this reply's idle
    clock (`with_idle_clocks`' rule). Equal to
    `with_nodes_of(previous, parse_ray_state(<now, clocks restored>, read_at_ms=…), read)`;
    `now` stays zeroed."""
    old = before.reply.cluster_resource_state.node_states
    if len(old) != len(previous.nodes):
        raise ValueError(f"{len(old)} node messages for {len(previous.nodes)} nodes")
    at = {message.node_id: i for i, message in enumerate(old)}
    by_id: dict[str, RayNode] | None = None
    nodes: list[RayNode] = []
    for message, ms in zip(now.reply.cluster_resource_state.node_states, now.idle_ms, strict=True):
        i = at.get(message.node_id)
        if i is not None and message == old[i]:
            node = previous.nodes[i]
            since = node.idle_since_ms
            if since is not None and not agrees(since, read.received_ms - ms, read):
                node = _with_idle_since(node, read.received_ms - ms)
            nodes.append(node)
            continue
        if by_id is None:
            by_id = {n.node_id: n for n in previous.nodes}
        fresh = _parse_with_clock(message, ms, read.received_ms)
        nodes.append(_kept(by_id.get(fresh.node_id), fresh, read))
    if same_demand(before, now):
        tasks, gangs, constraint = previous.tasks, previous.gangs, previous.constraint
    else:
        tasks, gangs, constraint = parse_demand(now.reply.cluster_resource_state)
    return RayState(nodes=tuple(nodes), tasks=tasks, gangs=gangs, constraint=constraint)


def _parse_with_clock(message: Any, idle_ms: int, read_at_ms: int) -> RayNode:
    message.idle_duration_ms = idle_ms  # the parse reads the clock; the message stays zeroed
    try:
        return parse_node(message, read_at_ms)
    finally:
        message.idle_duration_ms = 0


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
