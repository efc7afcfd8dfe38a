"""Scale up in whole slices: existing capacity first, then new slices of the best group."""

from __future__ import annotations

from typing import Any

import pytest

from kuberay_scaler.core.model.plan import Memory, ReplaceBackoff
from kuberay_scaler.core.model.ray import GangStrategy, TaskDemand
from kuberay_scaler.core.model.reasons import (
    Demand,
    DemandKind,
    Hold,
    HoldKind,
    InfeasibleKind,
    ProblemKind,
    ScaleUp,
    Waiting,
)
from tests.factories import (
    NOW_S,
    bundle,
    cluster,
    cpu_nodes,
    gang,
    group,
    head_node,
    pinned_slice_bundles,
    plan_of,
    pod,
    selector_bundle,
    slice_pods,
    slice_reservation,
    state,
    targets,
    tasks,
    tpu_group,
    tpu_slice_nodes,
)

TPU4 = {"TPU": 4}


def _busy_tpu_slice(replica: str) -> tuple[list[dict[str, Any]], list[Any]]:
    return (
        slice_pods("tpu", replica, 4),
        tpu_slice_nodes(replica, 4, busy_hosts=(0, 1, 2, 3)),
    )


@pytest.mark.parametrize(
    ("demand", "expected"),
    [
        ([tasks({"CPU": 1}, 1)], 1),
        ([tasks({"CPU": 1}, 8)], 1),
        ([tasks({"CPU": 1}, 9)], 2),
        ([tasks({"CPU": 1}, 10), tasks({"CPU": 4}, 2)], 3),
        ([tasks({"CPU": 8}, 3)], 3),
    ],
)
def test_cpu_tasks_launch_just_enough_hosts(demand: list[Any], expected: int) -> None:
    result = plan_of(cluster(group("cpu")), ray=state([head_node()], tasks=demand))
    assert targets(result) == {"cpu": expected}
    assert result.infeasible == ()


@pytest.mark.parametrize(
    ("count", "slices"),
    [(1, 1), (4, 1), (5, 2), (8, 2), (9, 3)],
)
def test_v6e_4x4_tasks_are_served_in_whole_slices(count: int, slices: int) -> None:
    result = plan_of(cluster(tpu_group()), ray=state([head_node()], tasks=[tasks(TPU4, count)]))
    decision = result.group("tpu")
    assert decision is not None
    assert decision.target == slices
    assert decision.num_of_hosts == 4
    assert decision.launching_hosts == 4 * slices


def test_demand_fits_free_capacity_of_running_hosts() -> None:
    pods = [pod("cpu-a", "cpu"), pod("cpu-b", "cpu")]
    nodes = [head_node(), *cpu_nodes(["cpu-a", "cpu-b"], free_cpu=4)]
    result = plan_of(
        cluster(group("cpu", replicas=2)), pods, state(nodes, tasks=[tasks({"CPU": 2}, 4)])
    )
    assert targets(result) == {"cpu": 2}


def test_demand_fits_a_launching_replica_without_pods_yet() -> None:
    # replicas=1 was written but KubeRay has not created the pod: that replica is capacity.
    result = plan_of(
        cluster(group("cpu", replicas=1)), ray=state([head_node()], tasks=[tasks({"CPU": 8}, 1)])
    )
    assert targets(result) == {"cpu": 1}


def test_demand_fits_a_pending_tpu_slice() -> None:
    pods = slice_pods("tpu", "tpu-a", 4, phase="Pending", age_s=30)
    result = plan_of(
        cluster(tpu_group(replicas=1)), pods, state([head_node()], tasks=[tasks(TPU4, 4)])
    )
    assert targets(result) == {"tpu": 1}
    assert result.group("tpu").deletions == ()  # type: ignore[union-attr]


