"""The poller's cheap skip of replies that say nothing new (adapters/ray_gcs/unchanged.py).

What must hold: a reply that, zeroed, equals the last one parses, with its own idle clocks, to
exactly what a full parse gives; a change of any field the parse reads makes the zeroed replies
differ; the versions and idle clocks (which a GCS moves on every call) and map order do not.
So the skip changes no observation and no decision, including when an idle clock crosses an
idle timeout. Idle clocks are idle-since times (the read time minus the duration): a node
whose idle-since agrees with the last read's keeps its very object (the slice map's memo knows
it so), one that went busy in between does not.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from google.protobuf.descriptor import FieldDescriptor
from hypothesis import given, settings
from hypothesis import strategies as st
from ray.core.generated import autoscaler_pb2

from kuberay_scaler.adapters.ray_gcs.poller import GcsPoller
from kuberay_scaler.adapters.ray_gcs.state import parse_ray_state
from kuberay_scaler.adapters.ray_gcs.unchanged import (
    SLOP_MS,
    ReadWindow,
    Zeroed,
    reparsed,
    with_idle_clocks,
    with_nodes_of,
    zeroed,
)
from tests.factories import NOW_MS, gcs_node, gcs_reply, gcs_request

IDLE = autoscaler_pb2.NodeStatus.Value("IDLE")
RUNNING = autoscaler_pb2.NodeStatus.Value("RUNNING")
# What a GCS moves on every call, and what nothing downstream reads (the parse ignores them).
MOVING = {"cluster_resource_state_version", "last_seen_autoscaler_state_version"}
MOVING_PER_NODE = {"idle_duration_ms", "node_state_version"}


def _node(i: int, *, idle_ms: int = 0, status: int = RUNNING) -> Any:
    return gcs_node(
        bytes([i]) * 28,
        f"pod-{i}",
        status=status,
        idle_ms=idle_ms,
        ray_node_type_name="tpu-group",
        node_ip_address=f"10.0.0.{i}",
        total_resources={"CPU": 8.0, "TPU": 4.0},
        available_resources={"CPU": 8.0 if status == IDLE else 2.0, "TPU": 4.0},
        labels={"ray.io/tpu-worker-id": str(i % 4)},
        dynamic_labels={"zone": "a"},
        node_state_version=3,
        instance_type_name="ct6e",
        node_activity=["busy" if status == RUNNING else ""],
    )


def _full_reply(idle: list[int]) -> Any:
    """A reply with every part the parse reads: a node per `idle` entry (0: busy), tasks, a gang
    and a constraint."""
    gang = autoscaler_pb2.GangResourceRequest(
        details="pg1:PACK|PENDING",
        requests=[autoscaler_pb2.ResourceRequest(resources_bundle={"TPU": 4.0})],
    )
    constraint = autoscaler_pb2.ClusterResourceConstraint(
        resource_requests=[gcs_request({"CPU": 4.0}, 2)]
    )
    return gcs_reply(
        7,
        nodes=[_node(i, idle_ms=ms, status=IDLE if ms else RUNNING) for i, ms in enumerate(idle)],
        demand=[gcs_request({"CPU": 1.0}, 3)],
        pending_gang_resource_requests=[gang],
        cluster_resource_constraints=[constraint],
        last_seen_autoscaler_state_version=2,
        cluster_session_name="session",
    )


def _copy(reply: Any) -> Any:
    out = autoscaler_pb2.GetClusterResourceStateReply()
    out.CopyFrom(reply)
    return out


def _tick(reply: Any, ms: int) -> Any:
    """What a GCS sends next when nothing happened: versions up, idle clocks `ms` older."""
    out = _copy(reply)
    state = out.cluster_resource_state
    state.cluster_resource_state_version += 1
    state.last_seen_autoscaler_state_version += 1
    for node in state.node_states:
        node.node_state_version += 1
        if node.idle_duration_ms:
            node.idle_duration_ms += ms
    return out


def _zeroed(reply: Any) -> Zeroed:
    """`reply` zeroed, on a copy (`zeroed` changes the message it is given)."""
    found = zeroed(_copy(reply))
    assert found is not None
    return found


def _same(a: Any, b: Any) -> bool:
    return bool(_zeroed(a).reply == _zeroed(b).reply)


@given(
    idle=st.lists(st.integers(0, 10**9), min_size=0, max_size=6),
    ms=st.integers(1, 10**7),
)
@settings(max_examples=60, deadline=None)
def test_a_tick_keeps_the_body_and_the_reused_parse_equals_a_full_one(
    idle: list[int], ms: int
) -> None:
    before = _full_reply(idle)
    after = _tick(before, ms)
    assert _same(before, after)
    found = _zeroed(after)
    first = parse_ray_state(before, read_at_ms=NOW_MS)
    later = NOW_MS + ms  # the tick is read `ms` later: every idle-since stays
    reused = with_idle_clocks(first, found.idle_ms, ReadWindow.at(later))
    assert reused == parse_ray_state(after, read_at_ms=later)
    assert reused is first  # not one node changed
    assert [n.idle_ms(later) for n in reused.nodes] == [n + ms if n else 0 for n in idle]


@given(
    idle=st.lists(st.integers(1, 10**9), min_size=1, max_size=6),
    rtt=st.integers(0, 2_000),
    at=st.integers(0, 2_000),
    restarted=st.booleans(),
)
@settings(max_examples=80, deadline=None)
def test_an_idle_since_within_the_read_window_is_kept_and_a_restarted_clock_is_not(
    idle: list[int], rtt: int, at: int, restarted: bool
) -> None:
    """The GCS measured each duration somewhere between request and reply: an earlier idle-since
    inside that window is the same clock (its object kept, by the poller's both paths); a clock
    that restarted after the last read (the host ran work in between) moves later."""
    before = _full_reply(idle)
    first = parse_ray_state(before, read_at_ms=NOW_MS)
    elapsed = 10_000  # the next read was asked for 10 s later and answered `rtt` ms after that
    read = ReadWindow(NOW_MS + elapsed, NOW_MS + elapsed + rtt)
    after = _copy(before)
    node0 = after.cluster_resource_state.node_states[0]
    for node in after.cluster_resource_state.node_states:
        node.idle_duration_ms += elapsed + min(at, rtt)  # measured `at` ms into the window
    if restarted:
        node0.idle_duration_ms = 3_000  # idle again 3 s before the read, after 10 s of work
    found = _zeroed(after)
    for state in (
        with_idle_clocks(first, found.idle_ms, read),
        with_nodes_of(first, parse_ray_state(after, read_at_ms=read.received_ms), read),
    ):
        kept = [a is b for a, b in zip(first.nodes, state.nodes, strict=True)]
        assert kept == [not restarted or i > 0 for i in range(len(idle))]
        since = state.nodes[0].idle_since_ms
        assert since is not None and first.nodes[0].idle_since_ms is not None
        if restarted:
            assert since == read.received_ms - 3_000 > first.nodes[0].idle_since_ms
        # However a duration is read, the idle-since is off by at most the window and the slop.
        true_since = NOW_MS - idle[0] if not restarted else read.sent_ms + min(at, rtt) - 3_000
        assert abs(since - true_since) <= rtt + SLOP_MS


def test_zeroed_sets_exactly_the_moving_fields_to_zero_and_keeps_the_idle_clocks() -> None:
    reply = _full_reply([0, 5000, 0, 9000])
    expected = _copy(reply)
    expected.cluster_resource_state.cluster_resource_state_version = 0
    expected.cluster_resource_state.last_seen_autoscaler_state_version = 0
    for node in expected.cluster_resource_state.node_states:
        node.idle_duration_ms = node.node_state_version = 0
    found = zeroed(reply)
    assert found is not None and found.reply is reply
    assert found.idle_ms == (0, 5000, 0, 9000)
    assert reply.SerializeToString(deterministic=True) == expected.SerializeToString(
        deterministic=True
    )
    assert zeroed({"cluster_resource_state": {}}) is None  # JSON forms are parsed in full


def test_map_entries_in_another_order_are_the_same_reply() -> None:
    """A real GCS writes map entries in a new order on every call (tests/ray)."""
    reply = _full_reply([0, 5000])
    shuffled = _tick(reply, 1000)
    for node in shuffled.cluster_resource_state.node_states:
        for field in ("available_resources", "total_resources", "labels"):
            entries = dict(getattr(node, field))
            getattr(node, field).clear()
            getattr(node, field).update(dict(reversed(list(entries.items()))))
    assert reply.SerializeToString(deterministic=False) != shuffled.SerializeToString()
    assert _same(reply, shuffled)


_ZERO: dict[int, Any] = {
    FieldDescriptor.TYPE_STRING: "",
    FieldDescriptor.TYPE_BYTES: b"",
    FieldDescriptor.TYPE_BOOL: False,
    FieldDescriptor.TYPE_FLOAT: 0.0,
    FieldDescriptor.TYPE_DOUBLE: 0.0,
}


def _changed(value: Any, field: FieldDescriptor) -> Any:
    if field.type == FieldDescriptor.TYPE_ENUM:
        numbers = [v.number for v in field.enum_type.values]
        return next(n for n in numbers if n != value)
    if field.type == FieldDescriptor.TYPE_BOOL:
        return not value
    if field.type in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        return value + 1.5
    if field.type == FieldDescriptor.TYPE_STRING:
        return value + "x"
    if field.type == FieldDescriptor.TYPE_BYTES:
        return value + b"x"
    return value + 1


def _mutations(message: Any, path: str) -> Iterator[str]:
    """Change each field of `message` in turn (yielding its path), one at a time, undoing each."""
    for field in message.DESCRIPTOR.fields:
        name = f"{path}.{field.name}"
        if field.is_repeated:
            container = getattr(message, field.name)
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                key = "zz-new-key"
                value_field = field.message_type.fields_by_name["value"]
                container[key] = "v" if value_field.type == FieldDescriptor.TYPE_STRING else 1.0
                yield name + "[+key]"
                del container[key]
                continue
            if field.message_type is not None:
                container.add()
                yield name + "[+item]"
                del container[-1]
                for i in range(len(container)):
                    yield from _mutations(container[i], f"{name}[{i}]")
                continue
            container.append(_changed(_ZERO.get(field.type, 0), field))
            yield name + "[+item]"
            del container[-1]
            continue
        if field.message_type is not None:
            yield from _mutations(getattr(message, field.name), name)
            continue
        old = getattr(message, field.name)
        setattr(message, field.name, _changed(old, field))
        yield name
        setattr(message, field.name, old)


def _is_moving(path: str) -> bool:
    leaf = path.rsplit(".", 1)[-1]
    return leaf in MOVING or (".node_states[" in path and leaf in MOVING_PER_NODE)


def test_every_field_but_versions_and_idle_clocks_makes_the_replies_differ() -> None:
    reply = _full_reply([0, 5000])
    base = _copy(reply)
    seen_moving, seen_other = set(), 0
    for path in _mutations(reply, "reply"):
        if _is_moving(path):
            assert _same(reply, base), f"{path} moves on every call yet made the replies differ"
            seen_moving.add(path.rsplit(".", 1)[-1])
        else:
            assert not _same(reply, base), f"a change of {path} went unseen"
            seen_other += 1
    assert seen_moving == MOVING | MOVING_PER_NODE
    assert seen_other > 40  # the walk reached nodes, requests, gangs and constraints
    assert reply == base  # every mutation undone


class _Replies:
    """A StateSource that answers with the replies it is given, in turn."""

    cluster_id = "c1"

    def __init__(self, replies: list[Any]) -> None:
        self.replies = replies

    async def get_cluster_resource_state(self) -> Any:
        return self.replies.pop(0)


class _BytesReplies(_Replies):
    """Like `GcsClient`: the replies as bytes, for the poller to decode."""

    async def get_cluster_resource_state_bytes(self) -> bytes:
        return bytes(self.replies.pop(0).SerializeToString(deterministic=True))


@pytest.mark.parametrize("source", [_Replies, _BytesReplies])
def test_poller_parses_only_replies_that_changed_and_publishes_what_a_full_parse_would(
    source: type[_Replies],
) -> None:
    first = _full_reply([0, 60_000, 0, 590_000])
    ticks = [first]
    for _ in range(3):
        ticks.append(_tick(ticks[-1], 5_000))  # node 3's clock crosses 10 min on the last one
    busy = _copy(ticks[-1])
    busy.cluster_resource_state.node_states[1].status = RUNNING
    busy.cluster_resource_state.node_states[1].idle_duration_ms = 0
    replies = [*ticks, busy, _tick(busy, 5_000)]
    read_at = [NOW_MS + 5_000 * i for i in range(len(replies) - 1)] + [NOW_MS + 5_000 * 4]
    expected = [parse_ray_state(r, read_at_ms=t) for r, t in zip(replies, read_at, strict=True)]
    changes: list[Any] = []
    wall = _Wall()
    poller = GcsPoller(source(replies), interval_s=1.0, on_change=changes.append, wall=wall)

    async def poll_all() -> list[Any]:
        out = []
        for t in read_at:
            wall.now = t
            out.append(await poller.poll_once())
        return out

    seen = asyncio.run(poll_all())
    assert [o.state for o in seen] == expected
    assert seen[3].state is not None and seen[3].state.nodes[3].idle_ms(read_at[3]) == 605_000
    assert poller.parses == 1  # the first reply in full
    assert poller.reparses == 1  # the one where node 1 turned busy: that node alone re-read
    assert len(changes) == 2


def test_with_idle_clocks_refuses_clocks_of_another_reply() -> None:
    state = parse_ray_state(_full_reply([0, 1000]), read_at_ms=NOW_MS)
    with pytest.raises(ValueError, match="3 idle clocks for 2 nodes"):
        with_idle_clocks(state, (0, 1, 2), ReadWindow.at(NOW_MS))


class _Wall:
    """The poller's wall clock (epoch ms), where the test puts it."""

    def __init__(self) -> None:
        self.now = NOW_MS

    def __call__(self) -> int:
        return self.now


@pytest.mark.parametrize("source", [_Replies, _BytesReplies])
def test_after_a_real_change_unchanged_nodes_keep_their_objects(source: type[_Replies]) -> None:
    first = _full_reply([0, 60_000, 0])
    changed = _tick(first, 1000)
    changed.cluster_resource_state.node_states[0].available_resources["CPU"] = 7.0
    wall = _Wall()
    poller = GcsPoller(source([first, changed]), interval_s=1.0, wall=wall)

    async def both() -> list[Any]:
        first_seen = await poller.poll_once()
        wall.now += 1000  # read a second later: node 1's idle-since is the same
        return [first_seen, await poller.poll_once()]

    before, after = asyncio.run(both())
    assert after.state == parse_ray_state(changed, read_at_ms=NOW_MS + 1000)
    assert (poller.parses, poller.reparses) == (1, 1)
    kept = [a is b for a, b in zip(before.state.nodes, after.state.nodes, strict=True)]
    assert kept == [False, True, True]  # node 0 changed; node 1 idle since the same moment


CHANGES = st.sampled_from(
    [
        "idle_moves",
        "node_busy",
        "node_resources",
        "node_added",
        "node_gone",
        "node_moved",
        "demand",
        "demand_gone",
        "gang",
        "nothing",
    ]
)


@given(
    idle=st.lists(st.integers(0, 10**6), min_size=1, max_size=6),
    changes=st.lists(st.tuples(CHANGES, st.integers(0, 20)), min_size=1, max_size=4),
)
@settings(max_examples=120, deadline=None)
def test_reparsing_what_changed_equals_a_full_parse(
    idle: list[int], changes: list[tuple[str, int]]
) -> None:
    """Whatever changed between two replies (nodes added, gone, reordered, changed; demand),
    re-reading only the changed parts gives what a full parse gives (with unchanged nodes'
    objects kept), and a node whose bytes did not change is the very object of the last parse."""
    before = _full_reply(idle)
    previous = parse_ray_state(before, read_at_ms=NOW_MS)
    old = _zeroed(before)
    after = _tick(before, 1000)
    nodes = after.cluster_resource_state.node_states
    for change, i in changes:
        k = i % len(nodes) if len(nodes) else 0
        if change == "node_busy" and len(nodes):
            nodes[k].status, nodes[k].idle_duration_ms = RUNNING, 0
        elif change == "node_resources" and len(nodes):
            nodes[k].available_resources["CPU"] = 1.0 + i
        elif change == "node_added":
            nodes.extend([_node(100 + i, idle_ms=5000 + i, status=IDLE)])
        elif change == "node_gone" and len(nodes):
            del nodes[k]
        elif change == "node_moved" and len(nodes) > 1:
            moved = autoscaler_pb2.NodeState()
            moved.CopyFrom(nodes[k])
            del nodes[k]
            nodes.add().CopyFrom(moved)
        elif change == "demand":
            task = after.cluster_resource_state.pending_resource_requests.add(count=1 + i)
            task.request.resources_bundle.update({"CPU": 2.0})
        elif change == "demand_gone":
            del after.cluster_resource_state.pending_resource_requests[:]
        elif change == "gang":
            gang = after.cluster_resource_state.pending_gang_resource_requests.add()
            gang.details = f"pg{i}:SPREAD|PENDING"
            gang.requests.add().resources_bundle.update({"CPU": 1.0})
    read = ReadWindow(NOW_MS + 1000, NOW_MS + 1000 + (changes[0][1] % 7))
    full = parse_ray_state(after, read_at_ms=read.received_ms)
    new = _zeroed(after)
    got = reparsed(previous, old, new, read)
    assert got == with_nodes_of(previous, full, read)
    assert [n.node_id for n in got.nodes] == [n.node_id for n in full.nodes]
    assert new.reply == _zeroed(after).reply  # still zeroed: the next reply is compared with it
    old_nodes = {n.node_id: n for n in old.reply.cluster_resource_state.node_states}
    for message, node in zip(new.reply.cluster_resource_state.node_states, got.nodes, strict=True):
        if old_nodes.get(message.node_id) == message:  # unchanged: the last parse's object
            assert any(node is p for p in previous.nodes)
