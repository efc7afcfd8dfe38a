"""A group with no pods says why it asks for nothing: none asked for and no demand, or slices
asked for (replicas) whose pods KubeRay has not created yet, which pending demand counts on."""

from __future__ import annotations

from kuberay_scaler.adapters.ray_gcs.state import parse_ray_state
from kuberay_scaler.core.model.reasons import Unchanged, UnchangedKind
from tests.factories import FIXTURES, NOW_MS, plan_of, sample


def _unchanged(replicas: int) -> list[Unchanged]:
    rc = sample("ray-cluster.tpu-v6e-16-multihost.yaml")
    rc["spec"]["workerGroupSpecs"][0]["replicas"] = replicas
    text = (FIXTURES / "ray_state" / "pending_slice_reservation.json").read_text()
    result = plan_of(rc, [], parse_ray_state(text, read_at_ms=NOW_MS))
    decision = result.group("tpu-group")
    assert decision is not None
    return [r for r in decision.reasons if isinstance(r, Unchanged)]


def test_demand_waiting_on_a_slice_asked_for_says_so() -> None:
    (why,) = _unchanged(replicas=1)  # the same demand scales 0 -> 1 (test_planner_fixtures)
    assert why.kind is UnchangedKind.AWAITING_PODS and why.count == 1
    assert "no demand" not in str(why) and "no pods yet" in str(why)


def test_a_group_nothing_asks_for_says_so() -> None:
    rc = sample("ray-cluster.tpu-v6e-16-multihost.yaml")
    rc["spec"]["workerGroupSpecs"][0]["replicas"] = 0
    result = plan_of(
        rc,
        [],
        parse_ray_state(
            (FIXTURES / "ray_state" / "idle_tpu_slice.json").read_text(), read_at_ms=NOW_MS
        ),
    )
    decision = result.group("tpu-group")
    assert decision is not None
    (why,) = [r for r in decision.reasons if isinstance(r, Unchanged)]
    assert why.kind is UnchangedKind.NO_SLICES
    assert "none asked for" in str(why)
