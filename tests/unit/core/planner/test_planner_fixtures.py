"""Plans on Ray state captured from a real Ray 2.60.0 head (tests/fixtures/ray_state)."""

from __future__ import annotations

from typing import Any

import pytest

from kuberay_scaler.adapters.ray_gcs.state import parse_ray_state
from kuberay_scaler.core.model.ray import RayState
from kuberay_scaler.core.model.reasons import InfeasibleKind, ProblemKind
from kuberay_scaler.core.planner.deadlines import Deadlines
from kuberay_scaler.core.planner.policy import Policy
from tests.factories import (
    FIXTURES,
    NOW_MS,
    cluster,
    deleted_pods,
    group,
    plan_of,
    pod,
    sample,
    targets,
    tpu_group,
)

SLICE_NAME = "tpu-group-q8m4z"  # TPU_NAME of the captured slice (README.md there)
EVERYTHING_IDLE = Policy(deadlines=Deadlines(idle_timeout_override_s=0))


def captured(name: str) -> RayState:
    path = FIXTURES / "ray_state" / f"{name}.json"
    if not path.exists():
        pytest.skip(f"fixture {path.name} not captured yet")
    return parse_ray_state(path.read_text(), read_at_ms=NOW_MS)


def tpu_cluster(tpu_replicas: int = 1, cpu_replicas: int = 1) -> dict[str, Any]:
    """The RayCluster the captures stand for: a v6e-16 group of 4 hosts and a 4-CPU group."""
    return cluster(
        tpu_group("tpu-group", replicas=tpu_replicas, cpu="1", max_replicas=4),
        group("cpu-group", replicas=cpu_replicas, cpu="4", max_replicas=10),
    )


def pods_of(ray: RayState) -> list[dict[str, Any]]:
    """The pods KubeRay would run for the captured nodes (instance id = pod name)."""
    pods = []
    for n in ray.nodes:
        if n.node_type == "tpu-group":
            worker = int(n.labels["ray.io/tpu-worker-id"])
            pods.append(pod(n.instance_id, n.node_type, replica=SLICE_NAME, host_index=worker))
        elif n.node_type == "cpu-group":
            pods.append(pod(n.instance_id, n.node_type))
    return pods


def test_pending_slice_reservation_launches_one_v6e_16_slice() -> None:
    ray = captured("pending_slice_reservation")
    result = plan_of(tpu_cluster(0, 0), [], ray)
    assert targets(result) == {"tpu-group": 1, "cpu-group": 0}
    decision = result.group("tpu-group")
    assert decision is not None
    assert decision.launching_hosts == 4
    assert result.infeasible == ()


def test_pending_slice_reservation_on_the_v6e_sample() -> None:
    rc = sample("ray-cluster.tpu-v6e-16-multihost.yaml")
    rc["spec"]["workerGroupSpecs"][0]["replicas"] = 0
    result = plan_of(rc, [], captured("pending_slice_reservation"))
    assert targets(result) == {"tpu-group": 1}


def test_pinned_slice_bundles_never_launch() -> None:
    ray = captured("pinned_slice_bundles")
    result = plan_of(tpu_cluster(), pods_of(ray), ray, policy=EVERYTHING_IDLE)
    assert targets(result) == {"tpu-group": 1, "cpu-group": 0}  # the idle CPU host may go
    assert deleted_pods(result, "tpu-group") == []
    assert result.infeasible == ()
    waiting = [p for p in result.problems if p.kind is ProblemKind.WAITS_ON_EXISTING_NODE]
    assert waiting and all(p.demand is not None for p in waiting)
    assert any(p.demand and SLICE_NAME in p.demand.shape for p in waiting)


def test_busy_slice_is_kept_whatever_the_timeout() -> None:
    ray = captured("busy_tpu_slice")
    result = plan_of(tpu_cluster(), pods_of(ray), ray, policy=EVERYTHING_IDLE)
    assert deleted_pods(result, "tpu-group") == []
    assert targets(result)["tpu-group"] == 1


def test_idle_slice_is_kept_until_the_timeout() -> None:
    ray = captured("idle_tpu_slice")  # idle for a few seconds only
    result = plan_of(tpu_cluster(), pods_of(ray), ray)
    assert targets(result) == {"tpu-group": 1, "cpu-group": 1}
    assert not result.changes


def test_idle_slice_past_the_timeout_is_deleted_whole() -> None:
    ray = captured("idle_tpu_slice")
    result = plan_of(tpu_cluster(), pods_of(ray), ray, policy=EVERYTHING_IDLE)
    assert targets(result) == {"tpu-group": 0, "cpu-group": 0}
    tpu = result.group("tpu-group")
    assert tpu is not None
    (deletion,) = tpu.deletions
    assert deletion.slice_key == SLICE_NAME
    assert len(deletion.pods) == len(deletion.node_ids) == 4


def test_pending_cpu_tasks_launch_cpu_hosts_only() -> None:
    ray = captured("pending_cpu_tasks")  # 10 × 1 CPU + 2 × 2 CPU on a head without CPUs
    result = plan_of(tpu_cluster(0, 0), [], ray)
    assert targets(result) == {"tpu-group": 0, "cpu-group": 4}  # 14 CPUs on 4-CPU hosts


def test_pending_placement_groups() -> None:
    ray = captured("pending_pgs")
    result = plan_of(tpu_cluster(0, 0), [], ray)
    # STRICT_SPREAD 3 × {CPU: 2}: three distinct CPU hosts.
    assert targets(result) == {"tpu-group": 0, "cpu-group": 3}
    # STRICT_PACK 2 × {CPU: 1, TPU: 4} needs 8 chips on one host: no v6e host has them.
    (infeasible,) = result.infeasible
    assert infeasible.demand.strategy == "STRICT_PACK"
    assert infeasible.kind is InfeasibleKind.NO_GROUP_OFFERS_PACKED


def test_request_resources_floor_launches_one_slice() -> None:
    ray = captured("request_resources")  # {TPU: 4} × 4 = one v6e-16 slice
    result = plan_of(tpu_cluster(0, 0), [], ray)
    assert targets(result) == {"tpu-group": 1, "cpu-group": 0}
