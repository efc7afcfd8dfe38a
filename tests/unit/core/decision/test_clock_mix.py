"""decide() makes the same decisions whether its monotonic reading is the wall clock's number
(one-shot use, and the old test worlds) or decades less (a real monotonic clock counts from
boot): a path that compares a monotonic instant with a wall one reads a 56-year gap here.

Each scenario is a few frames some seconds apart, each frame's memory the next one's; the Ray
nodes' idle clocks are stamped on the monotonic clock, as the daemon stamps replies (app.py).
Compared per frame: every group decision with its reasons (times shown to people are on the
wall clock in both worlds), the plan's problems, its next wake-up, every write (drain
deadlines are what Ray reads: the wall clock) and the plan's document (/debug/plan and
/debug/slices: idle ages, queued ages, the next probe). Each scenario also asserts that its
timer did decide something, so no comparison is of two plans where nothing happens.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import pytest

from kuberay_scaler.core.decision import Observation, decide, write_document
from kuberay_scaler.core.model.plan import GroupDecision, Memory, Plan
from kuberay_scaler.core.model.ray import NodeStatus, RayObservation, RayState
from kuberay_scaler.core.model.reasons import DisruptionKind, Keep, KeepKind
from kuberay_scaler.core.model.signals import CapacityEvent, CapacitySignal
from kuberay_scaler.core.planner.deadlines import Deadlines
from kuberay_scaler.core.planner.policy import Policy
from tests.factories import (
    KUEUE_ELASTIC_GATE,
    NOW,
    NOW_MS,
    cluster,
    head_node,
    slice_pods,
    slice_reservation,
    state,
    tasks,
    tpu_group,
    tpu_slice_nodes,
)
from tests.fuzz.pipeline import refused_outright

WALL = NOW.timestamp()  # the monotonic reading equals the wall clock's number
BOOT = 5_000.0  # a real monotonic clock: seconds since boot
DELAY_KEY = "kuberay-scaler.ray.io/scale-down-delay-after-add-seconds"


@dataclass(frozen=True)
class Frame:
    at_s: float  # seconds after NOW, on both clocks
    rc: dict[str, Any]
    pods: list[dict[str, Any]]
    ray: RayState  # idle clocks as the factories stamp them: idle `idle_s` at NOW
    events: tuple[CapacityEvent, ...] = ()
    refuse: bool = False  # Ray refuses every idle-termination drain of this frame


@dataclass(frozen=True)
class Scenario:
    frames: tuple[Frame, ...]
    policy: Policy = field(default_factory=Policy)
    # The memory before the first frame, from the monotonic reading at NOW.
    memory: Callable[[float], Memory] = lambda _mono: Memory()


def _on_clock(ray: RayState, mono_at_now: float) -> RayState:
    """`ray` as read by a daemon whose monotonic clock reads `mono_at_now` at NOW."""
    shift = int(mono_at_now * 1000) - NOW_MS
    nodes = tuple(
        n if n.idle_since_ms is None else replace(n, idle_since_ms=n.idle_since_ms + shift)
        for n in ray.nodes
    )
    return replace(ray, nodes=nodes)


def _frames(sc: Scenario, mono_at_now: float) -> list[tuple[Plan, tuple[Any, ...]]]:
    """Each frame's plan (after the drains' answers) and what the comparison reads of it."""
    memory = sc.memory(mono_at_now)
    out = []
    for f in sc.frames:
        mono = mono_at_now + f.at_s
        gcs = RayObservation(_on_clock(f.ray, mono_at_now), mono, "cluster-1", 1)
        observed = Observation.parse(
            raycluster=f.rc, pods=f.pods, gcs=gcs, capacity_events=f.events
        )
        d = decide(observed, memory, sc.policy, NOW + timedelta(seconds=f.at_s), mono_s=mono)
        result, writes = d.plan, [write_document(w) for w in d.writes]
        idle_drains = {(x.group, x.slice_key) for x in d.drains if not x.preempt}
        if f.refuse and idle_drains:
            result, patch = refused_outright(d, idle_drains, f.rc)
            writes += [write_document(patch)] if patch else []
        memory = result.memory
        groups = tuple(_as_said(g) for g in result.groups)
        shown = json.dumps(result.summary(), default=str, sort_keys=True)  # /debug/plan, slices
        read = (groups, result.problems, result.next_wake_s, tuple(map(str, writes)), shown)
        out.append((result, read))
    return out


def _as_said(g: GroupDecision) -> GroupDecision:
    """The decision with its reasons as people read them (a reason may carry a monotonic
    reading as data, e.g. an availability change's `since_mono`; what it says is wall time)."""
    held = str(g.held) if g.held is not None else None
    return replace(g, reasons=tuple(map(str, g.reasons)), held=held)  # type: ignore[arg-type]


def _kinds(plans: Sequence[Plan]) -> set[str]:
    """Every deletion kind and reason kind the plans hold (what the scenario must reach)."""
    found: set[str] = set()
    for p in plans:
        for g in p.groups:
            found |= {x.kind.value for x in g.deletions}
            found |= {str(getattr(r, "kind", "")) for r in g.reasons}
            found |= {"preempt" for _ in g.preempt}
    return found


def _tpu(replicas: int, **kw: Any) -> dict[str, Any]:
    return cluster(tpu_group(replicas=replicas, **kw))


def _idle_expiry() -> Scenario:
    """tpu-a idle 10 s of the 60 s timeout, tpu-b busy: tpu-a goes at 55 s, not before."""
    pods = slice_pods("tpu", "tpu-a", 4) + slice_pods("tpu", "tpu-b", 4)
    ray = state(
        [head_node(), *tpu_slice_nodes("tpu-a", 4, idle_s=10), *tpu_slice_nodes("tpu-b", 4)]
    )
    ray = replace(ray, nodes=(*ray.nodes[:5], *_busy(ray.nodes[5:])))
    frames = tuple(Frame(t, _tpu(2), pods, ray) for t in (0, 30, 49, 55))
    return Scenario(frames)


def _busy(nodes: Sequence[Any]) -> list[Any]:
    return [replace(n, status=NodeStatus.RUNNING, idle_since_ms=None) for n in nodes]


def _preemption() -> Scenario:
    """A busy slice above maxReplicas 0: drained for preemption, removed once its 30 s pass."""
    pods = slice_pods("tpu", "tpu-a", 4)
    ray = state([head_node(), *tpu_slice_nodes("tpu-a", 4, busy_hosts=(1,))])
    rc = _tpu(1, max_replicas=0)
    frames = tuple(Frame(t, rc, pods, ray) for t in (0, 10, 29, 31))
    return Scenario(frames, Policy(deadlines=Deadlines(preempt_deadline_s=30)))


def _broken_busy() -> Scenario:
    """Host 2 dead, three busy: kept for the 100 s bound, then drained for preemption."""
    pods = slice_pods("tpu", "tpu-a", 4)
    pods[2]["status"]["phase"] = "Failed"
    nodes = _busy(tpu_slice_nodes("tpu-a", 4, idle_s=None))
    nodes[2] = replace(nodes[2], status=NodeStatus.DEAD)
    ray = state([head_node(), *nodes])
    frames = tuple(Frame(t, _tpu(1), pods, ray) for t in (0, 50, 99, 101, 125, 132))
    return Scenario(
        frames, Policy(deadlines=Deadlines(broken_busy_max_s=100, preempt_deadline_s=30))
    )


def _refused_drain() -> Scenario:
    """An idle slice whose drain Ray refuses: not drained again until its backoff passes."""
    pods = slice_pods("tpu", "tpu-a", 4)
    ray = state([head_node(), *tpu_slice_nodes("tpu-a", 4, idle_s=900)])
    times = (0, 5, 20, 40, 80, 200)
    frames = tuple(Frame(t, _tpu(1), pods, ray, refuse=True) for t in times)
    return Scenario(frames)


def _availability_probe() -> Scenario:
    """A stockout marks the group unavailable; it is probed again after its 60 s backoff."""
    pods = slice_pods("tpu", "tpu-a", 4, phase="Pending", age_s=30)
    stockout = CapacityEvent(
        signal=CapacitySignal.STOCKOUT,
        source="cluster-autoscaler",
        reason="FailedScaleUp",
        message="GCE out of resources",
        last_seen_ms=NOW_MS - 5_000,
        pod="tpu-a-0",
    )
    demand = state([head_node()], [tasks({"TPU": 4}, 8)])
    frames = tuple(Frame(t, _tpu(1), pods, demand, (stockout,)) for t in (0, 30, 59, 61, 90))
    return Scenario(
        frames, Policy(deadlines=Deadlines(unavailable_backoff_s=60, unavailable_max_backoff_s=600))
    )


def _scale_down_delay() -> Scenario:
    """The group added a slice 5 s before NOW; its idle slice waits for the 60 s delay."""
    group = tpu_group(replicas=1)
    group["template"]["metadata"] = {"annotations": {DELAY_KEY: "60"}}
    rc = cluster(group)
    pods = slice_pods("tpu", "tpu-a", 4)
    ray = state([head_node(), *tpu_slice_nodes("tpu-a", 4, idle_s=900)])
    frames = tuple(Frame(t, rc, pods, ray) for t in (0, 30, 54, 56))
    return Scenario(frames, memory=lambda mono: Memory(scaled_up_at={"tpu": mono - 5}))


def _queued_cancel() -> Scenario:
    """A slice queued by Kueue that no demand uses: cancelled once the 60 s timeout passes."""
    pods = slice_pods("tpu", "tpu-a", 4, age_s=120, gates=(KUEUE_ELASTIC_GATE,))
    frames = tuple(Frame(t, _tpu(1), pods, state([head_node()])) for t in (0, 30, 59, 61))
    return Scenario(frames)


def _reservation_grace() -> Scenario:
    """A slice reservation seen at NOW; then tpu-a idle past the timeout and tpu-b idle below
    it: tpu-b stays anyway, tpu-a is kept by the grace (two slices reserved) until it ends."""
    held = tpu_slice_nodes("tpu-a", 4, idle_s=None) + tpu_slice_nodes("tpu-b", 4, idle_s=None)
    held = [replace(n, available={**n.available, "TPU-v6e-16-head": 0.0}) for n in held]
    pods = slice_pods("tpu", "tpu-a", 4) + slice_pods("tpu", "tpu-b", 4)
    reserving = state([head_node(), *_busy(held)], gangs=[slice_reservation()])
    a, b = tpu_slice_nodes("tpu-a", 4, idle_s=300), tpu_slice_nodes("tpu-b", 4, idle_s=10)
    idle = state([head_node(), *a, *b])
    frames = (
        Frame(0, _tpu(2), pods, reserving),
        *(Frame(t, _tpu(2), pods, idle) for t in (20, 40, 599, 601)),
    )
    return Scenario(frames, Policy(deadlines=Deadlines(reservation_grace_s=600)))


def _going(pods: list[dict[str, Any]], host: int) -> list[dict[str, Any]]:
    """`pods` with a DisruptionTarget condition on pod `host` (the scheduler preempts it)."""
    out = copy.deepcopy(pods)
    cond = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
    out[host]["status"].setdefault("conditions", []).append(cond)
    return out


def _disruption() -> Scenario:
    """A host of busy tpu-a is going, no room for a replacement: drained for preemption (30 s);
    then the condition clears (the pod stays) and the drained slice is replaced at the deadline."""
    pods = slice_pods("tpu", "tpu-a", 4) + slice_pods("tpu", "tpu-b", 4)
    nodes = _busy([*tpu_slice_nodes("tpu-a", 4), *tpu_slice_nodes("tpu-b", 4)])
    busy = state([head_node(), *nodes])
    drained = [
        replace(n, status=NodeStatus.DRAINING) if n.instance_id < "tpu-b" else n for n in nodes
    ]
    rc = _tpu(2, max_replicas=2)
    frames = (
        Frame(0, rc, _going(pods, 1), busy),
        Frame(10, rc, _going(pods, 1), busy),
        *(Frame(t, rc, pods, state([head_node(), *drained])) for t in (20, 29, 31)),
    )
    return Scenario(frames)


SCENARIOS: dict[str, tuple[Callable[[], Scenario], set[str]]] = {
    "idle expiry": (_idle_expiry, {"idle"}),
    "preemption deadline": (_preemption, {"preempt", "preempted"}),
    "broken-busy bound": (_broken_busy, {"broken_but_busy", "preempt", "replace"}),
    "refused-drain backoff": (_refused_drain, {KeepKind.DRAIN_BACKING_OFF.value}),
    "availability probe": (_availability_probe, {"group_probing"}),
    "scale-down delay": (_scale_down_delay, {"scale_down_delay", "idle"}),
    "queued cancel": (_queued_cancel, {"cancel"}),
    "reservation grace": (_reservation_grace, {KeepKind.RESERVATION_GRACE.value, "idle"}),
    "disruption deadline": (
        _disruption,
        {"preempt", "disruption_target", DisruptionKind.ABANDONED.value, "replace"},
    ),
}


@pytest.mark.parametrize("name", SCENARIOS)
def test_decisions_do_not_depend_on_where_the_monotonic_clock_starts(name: str) -> None:
    build, reached = SCENARIOS[name]
    scenario = build()
    on_wall = _frames(scenario, WALL)
    from_boot = _frames(scenario, BOOT)
    missing = reached - _kinds([p for p, _ in on_wall])
    assert not missing, f"{name}: the scenario never reached {missing}"
    for i, ((_, want), (_, got)) in enumerate(zip(on_wall, from_boot, strict=True)):
        at = scenario.frames[i].at_s
        assert got[0] == want[0], f"{name} at {at} s: group decisions differ"
        assert got[1:] == want[1:], f"{name} at {at} s: problems, wake-up or writes differ"


def test_the_reservation_grace_judges_idle_age_on_the_monotonic_tick() -> None:
    """Before: the grace read idle age as wall now minus a monotonic idle-since (decades), so
    tpu-b, idle 10 s of its 60 s timeout, was "past the timeout" and kept by the grace."""
    scenario = _reservation_grace()
    *_, (result, _) = _frames(replace(scenario, frames=scenario.frames[:2]), BOOT)
    decision = result.group("tpu")
    assert decision is not None
    keeps = [r for r in decision.reasons if isinstance(r, Keep)]
    assert [r.slice for r in keeps if r.kind is KeepKind.RESERVATION_GRACE] == ["tpu-a"]


def test_a_going_slice_says_its_preemption_deadline_on_the_wall_clock() -> None:
    """Before: the disruption stage put its monotonic deadline in the reasons: "drain slice
    tpu-a for preemption until 1970-01-01T01:23:50" and "replaced whole at 1970-...". What Ray
    is told (the drain's deadline_ms) was right: only what people read was wrong."""
    plans = [p for p, _ in _frames(_disruption(), BOOT)]
    said = " ".join(str(r) for p in plans for g in p.groups for r in g.reasons)
    assert "1970-" not in said
    assert "until 2026-11-30T12:00:30+00:00" in said
    assert "replaced whole at 2026-11-30T12:00:30+00:00" in said
