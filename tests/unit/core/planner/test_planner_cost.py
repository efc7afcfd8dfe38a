"""Planning cost is bounded by distinct shapes and groups, not by task count or replicas × hosts,
and a group whose planning fails is skipped with a named problem while the others are planned
(failure catalogue row 21)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from kuberay_scaler.core.model.cluster import MAX_GROUP_HOSTS
from kuberay_scaler.core.model.ray import Bundle, GangStrategy
from kuberay_scaler.core.model.reasons import HoldKind, ProblemKind, Waiting
from kuberay_scaler.core.planner import bins, pool, scale_up
from kuberay_scaler.core.planner import groups as planner_groups
from tests.factories import (
    bundle,
    cluster,
    gang,
    group,
    head_node,
    plan_of,
    state,
    targets,
    tasks,
)


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
    real = planner_groups.slice_shape

    def fragile(g: object) -> object:
        if getattr(g, "name", "") == "cursed":
            raise ZeroDivisionError("a bug that only this group's numbers reach")
        return real(g)  # type: ignore[arg-type]

    monkeypatch.setattr(planner_groups, "slice_shape", fragile)
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


class FitCounter:
    """Counts the planner's units of packing work: looks at whether a bundle fits a host, and
    resources taken from a host (a gang trial that is undone took them for nothing)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real_fit, real_take = bins.copies_that_fit, bins.take

        def fit(bundle: Bundle, free: Mapping[str, float], labels: Mapping[str, str]) -> int:
            self.calls += 1
            return real_fit(bundle, free, labels)

        def take(bin_: bins.Bin, bundle: Bundle, copies: int = 1) -> None:
            self.calls += 1
            real_take(bin_, bundle, copies)

        for module in (bins, pool, scale_up):
            monkeypatch.setattr(module, "copies_that_fit", fit)
            monkeypatch.setattr(module, "take", take)


def _open_groups(count: int, max_replicas: int | None = None) -> dict[str, Any]:
    raws = []
    for i in range(count):
        raw = group(f"g{i}", cpu="8")
        if max_replicas is None:
            del raw["maxReplicas"]
        else:
            raw["maxReplicas"] = max_replicas
        raws.append(raw)
    return cluster(*raws)


def _shape(i: int, cpu: float | None = None) -> dict[str, float]:
    # Distinct shapes: the memory differs; the CPU decides how full a host gets.
    return {"CPU": cpu if cpu is not None else 1 + i % 4, "memory": float(1 + i)}


def test_demand_split_into_many_entries_costs_what_one_entry_per_shape_costs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The GCS reports each shape once per raylet: 100 entries of a shape are one shape."""
    rc = _open_groups(3, max_replicas=200)
    split = [tasks(_shape(s), 10) for s in range(50) for _ in range(100)]
    merged = [tasks(_shape(s), 1000) for s in range(50)]
    counter = FitCounter(monkeypatch)
    by_entry = plan_of(rc, ray=state([head_node()], tasks=split))
    split_calls, counter.calls = counter.calls, 0
    by_shape = plan_of(rc, ray=state([head_node()], tasks=merged))
    assert targets(by_entry) == targets(by_shape)
    assert [d.reasons for d in by_entry.groups] == [d.reasons for d in by_shape.groups]
    assert split_calls == counter.calls, (split_calls, counter.calls)


@pytest.mark.parametrize("cpu", [None, 3.0], ids=["mixed", "half-full-hosts"])
def test_packing_work_is_bounded_by_groups_times_shapes_plus_hosts_never_by_tasks(
    monkeypatch: pytest.MonkeyPatch, cpu: float | None
) -> None:
    """10^6 tasks over 100 shapes and 10 groups: the fit checks stay within a few per group and
    shape plus a few per host the plan has, and do not grow when the tasks grow tenfold.

    With CPU 3 on 8-CPU hosts every host is left with 2 CPUs no later shape can use: a first fit
    that walks them costs shapes × hosts (1,000,000 checks here), not groups × shapes + hosts.
    """
    groups, shapes = 10, 100
    rc = _open_groups(groups, max_replicas=1000)
    counter = FitCounter(monkeypatch)
    calls = []
    for total in (10**6, 10**7):
        counter.calls = 0
        ray = state(
            [head_node()], tasks=[tasks(_shape(s, cpu), total // shapes) for s in range(shapes)]
        )
        result = plan_of(rc, ray=ray)
        hosts = sum(d.target for d in result.groups)
        assert hosts == groups * 1000  # demand exceeds every group's room
        calls.append(counter.calls)
        assert counter.calls <= 4 * groups * shapes + 2 * hosts, counter.calls
    assert calls[1] <= calls[0] * 1.1, calls


def test_identical_waiting_placement_groups_cost_one_trial(monkeypatch: pytest.MonkeyPatch) -> None:
    """10^4 equal gangs that find no room are each reported waiting, after one trial."""
    rc = cluster(group("g", cpu="8", max_replicas=100))
    spread = gang(GangStrategy.STRICT_SPREAD, bundle({"CPU": 2}), bundle({"CPU": 2}))
    counter = FitCounter(monkeypatch)
    calls = []
    for copies in (300, 10_000):  # 100 hosts of 8 CPUs hold 200 such gangs: the rest waits
        counter.calls = 0
        decision = plan_of(rc, ray=state([head_node()], gangs=[spread] * copies)).group("g")
        assert decision is not None and decision.target == 100
        waiting = [r for r in decision.reasons if isinstance(r, Waiting)]
        assert sum(r.count for r in waiting) == copies - 200, waiting
        calls.append(counter.calls)
    assert calls[1] <= 2 * calls[0] + 100, calls
