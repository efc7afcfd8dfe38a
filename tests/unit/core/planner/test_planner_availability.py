"""Group availability and fallback between slice types, on `plan` and `decide`."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import jsonpatch
import pytest

from kuberay_scaler.core.decision import Observation, decide
from kuberay_scaler.core.model.availability import (
    Availability,
    ChangeKind,
    GroupAvailability,
    UnavailableCause,
)
from kuberay_scaler.core.model.hosts import Host
from kuberay_scaler.core.model.labels import ANNOTATION_MAX_PROVISION
from kuberay_scaler.core.model.plan import DeleteKind, Fallback, Memory, Plan
from kuberay_scaler.core.model.ray import (
    Bundle,
    LabelConstraint,
    LabelSelector,
    RayObservation,
    RayState,
    TaskDemand,
)
from kuberay_scaler.core.model.reasons import (
    FellBack,
    HoldKind,
    ScaleDown,
    ScaleDownKind,
    Waiting,
)
from kuberay_scaler.core.model.signals import CapacityEvent, CapacitySignal
from kuberay_scaler.core.parse.pods import parse_pod, parse_pods, slim_pod
from kuberay_scaler.core.parse.raycluster import parse_raycluster
from kuberay_scaler.core.patch.ops import ops_json
from kuberay_scaler.core.planner.gate import evidence_for, pod_blocker
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
    snapshot_of,
    state,
    tasks,
    tpu_group,
    tpu_slice_nodes,
)

MONO = 5_000.0  # the daemon's monotonic reading at NOW


def _groups(v6e_replicas: int = 0, v5e_replicas: int = 0, **v6e: Any) -> dict[str, Any]:
    """The issue's cluster: v6e-16 (priority 10) and v5litepod-16 (priority 0)."""
    return cluster(
        tpu_group("v6e", replicas=v6e_replicas, priority=10, **v6e),
        tpu_group("v5e", replicas=v5e_replicas, accelerator="tpu-v5-lite-podslice", topology="4x4"),
    )


