"""Resources Ray adds to every node by itself, modelled as Ray's scheduler does (issue 12 item 3).

Each case runs Ray's own v2 ResourceDemandScheduler (installed wheel, node types from its KubeRay
derivation) and our planner on the same RayCluster and ClusterResourceState.
"""

from __future__ import annotations

from tests.factories import cluster, group
from tests.ray_reference import add_gang, add_node, add_tasks, answers, new_state

IMPLICIT = "node:__internal_implicit_resource_app"
CPU_HOST = {"CPU": 8, "memory": 32 * 2**30, "object_store_memory": 2**30}


def _rc(replicas: int = 0) -> dict[str, object]:
    return cluster(group("cpu", replicas=replicas, max_replicas=10))


def test_serve_max_replicas_per_node_scales_from_zero_like_ray() -> None:
    """max_replicas_per_node=2 asks each replica for half the implicit resource: 2 per node."""
    state = new_state()
    add_tasks(state, {"CPU": 1, IMPLICIT: 0.5}, 5)
    got = answers(_rc(), state)
    assert got.ray == {"cpu": 3}  # Ray's answer: 5 replicas, at most 2 per node
    assert got.ours == got.ray
    assert got.ours_infeasible == got.ray_infeasible == 0


def test_implicit_demand_an_existing_node_serves_is_neither_launched_for_nor_infeasible() -> None:
    state = new_state()
    add_node(state, "cpu-0", "cpu", CPU_HOST, ip="10.0.0.2")
    add_tasks(state, {"CPU": 1, IMPLICIT: 0.5}, 2)
    got = answers(_rc(replicas=1), state)
    assert got.ray == {"cpu": 1}
    assert got.ours == got.ray
    assert got.ours_infeasible == got.ray_infeasible == 0
    assert not got.plan.problems


def test_implicit_resource_partly_used_on_a_node_counts_what_is_left() -> None:
    """A node that reports the implicit resource (in use) has only what it reports left."""
    state = new_state()
    add_node(
        state,
        "cpu-0",
        "cpu",
        {**CPU_HOST, IMPLICIT: 1},
        available={**CPU_HOST, "CPU": 7, IMPLICIT: 0.5},
        idle_ms=None,
    )
    add_tasks(state, {"CPU": 1, IMPLICIT: 0.5}, 3)  # one more fits there, two need a new node
    got = answers(_rc(replicas=1), state)
    assert got.ray == {"cpu": 2}
    assert got.ours == got.ray


def test_demand_pinned_to_a_node_ip_waits_for_that_node() -> None:
    """`node:<ip>` exists only on that node: never a reason to launch, and not infeasible."""
    state = new_state()
    add_node(
        state,
        "cpu-0",
        "cpu",
        CPU_HOST,
        available={**CPU_HOST, "CPU": 0},
        idle_ms=None,
        ip="10.0.0.2",
    )
    add_tasks(state, {"CPU": 1, "node:10.0.0.2": 0.01}, 1)
    got = answers(_rc(replicas=1), state)
    assert got.ray == {"cpu": 1}
    assert got.ours == got.ray
    assert got.ours_infeasible == 0


def test_head_only_resource_never_launches_a_worker() -> None:
    state = new_state()
    add_tasks(state, {"node:__internal_head__": 0.001, "CPU": 0}, 1)
    got = answers(_rc(), state)
    assert got.ray == {"cpu": 0}
    assert got.ours == got.ray
    assert got.ours_infeasible == got.ray_infeasible == 0


def test_accelerator_type_of_a_running_node_is_served_there() -> None:
    state = new_state()
    gpu = {**CPU_HOST, "GPU": 1, "accelerator_type:A100": 1}
    add_node(state, "gpu-0", "gpu", gpu, ip="10.0.0.3")
    add_tasks(state, {"GPU": 1, "accelerator_type:A100": 0.001}, 1)
    rc = cluster(group("cpu", max_replicas=10), _gpu_group(replicas=1))
    got = answers(rc, state)
    assert got.ray == {"cpu": 0, "gpu": 1}
    assert got.ours == got.ray
    assert got.ours_infeasible == got.ray_infeasible == 0


def test_memory_demand_uses_what_the_template_declares_like_ray() -> None:
    state = new_state()
    add_tasks(state, {"CPU": 1, "memory": 20 * 2**30}, 3)  # 32Gi hosts: one per host
    got = answers(_rc(), state)
    assert got.ray == {"cpu": 3}
    assert got.ours == got.ray


def test_placement_group_with_implicit_bundles_like_ray() -> None:
    state = new_state()
    add_gang(state, [{"CPU": 1, IMPLICIT: 1}] * 3, "PACK")  # one per node whatever the packing
    got = answers(_rc(), state)
    assert got.ray == {"cpu": 3}
    assert got.ours == got.ray


def _gpu_group(replicas: int = 0) -> dict[str, object]:
    raw = group("gpu", replicas=replicas, max_replicas=4)
    raw["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1"
    return raw
