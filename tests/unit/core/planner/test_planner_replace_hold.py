"""Broken slices are replaced as a unit with backoff; unsure views hold instead of acting."""

from __future__ import annotations

from typing import Any

import pytest

from kuberay_scaler.core.model.availability import UnavailableCause
from kuberay_scaler.core.model.plan import DeleteKind, Memory, ReplaceBackoff
from kuberay_scaler.core.model.reasons import (
    Hold,
    HoldKind,
    Keep,
    KeepKind,
    ProblemKind,
    Replace,
    ScaleDown,
    ScaleDownKind,
    SliceFault,
    Waiting,
)
from kuberay_scaler.core.planner.deadlines import Deadlines
from kuberay_scaler.core.planner.policy import Policy
from tests.factories import (
    NOW_S,
    cluster,
    cpu_nodes,
    deleted_pods,
    group,
    head_node,
    plan_of,
    pod,
    slice_pods,
    state,
    targets,
    tasks,
    tpu_group,
    tpu_slice_nodes,
)

POLICY = Policy(deadlines=Deadlines(max_provision_s=600, missing_node_grace_s=120))


def _failed_host_slice() -> tuple[list[dict[str, Any]], list[Any]]:
    pods = slice_pods("tpu", "tpu-a", 4)
    pods[2]["status"]["phase"] = "Failed"
    pods[2]["status"]["reason"] = "Evicted"
    nodes = [head_node(), *tpu_slice_nodes("tpu-a", 4, idle_s=5)]
    return pods, nodes


def test_slice_with_a_failed_host_is_replaced_whole() -> None:
    pods, nodes = _failed_host_slice()
    result = plan_of(cluster(tpu_group(replicas=1)), pods, state(nodes), policy=POLICY)
    decision = result.group("tpu")
    assert decision is not None
    assert decision.target == 1  # KubeRay creates the fresh replica
    (deletion,) = decision.deletions
    assert deletion.kind is DeleteKind.REPLACE
    assert sorted(deletion.pods) == [f"tpu-a-{i}" for i in range(4)]
    assert isinstance(deletion.reason, Replace)
    assert (deletion.reason.fault, deletion.reason.slice) == (SliceFault.HOST_FAILED, "tpu-a")
    assert "Evicted" in deletion.reason.cause  # the pod's own status, passed through
    backoff = result.memory.backoff["tpu"]
    assert backoff.failures == 1
    assert backoff.until == NOW_S + POLICY.deadlines.replace_backoff_s


def test_slice_whose_ray_node_is_missing_past_the_grace_is_replaced() -> None:
    pods = slice_pods("tpu", "tpu-a", 4, age_s=900, running_for_s=300)
    nodes = [head_node(), *tpu_slice_nodes("tpu-a", 4, idle_s=5)[:3]]  # host 3 never joined
    result = plan_of(cluster(tpu_group(replicas=1)), pods, state(nodes), policy=POLICY)
    decision = result.group("tpu")
    assert decision is not None
    (deletion,) = decision.deletions
    assert deletion.kind is DeleteKind.REPLACE
    assert isinstance(deletion.reason, Replace)
    assert deletion.reason.fault is SliceFault.RAY_NODE_MISSING
    assert "tpu-a-3" in deletion.reason.cause  # names the host whose node is missing
    assert len(deletion.pods) == 4


def test_ray_node_missing_within_the_grace_is_waited_for() -> None:
    pods = slice_pods("tpu", "tpu-a", 4, age_s=300, running_for_s=60)
    nodes = [head_node(), *tpu_slice_nodes("tpu-a", 4, idle_s=5)[:3]]
    result = plan_of(cluster(tpu_group(replicas=1)), pods, state(nodes), policy=POLICY)
    assert deleted_pods(result, "tpu") == []


def test_slice_pending_past_max_provision_time_is_cancelled_not_replaced() -> None:
    # Past the provisioning deadline the group is unavailable; a slice whose pods
    # never ran is cancelled (the target drops), never replaced by the same stuck pods.
    pods = slice_pods("tpu", "tpu-a", 4, phase="Pending", age_s=700)
    result = plan_of(
        cluster(tpu_group(replicas=1)),
        pods,
        state([head_node()], [tasks({"TPU": 4}, 4)]),
        policy=POLICY,
    )
    decision = result.group("tpu")
    assert decision is not None
    (deletion,) = decision.deletions
    assert deletion.kind is DeleteKind.CANCEL
    assert isinstance(deletion.reason, ScaleDown)
    assert deletion.reason.kind is ScaleDownKind.CANCEL_UNAVAILABLE
    assert not [r for r in decision.reasons if isinstance(r, Replace)]
    assert decision.target == 0
    availability = result.memory.availability["tpu"]
    assert availability.cause is UnavailableCause.PROVISIONING_DEADLINE
    waiting = [r for r in decision.reasons if isinstance(r, Waiting)]
    assert [w.blocked.kind for w in waiting] == [HoldKind.GROUP_UNAVAILABLE]