def test_seed_review_example_seven_pods_is_one_complete_and_one_partial_slice() -> None:
    # kuberay#1913 review: 7 pods, numOfHosts 4, replicas 2. Counting pods // 4 = 1 replica
    # would create 4 more pods; the partial slice (3 of 4 pods) is already coming up.
    pods = slice_pods("tpu", "tpu-a", 4) + slice_pods("tpu", "tpu-b", 4, age_s=20)[:3]
    nodes = [head_node(), *tpu_slice_nodes("tpu-a", 4, busy_hosts=(0, 1, 2, 3))]
    result = plan_of(cluster(tpu_group(replicas=2)), pods, state(nodes, tasks=[tasks(TPU4, 4)]))
    assert result.slice_map is not None
    states = {s.key: s.state.value for s in result.slice_map.groups["tpu"].slices}
    assert states == {"tpu-a": "complete", "tpu-b": "partial"}
    decision = result.group("tpu")
    assert decision is not None
    assert decision.target == 2  # the partial slice serves the 4 TPU tasks: nothing new
    assert decision.deletions == ()


def test_slice_reservation_launches_exactly_one_v6e_16_slice() -> None:
    result = plan_of(cluster(tpu_group()), ray=state([head_node()], gangs=[slice_reservation()]))
    assert targets(result) == {"tpu": 1}
    decision = result.group("tpu")
    assert decision is not None
    ups = [r for r in decision.reasons if isinstance(r, ScaleUp)]
    assert [(r.kind, r.count) for r in ups] == [(DemandKind.PLACEMENT_GROUP, 1)]


def test_two_slice_reservations_launch_two_slices() -> None:
    demand = [slice_reservation(), slice_reservation()]
    result = plan_of(cluster(tpu_group()), ray=state([head_node()], gangs=demand))
    assert targets(result) == {"tpu": 2}


def test_slice_reservation_uses_an_idle_slice_instead_of_launching() -> None:
    pods = slice_pods("tpu", "tpu-a", 4)
    nodes = [head_node(), *tpu_slice_nodes("tpu-a", 4, idle_s=5)]
    result = plan_of(
        cluster(tpu_group(replicas=1)), pods, state(nodes, gangs=[slice_reservation()])
    )
    assert targets(result) == {"tpu": 1}


def test_reservation_for_another_pod_type_is_infeasible() -> None:
    result = plan_of(
        cluster(tpu_group()), ray=state([head_node()], gangs=[slice_reservation("v6e-256")])
    )
    assert targets(result) == {"tpu": 0}
    assert len(result.infeasible) == 1
    assert "TPU-v6e-256-head" in result.infeasible[0].demand.shape
    assert result.infeasible[0].kind is InfeasibleKind.NO_GROUP_OFFERS_BUNDLE


def test_bundles_pinned_to_an_existing_slice_never_launch() -> None:
    pods, nodes = _busy_tpu_slice("tpu-a")
    result = plan_of(
        cluster(tpu_group(replicas=1)),
        pods,
        state([head_node(), *nodes], gangs=[pinned_slice_bundles("tpu-a")]),
    )
    assert targets(result) == {"tpu": 1}
    assert result.infeasible == ()
    assert any(p.kind is ProblemKind.WAITS_ON_EXISTING_NODE for p in result.problems)


def test_pinned_tasks_never_launch_either() -> None:
    pods, nodes = _busy_tpu_slice("tpu-a")
    pinned = selector_bundle(TPU4, {"ray.io/tpu-slice-name": "tpu-a"})
    demand = [TaskDemand(bundle=pinned, count=4)]
    result = plan_of(cluster(tpu_group(replicas=1)), pods, state([head_node(), *nodes], demand))
    assert targets(result) == {"tpu": 1}


@pytest.mark.parametrize(
    ("strategy", "bundles", "expected"),
    [
        (GangStrategy.STRICT_SPREAD, [TPU4] * 4, 1),  # one bundle per host of one slice
        (GangStrategy.STRICT_SPREAD, [TPU4] * 8, 2),
        (GangStrategy.PACK, [TPU4] * 6, 2),
        (GangStrategy.SPREAD, [TPU4] * 3, 1),
        (GangStrategy.STRICT_PACK, [{"TPU": 2}, {"TPU": 2}], 1),
    ],
)
def test_tpu_placement_groups(
    strategy: GangStrategy, bundles: list[dict[str, float]], expected: int
) -> None:
    demand = gang(strategy, *(bundle(b) for b in bundles))
    result = plan_of(cluster(tpu_group()), ray=state([head_node()], gangs=[demand]))
    assert targets(result) == {"tpu": expected}


