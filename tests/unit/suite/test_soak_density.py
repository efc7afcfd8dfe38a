"""The soak judges real work: what each daemon write did, and what a run must have."""

from __future__ import annotations

from collections import Counter
from typing import Any

from tests.soak import (
    CPU_LANE_CPUS,
    DRAINING_ANNOTATION,
    LANE_GROUP,
    LANES,
    Density,
    soak_raycluster,
    write_kinds,
)


def _cluster(replicas: int, doomed: list[str] | None = None, draining: str = "") -> dict[str, Any]:
    group: dict[str, Any] = {"groupName": "tpu", "replicas": replicas, "numOfHosts": 2}
    if doomed is not None:
        group["scaleStrategy"] = {"workersToDelete": doomed}
    meta: dict[str, Any] = {"name": "soak"}
    if draining:
        meta["annotations"] = {DRAINING_ANNOTATION: draining}
    return {"metadata": meta, "spec": {"workerGroupSpecs": [group]}}


def test_each_kind_of_write_is_named() -> None:
    assert write_kinds(_cluster(0), _cluster(1)) == ["scale-up"]
    assert write_kinds(_cluster(1), _cluster(1, draining='{"tpu": ["s1"]}')) == ["draining record"]
    assert write_kinds(_cluster(1), _cluster(0, ["a", "b"])) == ["scale-down"]
    assert write_kinds(_cluster(1), _cluster(1, ["a", "b"])) == ["replacement"]
    assert write_kinds(_cluster(0, ["a", "b"]), _cluster(0, [])) == ["clear"]
    assert write_kinds(_cluster(2), _cluster(1)) == ["replicas lowered"]
    assert write_kinds(_cluster(1, draining="x"), _cluster(1)) == []  # the record removed


def test_a_run_needs_enough_writes_of_every_kind_and_a_drain() -> None:
    full = Density(20, Counter({"scale-up": 3, "scale-down": 2, "replacement": 1}), drains=3)
    assert full.problems(20) == []
    assert full.problems(21) == ["20 daemon writes judged, fewer than 21"]
    thin = Density(1, Counter({"scale-up": 1}), drains=0)
    assert thin.problems(20) == [
        "1 daemon writes judged, fewer than 20",
        "no scale-down write",
        "no replacement write",
        "no slice drained",
    ]


def _cpus(group: dict[str, Any]) -> float:
    return float(group["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"])


def test_the_cpu_lane_fits_only_cpu_hosts() -> None:
    """The CPU lane must scale the CPU group: were its shapes to fit a TPU host, they would run on
    a slice that is up and the lane would write nothing (a run judged 13 writes that way)."""
    groups = {g["groupName"]: g for g in soak_raycluster()["spec"]["workerGroupSpecs"]}
    assert set(LANE_GROUP.values()) == set(groups)
    assert set(LANES) == set(LANE_GROUP)
    assert _cpus(groups["tpu-group"]) < CPU_LANE_CPUS <= _cpus(groups["cpu-group"])
