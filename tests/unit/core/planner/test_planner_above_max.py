"""Groups running more replicas than maxReplicas (issue 12 items 1 and 2).

Single-host cases also run Ray's own v2 scheduler on the same input: it terminates the surplus
with cause MAX_NUM_NODE_PER_TYPE, picking nodes without Ray first, then the longest idle, then
the least used. For multi-host groups the whole-slice rule is ours.
"""

from __future__ import annotations

from datetime import timedelta

from ray.core.generated import instance_manager_pb2

from kuberay_scaler.core.defaults import PREEMPT_DEADLINE_S, RAYCLUSTER_POLL_INTERVAL_S
from kuberay_scaler.core.model.plan import DeleteKind, Memory, Plan
from kuberay_scaler.core.model.ray import NodeStatus
from kuberay_scaler.core.model.reasons import ScaleDownKind
from kuberay_scaler.core.parse.raycluster import parse_raycluster
from kuberay_scaler.core.patch.ops import build_patch, ops_json
from tests.factories import (
    NOW,
    NOW_S,
    cluster,
    cpu_nodes,
    deleted_pods,
    group,
    node,
    node_id_of,
    plan_of,
    pod,
    slice_pods,
    state,
    tpu_group,
    tpu_slice_nodes,
)
from tests.ray_reference import add_node, answers, new_state

HOST = {"CPU": 8, "memory": 32 * 2**30}
MAX_NUM_NODE_PER_TYPE = instance_manager_pb2.TerminationRequest.Cause.MAX_NUM_NODE_PER_TYPE


def assert_plan_invariants(rc: object, pods: object, result: Plan) -> None:
    """No partial, busy or undrained slice deleted; targets within [min, max]."""
    assert result.slice_map is not None
    for d in result.groups:
        gs = result.slice_map.groups[d.group]
        assert gs.group.min_replicas <= d.target <= gs.group.max_replicas or d.target == d.current
        by_key = {s.key: s for s in gs.slices}
        for x in d.deletions:
            sl = by_key[x.slice_key]
            assert set(x.pods) == set(sl.pod_names)  # the whole slice
            busy = [n for n in sl.nodes.values() if n.status is NodeStatus.RUNNING]
            assert not busy or x.reason.kind is ScaleDownKind.PREEMPTED, x


def _ray_terminated(got: object) -> set[str]:
    return {t.instance_id for t in got.ray_reply.to_terminate}  # type: ignore[attr-defined]


def test_idle_surplus_slices_leave_and_the_target_is_max_replicas_like_ray() -> None:
    rc = cluster(group("cpu", replicas=3, max_replicas=1))
    reply = new_state()
    add_node(reply, "cpu-0", "cpu", HOST, idle_ms=5_000, ip="10.0.0.2")
    add_node(reply, "cpu-1", "cpu", HOST, idle_ms=90_000, ip="10.0.0.3")
    add_node(reply, "cpu-2", "cpu", HOST, idle_ms=30_000, ip="10.0.0.4")
    got = answers(rc, reply)
    assert got.ray == {"cpu": 1}
    assert got.ours == got.ray
    assert {t.cause for t in got.ray_reply.to_terminate} == {MAX_NUM_NODE_PER_TYPE}
    decision = got.plan.group("cpu")
    assert decision is not None
    assert decision.target == 1
    assert set(deleted_pods(got.plan, "cpu")) == _ray_terminated(got) == {"cpu-1", "cpu-2"}
    assert {x.reason.kind for x in decision.deletions} == {ScaleDownKind.ABOVE_MAX}
    assert all(x.kind is DeleteKind.IDLE for x in decision.deletions)  # drained first


