"""The frame memo is the caller's and changes nothing: `decide()` gives the same Decision
document with a cold memo (None) as with a warm one carried across frames, on inputs of the
frozen fuzz corpus and on a control-tier scenario whose demand changes from frame to frame
(the reconciler passes its observer's memo; each of its decisions is checked against a cold
one)."""

from __future__ import annotations

import copy
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from ray.core.generated import autoscaler_pb2

from kuberay_scaler.adapters.ray_gcs.poller import NodeEntries, observation_of
from kuberay_scaler.core.decision import Decision, Observation, decide
from kuberay_scaler.core.model.plan import Memory
from kuberay_scaler.core.model.ray import RayObservation, RayState
from kuberay_scaler.core.planner.memo import FrameMemo
from kuberay_scaler.core.planner.policy import Policy
from kuberay_scaler.loop import reconciler as reconciler_module
from tests.control.fakes import make_loop, read_now
from tests.control.worlds import drain_busy_and_scale_up
from tests.factories import (
    NOW,
    cluster,
    cpu_nodes,
    group,
    head_node,
    pod,
    slice_pods,
    slice_reservation,
    state,
    tasks,
    tpu_group,
    tpu_slice_nodes,
)
from tests.fuzz.plan_corpus import LATER_S, MONO_S, inputs_of, load
from tests.fuzz.plan_corpus import NOW as CORPUS_NOW

CORPUS_CASES = range(0, 400, 25)  # 16 of the corpus's 400 inputs, spread over it


def _corpus_frame(case: dict[str, Any], later_s: float) -> Observation:
    rc, pods, reply = inputs_of(case)
    mono_s = MONO_S + later_s
    parsed = autoscaler_pb2.GetClusterResourceStateReply.FromString(reply)
    gcs = observation_of(
        parsed, observed_at=mono_s, cluster_id="c0", epoch=0, read_at_ms=int(mono_s * 1000)
    )
    return Observation.parse(copy.deepcopy(rc), list(pods), gcs)


def _both(
    observed: Observation, memory: Memory, at_s: float, memo: FrameMemo, base: Any = NOW
) -> Decision:
    """The decision with the warm memo, after checking it against a cold one."""
    now, mono_s = base + timedelta(seconds=at_s), MONO_S + at_s
    warm = decide(observed, memory, Policy(), now, mono_s=mono_s, memo=memo)
    cold = decide(observed, memory, Policy(), now, mono_s=mono_s)
    assert warm.document() == cold.document()
    assert warm.plan == cold.plan
    return warm


def test_corpus_decisions_are_the_same_with_a_warm_memo_as_with_a_cold_one() -> None:
    """One memo carried over every frame of the chosen cases (each twice, the second time on
    the memo the first left), as the daemon carries its own."""
    memo = FrameMemo()
    cases = load()
    for index in [*CORPUS_CASES, *CORPUS_CASES]:
        memory = Memory()
        for later_s in (0.0, LATER_S, LATER_S + 1):
            observed = _corpus_frame(cases[index], later_s)
            memory = _both(observed, memory, later_s, memo, CORPUS_NOW).plan.memory
    assert memo.slices.hits > 0


def _busy_cluster() -> tuple[dict[str, Any], list[dict[str, Any]], list[Any]]:
    """Every host busy: one TPU group of 4-host slices, one CPU group."""
    rc = cluster(
        tpu_group(replicas=3, max_replicas=20), group("cpu", cpu="8", replicas=4, max_replicas=40)
    )
    replicas = ("tpu-a", "tpu-b", "tpu-c")
    cpu_pods = [f"cpu-{i}" for i in range(4)]
    pods = [p for r in replicas for p in slice_pods("tpu", r, 4)]
    pods += [pod(name, "cpu") for name in cpu_pods]
    nodes = [head_node()]
    tpu = [n for r in replicas for n in tpu_slice_nodes(r, 4, busy_hosts=(0, 1, 2, 3))]
    nodes += [replace(n, available={**n.available, "CPU": 0.0}) for n in tpu]  # all busy
    nodes += cpu_nodes(cpu_pods, free_cpu=2)
    return rc, pods, nodes