@pytest.mark.parametrize(
    ("strategy", "bundles", "expected"),
    [
        (GangStrategy.STRICT_SPREAD, [{"CPU": 1}] * 3, 3),  # distinct hosts
        (GangStrategy.STRICT_PACK, [{"CPU": 2}] * 4, 1),  # one host of 8 CPU
        (GangStrategy.PACK, [{"CPU": 4}] * 3, 2),
        (GangStrategy.SPREAD, [{"CPU": 1}] * 3, 1),  # best effort: packing is allowed
    ],
)
def test_cpu_placement_groups(
    strategy: GangStrategy, bundles: list[dict[str, float]], expected: int
) -> None:
    demand = gang(strategy, *(bundle(b) for b in bundles))
    result = plan_of(cluster(group("cpu")), ray=state([head_node()], gangs=[demand]))
    assert targets(result) == {"cpu": expected}


def test_strict_pack_bigger_than_any_host_is_infeasible() -> None:
    demand = gang(GangStrategy.STRICT_PACK, *([bundle({"CPU": 2})] * 5))  # 10 CPU > 8
    result = plan_of(cluster(group("cpu")), ray=state([head_node()], gangs=[demand]))
    assert targets(result) == {"cpu": 0}
    assert len(result.infeasible) == 1
    assert result.infeasible[0].demand.strategy == "STRICT_PACK"


def test_placement_group_is_all_or_nothing_at_max_replicas() -> None:
    demand = gang(GangStrategy.STRICT_SPREAD, *([bundle({"CPU": 1})] * 3))
    result = plan_of(
        cluster(group("cpu", max_replicas=2)), ray=state([head_node()], gangs=[demand])
    )
    decision = result.group("cpu")
    assert decision is not None
    assert decision.target == 0  # two hosts would not place it: launch nothing
    waiting = [r for r in decision.reasons if isinstance(r, Waiting)]
    assert [(r.demand.strategy, r.kind, r.blocked.limit) for r in waiting] == [
        ("STRICT_SPREAD", HoldKind.AT_MAX_REPLICAS, 2)
    ]


def test_strict_pack_with_different_selectors_needs_a_host_matching_all() -> None:
    first = selector_bundle({"CPU": 1}, {"zone": "a"})
    second = selector_bundle({"CPU": 1}, {"team": "ml"})
    demand = gang(GangStrategy.STRICT_PACK, first, second)
    rc = cluster(
        group("zone-a", labels={"zone": "a"}),
        group("both", labels={"zone": "a", "team": "ml"}),
    )
    result = plan_of(rc, ray=state([head_node()], gangs=[demand]))
    assert targets(result) == {"zone-a": 0, "both": 1}


def test_request_resources_is_a_floor_for_the_whole_cluster() -> None:
    pods = [pod("cpu-a", "cpu")]
    nodes = [head_node(), *cpu_nodes(["cpu-a"], free_cpu=0)]  # busy: the floor counts totals
    result = plan_of(
        cluster(group("cpu", replicas=1)), pods, state(nodes, constraint=[tasks({"CPU": 1}, 20)])
    )
    assert targets(result) == {"cpu": 3}  # 24 CPU ≥ 20


def test_request_resources_already_met_launches_nothing() -> None:
    pods = [pod("cpu-a", "cpu"), pod("cpu-b", "cpu")]
    nodes = [head_node(), *cpu_nodes(["cpu-a", "cpu-b"], idle_s=1)]
    result = plan_of(
        cluster(group("cpu", replicas=2)), pods, state(nodes, constraint=[tasks({"CPU": 4}, 4)])
    )
    assert targets(result) == {"cpu": 2}


def test_slices_added_for_the_floor_also_serve_pending_tasks() -> None:
    demand = state([head_node()], tasks=[tasks({"CPU": 8}, 2)], constraint=[tasks({"CPU": 8}, 2)])
    result = plan_of(cluster(group("cpu")), ray=demand)
    assert targets(result) == {"cpu": 2}


