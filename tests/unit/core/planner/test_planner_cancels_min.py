"""Cancels of an unavailable group's pending slices and of unneeded queued ones stop at
minReplicas together, not only each alone (found by test_targets_stay_within_min_and_max)."""

from __future__ import annotations

from kuberay_scaler.core.model.reasons import Keep, KeepKind
from kuberay_scaler.core.planner.deadlines import Deadlines
from kuberay_scaler.core.planner.policy import Policy
from tests.factories import (
    KUEUE_ELASTIC_GATE,
    cluster,
    group,
    head_node,
    plan_of,
    slice_pods,
    state,
    tpu_slice_nodes,
)


def test_pending_and_queued_cancels_together_keep_min_replicas() -> None:
    rc = cluster(
        group("g", replicas=3, min_replicas=2, max_replicas=5, tpu="4", topology="2x2", cpu="24")
    )
    pods = [
        *slice_pods("g", "g-s0", 1, age_s=5000, phase="Pending"),  # past the deadline
        *slice_pods("g", "g-s1", 1, age_s=600),
        *slice_pods("g", "g-s2", 1, age_s=30, gates=(KUEUE_ELASTIC_GATE,)),  # no demand for it
    ]
    nodes = [head_node(), *tpu_slice_nodes("g-s1", 1, pod_type="v6e-4", group_name="g")]
    result = plan_of(
        rc, pods, state(nodes), policy=Policy(deadlines=Deadlines(idle_timeout_override_s=0))
    )
    decision = result.group("g")
    assert decision is not None
    assert decision.target == 2, [str(r) for r in decision.reasons]
    assert [x.slice_key for x in decision.deletions] == ["g-s0-0"]
    assert any(isinstance(r, Keep) and r.kind is KeepKind.MIN_REPLICAS for r in decision.reasons)
