"""The captured replies in tests/fixtures/ray_state still say what their README promises."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from ray.core.generated import autoscaler_pb2

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "ray_state"
SCENARIOS = (
    "idle_tpu_slice",
    "busy_tpu_slice",
    "pinned_slice_bundles",
    "pending_cpu_tasks",
    "pending_pgs",
    "pending_slice_reservation",
    "request_resources",
)
IDLE = autoscaler_pb2.NodeStatus.Value("IDLE")
RUNNING = autoscaler_pb2.NodeStatus.Value("RUNNING")


def load(name: str) -> Any:
    reply = autoscaler_pb2.GetClusterResourceStateReply()
    json_format.Parse((FIXTURES / f"{name}.json").read_text(), reply)
    return reply.cluster_resource_state


def tpu_hosts(state: Any) -> list[Any]:
    return sorted(
        (n for n in state.node_states if "TPU" in n.total_resources),
        key=lambda n: n.labels["ray.io/tpu-worker-id"],
    )


def selectors(request: Any) -> dict[str, list[str]]:
    return {
        c.label_key: list(c.label_values)
        for s in request.label_selectors
        for c in s.label_constraints
    }


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_fixture_parses(name: str) -> None:
    state = load(name)
    assert state.cluster_session_name.startswith("session_")
    assert any("node:__internal_head__" in n.total_resources for n in state.node_states)


def test_idle_slice_has_four_tpu_hosts_with_the_head_resource_on_worker_0() -> None:
    state = load("idle_tpu_slice")
    hosts = tpu_hosts(state)
    assert [h.labels["ray.io/tpu-worker-id"] for h in hosts] == ["0", "1", "2", "3"]
    assert ["TPU-v6e-16-head" in h.total_resources for h in hosts] == [True, False, False, False]
    assert {h.ray_node_type_name for h in hosts} == {"tpu-group"}
    assert all(h.instance_id.startswith("raycluster-tpu-tpu-group-worker-") for h in hosts)
    assert all(n.status == IDLE for n in state.node_states)


def test_busy_slice_hosts_run_without_idle_time() -> None:
    hosts = tpu_hosts(load("busy_tpu_slice"))
    assert [(h.status, h.idle_duration_ms) for h in hosts] == [(RUNNING, 0)] * 4
    assert all(h.available_resources["TPU"] == 0 for h in hosts if "TPU" in h.available_resources)


def test_pinned_bundles_name_the_slice() -> None:
    state = load("pinned_slice_bundles")
    (gang,) = [g for g in state.pending_gang_resource_requests if g.requests]
    requests = gang.bundle_selectors[0].resource_requests
    assert len(requests) == 4
    assert all(selectors(r) == {"ray.io/tpu-slice-name": ["tpu-group-q8m4z"]} for r in requests)
    worker0 = tpu_hosts(state)[0]
    assert any(key.startswith("TPU-v6e-16-head_group_") for key in worker0.total_resources)


def test_cpu_tasks_and_actors_are_counted_by_shape() -> None:
    state = load("pending_cpu_tasks")
    counts = {
        tuple(sorted(r.request.resources_bundle.items())): r.count
        for r in state.pending_resource_requests
    }
    assert counts == {(("CPU", 1.0),): 10, (("CPU", 2.0),): 2}


def test_placement_groups_carry_strategies_and_selectors() -> None:
    gangs = load("pending_pgs").pending_gang_resource_requests
    by_strategy = {g.details.split(":")[1]: g for g in gangs}
    assert set(by_strategy) == {"STRICT_SPREAD|PENDING", "STRICT_PACK|PENDING"}
    spread = by_strategy["STRICT_SPREAD|PENDING"].bundle_selectors[0].resource_requests
    assert all(r.placement_constraints[0].HasField("anti_affinity") for r in spread)
    pack = by_strategy["STRICT_PACK|PENDING"].bundle_selectors[0].resource_requests
    assert [selectors(r) for r in pack] == [
        {"ray.io/accelerator-type": ["TPU-V6E"]},
        {"ray.io/accelerator-type": ["TPU-V6E"], "ray.io/tpu-topology": ["4x4", "4x8"]},
    ]


def test_slice_reservation_asks_for_a_worker_0_head() -> None:
    (gang,) = load("pending_slice_reservation").pending_gang_resource_requests
    (request,) = gang.bundle_selectors[0].resource_requests
    assert dict(request.resources_bundle) == {"TPU-v6e-16-head": 1.0}
    assert selectors(request) == {
        "ray.io/tpu-worker-id": ["0"],
        "ray.io/tpu-pod-type": ["v6e-16"],
    }


def test_request_resources_is_sixteen_chips() -> None:
    (constraint,) = load("request_resources").cluster_resource_constraints
    total = sum(r.request.resources_bundle["TPU"] * r.count for r in constraint.resource_requests)
    assert total == 16