def test_label_selector_picks_the_group_with_matching_labels() -> None:
    rc = cluster(group("zone-a", labels={"zone": "a"}), group("zone-b", labels={"zone": "b"}))
    demand = [TaskDemand(bundle=bundle({"CPU": 1}, zone="b"), count=1)]
    result = plan_of(rc, ray=state([head_node()], demand))
    assert targets(result) == {"zone-a": 0, "zone-b": 1}


def test_node_group_label_selector_targets_that_group() -> None:
    rc = cluster(group("small", cpu="4"), group("big", cpu="16"))
    demand = [TaskDemand(bundle=selector_bundle({"CPU": 1}, {"ray.io/node-group": "big"}), count=1)]
    result = plan_of(rc, ray=state([head_node()], demand))
    assert targets(result) == {"small": 0, "big": 1}


def test_max_replicas_caps_the_target_and_says_why() -> None:
    result = plan_of(
        cluster(group("cpu", max_replicas=3)), ray=state([head_node()], [tasks({"CPU": 8}, 10)])
    )
    decision = result.group("cpu")
    assert decision is not None
    assert decision.target == 3
    waiting = [r for r in decision.reasons if isinstance(r, Waiting)]
    assert [(r.kind, r.blocked.limit) for r in waiting] == [(HoldKind.AT_MAX_REPLICAS, 3)]
    assert result.infeasible == ()


def test_min_replicas_counts_as_capacity() -> None:
    result = plan_of(
        cluster(group("cpu", replicas=0, min_replicas=2)),
        ray=state([head_node()], [tasks({"CPU": 8}, 2)]),
    )
    # KubeRay already runs max(replicas, min) = 2, enough for the demand: the plan writes what
    # runs (RunsMinReplicas, tests/unit/core/planner/test_planner_below_min.py), adds nothing.
    assert targets(result) == {"cpu": 2}


def test_min_replicas_target_counts_from_the_clamped_value() -> None:
    result = plan_of(
        cluster(group("cpu", replicas=0, min_replicas=2)),
        ray=state([head_node()], [tasks({"CPU": 8}, 3)]),
    )
    assert targets(result) == {"cpu": 3}


def test_suspended_group_is_not_scaled_up() -> None:
    result = plan_of(
        cluster(group("cpu", suspend=True)), ray=state([head_node()], [tasks({"CPU": 1}, 1)])
    )
    decision = result.group("cpu")
    assert decision is not None
    assert decision.target == 0
    waiting = [r for r in decision.reasons if isinstance(r, Waiting)]
    assert [r.kind for r in waiting] == [HoldKind.GROUP_SUSPENDED]


def test_suspended_cluster_is_held() -> None:
    result = plan_of(
        cluster(group("cpu"), suspend=True), ray=state([head_node()], [tasks({"CPU": 1}, 1)])
    )
    assert result.held is not None and result.held.kind is HoldKind.CLUSTER_SUSPENDED
    assert not result.changes


def test_higher_priority_group_wins() -> None:
    rc = cluster(group("low", priority=1), group("high", priority=5))
    result = plan_of(rc, ray=state([head_node()], [tasks({"CPU": 1}, 1)]))
    assert targets(result) == {"low": 0, "high": 1}


def test_smaller_slice_wins_at_equal_priority() -> None:
    rc = cluster(group("big", cpu="64"), group("small", cpu="4"))
    result = plan_of(rc, ray=state([head_node()], [tasks({"CPU": 1}, 1)]))
    assert targets(result) == {"big": 0, "small": 1}


def test_full_group_overflows_into_the_next_plain_group() -> None:
    rc = cluster(group("small", cpu="4", max_replicas=1), group("big", cpu="64"))
    result = plan_of(rc, ray=state([head_node()], [tasks({"CPU": 4}, 2)]))
    assert targets(result) == {"small": 1, "big": 1}


