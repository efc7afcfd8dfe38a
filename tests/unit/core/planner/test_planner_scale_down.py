"""Scale down in whole slices: every host idle long enough, nothing needs it, never below min."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from kuberay_scaler.core.model.plan import DeleteKind
from kuberay_scaler.core.model.ray import NodeStatus, RayNode
from kuberay_scaler.core.model.reasons import Keep, KeepKind, ScaleDown, ScaleDownKind
from kuberay_scaler.core.planner.deadlines import Deadlines
from kuberay_scaler.core.planner.policy import Policy
from tests.factories import (
    cluster,
    cpu_nodes,
    deleted_pods,
    group,
    head_node,
    node_id_of,
    plan_of,
    pod,
    slice_pods,
    slice_reservation,
    state,
    targets,
    tasks,
    tpu_group,
    tpu_slice_nodes,
)


def _tpu_slices(
    *idle: float | None, busy: dict[int, tuple[int, ...]] | None = None
) -> tuple[list[dict[str, Any]], list[RayNode]]:
    """One v6e-16 slice per entry: idle seconds for all hosts, None for busy."""
    pods: list[dict[str, Any]] = []
    nodes: list[RayNode] = [head_node()]
    for i, seconds in enumerate(idle):
        key = f"tpu-{chr(ord('a') + i)}"
        pods += slice_pods("tpu", key, 4, age_s=3600 + i)
        busy_hosts = (busy or {}).get(i, (0, 1, 2, 3) if seconds is None else ())
        nodes += tpu_slice_nodes(key, 4, idle_s=seconds or 0, busy_hosts=busy_hosts)
    return pods, nodes


def test_idle_v6e_slice_is_deleted_whole_with_every_host_drained() -> None:
    pods, nodes = _tpu_slices(120.0)
    result = plan_of(cluster(tpu_group(replicas=1)), pods, state(nodes))
    decision = result.group("tpu")
    assert decision is not None
    assert decision.target == 0
    (deletion,) = decision.deletions
    assert deletion.kind is DeleteKind.IDLE
    assert deletion.slice_key == "tpu-a"
    assert sorted(deletion.pods) == [f"tpu-a-{i}" for i in range(4)]
    assert sorted(deletion.node_ids) == sorted(node_id_of(f"tpu-a-{i}") for i in range(4))
    assert isinstance(deletion.reason, ScaleDown)
    why = deletion.reason
    assert (why.kind, why.slice, why.hosts, why.idle_s) == (ScaleDownKind.IDLE, "tpu-a", 4, 120.0)
    assert why.idle_s >= why.timeout_s


def test_slice_with_one_busy_host_is_kept() -> None:
    pods, nodes = _tpu_slices(120.0, busy={0: (2,)})
    result = plan_of(cluster(tpu_group(replicas=1)), pods, state(nodes))
    assert targets(result) == {"tpu": 1}
    assert deleted_pods(result, "tpu") == []


def test_slice_is_idle_only_as_long_as_its_least_idle_host() -> None:
    pods = slice_pods("tpu", "tpu-a", 4)
    nodes = [head_node(), *tpu_slice_nodes("tpu-a", 4, idle_per_host=[600, 600, 30, 600])]
    result = plan_of(cluster(tpu_group(replicas=1)), pods, state(nodes))
    assert targets(result) == {"tpu": 1}


def test_draining_host_makes_its_slice_not_idle() -> None:
    pods, nodes = _tpu_slices(120.0)
    draining = [n if n.instance_id != "tpu-a-1" else _draining(n) for n in nodes]
    result = plan_of(cluster(tpu_group(replicas=1)), pods, state(draining))
    assert deleted_pods(result, "tpu") == []


def _draining(n: RayNode) -> RayNode:
    return replace(n, status=NodeStatus.DRAINING)


@pytest.mark.parametrize(
    ("group_timeout", "cluster_timeout", "override", "idle_s", "deleted"),
    [
        (None, None, None, 59, False),  # default 60 s
        (None, None, None, 60, True),
        (None, 30, None, 45, True),  # cluster autoscalerOptions.idleTimeoutSeconds
        (300, 30, None, 45, False),  # group beats cluster
        (300, 30, None, 301, True),
        (300, 30, 10, 45, True),  # the settings override beats all
        (10, 10, 600, 45, False),
        (0, None, None, 0, True),  # zero timeout: idle at all is enough
    ],
)
def test_idle_timeout_precedence(
    group_timeout: int | None,
    cluster_timeout: int | None,
    override: float | None,
    idle_s: float,
    deleted: bool,
) -> None:
    extra: dict[str, Any] = {} if group_timeout is None else {"idleTimeoutSeconds": group_timeout}
    opts = {} if cluster_timeout is None else {"idleTimeoutSeconds": cluster_timeout}
    rc = cluster(group("cpu", replicas=1, **extra), autoscalerOptions=opts)
    pods = [pod("cpu-a", "cpu")]
    nodes = [head_node(), *cpu_nodes(["cpu-a"], idle_s=idle_s)]
    result = plan_of(
        rc, pods, state(nodes), policy=Policy(deadlines=Deadlines(idle_timeout_override_s=override))
    )
    assert (deleted_pods(result, "cpu") == ["cpu-a"]) is deleted


def test_min_replicas_floor_keeps_the_least_idle_slices() -> None:
    pods, nodes = _tpu_slices(100.0, 900.0, 300.0)
    result = plan_of(cluster(tpu_group(replicas=3, min_replicas=2)), pods, state(nodes))
    decision = result.group("tpu")
    assert decision is not None
    assert decision.target == 2
    assert [d.slice_key for d in decision.deletions] == ["tpu-b"]  # longest idle goes first
    kept = [r for r in decision.reasons if isinstance(r, Keep)]
    assert [(r.kind, r.count, r.min_replicas) for r in kept] == [(KeepKind.MIN_REPLICAS, 2, 2)]


def test_all_slices_idle_at_the_same_moment_are_planned_together() -> None:
    # Idle timers of survivors reset when nodes die (contract §4): one plan takes them all.
    pods, nodes = _tpu_slices(100.0, 900.0, 300.0)
    result = plan_of(cluster(tpu_group(replicas=3)), pods, state(nodes))
    decision = result.group("tpu")
    assert decision is not None
    assert decision.target == 0
    assert [d.slice_key for d in decision.deletions] == ["tpu-b", "tpu-c", "tpu-a"]
    assert len(deleted_pods(result, "tpu")) == 12


def test_idle_slices_of_several_groups_go_in_one_plan() -> None:
    pods, nodes = _tpu_slices(100.0)
    pods += [pod("cpu-a", "cpu")]
    nodes += cpu_nodes(["cpu-a"], idle_s=100)
    rc = cluster(tpu_group(replicas=1), group("cpu", replicas=1))
    result = plan_of(rc, pods, state(nodes))
    assert targets(result) == {"tpu": 0, "cpu": 0}


def test_idle_slice_needed_by_pending_demand_is_kept() -> None:
    pods, nodes = _tpu_slices(900.0)
    result = plan_of(
        cluster(tpu_group(replicas=1)), pods, state(nodes, tasks=[tasks({"TPU": 4}, 2)])
    )
    assert targets(result) == {"tpu": 1}
    assert deleted_pods(result, "tpu") == []


def test_idle_slice_needed_by_a_slice_reservation_is_kept() -> None:
    pods, nodes = _tpu_slices(900.0)
    result = plan_of(
        cluster(tpu_group(replicas=1)), pods, state(nodes, gangs=[slice_reservation()])
    )
    assert targets(result) == {"tpu": 1}


def test_idle_slice_needed_by_request_resources_is_kept() -> None:
    pods, nodes = _tpu_slices(900.0, 900.0)
    result = plan_of(
        cluster(tpu_group(replicas=2)), pods, state(nodes, constraint=[tasks({"TPU": 4}, 6)])
    )
    decision = result.group("tpu")
    assert decision is not None
    assert decision.target == 2  # 6 hosts' worth of TPU needs both slices
    assert decision.deletions == ()


def test_request_resources_keeps_only_what_it_needs() -> None:
    pods, nodes = _tpu_slices(900.0, 900.0)
    result = plan_of(
        cluster(tpu_group(replicas=2)), pods, state(nodes, constraint=[tasks({"TPU": 4}, 4)])
    )
    assert targets(result) == {"tpu": 1}


def test_demand_the_slice_cannot_serve_does_not_keep_it() -> None:
    pods, nodes = _tpu_slices(900.0)
    rc = cluster(tpu_group(replicas=1), group("gpu", cpu="8", resources={"GPU": "1"}))
    result = plan_of(rc, pods, state(nodes, tasks=[tasks({"GPU": 1}, 1)]))
    assert targets(result) == {"tpu": 0, "gpu": 1}


def test_cpu_demand_does_not_keep_an_idle_tpu_slice_when_a_cpu_host_is_free() -> None:
    pods, nodes = _tpu_slices(900.0)
    pods += [pod("cpu-a", "cpu")]
    nodes += cpu_nodes(["cpu-a"], idle_s=1)
    rc = cluster(tpu_group(replicas=1), group("cpu", replicas=1))
    result = plan_of(rc, pods, state(nodes, tasks=[tasks({"CPU": 2}, 1)]))
    assert targets(result) == {"tpu": 0, "cpu": 1}


def test_busy_and_pending_slices_are_never_idle_deleted() -> None:
    pods, nodes = _tpu_slices(None)
    pods += slice_pods("tpu", "tpu-z", 4, phase="Pending", age_s=30)
    result = plan_of(cluster(tpu_group(replicas=2)), pods, state(nodes))
    decision = result.group("tpu")
    assert decision is not None
    assert decision.deletions == ()
    assert decision.target == 2


def test_launching_replica_without_pods_is_never_cancelled() -> None:
    # The operator may be rebuilding it (a host pod was deleted externally): cancelling would
    # race with it (seen in the e2e tier). An unneeded slice leaves later through the idle path.
    pods, nodes = _tpu_slices(None)
    result = plan_of(cluster(tpu_group(replicas=2)), pods, state(nodes))
    decision = result.group("tpu")
    assert decision is not None
    assert decision.target == 2
    assert decision.deletions == ()
    assert not decision.changes


def test_launching_replica_is_kept_for_min_replicas() -> None:
    pods, nodes = _tpu_slices(None)
    result = plan_of(cluster(tpu_group(replicas=2, min_replicas=2)), pods, state(nodes))
    assert targets(result) == {"tpu": 2}


def test_partial_slice_is_not_deleted_as_idle() -> None:
    pods = slice_pods("tpu", "tpu-a", 4)[:3]
    nodes = [head_node(), *tpu_slice_nodes("tpu-a", 4, idle_s=900)[:3]]
    result = plan_of(cluster(tpu_group(replicas=1)), pods, state(nodes))
    decision = result.group("tpu")
    assert decision is not None
    assert decision.deletions == ()
    assert decision.target == 1


def test_idle_single_host_groups_delete_pods_one_by_one() -> None:
    names = ["cpu-a", "cpu-b", "cpu-c"]
    pods = [pod(n, "cpu") for n in names]
    nodes = [head_node(), *cpu_nodes(names[:2], idle_s=100), *cpu_nodes(names[2:], free_cpu=0)]
    result = plan_of(cluster(group("cpu", replicas=3)), pods, state(nodes))
    decision = result.group("cpu")
    assert decision is not None
    assert decision.target == 1
    assert sorted(deleted_pods(result, "cpu")) == ["cpu-a", "cpu-b"]
    assert all(len(d.pods) == 1 for d in decision.deletions)


def test_demand_uses_an_idle_running_host_before_a_launching_replica() -> None:
    # Placing the task on the launching replica would delete the idle host and keep the
    # launching one: churn for nothing. The running host serves it; the launch is kept.
    pods = [pod("cpu-a", "cpu")]
    nodes = [head_node(), *cpu_nodes(["cpu-a"], idle_s=900)]
    result = plan_of(cluster(group("cpu", replicas=2)), pods, state(nodes, [tasks({"CPU": 8}, 1)]))
    decision = result.group("cpu")
    assert decision is not None
    assert decision.deletions == ()
    assert decision.target == 2
