"""The slice map's per-slice memo (SliceMemo) changes nothing: over any sequence of frames in
which pods, Ray nodes and the group change and time passes, the memoized map equals the one
built afresh, and the decision built on it too. Idle clocks are idle-since times, so an idle
slice that nothing touched is the same value frame after frame and comes from the memo."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from kuberay_scaler.core.decision import Observation, decide
from kuberay_scaler.core.liveness import HostClock
from kuberay_scaler.core.model.hosts import Host, HostPhase
from kuberay_scaler.core.model.plan import Memory
from kuberay_scaler.core.model.ray import NodeStatus, RayNode, RayObservation, RayState, epoch_ms
from kuberay_scaler.core.parse.pods import parse_pods
from kuberay_scaler.core.parse.raycluster import parse_raycluster
from kuberay_scaler.core.planner.memo import FrameMemo
from kuberay_scaler.core.planner.policy import Policy
from kuberay_scaler.core.slicemap import SliceMemo, SliceTimeouts, build_slice_map
from tests.factories import (
    NOW,
    cluster,
    cpu_nodes,
    group,
    pod,
    slice_pods,
    state,
    tpu_slice_nodes,
)

TIMEOUTS = SliceTimeouts(max_provision_s=900, missing_node_grace_s=180)
REPLICAS = [f"tpu-{c}" for c in "abcdef"]
CPU_PODS = [f"cpu-{i}" for i in range(3)]


def _raycluster(doomed: tuple[str, ...] = ()) -> dict[str, Any]:
    rc = cluster(
        group("tpu", hosts=4, tpu="4", replicas=len(REPLICAS), max_replicas=10),
        group("cpu", replicas=len(CPU_PODS), max_replicas=10),
    )
    if doomed:
        rc["spec"]["workerGroupSpecs"][0]["scaleStrategy"] = {"workersToDelete": list(doomed)}
    return rc


def _start() -> tuple[list[Host], list[RayNode]]:
    spec = parse_raycluster(_raycluster())
    pods = [p for i, r in enumerate(REPLICAS) for p in slice_pods("tpu", r, 4, age_s=60 * i)]
    pods += [pod(name, "cpu") for name in CPU_PODS]
    hosts, problems = parse_pods(pods, spec)
    assert problems == []
    nodes = [
        n
        for i, r in enumerate(REPLICAS)
        for n in tpu_slice_nodes(r, 4, idle_s=30 * i if i % 2 else None)
    ]
    nodes += cpu_nodes(CPU_PODS, idle_s=20)
    return list(hosts), nodes


def _mutate(op: str, i: int, hosts: list[Host], nodes: list[RayNode]) -> tuple[str, ...]:
    """One change a watch event or a GCS reply can bring; returns workersToDelete to use."""
    if op == "pod_copy" and hosts:  # a watch event that changes nothing the map reads
        k = i % len(hosts)
        hosts[k] = replace(hosts[k])
    elif op == "pod_pending" and hosts:
        k = i % len(hosts)
        hosts[k] = replace(hosts[k], phase=HostPhase.PENDING, detail="Unschedulable")
    elif op == "pod_gone" and hosts:
        del hosts[i % len(hosts)]
    elif op == "node_copy" and nodes:  # a full parse of an unchanged node: a new object
        k = i % len(nodes)
        nodes[k] = replace(nodes[k])
    elif op == "node_busy" and nodes:
        k = i % len(nodes)
        nodes[k] = replace(nodes[k], status=NodeStatus.RUNNING, idle_since_ms=None)
    elif op == "node_idle_clock" and nodes:  # it ran work in between: idle again, since later
        k = i % len(nodes)
        was = nodes[k].idle_since_ms
        nodes[k] = replace(
            nodes[k], status=NodeStatus.IDLE, idle_since_ms=(was or epoch_ms(NOW)) + 1000
        )
    elif op == "node_wrong_worker" and nodes:
        k = i % len(nodes)
        labels = {**nodes[k].labels, "ray.io/tpu-worker-id": "7"}
        nodes[k] = replace(nodes[k], labels=labels)
    elif op == "node_gone" and nodes:
        del nodes[i % len(nodes)]
    elif op == "doomed" and hosts:
        return (hosts[i % len(hosts)].pod_name,)
    return ()


OPS = st.sampled_from(
    [
        "pod_copy",
        "pod_pending",
        "pod_gone",
        "node_copy",
        "node_busy",
        "node_idle_clock",
        "node_wrong_worker",
        "node_gone",
        "doomed",
        "ray_unknown",
        "time_passes",
        "nothing",
    ]
)


def _later(op: str, i: int, now: Any) -> Any:
    """`time_passes`: the next frame is `i` seconds later (idle slices may cross a timeout)."""
    return now + timedelta(seconds=i * 3) if op == "time_passes" else now


# A pod whose Ray node is gone, judged once while Ray's view is unknown (complete then: nothing
# says otherwise), must not stay complete once Ray is known again.
NODE_GONE_THEN_BLIND = [("node_gone", 26), ("ray_unknown", 0), ("nothing", 0)]


@given(st.lists(st.tuples(OPS, st.integers(0, 50)), min_size=1, max_size=12))
@example(NODE_GONE_THEN_BLIND)
@settings(max_examples=120, deadline=None)
def test_memoized_slice_map_equals_the_one_built_afresh(steps: list[tuple[str, int]]) -> None:
    hosts, nodes = _start()
    memo = SliceMemo()
    now = NOW
    for op, i in [("nothing", 0), *steps]:
        doomed = _mutate(op, i, hosts, nodes)
        now = _later(op, i, now)
        spec = parse_raycluster(_raycluster(doomed))  # a new spec object every frame, as parsed
        ray = None if op == "ray_unknown" else state(nodes)  # a GCS glitch: Ray's view unknown
        clock = HostClock.from_timestamps(hosts, ray.node_by_instance() if ray else {}, now)
        memoized = build_slice_map(spec, hosts, ray, now, TIMEOUTS, clock, memo)
        afresh = build_slice_map(spec, hosts, ray, now, TIMEOUTS, clock, SliceMemo())
        assert memoized == afresh


def test_unchanged_frames_take_complete_slices_from_the_memo() -> None:
    hosts, nodes = _start()
    spec = parse_raycluster(_raycluster())
    ray = state(nodes)
    memo = SliceMemo()
    first = build_slice_map(spec, hosts, ray, NOW, TIMEOUTS, None, memo)
    assert memo.hits == 0
    again = build_slice_map(spec, hosts, ray, NOW, TIMEOUTS, None, memo)
    assert memo.hits == len(REPLICAS) + len(CPU_PODS)  # every slice is complete
    assert memo.group_hits == 2  # both groups taken whole: nothing in them changed
    assert again == first
    pairs = zip(first.groups["cpu"].slices, again.groups["cpu"].slices, strict=True)
    assert all(a is b for a, b in pairs)
    # One pod of the TPU group changes: that group is judged slice by slice (its unchanged
    # slices still from the memo), the CPU group is taken whole.
    hosts[0] = replace(hosts[0], phase=HostPhase.PENDING, detail="Unschedulable")
    third = build_slice_map(spec, hosts, ray, NOW, TIMEOUTS, None, memo)
    assert memo.group_hits == 3
    assert third == build_slice_map(spec, hosts, ray, NOW, TIMEOUTS, None, SliceMemo())


def test_idle_slices_come_from_the_memo_as_time_passes() -> None:
    """Time alone changes no slice: a minute later every slice, idle ones included, is last
    frame's object, and their idle durations (derived from `now`) have grown by the minute."""
    hosts, nodes = _start()
    spec = parse_raycluster(_raycluster())
    ray = state(nodes)
    memo = SliceMemo()
    first = build_slice_map(spec, hosts, ray, NOW, TIMEOUTS, None, memo)
    later = NOW + timedelta(minutes=1)
    again = build_slice_map(spec, hosts, ray, later, TIMEOUTS, None, memo)
    assert memo.hits == len(REPLICAS) + len(CPU_PODS)
    idle = [s for gs in first.groups.values() for s in gs.slices if s.idle_since_ms() is not None]
    assert len(idle) == 3 + len(CPU_PODS)  # the odd TPU replicas and the CPU hosts
    for a, b in zip(first.groups["tpu"].slices, again.groups["tpu"].slices, strict=True):
        assert a is b
        if a.idle_since_ms() is not None:
            grown = b.idle_ms(epoch_ms(later)), a.idle_ms(epoch_ms(NOW))
            assert grown[0] is not None and grown[1] is not None
            assert grown[0] - grown[1] == 60_000


@given(st.lists(st.tuples(OPS, st.integers(0, 50)), min_size=1, max_size=8))
@example(NODE_GONE_THEN_BLIND)
@settings(max_examples=40, deadline=None)
def test_decisions_with_the_frame_memo_equal_decisions_without(
    steps: list[tuple[str, int]],
) -> None:
    hosts, nodes = _start()
    now = NOW
    memo = FrameMemo()  # the caller's, carried across the frames
    for op, i in [("nothing", 0), *steps]:
        doomed = _mutate(op, i, hosts, nodes)
        now = _later(op, i, now)
        ray = None if op == "ray_unknown" else RayState(tuple(nodes), (), (), ())
        observed = Observation(
            spec=parse_raycluster(_raycluster(doomed)),
            hosts=tuple(hosts),
            gcs=RayObservation(ray, 0.0, cluster_id="c"),
        )
        memoized = decide(observed, Memory(), Policy(), now, memo=memo)
        afresh = decide(observed, Memory(), Policy(), now)  # a cold memo
        assert memoized.document() == afresh.document()
        assert memoized.plan == afresh.plan
