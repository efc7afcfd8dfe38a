"""Invariants of group availability and fallback, over generated clusters (hypothesis).

- demand is never served by launching capacity of an unavailable group;
- a group never flaps faster than its backoff;
- pinned demand never moves;
- nothing that ran is cancelled without the gate.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from datetime import timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from kuberay_scaler.core.model.availability import (
    Availability,
    ChangeKind,
    GroupAvailability,
    UnavailableCause,
)
from kuberay_scaler.core.model.hosts import HostPhase
from kuberay_scaler.core.model.plan import DeleteKind, Memory, Plan
from kuberay_scaler.core.model.ray import RayState, TaskDemand
from kuberay_scaler.core.model.reasons import FellBack, ScaleUp
from kuberay_scaler.core.model.signals import CapacityEvent, CapacitySignal
from kuberay_scaler.core.planner.deadlines import Deadlines
from kuberay_scaler.core.planner.gate import evidence_for, gate, pod_blocker
from kuberay_scaler.core.planner.pipeline import plan
from kuberay_scaler.core.planner.policy import Policy
from tests.factories import (
    NOW,
    NOW_MS,
    NOW_S,
    cluster,
    head_node,
    selector_bundle,
    slice_pods,
    slice_reservation,
    snapshot_of,
    state,
    tasks,
    tpu_group,
    tpu_slice_nodes,
)
from tests.unit.core.planner.test_planner_properties import PROPERTY_SETTINGS, Scenario, scenarios

MONO = 10_000.0
_UNAVAILABLE = GroupAvailability(
    state=Availability.UNAVAILABLE,
    cause=UnavailableCause.STOCKOUT,
    detail="GCE out of resources",
    source="cluster-autoscaler",
    since_mono=MONO - 10,
    until_mono=MONO + 1_000,
    failures=1,
)


def _plan(sc: Scenario, memory: Memory, pods: list[dict[str, Any]] | None = None) -> Plan:
    ray = state(sc.nodes, sc.tasks, sc.gangs, sc.constraint)
    snap = snapshot_of(sc.rc, sc.pods if pods is None else pods)
    return plan(snap, ray, memory, sc.policy, NOW, mono_s=MONO)


def _group_names(sc: Scenario) -> list[str]:
    return [g["groupName"] for g in sc.rc["spec"]["workerGroupSpecs"]]


@st.composite
def with_unavailable(draw: st.DrawFn) -> tuple[Scenario, frozenset[str]]:
    sc = draw(scenarios())
    names = _group_names(sc)
    down = frozenset(n for n in names if draw(st.booleans()))
    availability = {n: _UNAVAILABLE for n in down}
    sc.memory = replace(sc.memory, availability=availability)
    return sc, down


def _without_slices(sc: Scenario, stuck: set[str]) -> Scenario:
    """The scenario as if the slices of these pods had never been asked for."""
    gone: dict[str, set[str]] = {}
    for p in sc.pods:
        if p["metadata"]["name"] in stuck:
            labels = p["metadata"]["labels"]
            replica = labels.get("ray.io/worker-group-replica-name", p["metadata"]["name"])
            gone.setdefault(labels["ray.io/group"], set()).add(replica)
    rc = copy.deepcopy(sc.rc)
    for g in rc["spec"]["workerGroupSpecs"]:
        g["replicas"] = max(0, g["replicas"] - len(gone.get(g["groupName"], ())))
    pods = [p for p in sc.pods if p["metadata"]["name"] not in stuck]
    return replace(sc, rc=rc, pods=pods)


def _pending_pods_of(sc: Scenario, groups: frozenset[str]) -> set[str]:
    """Pods of slices that never ran (Pending) in `groups`."""
    return {
        p["metadata"]["name"]
        for p in sc.pods
        if p["metadata"]["labels"].get("ray.io/group") in groups
        and p["status"]["phase"] == "Pending"
        and "deletionTimestamp" not in p["metadata"]
    }


@given(with_unavailable())
@PROPERTY_SETTINGS
def test_demand_is_never_served_by_launching_capacity_of_an_unavailable_group(
    case: tuple[Scenario, frozenset[str]],
) -> None:
    _check_launching_capacity(*case)


def _check_launching_capacity(sc: Scenario, down: frozenset[str]) -> None:
    result = _plan(sc, sc.memory)
    for d in result.groups:
        if d.group in down:
            assert d.new_hosts == 0, d
            assert not [r for r in d.reasons if isinstance(r, ScaleUp)], d
    # What an unavailable group has coming counts for nothing: without those pods at all, every
    # other group is planned exactly alike.
    stuck = _pending_pods_of(sc, down)
    without = _plan(_without_slices(sc, stuck), sc.memory)
    for d in result.groups:
        if d.group in down:
            continue
        other = without.group(d.group)
        assert other is not None
        assert (d.target, d.new_hosts, d.deletions) == (
            other.target,
            other.new_hosts,
            other.deletions,
        )


@st.composite
def two_generations(draw: st.DrawFn) -> tuple[Scenario, frozenset[str]]:
    """The issue's cluster with room everywhere: v6e (priority 10) and v5e, each with running,
    stuck and asked-for slices, either one unavailable, TPU tasks and slice reservations."""
    sc = Scenario(rc={}, nodes=[head_node()])
    raws = []
    for name, accelerator, pod_type in (
        ("v6e", "tpu-v6e-slice", "v6e-16"),
        ("v5e", "tpu-v5-lite-podslice", "v5litepod-16"),
    ):
        running, stuck = draw(st.integers(0, 2)), draw(st.integers(0, 3))
        for i in range(running):
            key = f"{name}-r{i}"
            sc.pods += slice_pods(name, key, 4)
            busy = draw(st.sampled_from([(), (0, 1, 2, 3)]))
            sc.nodes += tpu_slice_nodes(
                key, 4, pod_type=pod_type, group_name=name, busy_hosts=busy, idle_s=5
            )
        for i in range(stuck):
            sc.pods += slice_pods(name, f"{name}-p{i}", 4, phase="Pending", age_s=40)
        replicas = running + stuck + draw(st.integers(0, 2))
        raw = tpu_group(name, replicas=replicas, accelerator=accelerator, topology="4x4")
        raw.update(maxReplicas=20, minReplicas=draw(st.sampled_from([0, 0, 1])))
        raw["priority"] = 10 if name == "v6e" else 0
        raws.append(raw)
    sc.rc = cluster(*raws)
    sc.tasks = [tasks({"TPU": 4}, draw(st.integers(0, 24)))]
    if draw(st.booleans()):
        sc.gangs = [slice_reservation(draw(st.sampled_from(["v6e-16", "v5litepod-16"])))]
    down = frozenset(draw(st.sampled_from([{"v6e"}, {"v5e"}, {"v6e"}, set()])))
    sc.memory = Memory(availability={n: _UNAVAILABLE for n in down})
    return sc, down


@given(two_generations())
@PROPERTY_SETTINGS
def test_stuck_slices_of_an_unavailable_group_hold_no_demand(
    case: tuple[Scenario, frozenset[str]],
) -> None:
    _check_launching_capacity(*case)


@given(with_unavailable())
@PROPERTY_SETTINGS
def test_nothing_that_ran_is_cancelled_and_every_cancel_passes_the_gate_undrained(
    case: tuple[Scenario, frozenset[str]],
) -> None:
    sc, _ = case
    result = _plan(sc, sc.memory)
    snap = snapshot_of(sc.rc, sc.pods)
    ray = state(sc.nodes, sc.tasks, sc.gangs, sc.constraint)
    ev = evidence_for(snap.hosts, ray, None, Deadlines().missing_node_grace_s, NOW)
    cancels = [
        (d.group, x) for d in result.groups for x in d.deletions if x.kind is DeleteKind.CANCEL
    ]
    for _group, x in cancels:
        assert x.node_ids == ()
        for pod in x.pods:
            host = ev.hosts[pod]
            assert host.phase is HostPhase.PENDING
            assert not ev.entries.get(pod) and pod not in ev.clock.seen
            assert pod_blocker(pod, x.slice_key, ev, frozenset(), NOW_S) is None
    for d in result.groups:  # cancels never take a group below minReplicas
        gs = result.slice_map.groups[d.group] if result.slice_map else None
        assert gs is not None
        if d.target != d.current:
            assert gs.group.min_replicas <= d.target <= gs.group.max_replicas, d
    gated, blocked = gate(result, ev, frozenset(), NOW_S)
    assert not [b for b in blocked if b.path == "cancel_unavailable"]
    kept = {(d.group, x.slice_key) for d in gated.groups for x in d.deletions}
    assert all((g, x.slice_key) in kept for g, x in cancels)


# ---- pinned demand ----------------------------------------------------------------------------


def _issue_cluster(v6e: int, v5e: int) -> dict[str, Any]:
    return cluster(
        tpu_group("v6e", replicas=v6e, priority=10),
        tpu_group("v5e", replicas=v5e, accelerator="tpu-v5-lite-podslice", topology="4x4"),
    )


@given(
    v6e_state=st.sampled_from(["available", "unavailable", "probing"]),
    v6e_slices=st.sampled_from(["none", "stuck", "running"]),
    pin=st.sampled_from(["pod_type", "slice_name"]),
    count=st.integers(1, 9),
    plain=st.integers(0, 9),
)
@PROPERTY_SETTINGS
def test_pinned_demand_never_moves(
    v6e_state: str, v6e_slices: str, pin: str, count: int, plain: int
) -> None:
    pods: list[dict[str, Any]] = []
    nodes = [head_node()]
    if v6e_slices == "stuck":
        pods = slice_pods("v6e", "v6e-a", 4, phase="Pending", age_s=50)
    elif v6e_slices == "running":
        pods = slice_pods("v6e", "v6e-a", 4)
        nodes += tpu_slice_nodes("v6e-a", 4, group_name="v6e", busy_hosts=(0, 1, 2, 3))
    rc = _issue_cluster(1 if pods else 0, 0)
    label = (
        ("ray.io/tpu-pod-type", "v6e-16")
        if pin == "pod_type"
        else ("ray.io/tpu-slice-name", "v6e-a")
    )
    pinned = TaskDemand(selector_bundle({"TPU": 4}, dict([label])), count)
    others = [tasks({"TPU": 4}, plain)] if plain else []
    availability = {}
    if v6e_state != "available":
        availability["v6e"] = replace(_UNAVAILABLE, probing=v6e_state == "probing")
    memory = Memory(availability=availability)

    def run(demand: list[TaskDemand]) -> Plan:
        ray = RayState(nodes=tuple(nodes), tasks=tuple(demand), gangs=(), constraint=())
        return plan(snapshot_of(rc, pods), ray, memory, Policy(), NOW, mono_s=MONO)

    # Alone, it never opens another group, whatever v6e's state; with other demand, it never
    # adds to what the other group opens beyond that demand's own share.
    alone, nothing = run([pinned]), run([])
    assert _target(alone, "v5e") == _target(nothing, "v5e") == 0
    assert not [r for d in alone.groups for r in d.reasons if isinstance(r, FellBack)]
    if v6e_state == "unavailable" or pin == "slice_name":
        assert _target(alone, "v6e") <= _target(nothing, "v6e")  # it waits, and says so
    mixed, plain_only = run([pinned, *others]), run(others)
    fell = [r for d in mixed.groups for r in d.reasons if isinstance(r, FellBack)]
    assert all(
        "tpu-pod-type" not in r.demand.shape and "slice-name" not in r.demand.shape for r in fell
    )
    if v6e_state == "unavailable":
        assert _target(mixed, "v5e") == _target(plain_only, "v5e")


def _target(result: Plan, name: str) -> int:
    d = result.group(name)
    assert d is not None
    return d.target


# ---- flapping ---------------------------------------------------------------------------------

_FRAMES = st.lists(
    st.tuples(
        st.sampled_from(["stockout", "stuck", "up", "none", "triggered"]),
        st.floats(1.0, 400.0),
    ),
    min_size=1,
    max_size=25,
)


@given(frames=_FRAMES, initial=st.sampled_from([60.0, 180.0]), cap=st.sampled_from([600.0, 1800.0]))
@PROPERTY_SETTINGS
def test_a_group_never_flaps_faster_than_its_backoff(
    frames: list[tuple[str, float]], initial: float, cap: float
) -> None:
    policy = Policy(
        deadlines=Deadlines(unavailable_backoff_s=initial, unavailable_max_backoff_s=cap)
    )
    memory, mono, at_ms = Memory(), MONO, NOW_MS
    marked_at: float | None = None
    wait = 0.0
    for index, (what, step) in enumerate(frames):
        mono += step
        at_ms += int(step * 1000)
        rc, pods, nodes, events = _frame(what, index, at_ms)
        ray = state(nodes, [tasks({"TPU": 4}, 4)])
        now = NOW + timedelta(seconds=mono - MONO)
        result = plan(snapshot_of(rc, pods), ray, memory, policy, now, mono_s=mono, events=events)
        for change in result.availability_changes:
            if change.kind in (ChangeKind.MARKED, ChangeKind.PROBE_FAILED):
                assert marked_at is None or change.kind is ChangeKind.PROBE_FAILED
                marked_at, wait = mono, change.backoff_s
                assert initial <= wait <= cap
            elif change.kind in (ChangeKind.PROBE, ChangeKind.RECOVERED):
                assert marked_at is not None and mono - marked_at >= wait
                if change.kind is ChangeKind.RECOVERED:
                    marked_at = None
        a = result.memory.availability["v6e"]
        if a.unavailable and not a.probing:
            assert a.until_mono is not None and a.until_mono - a.since_mono >= initial
        memory = result.memory


def _frame(
    what: str, index: int, at_ms: int
) -> tuple[dict[str, Any], list[dict[str, Any]], list[Any], tuple[CapacityEvent, ...]]:
    """One frame of the v6e group's life: stuck with a stockout, stuck, a slice up, nothing."""
    key = f"v6e-{index}"
    nodes: list[Any] = [head_node()]
    events: tuple[CapacityEvent, ...] = ()
    if what == "up":
        pods = slice_pods("v6e", key, 4, age_s=40, running_for_s=30)
        nodes += tpu_slice_nodes(key, 4, group_name="v6e", busy_hosts=(0,))
    elif what == "none":
        pods = []
    else:
        pods = slice_pods("v6e", key, 4, phase="Pending", age_s=20)
        signal = {
            "stockout": CapacitySignal.STOCKOUT,
            "triggered": CapacitySignal.SCALE_UP_TRIGGERED,
        }.get(what)
        if signal is not None:
            events = (CapacityEvent(signal, "cluster-autoscaler", "x", "y", at_ms, pod=f"{key}-0"),)
    return _issue_cluster(1 if pods else 0, 0), pods, nodes, events