def _unschedulable(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pending pods the scheduler could not place, as the API shows them."""
    for p in pods:
        p["spec"].pop("nodeName", None)
        p["status"] = {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/3 nodes are available: 3 node(s) didn't match selector.",
                }
            ],
        }
    return pods


def _stuck_v6e(age_s: float = 100) -> list[dict[str, Any]]:
    return _unschedulable(slice_pods("v6e", "v6e-a", 4, phase="Pending", age_s=age_s))


def _demand() -> RayState:
    return state([head_node()], [tasks({"TPU": 4}, 4)])


def _plan(
    rc: dict[str, Any],
    pods: list[dict[str, Any]],
    ray: RayState,
    memory: Memory | None = None,
    *,
    mono_s: float = MONO,
    at: float = 0.0,
    events: tuple[CapacityEvent, ...] = (),
    policy: Policy | None = None,
) -> Plan:
    """`plan` `at` seconds after NOW (pods keep their ages as of NOW: the daemon's clock)."""
    now = NOW + timedelta(seconds=at)
    snap = snapshot_of(rc, pods)
    return plan(
        snap,
        ray,
        memory or Memory(),
        policy or Policy(),
        now,
        mono_s=mono_s + at,
        events=events,
    )


def _stockout(pod: str = "v6e-a-0", at_ms: int = NOW_MS - 5_000) -> CapacityEvent:
    return CapacityEvent(
        signal=CapacitySignal.STOCKOUT,
        source="cluster-autoscaler",
        reason="FailedScaleUp",
        message="Node scale up in zones us-central2-b associated with this pod failed:"
        " GCE out of resources. Pod is at risk of not being scheduled.",
        last_seen_ms=at_ms,
        pod=pod,
    )


def _targets(result: Plan) -> dict[str, int]:
    return {g.group: g.target for g in result.groups}


def _decision(result: Plan, name: str) -> Any:
    decision = result.group(name)
    assert decision is not None
    return decision


# ---- the first scenario -------------------------------------------------------------


def test_priority_first_while_nothing_is_known() -> None:
    result = _plan(_groups(), [], _demand())
    assert _targets(result) == {"v6e": 1, "v5e": 0}
    assert result.fallbacks == ()


def test_unschedulable_alone_is_only_suspect_while_the_autoscaler_may_be_adding_a_node() -> None:
    result = _plan(_groups(v6e_replicas=1), _stuck_v6e(), _demand())
    assert _targets(result) == {"v6e": 1, "v5e": 0}
    assert not _decision(result, "v6e").deletions
    assert result.memory.availability["v6e"].state is Availability.SUSPECT


def test_stockout_cancels_the_stuck_slice_and_moves_the_demand_to_v5e() -> None:
    # Issue 29, scenario 1: v6e stuck Unschedulable, the cluster-autoscaler's scale-up failed
    # (GCE out of resources): the stuck v6e slice is cancelled, not replaced, and v5e opens.
    result = _plan(_groups(v6e_replicas=1), _stuck_v6e(), _demand(), events=(_stockout(),))
    v6e, v5e = _decision(result, "v6e"), _decision(result, "v5e")
    (cancel,) = v6e.deletions
    assert cancel.kind is DeleteKind.CANCEL
    assert sorted(cancel.pods) == [f"v6e-a-{i}" for i in range(4)]
    assert cancel.node_ids == ()  # never ran: nothing to drain
    assert (v6e.target, v5e.target) == (0, 1)
    assert result.fallbacks == (Fallback("v6e", "v5e", "stockout", 1),)
    assert [type(r) for r in v5e.reasons if isinstance(r, FellBack)] == [FellBack]
    a = result.memory.availability["v6e"]
    assert (a.state, a.cause, a.until_mono) == (
        Availability.UNAVAILABLE,
        UnavailableCause.STOCKOUT,
        MONO + 180,
    )
    (change,) = result.availability_changes
    assert (change.group, change.kind, change.backoff_s) == ("v6e", ChangeKind.MARKED, 180)
    assert "GCE out of resources" in str(change)
    assert result.next_probe_s == {"v6e": 180}


def test_the_cancel_passes_the_deletion_gate_without_a_drain() -> None:
    rc, pods = _groups(v6e_replicas=1), _stuck_v6e()
    gcs = RayObservation(state=_demand(), observed_at=0.0)
    observed = Observation.parse(raycluster=rc, pods=pods, gcs=gcs, capacity_events=(_stockout(),))
    decision = decide(observed, Memory(), Policy(), NOW, mono_s=MONO)
    assert decision.blocked == ()
    assert decision.drains == ()  # pods that never ran need no drain
    patch = decision.patch
    assert patch is not None
    applied = jsonpatch.apply_patch(rc, ops_json(patch.ops))
    v6e, v5e = applied["spec"]["workerGroupSpecs"]
    assert v6e["replicas"] == 0
    assert sorted(v6e["scaleStrategy"]["workersToDelete"]) == [f"v6e-a-{i}" for i in range(4)]
    assert v5e["replicas"] == 1


def test_the_gate_allows_exactly_pods_that_never_ran() -> None:
    spec = parse_raycluster(_groups(v6e_replicas=1))
    running = slice_pods("v6e", "v6e-b", 4)  # ran: a Ray node each
    stuck = _stuck_v6e()
    hosts, problems = parse_pods([*running, *stuck], spec)
    assert problems == []
    ray = state([head_node(), *tpu_slice_nodes("v6e-b", 4, group_name="v6e")])
    ev = evidence_for(tuple(hosts), ray, None, 180.0, NOW)
    for p in stuck:
        assert pod_blocker(p["metadata"]["name"], "v6e-a", ev, frozenset(), NOW_S) is None
    for p in running:
        assert pod_blocker(p["metadata"]["name"], "v6e-b", ev, frozenset(), NOW_S) is not None


def test_a_triggered_scale_up_newer_than_the_failure_keeps_it_suspect() -> None:
    # The node-level autoscaler is trying its own fallbacks: never fight it.
    triggered = CapacityEvent(
        CapacitySignal.SCALE_UP_TRIGGERED,
        "cluster-autoscaler",
        "TriggeredScaleUp",
        "pod triggered scale-up: [{tpu-pool-b 0->4 (max: 8)}]",
        NOW_MS - 1_000,
        pod="v6e-a-1",
    )
    events = (_stockout(at_ms=NOW_MS - 5_000), triggered)
    result = _plan(_groups(v6e_replicas=1), _stuck_v6e(), _demand(), events=events)
    assert result.memory.availability["v6e"].state is Availability.SUSPECT
    assert _targets(result) == {"v6e": 1, "v5e": 0}
    assert not _decision(result, "v6e").deletions


def test_not_triggered_then_unschedulable_for_the_grace_is_unavailable() -> None:
    refused = CapacityEvent(
        CapacitySignal.NO_SCALE_UP,
        "cluster-autoscaler",
        "NotTriggerScaleUp",
        "pod didn't trigger scale-up: 2 node(s) didn't match Pod's node affinity/selector",
        NOW_MS - 2_000,
        pod="v6e-a-0",
    )
    rc, pods = _groups(v6e_replicas=1), _stuck_v6e()
    first = _plan(rc, pods, _demand(), events=(refused,))
    assert first.memory.availability["v6e"].state is Availability.SUSPECT
    early = _plan(rc, pods, _demand(), first.memory, at=30, events=(refused,))
    assert early.memory.availability["v6e"].state is Availability.SUSPECT
    late = _plan(rc, pods, _demand(), early.memory, at=61, events=(refused,))
    a = late.memory.availability["v6e"]
    assert (a.state, a.cause) == (Availability.UNAVAILABLE, UnavailableCause.UNSCHEDULABLE)
    assert _targets(late) == {"v6e": 0, "v5e": 1}


def test_the_groups_own_provisioning_deadline_without_any_event() -> None:
    # Drop-in mode (KubeRay's Role reads no Events): the deadline is the last resort.
    template = {"metadata": {"annotations": {ANNOTATION_MAX_PROVISION: "120"}}}
    rc = _groups(v6e_replicas=1)
    rc["spec"]["workerGroupSpecs"][0]["template"].update(template)
    before = _plan(rc, _stuck_v6e(age_s=100), _demand())
    assert _targets(before) == {"v6e": 1, "v5e": 0}
    after = _plan(rc, _stuck_v6e(age_s=130), _demand(), before.memory, at=30)
    a = after.memory.availability["v6e"]
    assert a.cause is UnavailableCause.PROVISIONING_DEADLINE
    assert _targets(after) == {"v6e": 0, "v5e": 1}
    assert [x.kind for x in _decision(after, "v6e").deletions] == [DeleteKind.CANCEL]


def test_the_provisioning_deadline_is_a_wake_up() -> None:
    # Nothing else may change before it passes (KubeRay's Role: no Events); the loop must plan
    # again then, not at its next resync (bench_fallback: deadline + 10.4 s, on the resync).
    template = {"metadata": {"annotations": {ANNOTATION_MAX_PROVISION: "120"}}}
    rc = _groups(v6e_replicas=1)
    rc["spec"]["workerGroupSpecs"][0]["template"].update(template)
    before = _plan(rc, _stuck_v6e(age_s=100), _demand())
    assert before.memory.availability["v6e"].state is Availability.SUSPECT
    assert before.next_wake_s == pytest.approx(20)  # 120 s deadline, 100 s old
    default = _plan(_groups(v6e_replicas=1), _stuck_v6e(age_s=100), _demand())
    assert default.next_wake_s == pytest.approx(60)  # the suspect grace, before 900 s
    late = _plan(rc, _stuck_v6e(age_s=130), _demand(), before.memory, at=30)
    assert late.memory.availability["v6e"].unavailable
    assert late.next_wake_s == late.next_idle_expiry_s == 180  # the probe, nothing else


def test_image_pull_failure_makes_the_group_unavailable() -> None:
    pods = slice_pods("v6e", "v6e-a", 4, phase="Pending", age_s=100)
    for p in pods:
        p["status"]["containerStatuses"][1]["state"] = {"waiting": {"reason": "ImagePullBackOff"}}
    result = _plan(_groups(v6e_replicas=1), pods, _demand())
    assert result.memory.availability["v6e"].cause is UnavailableCause.IMAGE
    assert _targets(result) == {"v6e": 0, "v5e": 1}


def test_replicas_without_pods_for_the_deadline_are_quota() -> None:
    rc = _groups(v6e_replicas=1)
    first = _plan(rc, [], _demand())
    assert _targets(first) == {"v6e": 1, "v5e": 0}  # asked for: KubeRay is creating them
    slow = _plan(rc, [], _demand(), first.memory, at=899)  # a slow operator is no quota
    assert _targets(slow) == {"v6e": 1, "v5e": 0}
    later = _plan(rc, [], _demand(), slow.memory, at=901)
    assert later.memory.availability["v6e"].cause is UnavailableCause.QUOTA
    assert _targets(later) == {"v6e": 0, "v5e": 1}
    v6e = _decision(later, "v6e")
    assert [r.kind for r in v6e.reasons if isinstance(r, ScaleDown)] == [
        ScaleDownKind.CANCEL_UNAVAILABLE
    ]
    assert v6e.reason_code == "cancel_unavailable"


# ---- backoff and probe ------------------------------------------------------------------------


def _marked() -> Plan:
    return _plan(_groups(v6e_replicas=1), _stuck_v6e(), _demand(), events=(_stockout(),))


def test_no_v6e_slice_is_added_before_the_backoff_ends() -> None:
    marked = _marked()
    # The cancel applied, the v5e slice launching; more demand arrives before the probe.
    more = state([head_node()], [tasks({"TPU": 4}, 8)])
    during = _plan(
        _groups(0, 1),
        slice_pods("v5e", "v5e-a", 4, phase="Pending", age_s=20),
        more,
        marked.memory,
        at=170,
    )
    assert _targets(during)["v6e"] == 0
    assert _targets(during)["v5e"] == 2
    waiting = [r for r in _decision(during, "v6e").reasons if isinstance(r, Waiting)]
    assert waiting == []  # it fell back; nothing waits on v6e


def test_after_the_backoff_one_slice_probes_and_its_coming_up_makes_it_available() -> None:
    marked = _marked()
    more = state([head_node()], [tasks({"TPU": 4}, 12)])
    probe = _plan(_groups(0, 1), [], more, marked.memory, at=181)
    assert probe.memory.availability["v6e"].probing
    assert [c.kind for c in probe.availability_changes] == [ChangeKind.PROBE]
    assert _targets(probe) == {"v6e": 1, "v5e": 2}  # one probe slice, the rest falls back
    up = slice_pods("v6e", "v6e-p", 4, age_s=30, running_for_s=20)
    nodes = [head_node(), *tpu_slice_nodes("v6e-p", 4, group_name="v6e")]
    back = _plan(_groups(1, 2), up, state(nodes), probe.memory, at=240)
    assert back.memory.availability["v6e"].state is Availability.AVAILABLE
    assert [c.kind for c in back.availability_changes] == [ChangeKind.RECOVERED]
    assert back.memory.availability["v6e"].failures == 0


def test_a_failed_probe_doubles_the_backoff() -> None:
    marked = _marked()
    probe = _plan(_groups(0, 1), [], _demand(), marked.memory, at=181)
    stuck = _stuck_v6e(age_s=10)
    again = (_stockout(at_ms=NOW_MS + 200_000),)
    failed = _plan(_groups(1, 1), stuck, _demand(), probe.memory, at=200, events=again)
    a = failed.memory.availability["v6e"]
    assert (a.state, a.failures) == (Availability.UNAVAILABLE, 2)
    assert a.until_mono == MONO + 200 + 360
    assert [c.kind for c in failed.availability_changes] == [ChangeKind.PROBE_FAILED]
    assert [x.kind for x in _decision(failed, "v6e").deletions] == [DeleteKind.CANCEL]


def test_an_old_failure_event_never_marks_a_recovered_group_again() -> None:
    marked = _marked()
    recovered = replace(
        marked.memory,
        availability={
            "v6e": GroupAvailability(
                seen_failure_ms=marked.memory.availability["v6e"].seen_failure_ms
            )
        },
    )
    result = _plan(_groups(1), _stuck_v6e(), _demand(), recovered, at=400, events=(_stockout(),))
    assert result.memory.availability["v6e"].state is not Availability.UNAVAILABLE


# ---- Ray's order: ordered label selectors ---------------------------------------------------


def _prefers(*pod_types: str) -> Bundle:
    """A bundle whose label selectors are tried in order (Ray's fallback_strategy)."""
    selectors = tuple(
        LabelSelector((LabelConstraint("ray.io/tpu-pod-type", frozenset([t])),)) for t in pod_types
    )
    return Bundle(resources={"TPU": 4}, selectors=selectors)


def test_the_first_matching_selector_wins_over_group_priority() -> None:
    # Issue 29, scenario 2: [v5litepod-16, v6e-16] opens v5e, as Ray v2 does.
    ray = state([head_node()], [TaskDemand(_prefers("v5litepod-16", "v6e-16"), 4)])
    assert _targets(_plan(_groups(), [], ray)) == {"v6e": 0, "v5e": 1}
    ray = state([head_node()], [TaskDemand(_prefers("v6e-16", "v5litepod-16"), 4)])
    assert _targets(_plan(_groups(), [], ray)) == {"v6e": 1, "v5e": 0}


def test_ordered_selectors_fall_back_to_the_second_when_the_first_is_unavailable() -> None:
    ray = state([head_node()], [TaskDemand(_prefers("v6e-16", "v5litepod-16"), 4)])
    result = _plan(_groups(v6e_replicas=1), _stuck_v6e(), ray, events=(_stockout(),))
    assert _targets(result) == {"v6e": 0, "v5e": 1}


# ---- pinned demand ----------------------------------------------------------------------------


def test_demand_pinned_to_the_unavailable_group_waits_and_says_so() -> None:
    pinned = selector_bundle({"TPU": 4}, {"ray.io/tpu-pod-type": "v6e-16"})
    ray = state([head_node()], [TaskDemand(pinned, 4)])
    result = _plan(_groups(v6e_replicas=1), _stuck_v6e(), ray, events=(_stockout(),))
    assert _targets(result) == {"v6e": 0, "v5e": 0}
    (waiting,) = [r for r in _decision(result, "v6e").reasons if isinstance(r, Waiting)]
    assert waiting.blocked.kind is HoldKind.GROUP_UNAVAILABLE
    assert waiting.blocked.until == NOW + timedelta(seconds=180)
    assert "stockout" in str(waiting)


# ---- parse and transform ----------------------------------------------------------------------


def test_slim_pod_keeps_what_judges_a_pod_unschedulable() -> None:
    spec = parse_raycluster(_groups(v6e_replicas=1))
    for p in _stuck_v6e():
        host = parse_pod(slim_pod(p), spec)
        assert host == parse_pod(p, spec)
        assert isinstance(host, Host) and host.detail == "Unschedulable"


# ---- what the user reads ----------------------------------------------------------------------


def test_the_morning_log_line_says_what_happened() -> None:
    from kuberay_scaler.loop.record import capacity_lines

    result = _plan(_groups(v6e_replicas=1), _stuck_v6e(), _demand(), events=(_stockout(),))
    ((line, change),) = capacity_lines(result)
    assert change.kind is ChangeKind.MARKED
    assert line.startswith("v6e unavailable (stockout): Node scale up in zones")
    assert "(cluster-autoscaler, 11:59:55)" in line  # the Event's own time
    assert "; 1 pending slice(s) cancelled; demand → v5e; v6e probed again at 12:03:00" in line


def test_debug_documents_show_availability_and_the_next_probe() -> None:
    from kuberay_scaler.adapters.web.slices_page import render_slices

    result = _plan(_groups(v6e_replicas=1), _stuck_v6e(), _demand(), events=(_stockout(),))
    doc = result.summary()
    v6e = next(g for g in doc["groups"] if g["name"] == "v6e")
    assert v6e["availability"]["state"] == "unavailable"
    assert v6e["availability"]["cause"] == "stockout"
    assert v6e["availability"]["next_probe_at"] == "2026-11-30T12:03:00+00:00"
    assert doc["fallbacks"] == [{"from": "v6e", "to": "v5e", "cause": "stockout", "slices": 1}]
    page = render_slices(doc)
    assert "avail-unavailable" in page and "next probe at 2026-11-30T12:03:00+00:00" in page


def test_ray_status_shows_the_unavailable_group_with_its_cause() -> None:
    from kuberay_scaler.loop.report import report_from_plan

    result = _plan(_groups(v6e_replicas=1), _stuck_v6e(), _demand(), events=(_stockout(),))
    report = report_from_plan(result, NOW_MS // 1000)
    (failed,) = [f for f in report.failed if f.group == "v6e"]
    assert "unavailable (stockout)" in failed.reason and "demand → v5e" in failed.reason
    assert failed.started_at_s == (NOW_MS - 5_000) // 1000  # when the autoscaler said so
    assert [p.group for p in report.pending_pods] == []  # the cancelled pods are not pending
    assert {g.group for g in report.launching} == {"v5e"}


def test_the_probe_is_a_wake_up() -> None:
    result = _plan(_groups(v6e_replicas=1), _stuck_v6e(), _demand(), events=(_stockout(),))
    assert result.next_idle_expiry_s == 180


async def test_the_recorder_sets_the_gauges_counts_fallbacks_and_sends_one_event() -> None:
    import asyncio

    from kuberay_scaler.core.model.outcome import PatchOutcome
    from kuberay_scaler.loop.execute import Executed
    from kuberay_scaler.loop.health import Outcome, Progress
    from kuberay_scaler.loop.reconcile_report import Attempt, Carried, ReconcileReport, Seen
    from kuberay_scaler.loop.record import Recorder
    from kuberay_scaler.runtime.metrics import Metrics
    from tests.control.fakes import FakeEvents

    rc, pods = _groups(v6e_replicas=1), _stuck_v6e()
    gcs = RayObservation(state=_demand(), observed_at=0.0)
    observed = Observation.parse(raycluster=rc, pods=pods, gcs=gcs, capacity_events=(_stockout(),))
    decision = decide(observed, Memory(), Policy(), NOW, mono_s=MONO)
    metrics = Metrics()

    def sample(name: str, **labels: str) -> float | None:
        return metrics.sample(name, labels)

    before = sample(
        "kuberay_scaler_fallbacks_total", **{"from": "v6e", "to": "v5e", "cause": "stockout"}
    )
    events = FakeEvents()
    recorder = Recorder(events, Progress(0.0, 60.0, 3), metrics=metrics)
    applied = Executed(decision.plan, PatchOutcome("applied"), "patch")
    attempt = Attempt(Seen(), decision, Carried.SENT, applied)
    recorder.record(ReconcileReport(Outcome.done("applied"), (attempt,)))
    for _ in range(1000):  # sent in the background: the unavailable Event and one per group
        if len(events.recorded) >= 3:
            break
        await asyncio.sleep(0)
    assert len(events.recorded) == 3
    assert sample("kuberay_scaler_group_available", group="v6e", cause="stockout") == 0
    assert sample("kuberay_scaler_group_available", group="v5e", cause="none") == 1
    after = sample(
        "kuberay_scaler_fallbacks_total", **{"from": "v6e", "to": "v5e", "cause": "stockout"}
    )
    assert (after or 0) - (before or 0) == 1
    reasons = [r for r, _ in events.recorded]
    assert reasons.count("GroupUnavailable") == 1
    (text,) = [m for r, m in events.recorded if r == "GroupUnavailable"]
    assert "demand → v5e" in text


def test_a_probe_refused_by_the_autoscaler_fails_after_the_grace() -> None:
    marked = _marked()
    probe = _plan(_groups(0, 1), [], _demand(), marked.memory, at=181)
    refused = CapacityEvent(
        CapacitySignal.NO_SCALE_UP,
        "cluster-autoscaler",
        "NotTriggerScaleUp",
        "pod didn't trigger scale-up: 1 max node group size reached",
        NOW_MS + 190_000,
        pod="v6e-a-0",
    )
    stuck, rc = _stuck_v6e(age_s=10), _groups(1, 1)
    early = _plan(rc, stuck, _demand(), probe.memory, at=200, events=(refused,))
    assert early.memory.availability["v6e"].probing
    late = _plan(rc, stuck, _demand(), early.memory, at=242, events=(refused,))
    a = late.memory.availability["v6e"]
    assert (a.cause, a.failures, a.probing) == (UnavailableCause.UNSCHEDULABLE, 2, False)


def test_kuberays_failed_to_create_event_is_quota_at_once() -> None:
    failed = CapacityEvent(
        CapacitySignal.QUOTA,
        "raycluster-controller",
        "FailedToCreateWorkerPod",
        'Failed to create worker Pod default/rc-v6e-x, pods "rc-v6e-x" is forbidden: exceeded'
        " quota: tpu-quota, requested: google.com/tpu=4, used: google.com/tpu=16,"
        " limited: google.com/tpu=16",
        NOW_MS - 1_000,
        group="v6e",
    )
    result = _plan(_groups(v6e_replicas=1), [], _demand(), events=(failed,))
    assert result.memory.availability["v6e"].cause is UnavailableCause.QUOTA
    assert _targets(result) == {"v6e": 0, "v5e": 1}


def test_the_stage_is_pure_and_returns_frozen_values() -> None:
    from types import MappingProxyType

    from kuberay_scaler.core.planner.availability import AvailabilityPolicy, judge_availability
    from kuberay_scaler.core.slicemap import build_slice_map

    snap = snapshot_of(_groups(v6e_replicas=1), _stuck_v6e())
    slice_map = build_slice_map(snap.spec, snap.hosts, _demand(), NOW)
    previous: dict[str, GroupAvailability] = {}
    args = (slice_map, (_stockout(),), previous, AvailabilityPolicy(), MONO)
    first, again = judge_availability(*args), judge_availability(*args)
    assert first == again and previous == {}  # same values in, same values out; input untouched
    assert isinstance(first.groups, MappingProxyType)
    assert first.groups["v6e"].cause is UnavailableCause.STOCKOUT
    assert first.groups["v5e"].state is Availability.AVAILABLE
    assert [c.group for c in first.changes] == ["v6e"]


def test_the_deadline_annotation_parses_or_names_the_group_as_a_problem() -> None:
    rc = _groups()
    meta = {"annotations": {ANNOTATION_MAX_PROVISION: "300"}}
    rc["spec"]["workerGroupSpecs"][0]["template"]["metadata"] = meta
    spec = parse_raycluster(rc)
    v6e = spec.group("v6e")
    assert v6e is not None and v6e.max_provision_s == 300
    for bad in ("0", "-5", "soon", "nan", "inf"):
        meta["annotations"][ANNOTATION_MAX_PROVISION] = bad
        spec = parse_raycluster(rc)
        assert spec.group("v6e") is None and spec.group("v5e") is not None
        assert any(ANNOTATION_MAX_PROVISION in p.message for p in spec.problems)


def test_an_unavailable_group_with_a_write_in_flight_never_holds_demand() -> None:
    # Our cancel of v6e is not observed yet; demand preferring v6e first must still go on.
    marked = _marked()
    memory = replace(marked.memory, awaiting_write={"v6e": "cancel in flight"})
    ray = state([head_node()], [TaskDemand(_prefers("v6e-16", "v5litepod-16"), 8)])
    result = _plan(_groups(1, 1), _stuck_v6e(), ray, memory, at=5)
    assert _targets(result)["v5e"] == 2


def test_a_group_whose_planning_raises_keeps_its_backoff(monkeypatch: Any) -> None:
    from kuberay_scaler.core.planner import groups as planner_groups
    from kuberay_scaler.core.planner.shapes import slice_shape as real

    marked = _marked()

    def fragile(g: Any) -> Any:
        if g.name == "v6e":
            raise ZeroDivisionError("a bug only this group's numbers reach")
        return real(g)

    monkeypatch.setattr(planner_groups, "slice_shape", fragile)
    result = _plan(_groups(0, 1), [], _demand(), marked.memory, at=10)
    assert result.memory.availability["v6e"] == marked.memory.availability["v6e"]
