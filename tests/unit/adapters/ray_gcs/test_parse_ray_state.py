"""GetClusterResourceStateReply → RayState, from protobuf and from proto3 JSON alike."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from ray.core.generated import autoscaler_pb2

from kuberay_scaler.adapters.ray_gcs.state import RayStateError, parse_ray_state
from kuberay_scaler.core.model.ray import HEAD_RESOURCE, GangStrategy, NodeStatus, RayState
from tests.factories import NOW_MS

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "ray_state"
SLICE = "tpu-group-abcde"
HOST0_ID = bytes.fromhex("a0" * 28)
DEAD_ID = bytes.fromhex("dd" * 28)

_IN, _NOT_IN = 1, 2  # LabelSelectorOperator


def add_node(state: Any, node_id: bytes, instance: str, **fields: Any) -> Any:
    node = state.node_states.add(node_id=node_id, instance_id=instance)
    for key in ("total_resources", "available_resources", "labels"):
        getattr(node, key).update(fields.pop(key, {}))
    for key, value in fields.items():
        setattr(node, key, value)
    return node


def add_request(
    target: Any, resources: dict[str, float], labels: dict[str, tuple[int, list[str]]]
) -> Any:
    request = target.add()
    request.resources_bundle.update(resources)
    if labels:
        selector = request.label_selectors.add()
        for key, (op, values) in labels.items():
            selector.label_constraints.add(label_key=key, operator=op, label_values=values)
    return request


def tpu_host(state: Any, index: int) -> None:
    total = {"CPU": 24.0, "TPU": 4.0, SLICE: 1.0, "accelerator_type:TPU-V6E": 1.0}
    if index == 0:
        total["TPU-v6e-16-head"] = 1.0
    add_node(
        state,
        HOST0_ID if index == 0 else bytes([index]) * 28,
        f"{SLICE}-{index}",
        ray_node_type_name="tpu-group",
        status=autoscaler_pb2.IDLE,
        idle_duration_ms=42_000,
        node_ip_address=f"127.0.0.{20 + index}",
        total_resources=total,
        available_resources=total,
        labels={
            "ray.io/tpu-slice-name": SLICE,
            "ray.io/tpu-worker-id": str(index),
            "ray.io/tpu-pod-type": "v6e-16",
        },
    )


def realistic_reply() -> Any:
    """What a head reports with one 4-host TPU slice up, one dead node and mixed demand."""
    reply = autoscaler_pb2.GetClusterResourceStateReply()
    state = reply.cluster_resource_state
    state.cluster_session_name = "session_2026-11-30_12-00-00_000000_1"
    state.cluster_resource_state_version = 17
    add_node(
        state,
        b"\x01" * 28,
        "rc-head-x7k2p",
        ray_node_type_name="headgroup",
        status=autoscaler_pb2.RUNNING,
        node_ip_address="127.0.0.10",
        total_resources={"CPU": 0.0, "memory": 1e9, HEAD_RESOURCE: 1.0},
        available_resources={"CPU": 0.0, HEAD_RESOURCE: 1.0},
    )
    for index in range(4):
        tpu_host(state, index)
    # A host holding placement-group bundles lists per-group resources too: not capacity.
    state.node_states[2].total_resources.update({"TPU_group_pg1": 4.0, "bundle_group_0_pg1": 1.0})
    add_node(
        state, DEAD_ID, "cpu-worker-gone", ray_node_type_name="cpu", status=autoscaler_pb2.DEAD
    )
    tasks = state.pending_resource_requests.add(count=10)
    tasks.request.resources_bundle.update({"CPU": 1.0})
    state.pending_resource_requests.add(count=0).request.resources_bundle.update({"CPU": 9.0})
    slice_head = state.pending_gang_resource_requests.add(details="pg2:PACK|PENDING")
    add_request(
        slice_head.bundle_selectors.add().resource_requests,
        {"TPU-v6e-16-head": 1.0},
        {"ray.io/tpu-worker-id": (_IN, ["0"]), "ray.io/tpu-pod-type": (_IN, ["v6e-16"])},
    )
    spread = state.pending_gang_resource_requests.add(details="pg3:STRICT_SPREAD|PENDING")
    for _ in range(2):
        request = add_request(spread.requests, {"CPU": 2.0}, {"zone": (_NOT_IN, ["b"])})
        request.placement_constraints.add().anti_affinity.label_name = "_PG_pg3"
    state.pending_gang_resource_requests.add(details="empty")  # skipped
    constraint = state.cluster_resource_constraints.add()
    constraint.resource_requests.add(count=2).request.resources_bundle.update({"TPU": 4.0})
    return reply


def test_nodes_are_read_with_instance_ids_and_labels() -> None:
    ray = parse_ray_state(realistic_reply(), read_at_ms=NOW_MS)

    assert [n.instance_id for n in ray.nodes] == [
        "rc-head-x7k2p",
        *(f"{SLICE}-{i}" for i in range(4)),
        "cpu-worker-gone",
    ]
    head, host0 = ray.nodes[0], ray.nodes[1]
    assert head.is_head and not host0.is_head
    assert head.status is NodeStatus.RUNNING
    assert host0.node_id == HOST0_ID.hex()
    assert host0.node_type == "tpu-group"
    assert host0.status is NodeStatus.IDLE and host0.idle
    assert host0.idle_ms(NOW_MS) == 42_000
    assert host0.idle_since_ms == NOW_MS - 42_000  # a point in time: read at NOW_MS
    assert host0.ip == "127.0.0.20"
    assert host0.labels["ray.io/tpu-worker-id"] == "0"
    assert host0.labels["ray.io/tpu-slice-name"] == SLICE


def test_tpu_head_resource_only_on_worker_0() -> None:
    ray = parse_ray_state(realistic_reply(), read_at_ms=NOW_MS)

    with_head = [n.instance_id for n in ray.nodes if "TPU-v6e-16-head" in n.total]
    assert with_head == [f"{SLICE}-0"]


def test_placement_group_bookkeeping_resources_are_not_capacity() -> None:
    host1 = parse_ray_state(realistic_reply(), read_at_ms=NOW_MS).nodes[2]

    assert dict(host1.total) == {
        "CPU": 24.0,
        "TPU": 4.0,
        SLICE: 1.0,
        "accelerator_type:TPU-V6E": 1.0,
    }


def test_dead_nodes_are_kept_but_never_joined_to_pods() -> None:
    ray = parse_ray_state(realistic_reply(), read_at_ms=NOW_MS)

    dead = ray.nodes[-1]
    assert dead.status is NodeStatus.DEAD and not dead.alive
    assert "cpu-worker-gone" not in ray.node_by_instance()
    assert f"{SLICE}-3" in ray.node_by_instance()


def test_demand_tasks_gangs_and_constraint() -> None:
    ray = parse_ray_state(realistic_reply(), read_at_ms=NOW_MS)

    [tasks] = ray.tasks  # the count-0 entry is dropped
    assert (dict(tasks.bundle.resources), tasks.count) == ({"CPU": 1.0}, 10)
    slice_head, spread = ray.gangs  # the empty gang is dropped
    assert slice_head.strategy is GangStrategy.PACK
    [bundle] = slice_head.bundles
    assert dict(bundle.resources) == {"TPU-v6e-16-head": 1.0}
    [selector] = bundle.selectors
    assert selector.matches({"ray.io/tpu-worker-id": "0", "ray.io/tpu-pod-type": "v6e-16"})
    assert not selector.matches({"ray.io/tpu-worker-id": "1", "ray.io/tpu-pod-type": "v6e-16"})
    assert spread.strategy is GangStrategy.STRICT_SPREAD
    assert len(spread.bundles) == 2
    assert spread.bundles[0].selectors[0].constraints[0].negated is True
    [floor] = ray.constraint
    assert (dict(floor.bundle.resources), floor.count) == ({"TPU": 4.0}, 2)


def test_protobuf_and_proto3_json_give_equal_results() -> None:
    reply = realistic_reply()
    from_proto = parse_ray_state(reply, read_at_ms=NOW_MS)

    as_text = json_format.MessageToJson(reply)
    as_camel = json.loads(as_text)
    as_snake = json_format.MessageToDict(reply, preserving_proto_field_name=True)

    assert parse_ray_state(as_text, read_at_ms=NOW_MS) == from_proto
    assert parse_ray_state(as_text.encode(), read_at_ms=NOW_MS) == from_proto
    assert parse_ray_state(as_camel, read_at_ms=NOW_MS) == from_proto
    assert parse_ray_state(as_snake, read_at_ms=NOW_MS) == from_proto
    assert parse_ray_state(reply.cluster_resource_state, read_at_ms=NOW_MS) == from_proto
    assert parse_ray_state(as_camel["clusterResourceState"], read_at_ms=NOW_MS) == from_proto


def test_unknown_fields_from_newer_ray_are_ignored() -> None:
    doc = json_format.MessageToDict(realistic_reply())
    doc["clusterResourceState"]["someFutureField"] = {"x": 1}
    doc["clusterResourceState"]["nodeStates"][0]["newNodeField"] = 3

    assert parse_ray_state(doc, read_at_ms=NOW_MS) == parse_ray_state(
        realistic_reply(), read_at_ms=NOW_MS
    )


def test_an_empty_reply_is_a_state_with_nothing_in_it() -> None:
    ray = parse_ray_state({"clusterResourceState": {}}, read_at_ms=NOW_MS)

    assert ray == RayState(nodes=(), tasks=(), gangs=(), constraint=())


def test_non_finite_resources_are_dropped() -> None:
    doc = {
        "clusterResourceState": {
            "nodeStates": [{"instanceId": "p", "totalResources": {"CPU": "NaN", "GPU": 1}}],
            "pendingResourceRequests": [
                {"request": {"resourcesBundle": {"CPU": "Infinity", "GPU": 1}}, "count": 1}
            ],
        }
    }

    ray = parse_ray_state(doc, read_at_ms=NOW_MS)

    assert dict(ray.nodes[0].total) == {"GPU": 1.0}
    assert dict(ray.tasks[0].bundle.resources) == {"GPU": 1.0}


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (None, "got NoneType"),
        (42, "got int"),
        ([{"clusterResourceState": {}}], "got list"),
        ("{not json", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        ("[]", "got list"),
        ({}, "no clusterResourceState"),
        ({"apiVersion": "ray.io/v1", "kind": "RayCluster", "spec": {}}, "no clusterResourceState"),
        ({"clusterResourceState": 5}, "not a GetClusterResourceStateReply"),
        ({"clusterResourceState": {"nodeStates": {"a": 1}}}, "not a GetClusterResourceStateReply"),
        ({"clusterResourceState": {"nodeStates": [{"idleDurationMs": 1e30}]}}, "out of range"),
        ({"nodeStates": [{"instanceId": 5}]}, "not a GetClusterResourceStateReply"),
    ],
)
def test_input_that_is_not_a_reply_raises_ray_state_error(bad: object, why: str) -> None:
    # Documented contract: never an empty state (that would read as "no demand"), never another
    # exception type. The caller treats RayStateError as "demand unknown" and holds.
    with pytest.raises(RayStateError, match=why):
        parse_ray_state(bad, read_at_ms=NOW_MS)


FIXTURE_FILES = sorted(FIXTURES.glob("*.json"))
# The capture's TPU slice (fixtures/ray_state/README.md): pod name → TPU worker id.
CAPTURED_SLICE = "tpu-group-q8m4z"
CAPTURED_HOSTS = {
    "raycluster-tpu-tpu-group-worker-b7x2k": "0",
    "raycluster-tpu-tpu-group-worker-c4m9p": "1",
    "raycluster-tpu-tpu-group-worker-d2q8r": "2",
    "raycluster-tpu-tpu-group-worker-f6t3w": "3",
}
CPU_HOST = "raycluster-tpu-cpu-group-worker-h2k9d"


def captured(name: str) -> RayState:
    return parse_ray_state((FIXTURES / name).read_text(), read_at_ms=NOW_MS)


def test_the_captured_fixtures_are_there() -> None:
    assert len(FIXTURE_FILES) >= 7


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=lambda p: p.name)
def test_every_captured_reply_parses_with_exactly_one_head(path: Path) -> None:
    ray = parse_ray_state(path.read_text(), read_at_ms=NOW_MS)

    [head] = [n for n in ray.nodes if n.is_head]
    assert head.alive
    assert head.instance_id == ""  # a head started by hand has no RAY_CLOUD_INSTANCE_ID
    assert all(len(n.node_id) == 56 for n in ray.nodes)  # 28-byte ids, as hex
    assert all("_group_" not in key for n in ray.nodes for key in n.total)


def test_captured_protobuf_and_json_agree() -> None:
    text = (FIXTURES / "pinned_slice_bundles.json").read_text()
    message = json_format.Parse(text, autoscaler_pb2.GetClusterResourceStateReply())

    assert parse_ray_state(message, read_at_ms=NOW_MS) == parse_ray_state(text, read_at_ms=NOW_MS)


def test_captured_idle_tpu_slice() -> None:
    ray = captured("idle_tpu_slice.json")

    tpu = {n.instance_id: n for n in ray.nodes if n.node_type == "tpu-group"}
    assert {pod: n.labels["ray.io/tpu-worker-id"] for pod, n in tpu.items()} == CAPTURED_HOSTS
    assert all(n.labels["ray.io/tpu-slice-name"] == CAPTURED_SLICE for n in tpu.values())
    assert all(n.labels["ray.io/tpu-pod-type"] == "v6e-16" for n in tpu.values())
    assert all(n.total["TPU"] == 4.0 and n.total[CAPTURED_SLICE] == 1.0 for n in tpu.values())
    with_head = [pod for pod, n in tpu.items() if "TPU-v6e-16-head" in n.total]
    assert with_head == ["raycluster-tpu-tpu-group-worker-b7x2k"]  # worker 0 only
    assert all(n.status is NodeStatus.IDLE and n.idle_ms(NOW_MS) > 0 for n in ray.nodes)
    assert ray.node_by_instance()[CPU_HOST].node_type == "cpu-group"
    assert (ray.tasks, ray.gangs, ray.constraint) == ((), (), ())


def test_captured_busy_slice_hosts_are_running_without_idle_time() -> None:
    ray = captured("busy_tpu_slice.json")

    tpu = [n for n in ray.nodes if n.node_type == "tpu-group"]
    assert len(tpu) == 4
    assert all(
        n.status is NodeStatus.RUNNING and not n.idle and n.idle_since_ms is None for n in tpu
    )
    assert all("TPU" not in n.available for n in tpu)  # used up: absent, not 0


def test_captured_pinned_slice_bundles_pend_as_one_spread_gang() -> None:
    raw = json.loads((FIXTURES / "pinned_slice_bundles.json").read_text())
    raw_totals = [n["totalResources"] for n in raw["clusterResourceState"]["nodeStates"]]
    assert any("_group_" in key for total in raw_totals for key in total)  # there in the reply

    ray = captured("pinned_slice_bundles.json")

    [gang] = ray.gangs
    assert gang.strategy is GangStrategy.SPREAD
    assert len(gang.bundles) == 4
    for bundle in gang.bundles:
        assert dict(bundle.resources) == {"CPU": 1.0, "TPU": 4.0}
        assert bundle.selectors[0].matches({"ray.io/tpu-slice-name": CAPTURED_SLICE})
        assert not bundle.selectors[0].matches({"ray.io/tpu-slice-name": "other-slice"})


def test_captured_pending_cpu_tasks_are_counted_entries() -> None:
    ray = captured("pending_cpu_tasks.json")

    counts = sorted((dict(t.bundle.resources)["CPU"], t.count) for t in ray.tasks)
    assert counts == [(1.0, 10), (2.0, 2)]


def test_captured_pending_placement_groups() -> None:
    ray = captured("pending_pgs.json")

    by_strategy = {g.strategy: g for g in ray.gangs}
    spread = by_strategy[GangStrategy.STRICT_SPREAD]
    assert [dict(b.resources) for b in spread.bundles] == [{"CPU": 2.0}] * 3
    pack = by_strategy[GangStrategy.STRICT_PACK]
    first, second = pack.bundles
    assert first.selectors[0].matches({"ray.io/accelerator-type": "TPU-V6E"})
    tpu_4x8 = {"ray.io/accelerator-type": "TPU-V6E", "ray.io/tpu-topology": "4x8"}
    assert second.selectors[0].matches(tpu_4x8)
    assert not second.selectors[0].matches({**tpu_4x8, "ray.io/tpu-topology": "2x2"})


def test_captured_slice_reservation_asks_for_worker_0_of_a_v6e_16() -> None:
    [gang] = captured("pending_slice_reservation.json").gangs

    assert gang.strategy is GangStrategy.PACK
    [bundle] = gang.bundles
    assert dict(bundle.resources) == {"TPU-v6e-16-head": 1.0}
    worker_0 = {"ray.io/tpu-worker-id": "0", "ray.io/tpu-pod-type": "v6e-16"}
    assert bundle.selectors[0].matches(worker_0)
    assert not bundle.selectors[0].matches({**worker_0, "ray.io/tpu-worker-id": "1"})


def test_captured_request_resources_floor() -> None:
    [floor] = captured("request_resources.json").constraint

    assert (dict(floor.bundle.resources), floor.count) == ({"TPU": 4.0}, 4)


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=lambda p: p.name)
def test_alive_instance_ids_match_the_full_parse(path: Path) -> None:
    from kuberay_scaler.adapters.ray_gcs.state import alive_instance_ids

    reply = json_format.Parse(
        path.read_text(), autoscaler_pb2.GetClusterResourceStateReply(), ignore_unknown_fields=True
    )
    dead = reply.cluster_resource_state.node_states.add(instance_id="gone", status=2)  # DEAD
    assert dead.instance_id == "gone"
    assert alive_instance_ids(reply) == list(
        parse_ray_state(reply, read_at_ms=NOW_MS).node_by_instance()
    )
    assert "gone" not in (alive_instance_ids(reply) or [])
    assert alive_instance_ids(json_format.MessageToDict(reply)) is None
