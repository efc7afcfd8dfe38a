"""A slice coming up counts at full size for the demand it was launched for (issue 22: a second
slice was asked for while the first one's hosts were joining Ray). Pure planner frames."""

from __future__ import annotations

import pytest

from kuberay_scaler.core.model.ray import RayNode
from kuberay_scaler.core.model.slices import SliceState
from tests.factories import (
    cluster,
    head_node,
    plan_of,
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


@pytest.mark.xfail(strict=True, reason="known residual (issue 22): the last host's join")
def test_the_last_host_taken_while_its_actor_is_still_reported_pending() -> None:
    """The same report lag at the last join: the slice is whole, so Ray's view of each host
    counts, and one actor looks unserved. Holding that without memory the offline replan of
    a capture lacks is not done yet (a settle window kept in Memory made the daemon and
    `plan` on its capture disagree: tests/integration/test_capture.py)."""
    rc = cluster(tpu_group(replicas=1, max_replicas=4))
    pods = slice_pods("tpu", "tpu-a", 4, age_s=20)
    all_taken = state(
        [head_node(), *_hosts("tpu-a", (0, 1, 2, 3), busy=(0, 1, 2, 3))], [tasks(TPU_ACTOR, 1)]
    )
    assert targets(plan_of(rc, pods, all_taken)) == {"tpu": 1}