def test_replacement_serves_the_demand_no_extra_slice_is_launched() -> None:
    pods = slice_pods("tpu", "tpu-a", 4)
    pods[2]["status"]["phase"] = "Failed"
    result = plan_of(
        cluster(tpu_group(replicas=1)),
        pods,
        state([head_node()], [tasks({"TPU": 4}, 4)]),
        policy=POLICY,
    )
    assert [x.kind for x in deletions(result, "tpu")] == [DeleteKind.REPLACE]
    assert targets(result) == {"tpu": 1}


def deletions(result: Any, name: str) -> list[Any]:
    decision = result.group(name)
    assert decision is not None
    return list(decision.deletions)


def test_partial_slice_past_max_provision_time_is_replaced_as_a_unit() -> None:
    pods = slice_pods("tpu", "tpu-a", 4, age_s=700)[:3]
    result = plan_of(cluster(tpu_group(replicas=1)), pods, state([head_node()]), policy=POLICY)
    decision = result.group("tpu")
    assert decision is not None
    assert [sorted(d.pods) for d in decision.deletions] == [["tpu-a-0", "tpu-a-1", "tpu-a-2"]]


def test_replacement_waits_out_the_groups_backoff() -> None:
    pods, nodes = _failed_host_slice()
    memory = Memory(backoff={"tpu": ReplaceBackoff(NOW_S + 30, 1, 1)})
    result = plan_of(
        cluster(tpu_group(replicas=1)), pods, state(nodes), memory=memory, policy=POLICY
    )
    decision = result.group("tpu")
    assert decision is not None
    assert decision.deletions == ()
    kept = [r for r in decision.reasons if isinstance(r, Keep)]
    assert [(r.kind, r.count) for r in kept] == [(KeepKind.REPLACE_BACKING_OFF, 1)]


def test_backoff_doubles_with_each_failure_up_to_the_cap() -> None:
    pods, nodes = _failed_host_slice()
    memory = Memory(backoff={"tpu": ReplaceBackoff(NOW_S - 1, 3, 1)})
    result = plan_of(
        cluster(tpu_group(replicas=1)), pods, state(nodes), memory=memory, policy=POLICY
    )
    backoff = result.memory.backoff["tpu"]
    assert backoff.failures == 4
    assert backoff.until == NOW_S + min(300 * 8, POLICY.deadlines.replace_max_backoff_s)


def test_backoff_of_one_group_does_not_stop_another() -> None:
    pods, nodes = _failed_host_slice()
    pods += [pod("cpu-a", "cpu")]
    nodes += cpu_nodes(["cpu-a"], idle_s=600)
    memory = Memory(backoff={"tpu": ReplaceBackoff(NOW_S + 30, 1, 1)})
    rc = cluster(tpu_group(replicas=1), group("cpu", replicas=1))
    result = plan_of(rc, pods, state(nodes), memory=memory, policy=POLICY)
    assert deleted_pods(result, "tpu") == []
    assert deleted_pods(result, "cpu") == ["cpu-a"]


def test_unknown_demand_holds_everything() -> None:
    pods = slice_pods("tpu", "tpu-a", 4)
    result = plan_of(cluster(tpu_group(replicas=1)), pods, ray=None)
    assert result.held is not None and result.held.kind is HoldKind.DEMAND_UNKNOWN
    assert not result.changes
    assert all(g.held for g in result.groups)


def test_unsynced_view_holds_everything() -> None:
    pods, nodes = _failed_host_slice()
    result = plan_of(cluster(tpu_group(replicas=1)), pods, state(nodes), synced=False)
    assert result.held is not None and result.held.kind is HoldKind.NOT_SYNCED
    assert not result.changes