def test_one_idle_surplus_slice_never_leaves_replicas_at_zero() -> None:
    """The reported bug: maxReplicas 1, two pods, one idle: target was 0 with a pod left."""
    rc = cluster(group("cpu", replicas=2, max_replicas=1))
    reply = new_state()
    add_node(reply, "cpu-0", "cpu", HOST, idle_ms=None, available={"CPU": 0}, ip="10.0.0.2")
    add_node(reply, "cpu-1", "cpu", HOST, idle_ms=1_000, ip="10.0.0.3")
    got = answers(rc, reply)
    assert got.ours == got.ray == {"cpu": 1}
    assert deleted_pods(got.plan, "cpu") == ["cpu-1"] == sorted(_ray_terminated(got))
    patch = ops_json(build_patch(parse_raycluster(rc), got.plan))
    assert {"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 1} in patch


def test_max_replicas_zero_removes_every_idle_slice_like_ray() -> None:
    """Item 2: maxReplicas 0 with running pods took the minReplicas path ("2 idle kept")."""
    rc = cluster(group("cpu", replicas=2, max_replicas=0))
    reply = new_state()
    add_node(reply, "cpu-0", "cpu", HOST, idle_ms=1_000, ip="10.0.0.2")
    add_node(reply, "cpu-1", "cpu", HOST, idle_ms=2_000, ip="10.0.0.3")
    got = answers(rc, reply)
    assert got.ours == got.ray == {"cpu": 0}
    assert sorted(deleted_pods(got.plan, "cpu")) == ["cpu-0", "cpu-1"]
    decision = got.plan.group("cpu")
    assert decision is not None and decision.target == 0
    assert not any("min" in str(r) for r in decision.reasons)


def test_pods_without_a_ray_node_go_first_like_ray() -> None:
    rc = cluster(group("cpu", replicas=2, max_replicas=1))
    reply = new_state()
    add_node(reply, "cpu-0", "cpu", HOST, idle_ms=600_000, ip="10.0.0.2")
    pods = [
        pod("rc-head", "headgroup", head=True),
        pod("cpu-0", "cpu"),
        pod("cpu-1", "cpu", phase="Pending"),
    ]
    got = answers(rc, reply, pods)
    assert got.ours == {"cpu": 1}
    assert deleted_pods(got.plan, "cpu") == ["cpu-1"]


def test_busy_surplus_is_drained_for_preemption_first_and_deleted_later() -> None:
    rc = cluster(group("cpu", replicas=2, max_replicas=1))
    pods = [pod("cpu-0", "cpu"), pod("cpu-1", "cpu")]
    busy = cpu_nodes(["cpu-0"], free_cpu=2) + cpu_nodes(["cpu-1"], free_cpu=6)
    first = plan_of(rc, pods, state(busy))
    decision = first.group("cpu")
    assert decision is not None
    # Nothing busy is deleted now: cpu-1 (least used, like Ray) is drained with a deadline.
    assert not decision.deletions
    (preempt,) = decision.preempt
    assert (preempt.slice_key, preempt.kind) == ("cpu-1", DeleteKind.PREEMPT)
    assert preempt.reason.kind is ScaleDownKind.PREEMPT
    deadline = first.memory.preempting["cpu-1"]
    assert deadline == NOW_S + PREEMPT_DEADLINE_S
    assert decision.changes  # the drain must be executed even without a spec change
    assert_plan_invariants(rc, pods, first)

    # Still busy before the deadline: kept, not drained again, nothing more preempted.
    later = NOW + timedelta(seconds=PREEMPT_DEADLINE_S / 2)
    second = plan_of(rc, pods, state(busy), memory=first.memory, now=later)
    d2 = second.group("cpu")
    assert d2 is not None and not d2.deletions and not d2.preempt
    assert second.memory.preempting == {"cpu-1": deadline}

    # Drained (Ray says DRAINING, nothing running): deleted, drained once more for idle
    # termination (accepted for a node with no work) so the deletion gate's (a) holds.
    drained = [
        busy[0],
        node(
            "cpu-1",
            group_name="cpu",
            resources=dict(busy[1].total),
            draining=True,
        ),
    ]
    assert drained[1].status is NodeStatus.DRAINING
    third = plan_of(rc, pods, state(drained), memory=first.memory, now=later)
    d3 = third.group("cpu")
    assert d3 is not None
    assert deleted_pods(third, "cpu") == ["cpu-1"]
    assert d3.deletions[0].node_ids == (node_id_of("cpu-1"),)
    assert d3.deletions[0].reason.kind is ScaleDownKind.PREEMPTED
    assert d3.target == 1


def test_default_preemption_deadline_frees_the_slice_within_kuberays_60_s() -> None:
    """KubeRay's e2e test (maxReplicas 2 -> 1, both workers busy) wants the
    surplus gone within 60 s; Ray's own autoscaler stops the node at once. Our default drain
    notice plus the poll-mode GET and a loaded machine's reaction must fit in that."""
    assert PREEMPT_DEADLINE_S + RAYCLUSTER_POLL_INTERVAL_S + 15.0 <= 60.0
    rc = cluster(group("cpu", replicas=2, max_replicas=1))
    pods = [pod("cpu-0", "cpu"), pod("cpu-1", "cpu")]
    busy = cpu_nodes(["cpu-0", "cpu-1"], free_cpu=2)
    first = plan_of(rc, pods, state(busy))
    at_deadline = NOW + timedelta(seconds=PREEMPT_DEADLINE_S)
    second = plan_of(rc, pods, state(busy), memory=first.memory, now=at_deadline)
    assert len(deleted_pods(second, "cpu")) == 1  # still busy, but its notice is over


def test_busy_surplus_past_its_deadline_is_deleted() -> None:
    rc = cluster(group("cpu", replicas=2, max_replicas=1))
    pods = [pod("cpu-0", "cpu"), pod("cpu-1", "cpu")]
    busy = cpu_nodes(["cpu-0", "cpu-1"], free_cpu=2)
    memory = Memory(preempting={"cpu-1": NOW_S - 1})
    result = plan_of(rc, pods, state(busy), memory=memory)
    assert deleted_pods(result, "cpu") == ["cpu-1"]


def test_multi_host_surplus_leaves_as_whole_slices_idle_first() -> None:
    rc = cluster(tpu_group(replicas=3, max_replicas=1))
    pods = [
        *slice_pods("tpu", "tpu-a", 4),
        *slice_pods("tpu", "tpu-b", 4),
        *slice_pods("tpu", "tpu-c", 4),
    ]
    nodes = [
        *tpu_slice_nodes("tpu-a", 4, busy_hosts=(1,)),
        *tpu_slice_nodes("tpu-b", 4, idle_s=300),
        *tpu_slice_nodes("tpu-c", 4, idle_per_host=[50, 50, 5, 50]),
    ]
    result = plan_of(rc, pods, state(nodes))
    decision = result.group("tpu")
    assert decision is not None
    assert decision.target == 1
    assert [x.slice_key for x in decision.deletions] == ["tpu-b", "tpu-c"]
    for x in decision.deletions:
        assert len(x.pods) == 4  # never a partial slice
    assert not decision.preempt
    assert_plan_invariants(rc, pods, result)


def test_max_replicas_zero_multi_host_busy_slice_is_preempted_not_deleted() -> None:
    rc = cluster(tpu_group(replicas=1, max_replicas=0))
    pods = slice_pods("tpu", "tpu-a", 4)
    result = plan_of(rc, pods, state(tpu_slice_nodes("tpu-a", 4, busy_hosts=(2,))))
    decision = result.group("tpu")
    assert decision is not None
    assert not decision.deletions
    assert [x.slice_key for x in decision.preempt] == ["tpu-a"]
    assert len(decision.preempt[0].node_ids) == 4  # every host drained
    assert_plan_invariants(rc, pods, result)


def test_within_max_replicas_nothing_changes() -> None:
    rc = cluster(group("cpu", replicas=2, max_replicas=2))
    pods = [pod("cpu-0", "cpu"), pod("cpu-1", "cpu")]
    result = plan_of(rc, pods, state(cpu_nodes(["cpu-0", "cpu-1"], free_cpu=0)))
    decision = result.group("cpu")
    assert decision is not None and not decision.changes


def test_preempt_deadline_comes_from_settings() -> None:
    from kuberay_scaler.runtime.policy import policy_from_settings
    from kuberay_scaler.runtime.settings import load_settings

    policy = policy_from_settings(load_settings({"KUBERAY_SCALER_PREEMPT_DEADLINE_S": "120"}))
    rc = cluster(group("cpu", replicas=2, max_replicas=1))
    pods = [pod("cpu-0", "cpu"), pod("cpu-1", "cpu")]
    result = plan_of(rc, pods, state(cpu_nodes(["cpu-0", "cpu-1"], free_cpu=2)), policy=policy)
    assert list(result.memory.preempting.values()) == [NOW_S + 120]
