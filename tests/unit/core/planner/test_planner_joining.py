"""A slice coming up counts at full size for the demand it was launched for, and a host that
joined just now may hold the demand its own work may still be reported as (a second
slice was asked for while the first one's hosts were joining Ray). Pure planner frames."""

from __future__ import annotations

from datetime import timedelta

import pytest

from kuberay_scaler.core.defaults import JOIN_SETTLE_S
from kuberay_scaler.core.model.ray import GangStrategy, RayNode
from kuberay_scaler.core.model.reasons import Hold, HoldKind
from kuberay_scaler.core.model.slices import SliceState
from kuberay_scaler.core.planner.deadlines import Deadlines
from kuberay_scaler.core.planner.policy import Policy
from tests.factories import (
    NOW,
    bundle,
    cluster,
    cpu_nodes,
    deleted_pods,
    gang,
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

TPU_ACTOR = {"CPU": 1, "TPU": 4}


def _hosts(replica: str, joined: tuple[int, ...], busy: tuple[int, ...]) -> list[RayNode]:
    nodes = tpu_slice_nodes(replica, 4, busy_hosts=busy)
    return [n for n in nodes if int(n.instance_id.rsplit("-", 1)[1]) in joined]


def test_a_partly_joined_slice_serves_the_demand_its_joined_hosts_already_took() -> None:
    """2 of 4 hosts in Ray, each running its actor, while the GCS still reports 3 actors
    pending (one of them the actor that just moved onto host 1): no second slice."""
    pods = slice_pods("tpu", "tpu-a", 4, age_s=20)
    ray = state([head_node(), *_hosts("tpu-a", (1, 3), busy=(1, 3))], [tasks(TPU_ACTOR, 3)])
    result = plan_of(cluster(tpu_group(replicas=1, max_replicas=4)), pods, ray)
    assert result.slice_map is not None
    (coming,) = result.slice_map.groups["tpu"].slices
    assert coming.state is SliceState.PENDING
    assert targets(result) == {"tpu": 1}


def test_pods_without_any_ray_node_yet_serve_a_whole_slice_of_demand() -> None:
    pods = slice_pods("tpu", "tpu-a", 4, age_s=20)
    result = plan_of(
        cluster(tpu_group(replicas=1, max_replicas=4)),
        pods,
        state([head_node()], [tasks(TPU_ACTOR, 4)]),
    )
    assert targets(result) == {"tpu": 1}


def test_demand_beyond_a_partly_joined_slice_still_gets_a_slice() -> None:
    """Full size, never more: 5 actors pending beside a coming slice of 4 hosts need one more."""
    pods = slice_pods("tpu", "tpu-a", 4, age_s=20)
    ray = state([head_node(), *_hosts("tpu-a", (0,), busy=())], [tasks(TPU_ACTOR, 5)])
    result = plan_of(cluster(tpu_group(replicas=1, max_replicas=4)), pods, ray)
    assert targets(result) == {"tpu": 2}


def test_the_last_host_taken_while_its_actor_is_still_reported_pending() -> None:
    """The same report lag at the last join: the slice is whole, so Ray's view of each host
    counts, and one actor looks unserved. Its hosts' Ray containers started 15 s ago (within
    JOIN_SETTLE_S), so what they use may still be reported pending: no second slice, and the
    reasons say why."""
    rc = cluster(tpu_group(replicas=1, max_replicas=4))
    pods = slice_pods("tpu", "tpu-a", 4, age_s=20)
    all_taken = state(
        [head_node(), *_hosts("tpu-a", (0, 1, 2, 3), busy=(0, 1, 2, 3))], [tasks(TPU_ACTOR, 1)]
    )
    result = plan_of(rc, pods, all_taken)
    assert targets(result) == {"tpu": 1}
    decision = result.group("tpu")
    assert decision is not None
    (held,) = [r for r in decision.reasons if isinstance(r, Hold)]
    assert held.kind is HoldKind.JOIN_SETTLING and held.count == 1  # one host held the actor
    assert result.settle_s == pytest.approx(JOIN_SETTLE_S - 15)
    assert result.next_idle_expiry_s == pytest.approx(JOIN_SETTLE_S - 15)  # the loop replans


def test_the_same_reply_after_the_settle_time_is_real_demand() -> None:
    """The hold is bounded: once the hosts' containers started JOIN_SETTLE_S ago, the same
    reply is demand the slice cannot hold, and a second slice is asked for."""
    rc = cluster(tpu_group(replicas=1, max_replicas=4))
    pods = slice_pods("tpu", "tpu-a", 4, age_s=20)
    all_taken = state(
        [head_node(), *_hosts("tpu-a", (0, 1, 2, 3), busy=(0, 1, 2, 3))], [tasks(TPU_ACTOR, 1)]
    )
    later = NOW + timedelta(seconds=JOIN_SETTLE_S - 15 + 0.5)
    result = plan_of(rc, pods, all_taken, now=later)
    assert targets(result) == {"tpu": 2}
    assert result.settle_s is None


def test_demand_for_two_more_slices_beside_a_slice_just_up_gets_a_slice_at_once() -> None:
    """No under-provisioning beyond the bound: 4 actors run on a slice just up and 5 more are
    pending. At most one copy per host of the slice just up can be its own work still
    reported pending, so at least one more slice is asked for now; once the settle time is
    over, the two the demand needs."""
    rc = cluster(tpu_group(replicas=1, max_replicas=4))
    pods = slice_pods("tpu", "tpu-a", 4, age_s=20)
    busy = state(
        [head_node(), *_hosts("tpu-a", (0, 1, 2, 3), busy=(0, 1, 2, 3))], [tasks(TPU_ACTOR, 5)]
    )
    assert targets(plan_of(rc, pods, busy)) == {"tpu": 2}
    later = NOW + timedelta(seconds=JOIN_SETTLE_S)
    assert targets(plan_of(rc, pods, busy, now=later)) == {"tpu": 3}


def test_a_slice_up_for_long_holds_nothing() -> None:
    """Hosts that started long ago are Ray's view as it is (the default pods run for 595 s)."""
    rc = cluster(tpu_group(replicas=1, max_replicas=4))
    pods = slice_pods("tpu", "tpu-a", 4)
    all_taken = state(
        [head_node(), *_hosts("tpu-a", (0, 1, 2, 3), busy=(0, 1, 2, 3))], [tasks(TPU_ACTOR, 1)]
    )
    assert targets(plan_of(rc, pods, all_taken)) == {"tpu": 2}


def test_the_settle_changes_no_deletion() -> None:
    """Slice A idle far past its timeout, slice B just up and busy, demand that fits A, then
    demand that fits nowhere: what is deleted (and which slices demand needs) is the same with
    the settle on and off; only whether a slice is added differs."""
    rc = cluster(tpu_group(replicas=2, max_replicas=4))
    pods = slice_pods("tpu", "tpu-a", 4) + slice_pods("tpu", "tpu-b", 4, age_s=20)
    idle_a = tpu_slice_nodes("tpu-a", 4, idle_s=10_000)
    busy_b = tpu_slice_nodes("tpu-b", 4, busy_hosts=(0, 1, 2, 3))
    for pending in (0, 1, 4, 5, 9):
        ray = state([head_node(), *idle_a, *busy_b], [tasks(TPU_ACTOR, pending)] if pending else [])
        on = plan_of(rc, pods, ray)
        off = plan_of(rc, pods, ray, policy=Policy(deadlines=Deadlines(join_settle_s=0)))
        assert deleted_pods(on, "tpu") == deleted_pods(off, "tpu"), pending
        assert targets(on)["tpu"] <= targets(off)["tpu"], pending


def test_a_single_host_worker_just_up_holds_the_task_it_took() -> None:
    """A single-host worker is whole the moment it joins: its task shows on it while still
    reported pending. Within the settle time no second worker; demand beyond it does get one."""
    rc = cluster(group("cpu", replicas=1, max_replicas=10))
    pods = [pod("cpu-0", "cpu", age_s=12)]
    lagging = state([head_node(), *cpu_nodes(["cpu-0"], free_cpu=0)], [tasks({"CPU": 8}, 1)])
    assert targets(plan_of(rc, pods, lagging)) == {"cpu": 1}
    more = state([head_node(), *cpu_nodes(["cpu-0"], free_cpu=0)], [tasks({"CPU": 8}, 3)])
    assert targets(plan_of(rc, pods, more)) == {"cpu": 3}


def test_a_strict_spread_gang_never_counts_one_host_just_up_twice() -> None:
    """The used part of a worker just up is a bin of its own beside the host's free part; a
    STRICT_SPREAD placement group may take only one of the two: two bundles on one host are
    two hosts' demand, so a second worker is asked for."""
    rc = cluster(group("cpu", replicas=1, max_replicas=10))
    pods = [pod("cpu-0", "cpu", age_s=12)]
    half = cpu_nodes(["cpu-0"], free_cpu=4)
    spread = gang(GangStrategy.STRICT_SPREAD, bundle({"CPU": 4}), bundle({"CPU": 4}))
    result = plan_of(rc, pods, state([head_node(), *half], gangs=[spread]))
    assert targets(result) == {"cpu": 2}
    packed = gang(GangStrategy.PACK, bundle({"CPU": 4}), bundle({"CPU": 4}))
    held = plan_of(rc, pods, state([head_node(), *half], gangs=[packed]))
    assert targets(held) == {"cpu": 1}  # PACK may share the host: its used part may be it
