"""Gangs launched together (item 3): demand that says k slices of a type are wanted
together — Ray Train v2's request_resources bundle set, a placement group whose bundles span k
slices — is launched as k slices in one plan and one patch, not one per round trip. (It already
was: these tests pin it.)"""

from __future__ import annotations

import jsonpatch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kuberay_scaler.core.decision import Observation, Patch, decide
from kuberay_scaler.core.model.plan import Memory
from kuberay_scaler.core.model.ray import GangStrategy, RayObservation, TaskDemand
from kuberay_scaler.core.model.reasons import ScaleUp
from kuberay_scaler.core.patch.ops import ops_json
from kuberay_scaler.core.planner.policy import Policy
from tests.factories import (
    NOW,
    cluster,
    gang,
    head_node,
    plan_of,
    selector_bundle,
    state,
    targets,
    tpu_group,
)

# One Ray Train worker per v6e-16 host (4 chips), selecting the pod type as Train's
# ScalingConfig(label_selector=...) does.
WORKER = selector_bundle({"CPU": 1, "TPU": 4}, {"ray.io/tpu-pod-type": "v6e-16"})


def _train_request(workers: int) -> list[TaskDemand]:
    return [TaskDemand(WORKER, workers)]


def test_request_resources_for_four_slices_launches_four_in_one_patch() -> None:
    rc = cluster(tpu_group(max_replicas=8))
    ray = state([head_node()], constraint=_train_request(16))
    decision = decide(Observation.parse(rc, [], RayObservation(ray, 0.0)), Memory(), Policy(), NOW)
    [patch] = decision.writes
    assert isinstance(patch, Patch)
    after = jsonpatch.apply_patch(rc, ops_json(patch.ops), in_place=False)
    assert after["spec"]["workerGroupSpecs"][0]["replicas"] == 4
    [up] = [r for r in decision.plan.group("tpu").reasons if isinstance(r, ScaleUp)]  # type: ignore[union-attr]
    assert up.count == 16


@pytest.mark.parametrize(
    "strategy", [GangStrategy.PACK, GangStrategy.SPREAD, GangStrategy.STRICT_SPREAD]
)
def test_a_placement_group_spanning_four_slices_launches_four_at_once(
    strategy: GangStrategy,
) -> None:
    pg = gang(strategy, *([WORKER] * 16))
    result = plan_of(cluster(tpu_group(max_replicas=8)), ray=state([head_node()], gangs=[pg]))
    assert targets(result) == {"tpu": 4}


def test_a_gang_that_does_not_fit_the_room_launches_nothing() -> None:
    """All or nothing: 4 slices wanted, room for 3: no partial gang holding idle chips."""
    pg = gang(GangStrategy.STRICT_SPREAD, *([WORKER] * 16))
    result = plan_of(cluster(tpu_group(max_replicas=3)), ray=state([head_node()], gangs=[pg]))
    assert targets(result) == {"tpu": 0}


@settings(max_examples=40)
@given(
    k=st.integers(min_value=1, max_value=6),
    strategy=st.sampled_from([GangStrategy.STRICT_SPREAD, GangStrategy.SPREAD, GangStrategy.PACK]),
    room=st.integers(min_value=0, max_value=8),
    as_request=st.booleans(),
)
def test_k_slices_wanted_together_are_launched_together_or_not_at_all(
    k: int, strategy: GangStrategy, room: int, as_request: bool
) -> None:
    """Invariant: a gang of 4k one-host bundles opens exactly k slices in one plan when the
    group may add k, and none when it may not (request_resources, a floor, takes what fits)."""
    rc = cluster(tpu_group(max_replicas=room))
    if as_request:
        ray = state([head_node()], constraint=_train_request(4 * k))
        expected = min(k, room)
    else:
        ray = state([head_node()], gangs=[gang(strategy, *([WORKER] * (4 * k)))])
        expected = k if k <= room else 0
    assert targets(plan_of(rc, ray=ray)) == {"tpu": expected}