@pytest.mark.parametrize(
    ("mode", "expected"),
    [("Default", 10), ("Aggressive", 10), ("Conservative", 1)],
)
def test_upscaling_mode_limits_one_step(mode: str, expected: int) -> None:
    rc = cluster(group("cpu", max_replicas=20), autoscalerOptions={"upscalingMode": mode})
    result = plan_of(rc, ray=state([head_node()], [tasks({"CPU": 8}, 10)]))
    assert targets(result) == {"cpu": expected}


def test_conservative_allows_as_many_launching_slices_as_the_cluster_has_nodes() -> None:
    pods = [pod(f"cpu-{i}", "cpu") for i in range(4)]
    nodes = [head_node(), *cpu_nodes([f"cpu-{i}" for i in range(4)], free_cpu=0)]
    rc = cluster(
        group("cpu", replicas=4, max_replicas=20),
        autoscalerOptions={"upscalingMode": "Conservative"},
    )
    result = plan_of(rc, pods, state(nodes, [tasks({"CPU": 8}, 10)]))
    assert targets(result) == {"cpu": 9}  # 5 alive nodes: at most 5 replicas launching


def test_conservative_waits_while_slices_are_launching() -> None:
    rc = cluster(tpu_group(replicas=1), autoscalerOptions={"upscalingMode": "Conservative"})
    pods = slice_pods("tpu", "tpu-a", 4, phase="Pending", age_s=30)
    result = plan_of(rc, pods, state([head_node()], [tasks(TPU4, 12)]))
    decision = result.group("tpu")
    assert decision is not None
    assert decision.target == 1
    waiting = [r for r in decision.reasons if isinstance(r, Waiting)]
    assert [r.kind for r in waiting] == [HoldKind.CONSERVATIVE_UPSCALING]


def test_cpu_demand_never_launches_a_tpu_slice_when_a_cpu_group_can_serve_it() -> None:
    rc = cluster(tpu_group(priority=10), group("cpu"))
    result = plan_of(rc, ray=state([head_node()], [tasks({"CPU": 1}, 20)]))
    assert targets(result) == {"tpu": 0, "cpu": 3}


def test_cpu_demand_waits_for_a_cpu_group_at_max_rather_than_spend_a_tpu_slice() -> None:
    rc = cluster(tpu_group(), group("cpu", max_replicas=1))
    result = plan_of(rc, ray=state([head_node()], [tasks({"CPU": 8}, 3)]))
    assert targets(result) == {"tpu": 0, "cpu": 1}
    assert result.infeasible == ()


def test_cpu_demand_uses_a_tpu_group_when_no_plain_group_fits() -> None:
    rc = cluster(tpu_group(), group("cpu", cpu="4"))
    result = plan_of(rc, ray=state([head_node()], [tasks({"CPU": 16}, 1)]))
    assert targets(result) == {"tpu": 1, "cpu": 0}


def test_demand_for_a_group_awaiting_its_write_is_not_sent_elsewhere() -> None:
    rc = cluster(group("small", cpu="8"), group("big", cpu="16"))
    memory = Memory(awaiting_write={"small": "replicas 0 → 1 not yet observed"})
    result = plan_of(rc, ray=state([head_node()], [tasks({"CPU": 8}, 1)]), memory=memory)
    assert targets(result) == {"small": 0, "big": 0}
    decision = result.group("small")
    assert decision is not None
    assert decision.held == Hold(
        HoldKind.AWAITING_WRITE, "small", detail="replicas 0 → 1 not yet observed"
    )


def test_mixed_cluster_sends_each_demand_to_its_own_group() -> None:
    rc = cluster(group("cpu"), tpu_group())
    demand = [tasks({"CPU": 2}, 8), tasks(TPU4, 8)]
    result = plan_of(rc, ray=state([head_node()], demand))
    assert targets(result) == {"cpu": 2, "tpu": 2}


def test_mixed_cluster_v4_and_v6e() -> None:
    rc = cluster(
        tpu_group("v6e"),
        tpu_group("v4", accelerator="tpu-v4-podslice", topology="2x2x2", hosts=2),
        group("cpu"),
    )
    demand = state([head_node()], gangs=[slice_reservation("v4-16"), slice_reservation("v6e-16")])
    result = plan_of(rc, ray=demand)
    assert targets(result) == {"v6e": 1, "v4": 1, "cpu": 0}