def test_frames_whose_demand_changes_decide_alike_warm_and_cold() -> None:
    """The same node objects frame after frame (as the poller hands them on), the demand
    growing, then a node freed: the capacity view's bins of unchanged nodes come from the memo
    (one a plan took from is built again), and every decision equals a cold one."""
    rc, pods, nodes = _busy_cluster()
    memo = FrameMemo()
    demand = [
        [tasks({"CPU": 1}, 4)],  # fits the free CPUs: bins taken from
        [tasks({"CPU": 1}, 8)],  # exactly the free CPUs (none if a taken bin came back)
        [tasks({"CPU": 1}, 4), tasks({"CPU": 6}, 3)],  # new hosts
        [tasks({"CPU": 6}, 3), tasks({"TPU": 4}, 6)],  # new slices
        [tasks({"TPU": 4}, 6)],
        [],
        [tasks({"CPU": 2}, 9)],
    ]
    gangs = [(), (), (), (slice_reservation(),), (slice_reservation(),), (), ()]
    memory = Memory()
    parsed = Observation.parse(rc, pods)  # parsed once, as the daemon's observer does
    for step, (wanted, gang) in enumerate(zip(demand, gangs, strict=True)):
        if step == 4:  # one CPU host frees up: a new node object, the others unchanged
            nodes[-1] = replace(nodes[-1], available={**nodes[-1].available, "CPU": 8.0})
        ray = state(nodes, wanted, gang)
        observed = replace(parsed, gcs=RayObservation(ray, MONO_S + step, cluster_id="c"))
        memory = _both(observed, memory, float(step), memo).plan.memory
    assert memo.capacity.view_hits > 0  # every node bin at once, the taken ones built again


async def test_the_reconciler_decides_with_its_observers_memo_as_a_cold_one_would(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The control tier: the reconciler passes its observer's memo frame after frame; every
    decision it makes equals the one a cold memo gives for the same input."""
    real = reconciler_module.decide
    memos: list[FrameMemo | None] = []

    def checked(observed: Observation, *args: Any, **kwargs: Any) -> Decision:
        memos.append(kwargs.get("memo"))
        warm = real(observed, *args, **kwargs)
        cold = real(observed, *args, **{**kwargs, "memo": None})
        assert warm.document() == cold.document()
        return warm

    monkeypatch.setattr(reconciler_module, "decide", checked)
    rc, pods, reply = drain_busy_and_scale_up()
    loop = make_loop(rc, pods)
    first = read_now(reply, loop.clock.monotonic(), cluster_id="cluster-1", epoch=1)
    parsed = first.state or _none()  # parsed once: its node objects are handed on
    for step, wanted in enumerate(([tasks({"CPU": 30}, 2)], [tasks({"CPU": 30}, 3)], [])):
        loop.clock.advance(1)
        ray = replace(parsed, tasks=tuple(wanted))  # the same node objects, new demand
        now = loop.clock.monotonic()
        loop.reconciler.observe_gcs(RayObservation(ray, now, "cluster-1", 1))
        loop.reconciler.gcs_changed()
        await loop.reconciler.reconcile()
        assert len(memos) == step + 1
    assert memos and all(m is loop.reconciler.observer.memo for m in memos)
    assert loop.reconciler.observer.memo.slices.hits > 0


def _none() -> RayState:
    raise AssertionError("the scenario's reply parses")


def test_the_pollers_node_entries_give_the_content_built_afresh() -> None:
    """The poller's memo of each node's part of the content (NodeEntries) over replies that
    keep every node, change one, drop one, and change only the demand: each content equals
    the one built without it."""
    _, _, nodes = _busy_cluster()
    entries = NodeEntries()
    freed = replace(nodes[2], available={**nodes[2].available, "CPU": 8.0})
    frames = [
        state(nodes),
        state(nodes, [tasks({"CPU": 1}, 3)]),  # new demand, the same node objects
        state([*nodes[:2], freed, *nodes[3:]]),  # one node changed
        state(nodes[1:]),  # one node gone
        state(nodes),
    ]
    for ray in frames:
        observed = RayObservation(ray, 0.0, "c")
        assert observed.content(entries.of) == observed.content()
