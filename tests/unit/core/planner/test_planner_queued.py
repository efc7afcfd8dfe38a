"""Queued slices: pods held by a scheduling gate, the way Kueue holds the pods of a
workload slice it has not admitted. Queued is a state of its own: never broken, never replaced
for being slow, coming capacity for the demand it will serve, cancelled undrained (through the
deletion gate) once no demand has used it for the idle timeout."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import jsonpatch
from hypothesis import given, settings
from hypothesis import strategies as st

from kuberay_scaler.adapters.web.slices_page import render_slices
from kuberay_scaler.core.decision import Drain, Observation, Patch, RecordIntent, decide
from kuberay_scaler.core.model.hosts import Host, HostClock
from kuberay_scaler.core.model.plan import DeleteKind, Memory, Plan, Snapshot
from kuberay_scaler.core.model.ray import RayObservation, RayState
from kuberay_scaler.core.model.reasons import (
    Keep,
    KeepKind,
    Replace,
    ScaleDown,
    ScaleDownKind,
    ScaleUp,
    Unchanged,
    UnchangedKind,
)
from kuberay_scaler.core.model.slices import SliceState
from kuberay_scaler.core.parse.pods import parse_pod, parse_pods, slim_pod
from kuberay_scaler.core.parse.raycluster import parse_raycluster
from kuberay_scaler.core.patch.ops import ops_json
from kuberay_scaler.core.planner.gate import evidence_for, gate
from kuberay_scaler.core.planner.pipeline import plan
from kuberay_scaler.core.planner.policy import Policy
from kuberay_scaler.loop.report import report_from_plan
from tests.factories import (
    KUEUE_ELASTIC_GATE,
    NOW,
    NOW_S,
    cluster,
    head_node,
    pod,
    slice_pods,
    slice_reservation,
    state,
    tasks,
    tpu_group,
)

SIXTEEN_MIN = 16 * 60  # past the 15-min provisioning deadline


def _queued(replica: str, *, age_s: float = SIXTEEN_MIN, hosts: int = 4) -> list[dict[str, Any]]:
    return slice_pods("tpu", replica, hosts, age_s=age_s, gates=(KUEUE_ELASTIC_GATE,))


def _plan(
    rc: dict[str, Any],
    pods: list[dict[str, Any]],
    ray: RayState,
    *,
    memory: Memory | None = None,
    mono_s: float = 1000.0,
) -> Plan:
    spec = parse_raycluster(rc)
    hosts, problems = parse_pods(pods, spec)
    assert problems == []
    snap = Snapshot(spec=spec, hosts=tuple(hosts))
    return plan(snap, ray, memory or Memory(), Policy(), NOW, mono_s=mono_s)


def test_a_gated_pod_keeps_its_gates_through_the_informers_slim_transform() -> None:
    spec = parse_raycluster(cluster(tpu_group(replicas=1)))
    [raw] = slice_pods("tpu", "tpu-a", 1, gates=(KUEUE_ELASTIC_GATE, "example.com/other"))
    slim = slim_pod(raw)
    assert slim["spec"]["schedulingGates"] == raw["spec"]["schedulingGates"]
    host = parse_pod(slim, spec)
    assert isinstance(host, Host) and host == parse_pod(raw, spec)
    assert host.gates == (KUEUE_ELASTIC_GATE, "example.com/other")
    assert host.detail == "SchedulingGated"


def test_a_gated_slice_is_queued_not_broken_past_the_provisioning_deadline() -> None:
    result = _plan(cluster(tpu_group(replicas=1)), _queued("tpu-a"), state([head_node()]))
    [sl] = result.slice_map.groups["tpu"].slices  # type: ignore[union-attr]
    assert sl.state is SliceState.QUEUED and sl.fault is None
    assert sl.queued_s is not None and sl.queued_s >= SIXTEEN_MIN
    assert sl.gates == (KUEUE_ELASTIC_GATE,)
    assert "queued in Kueue" in sl.reason
    decision = result.group("tpu")
    assert decision is not None
    assert decision.deletions == () and decision.target == 1
    assert not any(isinstance(r, Replace) for r in decision.reasons)
    assert [r.kind for r in decision.reasons if isinstance(r, Unchanged)] == [UnchangedKind.QUEUED]


def test_the_same_slice_without_the_gate_is_past_its_deadline() -> None:
    """The control: pending 16 min, not gated, is past the provisioning deadline: its group is
    unavailable and the never-ran slice is cancelled (capacity fallback), never kept queued."""
    pods = slice_pods("tpu", "tpu-a", 4, age_s=SIXTEEN_MIN, phase="Pending")
    result = _plan(cluster(tpu_group(replicas=1)), pods, state([head_node()]))
    decision = result.group("tpu")
    assert decision is not None
    assert [x.kind for x in decision.deletions] == [DeleteKind.CANCEL]
    assert result.slice_map is not None
    assert result.slice_map.groups["tpu"].slices[0].state is not SliceState.QUEUED


def test_a_gated_partial_slice_is_queued_not_missing_hosts() -> None:
    result = _plan(cluster(tpu_group(replicas=1)), _queued("tpu-a", hosts=2), state([head_node()]))
    [sl] = result.slice_map.groups["tpu"].slices  # type: ignore[union-attr]
    assert sl.state is SliceState.QUEUED and "2 of 4 hosts" in sl.reason
    decision = result.group("tpu")
    assert decision is not None and decision.deletions == ()


def test_a_queued_slice_is_coming_capacity_so_demand_is_not_provisioned_twice() -> None:
    ray = state([head_node()], tasks=[tasks({"TPU": 4}, 4)])
    result = _plan(cluster(tpu_group(replicas=1)), _queued("tpu-a"), ray)
    decision = result.group("tpu")
    assert decision is not None
    assert decision.target == 1
    assert not any(isinstance(r, ScaleUp) for r in decision.reasons)
    # More than it holds still opens a slice: it is counted at its size, not as infinite.
    more = state([head_node()], tasks=[tasks({"TPU": 4}, 8)])
    bigger = _plan(cluster(tpu_group(replicas=1)), _queued("tpu-a"), more)
    assert bigger.group("tpu").target == 2  # type: ignore[union-attr]


def test_a_slice_reservation_waits_on_the_queued_slice() -> None:
    ray = state([head_node()], gangs=[slice_reservation()])
    result = _plan(cluster(tpu_group(replicas=1)), _queued("tpu-a"), ray)
    assert result.group("tpu").target == 1  # type: ignore[union-attr]


def test_demand_gone_cancels_the_queued_slice_after_the_idle_timeout_undrained() -> None:
    rc = cluster(tpu_group(replicas=1))
    ray = state([head_node()])
    first = _plan(rc, _queued("tpu-a"), ray, mono_s=1000.0)
    assert first.group("tpu").deletions == ()  # type: ignore[union-attr]
    assert dict(first.memory.queued_unneeded_since) == {"tpu-a": 1000.0}
    assert first.next_idle_expiry_s == 60.0  # the loop wakes when it falls due
    soon = _plan(rc, _queued("tpu-a"), ray, memory=first.memory, mono_s=1059.0)
    assert soon.group("tpu").deletions == ()  # type: ignore[union-attr]
    due = _plan(rc, _queued("tpu-a"), ray, memory=soon.memory, mono_s=1060.0)
    decision = due.group("tpu")
    assert decision is not None
    [cancel] = decision.deletions
    assert cancel.kind is DeleteKind.CANCEL and cancel.node_ids == ()
    assert cancel.pods == tuple(f"tpu-a-{i}" for i in range(4))
    assert isinstance(cancel.reason, ScaleDown)
    assert cancel.reason.kind is ScaleDownKind.CANCEL_QUEUED
    assert decision.target == 0 and decision.reason_code == "cancel_queued"


def test_demand_back_before_the_timeout_restarts_the_wait() -> None:
    rc = cluster(tpu_group(replicas=1))
    first = _plan(rc, _queued("tpu-a"), state([head_node()]), mono_s=1000.0)
    wanted = state([head_node()], tasks=[tasks({"TPU": 4}, 1)])
    back = _plan(rc, _queued("tpu-a"), wanted, memory=first.memory, mono_s=1030.0)
    assert dict(back.memory.queued_unneeded_since) == {}
    later = _plan(rc, _queued("tpu-a"), state([head_node()]), memory=back.memory, mono_s=1070.0)
    assert later.group("tpu").deletions == ()  # type: ignore[union-attr]


def test_min_replicas_keeps_a_queued_slice() -> None:
    rc = cluster(tpu_group(replicas=1, min_replicas=1))
    memory = Memory(queued_unneeded_since={"tpu-a": 0.0})
    result = _plan(rc, _queued("tpu-a"), state([head_node()]), memory=memory, mono_s=1000.0)
    decision = result.group("tpu")
    assert decision is not None and decision.deletions == ()
    assert [r.kind for r in decision.reasons if isinstance(r, Keep)] == [KeepKind.MIN_REPLICAS]


def test_the_cancel_passes_the_deletion_gate_with_no_drain_through_decide() -> None:
    rc = cluster(tpu_group(replicas=1))
    pods = _queued("tpu-a")
    observed = Observation.parse(
        rc, pods, RayObservation(state([head_node()]), 0.0, cluster_id="c")
    )
    memory = Memory(queued_unneeded_since={"tpu-a": 0.0})
    decision = decide(observed, memory, Policy(), NOW, mono_s=1000.0)
    assert decision.blocked == ()
    assert not any(isinstance(w, (Drain, RecordIntent)) for w in decision.writes)
    [patch] = decision.writes
    assert isinstance(patch, Patch)
    after = jsonpatch.apply_patch(rc, ops_json(patch.ops), in_place=False)
    spec = after["spec"]["workerGroupSpecs"][0]
    assert spec["replicas"] == 0
    assert spec["scaleStrategy"]["workersToDelete"] == [f"tpu-a-{i}" for i in range(4)]


def test_ray_status_shows_queued_pods_as_queued_not_launching() -> None:
    result = _plan(cluster(tpu_group(replicas=1)), _queued("tpu-a"), state([head_node()]))
    report = report_from_plan(result, int(NOW.timestamp()))
    assert [p.pod_name for p in report.pending_pods] == [f"tpu-a-{i}" for i in range(4)]
    assert all(p.detail.startswith("queued in Kueue") for p in report.pending_pods)
    assert report.launching == () and report.failed == ()


def test_the_debug_document_says_queued_and_for_how_long() -> None:
    result = _plan(cluster(tpu_group(replicas=1)), _queued("tpu-a"), state([head_node()]))
    [doc] = result.summary()["groups"][0]["slices"]
    assert doc["state"] == "queued" and doc["gates"] == [KUEUE_ELASTIC_GATE]
    assert doc["queued_s"] >= SIXTEEN_MIN


@settings(max_examples=60)
@given(
    ages=st.lists(st.floats(min_value=0, max_value=7200), min_size=1, max_size=4),
    unneeded_for=st.lists(st.floats(min_value=0, max_value=600), min_size=4, max_size=4),
    demand=st.integers(min_value=0, max_value=20),
    min_replicas=st.integers(min_value=0, max_value=4),
)
def test_queued_slices_are_never_replaced_and_only_cancelled_undrained_and_unneeded(
    ages: list[float], unneeded_for: list[float], demand: int, min_replicas: int
) -> None:
    """Invariant: whatever their age, queued slices are never replaced; a cancel names only
    queued slices' never-run pods, drains nothing, passes the gate, and never goes below
    minReplicas; while demand needs every queued slice none is cancelled."""
    keys = [f"tpu-{i}" for i in range(len(ages))]
    pods = [p for k, age in zip(keys, ages, strict=False) for p in _queued(k, age_s=age)]
    replicas = max(len(keys), min_replicas)
    rc = cluster(tpu_group(replicas=replicas, min_replicas=min_replicas))
    ray = state([head_node()], tasks=[tasks({"TPU": 4}, demand)] if demand else [])
    mono = 10_000.0
    memory = Memory(
        queued_unneeded_since={k: mono - s for k, s in zip(keys, unneeded_for, strict=False)}
    )
    result = _plan(rc, pods, ray, memory=memory, mono_s=mono)
    decision = result.group("tpu")
    assert decision is not None
    assert not any(x.kind is DeleteKind.REPLACE for x in decision.deletions)
    cancels = [x for x in decision.deletions if x.kind is DeleteKind.CANCEL]
    assert all(x.node_ids == () and x.slice_key in keys for x in cancels)
    assert decision.target >= min_replicas
    if demand >= 4 * len(keys):
        assert cancels == []
    spec = parse_raycluster(rc)
    hosts, _ = parse_pods(pods, spec)
    ev = evidence_for(hosts, ray, None, 180.0, NOW)
    gated, blocked = gate(result, ev, frozenset(), NOW_S)
    assert blocked == ()
    assert gated.group("tpu") == decision


def test_a_head_pod_still_needs_no_gate() -> None:
    """Head and worker pods without gates parse with none (no field invented)."""
    spec = parse_raycluster(cluster(tpu_group()))
    host = parse_pod(pod("rc-head", "headgroup", head=True), spec)
    assert isinstance(host, Host) and host.gates == ()


def test_debug_slices_page_shows_the_slice_queued_in_kueue() -> None:
    result = _plan(cluster(tpu_group(replicas=1)), _queued("tpu-a"), state([head_node()]))
    page = render_slices(result.summary())
    assert "<span class='state queued'>queued</span>" in page
    assert "queued in Kueue (gate kueue.x-k8s.io/elastic-job) for 16 min" in page


def test_no_cancel_timer_runs_while_rays_view_settles() -> None:
    """After a GCS restart or a blind spell a reply may lack the demand for a moment: the
    timers restart once Ray's view has settled (HostClock.settling), nothing is cancelled."""
    rc = cluster(tpu_group(replicas=1))
    spec = parse_raycluster(rc)
    hosts, _ = parse_pods(_queued("tpu-a"), spec)
    clock = replace(HostClock.from_timestamps(hosts, {}, NOW), settling="GCS restarted: settling")
    snap = Snapshot(spec=spec, hosts=tuple(hosts), clock=clock)
    memory = Memory(queued_unneeded_since={"tpu-a": 0.0})
    result = plan(snap, state([head_node()]), memory, Policy(), NOW, mono_s=1000.0)
    assert result.group("tpu").deletions == ()  # type: ignore[union-attr]
    assert dict(result.memory.queued_unneeded_since) == {}


def test_a_queued_slice_short_of_hosts_still_counts_whole() -> None:
    """KubeRay creates the rest of its pods (gated too): it serves 4 hosts' demand, not 2."""
    ray = state([head_node()], tasks=[tasks({"TPU": 4}, 4)])
    result = _plan(cluster(tpu_group(replicas=1)), _queued("tpu-a", hosts=2), ray)
    assert result.group("tpu").target == 1  # type: ignore[union-attr]
