"""Planning cost is bounded by distinct shapes and groups, not by task count or replicas × hosts,
and a group whose planning fails is skipped with a named problem while the others are planned
(failure catalogue row 21)."""

from __future__ import annotations

import pytest

from kuberay_scaler.model.cluster import MAX_GROUP_HOSTS
from kuberay_scaler.model.reasons import HoldKind, ProblemKind
from kuberay_scaler.planner import core
from tests.factories import cluster, group, head_node, plan_of, state, tasks


def test_a_million_pending_tasks_with_max_replicas_unset_asks_for_at_most_the_bound() -> None:
    raw = group("open", cpu="1")
    del raw["maxReplicas"]
    ray = state([head_node()], tasks=[tasks({"CPU": 1}, 1_000_000)])
    result = plan_of(cluster(raw), ray=ray)
    decision = result.group("open")
    assert decision is not None
    assert decision.target == MAX_GROUP_HOSTS  # never 10^6 replicas
    assert any("hosts per group" in str(r) for r in decision.reasons), decision.reasons


def test_at_the_bound_a_group_is_held_with_a_named_reason() -> None:
    raw = group("open", cpu="1", replicas=MAX_GROUP_HOSTS)
    del raw["maxReplicas"]
    ray = state([head_node()], tasks=[tasks({"CPU": 1}, 1_000_000)])
    decision = plan_of(cluster(raw), ray=ray).group("open")
    assert decision is not None and decision.target == MAX_GROUP_HOSTS
    holds = [getattr(r, "blocked", None) for r in decision.reasons]
    assert any(h is not None and h.kind is HoldKind.AT_HOST_BOUND for h in holds), decision.reasons


def test_multi_host_groups_are_bounded_in_hosts_not_replicas() -> None:
    raw = group("wide", cpu="1", hosts=100)
    del raw["maxReplicas"]
    ray = state([head_node()], tasks=[tasks({"CPU": 1}, 1_000_000)])
    decision = plan_of(cluster(raw), ray=ray).group("wide")
    assert decision is not None and decision.target * 100 <= MAX_GROUP_HOSTS


def test_a_group_whose_planning_raises_is_skipped_and_the_others_are_planned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = core.slice_shape

    def fragile(g: object) -> object:
        if getattr(g, "name", "") == "cursed":
            raise ZeroDivisionError("a bug that only this group's numbers reach")
        return real(g)  # type: ignore[arg-type]

    monkeypatch.setattr(core, "slice_shape", fragile)
    rc = cluster(group("good", max_replicas=5), group("cursed", max_replicas=5))
    ray = state([head_node()], tasks=[tasks({"CPU": 8}, 2)])

    result = plan_of(rc, ray=ray)

    good = result.group("good")
    assert good is not None and good.target == 2
    cursed = result.group("cursed")
    assert cursed is not None and cursed.target == cursed.current  # held, not scaled
    problems = [p for p in result.problems if p.group == "cursed"]
    assert problems and problems[0].kind is ProblemKind.PLAN_FAILED
    assert "ZeroDivisionError" in problems[0].message
