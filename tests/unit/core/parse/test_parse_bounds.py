"""CRD-valid but absurd numbers are refused at parse time: that group is skipped with a problem
naming the field, and every other group is still planned (failure catalogue row 21)."""

from __future__ import annotations

from typing import Any

import pytest

from kuberay_scaler.core.model.cluster import MAX_GROUP_HOSTS, MAX_HOSTS_PER_SLICE, MAX_RESOURCE
from kuberay_scaler.core.model.reasons import ProblemKind
from kuberay_scaler.core.parse.raycluster import parse_raycluster
from tests.factories import cluster, group, head_node, plan_of, state, tasks


def extreme(**fields: Any) -> dict[str, Any]:
    return group("bad", **{"max_replicas": 10, **fields})


def params(**values: str) -> dict[str, Any]:
    return {"rayStartParams": values}


EXTREMES = {
    "resources 1e400": (params(resources='{"CPU": 1e400}'), "rayStartParams resources"),
    "resources Infinity": (params(resources='"{\\"TPU\\": Infinity}"'), "rayStartParams"),
    "resources NaN": (params(resources='{"custom": NaN}'), "rayStartParams resources"),
    "resources negative": (params(resources='{"custom": -1}'), "rayStartParams resources"),
    "resources huge": (params(resources='{"custom": 1e300}'), "rayStartParams resources"),
    "num-cpus 1e400": (params(**{"num-cpus": "1e400"}), "num-cpus"),
    "num-cpus huge": (params(**{"num-cpus": "1e20"}), "num-cpus"),
    "memory NaN": (params(memory="NaN"), "memory"),
    "group resources huge": ({"resources": {"custom": "1e300"}}, "resources custom"),
    "container cpu huge": ({"cpu": "1e300"}, "container resource cpu"),
    "numOfHosts 10^6": ({"hosts": 1_000_000}, "numOfHosts"),
    "replicas 10^6": ({"replicas": 1_000_000, "max_replicas": 2_000_000}, "replicas"),
    "minReplicas 10^6": (
        {"min_replicas": 1_000_000, "max_replicas": 2_000_000},
        "minReplicas",
    ),
    "replicas x hosts": ({"replicas": 100, "hosts": 1000, "max_replicas": 200}, "hosts"),
}


@pytest.mark.parametrize("name", list(EXTREMES))
def test_an_absurd_number_skips_only_its_group_with_a_named_problem(name: str) -> None:
    fields, named = EXTREMES[name]
    spec = parse_raycluster(cluster(group("good", max_replicas=5), extreme(**fields)))

    assert [g.name for g in spec.groups] == ["good"]
    assert spec.skipped_groups == ("bad",)
    [problem] = spec.problems
    assert problem.group == "bad"
    assert named in problem.message, problem.message


@pytest.mark.parametrize("name", list(EXTREMES))
def test_the_good_group_next_to_an_absurd_one_still_scales(name: str) -> None:
    fields, _ = EXTREMES[name]
    rc = cluster(group("good", max_replicas=5), extreme(**fields))
    ray = state([head_node()], tasks=[tasks({"CPU": 8}, 2)])

    result = plan_of(rc, ray=ray)

    good = result.group("good")
    assert good is not None and good.target == 2
    assert any(p.kind is ProblemKind.SPEC and p.group == "bad" for p in result.problems)


def test_bounds_are_generous_for_real_clusters() -> None:
    # The largest TPU slices (v5p-17920: 2240 hosts) and many-host groups parse fine.
    big = group("big", hosts=2240, replicas=4, max_replicas=4, tpu="4", topology="16x16x35")
    many = group("many", replicas=MAX_GROUP_HOSTS, max_replicas=MAX_GROUP_HOSTS)
    roomy = group("roomy", **params(memory=str(2**49), resources='{"custom": 1e12}'))
    spec = parse_raycluster(cluster(big, many, roomy))
    assert spec.problems == ()
    assert {g.name for g in spec.groups} == {"big", "many", "roomy"}
    assert MAX_HOSTS_PER_SLICE >= 2240 and MAX_RESOURCE > 2**49


def test_max_replicas_unset_is_still_allowed() -> None:
    raw = group("open")
    del raw["maxReplicas"]
    spec = parse_raycluster(cluster(raw))
    assert spec.problems == () and spec.groups[0].max_replicas > MAX_GROUP_HOSTS
