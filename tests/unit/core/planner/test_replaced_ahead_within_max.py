"""A slice added ahead for a going slice's work stays within maxReplicas once the later
disruption steps have kept their idle slices (a spare, do-not-disrupt, the scale-down delay):
KubeRay clamps replicas to maxReplicas, so an addition above it would never launch and the plan
would promise a replacement that never comes. It is said instead (`NO_ROOM`), and more demand
never lowers the target (found by hypothesis: test_more_demand_never_yields_fewer_replicas)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from kuberay_scaler.core.model.plan import GroupDecision, Memory, Plan
from kuberay_scaler.core.model.ray import GangDemand, GangStrategy, RayNode, TaskDemand
from kuberay_scaler.core.model.reasons import Disruption, DisruptionKind
from kuberay_scaler.core.model.signals import NodeMaintenance
from kuberay_scaler.core.planner.pipeline import plan
from kuberay_scaler.core.planner.policy import Policy
from tests.factories import (
    NOW,
    bundle,
    cluster,
    gang,
    group,
    head_node,
    slice_pods,
    snapshot_of,
    state,
    tpu_group,
    tpu_slice_nodes,
)

T0 = NOW.timestamp()  # the monotonic reading where the nodes' idle clocks are stamped
DO_NOT_DISRUPT = {"karpenter.sh/do-not-disrupt": "true"}


def going(p: dict[str, Any]) -> dict[str, Any]:
    cond = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
    p["status"].setdefault("conditions", []).append(cond)
    return p


def on_own_nodes(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for p in pods:
        p["spec"]["nodeName"] = f"node-{p['metadata']['name']}"
    return pods


def run(
    rc: dict[str, Any],
    pods: list[dict[str, Any]],
    nodes: list[RayNode],
    *,
    tasks: tuple[TaskDemand, ...] = (),
    gangs: tuple[GangDemand, ...] = (),
    memory: Memory | None = None,
    maintenance: dict[str, NodeMaintenance] | None = None,
) -> Plan:
    return plan(
        snapshot_of(rc, pods),
        state(nodes, tasks, gangs),
        memory or Memory(),
        Policy(),
        NOW,
        mono_s=T0,
        maintenance=maintenance or {},
    )


def decision_of(result: Plan, name: str) -> GroupDecision:
    found = result.group(name)
    assert found is not None
    return found


def disruptions(d: GroupDecision, kind: DisruptionKind) -> list[Disruption]:
    return [r for r in d.reasons if isinstance(r, Disruption) and r.kind is kind]


def assert_within_max(d: GroupDecision, max_replicas: int) -> None:
    assert d.target <= max_replicas, [str(r) for r in d.reasons]


# --- the example hypothesis found -------------------------------------------------------------


def _example() -> tuple[dict[str, Any], list[dict[str, Any]], list[RayNode]]:
    """g0: v6e-4 slices (one host each), replicas 5 = maxReplicas, four slices up: s0 idle and
    going (DisruptionTarget), s1 and s3 busy, s2 idle with do-not-disrupt."""
    g0 = group("g0", replicas=5, max_replicas=5, cpu="24", tpu="4", topology="2x2")
    g0["idleTimeoutSeconds"] = 0
    rc = cluster(g0, group("g1", replicas=0, max_replicas=3, cpu="4"))
    pods: list[dict[str, Any]] = []
    nodes: list[RayNode] = [head_node()]
    for i, busy in enumerate((False, True, False, True)):
        key = f"g0-s{i}"
        pods += slice_pods("g0", key, 1, age_s=3600 - i)
        nodes += tpu_slice_nodes(
            key, 1, pod_type="v6e-4", group_name="g0", busy_hosts=(0,) if busy else ()
        )
    going(pods[0])
    pods[2]["metadata"]["annotations"] = dict(DO_NOT_DISRUPT)
    return rc, pods, nodes


CPU_TASKS = (TaskDemand(bundle({"CPU": 1}), 6),)
ONE_SLICE_GANG = gang(GangStrategy.STRICT_SPREAD, bundle({"TPU": 4}))


def test_a_replacement_ahead_never_takes_the_room_of_a_do_not_disrupt_slice_kept() -> None:
    rc, pods, nodes = _example()
    result = run(rc, pods, nodes, tasks=CPU_TASKS, gangs=(ONE_SLICE_GANG,))
    d = decision_of(result, "g0")
    assert_within_max(d, 5)
    assert d.target == 5 and d.deletions == ()  # s2 stays (do-not-disrupt), nothing added
    assert [x.slice_key for x in d.preempt] == ["g0-s0-0"]  # the going slice is still drained
    assert not disruptions(d, DisruptionKind.REPLACED_AHEAD)
    (said,) = disruptions(d, DisruptionKind.NO_ROOM)  # not hidden: the plan says it
    assert said.slice == "g0-s0-0" and "maxReplicas 5" in str(said)
    assert dict(result.memory.replaced_ahead) == {}  # a later plan tries again


def test_more_of_the_same_demand_never_lowers_the_target_of_a_group_with_a_going_slice() -> None:
    rc, pods, nodes = _example()
    before = decision_of(run(rc, pods, nodes, tasks=CPU_TASKS, gangs=(ONE_SLICE_GANG,)), "g0")
    more = (ONE_SLICE_GANG, ONE_SLICE_GANG)
    after = decision_of(run(rc, pods, nodes, tasks=CPU_TASKS, gangs=more), "g0")
    assert after.target >= before.target, (before.target, after.target)
    assert_within_max(after, 5)
    assert disruptions(after, DisruptionKind.NO_ROOM)


# --- the other steps that give a replica back -------------------------------------------------


def tpu_slices(*idle: float | None) -> tuple[list[dict[str, Any]], list[RayNode]]:
    """One v6e-16 slice per entry (tpu-a, tpu-b, ...): idle seconds, or None for busy."""
    pods: list[dict[str, Any]] = []
    nodes: list[RayNode] = [head_node()]
    for i, seconds in enumerate(idle):
        key = f"tpu-{chr(ord('a') + i)}"
        pods += on_own_nodes(slice_pods("tpu", key, 4, age_s=3600 + i))
        hosts = (0, 1, 2, 3) if seconds is None else ()
        nodes += tpu_slice_nodes(key, 4, idle_s=seconds or 0, busy_hosts=hosts)
    return pods, nodes


def test_a_spare_kept_for_one_going_slice_leaves_no_room_to_add_one_for_another() -> None:
    pods, nodes = tpu_slices(None, None, 900.0)  # tpu-a, tpu-b busy and going; tpu-c idle
    going(pods[0])
    going(pods[4])
    d = decision_of(run(cluster(tpu_group(replicas=3, max_replicas=3)), pods, nodes), "tpu")
    assert_within_max(d, 3)
    assert d.target == 3 and d.deletions == ()
    assert len(disruptions(d, DisruptionKind.SPARE_KEPT)) == 1
    assert len(disruptions(d, DisruptionKind.NO_ROOM)) == 1
    assert not disruptions(d, DisruptionKind.REPLACED_AHEAD)


def _maintenance_on(host: str) -> dict[str, NodeMaintenance]:
    start_ms = int((T0 + 7200) * 1000)  # two hours away: not going, never a spare
    return {f"node-{host}": NodeMaintenance(f"node-{host}", start_ms)}


def test_the_scale_down_delay_keeping_an_idle_slice_leaves_no_room_ahead() -> None:
    pods, nodes = tpu_slices(None, 900.0)  # tpu-a busy and going; tpu-b idle, maintenance due
    going(pods[0])
    rc = cluster(tpu_group(replicas=2, max_replicas=2))
    memory = Memory(scaled_up_at=MappingProxyType({"tpu": T0 - 100}))  # within the delay
    result = run(rc, pods, nodes, memory=memory, maintenance=_maintenance_on("tpu-b-0"))
    d = decision_of(result, "tpu")
    assert_within_max(d, 2)
    assert d.target == 2 and d.deletions == ()
    assert disruptions(d, DisruptionKind.SCALE_DOWN_DELAY)
    assert [r.slice for r in disruptions(d, DisruptionKind.NO_ROOM)] == ["tpu-a"]
    assert dict(result.memory.replaced_ahead) == {}


def test_an_idle_slice_that_does_leave_still_makes_room_for_the_replacement_ahead() -> None:
    pods, nodes = tpu_slices(None, 900.0)  # as above, without the delay: tpu-b leaves
    going(pods[0])
    rc = cluster(tpu_group(replicas=2, max_replicas=2))
    result = run(rc, pods, nodes, maintenance=_maintenance_on("tpu-b-0"))
    d = decision_of(result, "tpu")
    assert d.target == 2 and [x.slice_key for x in d.deletions] == ["tpu-b"]
    assert [r.slice for r in disruptions(d, DisruptionKind.REPLACED_AHEAD)] == ["tpu-a"]
    assert dict(result.memory.replaced_ahead) == {"tpu-a": "tpu"}