def test_gpu_demand_without_a_gpu_group_is_infeasible_with_a_reason() -> None:
    result = plan_of(cluster(group("cpu")), ray=state([head_node()], [tasks({"GPU": 1}, 2)]))
    assert targets(result) == {"cpu": 0}
    assert len(result.infeasible) == 1
    item = result.infeasible[0]
    assert item.count == 2
    assert item.demand == Demand(DemandKind.TASK, "{GPU: 1}")
    assert item.kind is InfeasibleKind.NO_GROUP_OFFERS


def test_demand_served_by_the_head_only_is_not_infeasible() -> None:
    result = plan_of(
        cluster(group("cpu", cpu="4")),
        ray=state([head_node(cpu=16)], [tasks({"CPU": 16}, 1)]),
    )
    assert targets(result) == {"cpu": 0}
    assert result.infeasible == ()


def test_backing_off_group_is_not_scaled_up() -> None:
    memory = Memory(backoff={"cpu": ReplaceBackoff(NOW_S + 300, 1, 1)})
    result = plan_of(
        cluster(group("cpu")), ray=state([head_node()], [tasks({"CPU": 1}, 1)]), memory=memory
    )
    decision = result.group("cpu")
    assert decision is not None
    assert decision.target == 0
    waiting = [r for r in decision.reasons if isinstance(r, Waiting)]
    assert [(r.kind, r.blocked.failures) for r in waiting] == [(HoldKind.BACKING_OFF, 1)]


def test_gang_spanning_a_cpu_and_a_tpu_group_launches_both() -> None:
    # A trainer bundle too big for a TPU host (24 CPU) plus one bundle per TPU host.
    demand = gang(GangStrategy.PACK, bundle({"CPU": 32}), *([bundle(TPU4)] * 4))
    rc = cluster(group("cpu", cpu="32"), tpu_group())
    result = plan_of(rc, ray=state([head_node()], gangs=[demand]))
    assert targets(result) == {"cpu": 1, "tpu": 1}
    assert result.infeasible == ()


def test_gang_packs_its_cpu_bundle_onto_the_tpu_slice_it_launches() -> None:
    # Ray packs a PACK group onto as few hosts as it can: the trainer bundle will land on a
    # TPU host of the new slice, so a CPU host for it would only sit idle.
    demand = gang(GangStrategy.PACK, bundle({"CPU": 8}), *([bundle(TPU4)] * 4))
    result = plan_of(cluster(group("cpu"), tpu_group()), ray=state([head_node()], gangs=[demand]))
    assert targets(result) == {"cpu": 0, "tpu": 1}


def test_gang_with_an_unservable_bundle_is_infeasible_and_launches_nothing() -> None:
    demand = gang(GangStrategy.PACK, bundle({"GPU": 1}), *([bundle(TPU4)] * 4))
    result = plan_of(cluster(group("cpu"), tpu_group()), ray=state([head_node()], gangs=[demand]))
    assert targets(result) == {"cpu": 0, "tpu": 0}
    (item,) = result.infeasible
    assert item.kind is InfeasibleKind.NO_GROUP_OFFERS_BUNDLE
    assert item.missing == "{GPU: 1}"


def test_waiting_gang_keeps_the_idle_host_it_will_need() -> None:
    # The gang's TPU part waits for the TPU group (its write is in flight); its CPU part fits
    # the idle CPU host, which must not be scaled down meanwhile.
    pods = [pod("cpu-a", "cpu")]
    nodes = [head_node(), *cpu_nodes(["cpu-a"], idle_s=900)]
    demand = gang(GangStrategy.PACK, bundle({"CPU": 8}), *([bundle(TPU4)] * 4))
    memory = Memory(awaiting_write={"tpu": "replicas 0 → 1 not yet observed"})
    rc = cluster(group("cpu", replicas=1), tpu_group())
    result = plan_of(rc, pods, state(nodes, gangs=[demand]), memory=memory)
    assert targets(result) == {"cpu": 1, "tpu": 0}
    assert result.group("cpu").deletions == ()  # type: ignore[union-attr]
