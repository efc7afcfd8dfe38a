"""The invariant checker itself: each rule fires on a write that breaks it and stays quiet on one
that keeps it (a checker that never fires proves nothing)."""

from __future__ import annotations

import copy
from typing import Any

from tests.invariants import (
    ABSENT,
    DEAD,
    DRAINING,
    IDLE,
    RUNNING,
    InvariantChecker,
    World,
    Write,
    check_write,
    not_cleared,
)

DAEMON = "daemon"


def _rc(replicas: int = 1, doomed: list[str] | None = None, **group: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "groupName": "tpu",
        "replicas": replicas,
        "minReplicas": 0,
        "maxReplicas": 3,
        "numOfHosts": 2,
        **group,
    }
    if doomed is not None:
        spec["scaleStrategy"] = {"workersToDelete": doomed}
    return {"metadata": {"name": "rc"}, "spec": {"workerGroupSpecs": [spec]}}


def _pod(name: str, replica: str, *, terminating: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "labels": {
            "ray.io/group": "tpu",
            "ray.io/node-type": "worker",
            "ray.io/worker-group-replica-name": replica,
        },
    }
    if terminating:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"phase": "Running"}}


PODS = {n: _pod(n, r) for n, r in (("a0", "a"), ("a1", "a"), ("b0", "b"), ("b1", "b"))}


def _rules(write: Write, world: World) -> list[str]:
    return [v.rule for v in check_write(write, world)]


def test_whole_drained_slice_is_clean() -> None:
    world = World(PODS, {"a0": DRAINING, "a1": DRAINING, "b0": RUNNING, "b1": RUNNING})
    assert _rules(Write(_rc(2), _rc(1, ["a0", "a1"]), DAEMON), world) == []


def test_partial_slice_fires_and_names_the_left_out_pod() -> None:
    world = World(PODS, {"a0": DRAINING, "a1": DRAINING})
    [violation] = check_write(Write(_rc(2), _rc(1, ["a0"]), DAEMON), world)
    assert violation.rule == "partial-slice" and "a1" in violation.message
    assert "a0: Running, ray DRAINING" in str(violation)  # the world it was made from


def test_terminating_host_need_not_be_named() -> None:
    pods = {**PODS, "a1": _pod("a1", "a", terminating=True)}
    world = World(pods, {"a0": DRAINING, "a1": DEAD})
    assert _rules(Write(_rc(2), _rc(1, ["a0"]), DAEMON), world) == []


def test_busy_and_undrained_hosts_fire() -> None:
    busy = World(PODS, {"a0": DRAINING, "a1": RUNNING})
    idle = World(PODS, {"a0": DRAINING, "a1": IDLE})
    assert _rules(Write(_rc(2), _rc(1, ["a0", "a1"]), DAEMON), busy) == ["busy-deleted"]
    assert _rules(Write(_rc(2), _rc(1, ["a0", "a1"]), DAEMON), idle) == ["undrained-deleted"]


def test_partial_drain_rule_a_broken_slice_may_go_whole() -> None:
    dead_host = World(PODS, {"a0": DEAD, "a1": RUNNING})
    never_joined = World(PODS, {"a1": RUNNING})
    missing_pod = World({k: v for k, v in PODS.items() if k != "a1"}, {"a0": RUNNING})
    for world in (dead_host, never_joined, missing_pod):
        assert _rules(Write(_rc(2), _rc(1, ["a0", "a1"]), DAEMON), world) == []
    assert never_joined.ray is not None and never_joined.ray.get("a0", ABSENT) == ABSENT


def test_names_already_listed_are_not_judged_again() -> None:
    world = World(PODS, {"a0": RUNNING, "a1": RUNNING})
    before = _rc(1, ["a0", "a1"])
    assert _rules(Write(before, copy.deepcopy(before), DAEMON), world) == []


def test_bounds_only_when_replicas_change() -> None:
    world = World(PODS)
    assert _rules(Write(_rc(3), _rc(4), DAEMON), world) == ["out-of-bounds"]
    assert _rules(Write(_rc(1, minReplicas=1), _rc(0, minReplicas=1), DAEMON), world) == [
        "out-of-bounds"
    ]
    above = _rc(5)  # a user's value above max, left alone by the write
    assert _rules(Write(above, copy.deepcopy(above), DAEMON), world) == []
    absent = _rc(0, minReplicas=1)
    del absent["spec"]["workerGroupSpecs"][0]["replicas"]  # the CRD default, 0
    assert _rules(Write(absent, _rc(0, minReplicas=1), DAEMON), world) == []


def test_writes_while_blind_except_clearing() -> None:
    gone = {k: v for k, v in PODS.items() if not k.startswith("a")}
    blind = World(gone, None, blind_since=0.0)
    raise_write = Write(_rc(1), _rc(2), DAEMON, at=10.0)
    clear = Write(_rc(1, ["a0", "a1"]), _rc(1, []), DAEMON, at=10.0)
    early = Write(_rc(1), _rc(2), DAEMON, at=1.0)  # decided before the GCS went down
    assert _rules(raise_write, blind) == ["write-while-blind"]
    assert _rules(clear, blind) == []
    assert _rules(early, blind) == []


def test_second_scale_up_before_the_first_is_visible() -> None:
    checker = InvariantChecker(DAEMON)
    no_pods = World({}, demand="d1")
    checker.record(Write(_rc(0), _rc(1), DAEMON), no_pods)
    assert [v.rule for v in checker.record(Write(_rc(1), _rc(2), DAEMON), no_pods)] == [
        "second-scale-up"
    ]
    # new demand, or the first raise visible: a further raise is fine
    fresh = InvariantChecker(DAEMON)
    fresh.record(Write(_rc(0), _rc(1), DAEMON), no_pods)
    assert fresh.record(Write(_rc(1), _rc(2), DAEMON), World({}, demand="d2")) == []
    seen = InvariantChecker(DAEMON)
    seen.record(Write(_rc(0), _rc(1), DAEMON), no_pods)
    one_slice = {k: v for k, v in PODS.items() if k.startswith("a")}
    assert seen.record(Write(_rc(1), _rc(2), DAEMON), World(one_slice, demand="d1")) == []


def test_other_writers_are_not_judged_but_counted() -> None:
    checker = InvariantChecker(DAEMON)
    checker.record(Write(_rc(3), _rc(9), "gitops"), World(PODS))
    assert checker.violations == [] and checker.writes_seen == 1 and checker.judged == 0


def test_not_cleared_at_the_end_and_daemon_exit() -> None:
    final = _rc(0, ["a0", "a1"])
    assert [g for g, _ in not_cleared(final, World({}))] == ["tpu"]
    assert not_cleared(final, World(PODS)) == []
    checker = InvariantChecker(DAEMON)
    checker.daemon_exited(1, "Traceback ...")
    assert checker.counts() == {"daemon-exited": 1}