def test_pending_workers_to_delete_block_scale_down_of_that_group_only() -> None:
    pods = slice_pods("tpu", "tpu-a", 4) + slice_pods("tpu", "tpu-b", 4)
    nodes = [
        head_node(),
        *tpu_slice_nodes("tpu-a", 4, idle_s=900),
        *tpu_slice_nodes("tpu-b", 4, idle_s=900),
    ]
    pods += [pod("cpu-a", "cpu")]
    nodes += cpu_nodes(["cpu-a"], idle_s=900)
    wtd: dict[str, Any] = {"scaleStrategy": {"workersToDelete": [f"tpu-a-{i}" for i in range(4)]}}
    rc = cluster(tpu_group(replicas=1, **wtd), group("cpu", replicas=1))
    result = plan_of(rc, pods, state(nodes))
    tpu = result.group("tpu")
    assert tpu is not None
    assert tpu.deletions == ()  # tpu-b is idle too, but nothing is stacked on a pending delete
    assert tpu.target == 1
    assert tpu.held is not None
    assert (tpu.held.kind, tpu.held.count) == (HoldKind.WORKERS_TO_DELETE_PENDING, 4)
    assert deleted_pods(result, "cpu") == ["cpu-a"]


def test_pending_workers_to_delete_still_allow_scale_up() -> None:
    pods = slice_pods("tpu", "tpu-a", 4)
    nodes = [head_node(), *tpu_slice_nodes("tpu-a", 4, idle_s=900)]
    wtd: dict[str, Any] = {"scaleStrategy": {"workersToDelete": [f"tpu-a-{i}" for i in range(4)]}}
    rc = cluster(tpu_group(replicas=0, **wtd))
    result = plan_of(rc, pods, state(nodes, [tasks({"TPU": 4}, 4)]))
    assert targets(result) == {"tpu": 1}


def test_workers_to_delete_all_gone_is_cleared() -> None:
    pods = slice_pods("tpu", "tpu-b", 4)
    nodes = [head_node(), *tpu_slice_nodes("tpu-b", 4, busy_hosts=(0,))]
    wtd: dict[str, Any] = {"scaleStrategy": {"workersToDelete": [f"tpu-a-{i}" for i in range(4)]}}
    result = plan_of(cluster(tpu_group(replicas=1, **wtd)), pods, state(nodes))
    decision = result.group("tpu")
    assert decision is not None
    assert decision.clear_workers_to_delete
    assert decision.target == 1
    assert result.changes


def test_workers_to_delete_is_cleared_even_while_demand_is_unknown() -> None:
    wtd: dict[str, Any] = {"scaleStrategy": {"workersToDelete": ["gone-0"]}}
    result = plan_of(cluster(tpu_group(replicas=0, **wtd)), [], ray=None)
    decision = result.group("tpu")
    assert decision is not None
    assert decision.clear_workers_to_delete
    assert decision.target == decision.current


def test_group_awaiting_its_write_is_held_entirely_and_others_go_on() -> None:
    pods, nodes = _failed_host_slice()
    pods += [pod("cpu-a", "cpu")]
    nodes += cpu_nodes(["cpu-a"], idle_s=900)
    memory = Memory(awaiting_write={"tpu": "replicas 1 → 2 not yet observed"})
    rc = cluster(tpu_group(replicas=1), group("cpu", replicas=1))
    result = plan_of(rc, pods, state(nodes, [tasks({"TPU": 4}, 8)]), memory=memory, policy=POLICY)
    tpu = result.group("tpu")
    assert tpu is not None
    assert (tpu.target, tpu.deletions) == (1, ())
    assert tpu.held == Hold(
        HoldKind.AWAITING_WRITE, "tpu", detail="replicas 1 → 2 not yet observed"
    )
    assert deleted_pods(result, "cpu") == ["cpu-a"]


def test_multi_host_pods_without_slice_labels_are_left_alone() -> None:
    pods = [pod(f"tpu-{i}", "tpu", age_s=3600) for i in range(4)]
    nodes = [head_node(), *tpu_slice_nodes("tpu", 4, idle_s=900)]
    result = plan_of(cluster(tpu_group(replicas=1)), pods, state(nodes), policy=POLICY)
    assert deleted_pods(result, "tpu") == []
    assert any(
        p.kind is ProblemKind.SLICE_MAP and p.group == "tpu" and "cannot be told apart" in p.message
        for p in result.problems
    )


@pytest.mark.parametrize("phase", ["Failed", "Succeeded", "Unknown"])
def test_single_host_failed_pod_is_replaced(phase: str) -> None:
    pods = [pod("cpu-a", "cpu", phase=phase)]
    result = plan_of(cluster(group("cpu", replicas=1)), pods, state([head_node()]), policy=POLICY)
    decision = result.group("cpu")
    assert decision is not None
    assert [(d.kind, d.pods) for d in decision.deletions] == [(DeleteKind.REPLACE, ("cpu-a",))]
    assert decision.target == 1
