"""Replicas below minReplicas (issue 22 item 3): KubeRay runs minReplicas when `replicas` is
lower, so the plan starts from what runs, writes it, and says so (RunsMinReplicas)."""

from __future__ import annotations

from kuberay_scaler.core.model.reasons import RunsMinReplicas, ScaleDown
from tests.factories import (
    cluster,
    cpu_nodes,
    group,
    head_node,
    plan_of,
    pod,
    state,
    targets,
    tasks,
)


def _cpu_pods(n: int) -> list[dict[str, object]]:
    return [pod(f"cpu-{i}", "cpu") for i in range(n)]


def test_no_demand_target_is_what_kuberay_runs_and_says_why() -> None:
    pods = _cpu_pods(2)
    result = plan_of(
        cluster(group("cpu", replicas=1, min_replicas=2)),
        pods,
        ray=state([head_node(), *cpu_nodes([p["metadata"]["name"] for p in pods])], []),
    )
    decision = result.group("cpu")
    assert decision is not None
    assert (decision.current, decision.target) == (1, 2)
    assert RunsMinReplicas(replicas=1, min_replicas=2) in decision.reasons
    assert not decision.deletions


def test_scale_up_counts_from_min_replicas() -> None:
    pods = _cpu_pods(2)
    busy = cpu_nodes([p["metadata"]["name"] for p in pods], free_cpu=0)
    result = plan_of(
        cluster(group("cpu", replicas=1, min_replicas=2, max_replicas=3)),
        pods,
        ray=state([head_node(), *busy], [tasks({"CPU": 8}, 1)]),
    )
    decision = result.group("cpu")
    assert decision is not None
    assert decision.target == 3
    assert any(isinstance(r, RunsMinReplicas) for r in decision.reasons)


def test_idle_slices_at_min_are_kept_with_target_min() -> None:
    pods = _cpu_pods(2)
    idle = cpu_nodes([p["metadata"]["name"] for p in pods], idle_s=3600)
    result = plan_of(
        cluster(group("cpu", replicas=0, min_replicas=2)), pods, ray=state([head_node(), *idle], [])
    )
    decision = result.group("cpu")
    assert decision is not None
    assert decision.target == 2
    assert not decision.deletions
    assert not [r for r in decision.reasons if isinstance(r, ScaleDown)]


def test_suspended_group_below_min_is_left_alone() -> None:
    result = plan_of(
        cluster(group("cpu", replicas=0, min_replicas=2, suspend=True)),
        ray=state([head_node()], []),
    )
    assert targets(result) == {"cpu": 0}
    decision = result.group("cpu")
    assert decision is not None
    assert not any(isinstance(r, RunsMinReplicas) for r in decision.reasons)


def test_at_or_above_min_says_nothing_about_it() -> None:
    pods = _cpu_pods(2)
    result = plan_of(
        cluster(group("cpu", replicas=2, min_replicas=2)),
        pods,
        ray=state([head_node(), *cpu_nodes([p["metadata"]["name"] for p in pods])], []),
    )
    decision = result.group("cpu")
    assert decision is not None
    assert decision.target == 2
    assert not any(isinstance(r, RunsMinReplicas) for r in decision.reasons)
