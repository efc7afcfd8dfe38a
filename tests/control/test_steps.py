"""The loop's steps alone, each without a Reconciler: execute (with the fakes), record (the
Recorder), and the pieces the Reconciler sequences (the memory kept after the writes, the write
backoff, how a reconcile ends, drain errors, the schedule, the report to Ray).

Every execute test asserts the invariant, not just the path: no slice is deleted unless every
host of it accepted its drain, targets stay within [min, max], and one slice's failed drain
stops nobody else's writes.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from types import MappingProxyType
from typing import Any

import pytest

from kuberay_scaler.core.backoff import Backoff
from kuberay_scaler.core.decision import Decision, Observation, decide
from kuberay_scaler.core.model.outcome import PatchOutcome
from kuberay_scaler.core.model.plan import Memory
from kuberay_scaler.core.model.reasons import KeepKind
from kuberay_scaler.core.patch.ops import ops_json
from kuberay_scaler.core.planner.gate import Blocked
from kuberay_scaler.core.planner.policy import Policy
from kuberay_scaler.loop import reconciler as reconciler_module
from kuberay_scaler.loop.execute import Executed, WriteBackoff, execute
from kuberay_scaler.loop.health import DrainErrors, Outcome, Progress, Step
from kuberay_scaler.loop.reconcile_report import Attempt, Carried, ReconcileReport, Seen
from kuberay_scaler.loop.record import Recorder
from kuberay_scaler.loop.report import report_for
from kuberay_scaler.loop.trigger import MIN_WAKE_S, WAKE_MARGIN_S, Schedule
from kuberay_scaler.runtime.metrics import Metrics
from tests.control.fakes import (
    FakeApiServer,
    FakeEvents,
    FakeFeed,
    FakeGcs,
    FakeView,
    FakeWriter,
    make_loop,
    observation,
)
from tests.control.worlds import drain_busy_and_scale_up
from tests.factories import NOW, NOW_S, node_id_of

TPU_A = ("tpu", "tpu-a")  # the scenario's idle slice (tpu-b is busy; CPU demand wants 2 hosts)


def _decision(rc: dict[str, Any], pods: list[dict[str, Any]], reply: Any) -> Decision:
    gcs = observation(reply, cluster_id="cluster-1")
    return decide(Observation.parse(raycluster=rc, pods=pods, gcs=gcs), Memory(), Policy(), NOW)


class World:
    """The scenario's decision and the fakes `execute` talks to."""

    def __init__(self) -> None:
        rc, self.pods, reply = drain_busy_and_scale_up()
        self.decision = _decision(rc, self.pods, reply)
        self.server = FakeApiServer(rc)
        self.view, self.writer = FakeView(self.server), FakeWriter(self.server)
        self.gcs, self.feed = FakeGcs(fresh=reply), FakeFeed()

    async def execute(self) -> Executed:
        return await execute(
            self.decision, writer=self.writer, gcs=self.gcs, feed=self.feed, view=self.view
        )

    def deleted(self) -> set[str]:
        tpu = self.server.obj["spec"]["workerGroupSpecs"][0]
        return set((tpu.get("scaleStrategy") or {}).get("workersToDelete") or [])

    def replicas(self) -> tuple[int, int]:
        tpu, cpu = self.server.obj["spec"]["workerGroupSpecs"]
        return tpu["replicas"], cpu["replicas"]

    def assert_only_drained_slices_deleted(self) -> None:
        accepted = {d.node_id for d in self.gcs.drains} - self.gcs.refuse - self.gcs.fail
        for pod in self.deleted():
            assert node_id_of(pod) in accepted, f"{pod} deleted without an accepted drain"
        for group in self.server.obj["spec"]["workerGroupSpecs"]:
            assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]


async def test_execute_records_drains_then_patches_what_the_decision_says() -> None:
    world = World()
    done = await world.execute()

    assert done.applied and done.step == "patch" and not done.replan
    record, patch = world.decision.record, world.decision.patch
    assert record is not None and patch is not None
    assert [c.ops for c in world.writer.calls] == [ops_json(record.ops), ops_json(patch.ops)]
    (drain,) = world.decision.drains
    assert sorted(world.gcs.drained) == sorted(drain.node_ids)
    assert {d.cluster_id for d in world.gcs.drains} == {"cluster-1"}  # pinned to the plan's GCS
    assert done.answered == {TPU_A} and not done.refused and not done.drain_errors
    assert world.deleted() == {f"tpu-a-{i}" for i in range(4)}
    assert world.replicas() == (1, 2)
    assert world.feed.polls_asked == 1  # a poll soon after the drains
    world.assert_only_drained_slices_deleted()


async def test_execute_keeps_a_slice_whose_drain_is_refused_and_still_scales_the_rest() -> None:
    world = World()
    world.gcs.refuse = {node_id_of(f"tpu-a-{i}") for i in range(4)}
    done = await world.execute()

    assert done.applied and done.refused == {TPU_A}
    assert world.deleted() == set() and world.replicas() == (2, 2)  # kept; CPU still scaled up
    assert TPU_A[1] in done.plan.memory.refused  # its drain backs off
    world.assert_only_drained_slices_deleted()


async def test_execute_drain_that_errs_is_a_drain_error_and_stops_no_other_write() -> None:
    world = World()
    world.gcs.fail = {node_id_of("tpu-a-0")}
    done = await world.execute()

    assert done.applied and done.drain_errors == {TPU_A} and TPU_A in done.answered
    assert world.replicas()[1] == 2  # the CPU scale-up went
    world.assert_only_drained_slices_deleted()


async def test_execute_stale_record_asks_for_a_replan_and_drains_nothing() -> None:
    world = World()
    world.writer.answer(409)
    done = await world.execute()

    assert done.replan and done.step == "record" and not done.applied
    assert world.gcs.drains == [] and len(world.writer.calls) == 1
    world.assert_only_drained_slices_deleted()


async def test_execute_record_write_that_fails_keeps_its_slices_and_sends_the_rest() -> None:
    world = World()
    world.writer.answer(500)
    done = await world.execute()

    assert done.record_failed is not None and done.record_failed.kind == "transient"
    assert done.applied and world.gcs.drains == []  # nothing drained without the record
    assert world.deleted() == set() and world.replicas() == (2, 2)
    world.assert_only_drained_slices_deleted()


# --- the memory kept after the writes ------------------------------------------------------------


async def test_remembered_keeps_the_plans_memory_once_applied() -> None:
    world = World()
    done = await world.execute()
    kept = done.remembered(Memory())
    assert kept.awaiting_write == {} and kept.draining == {}
    assert kept.preempting == done.plan.memory.preempting
    assert kept.refused == done.plan.memory.refused


async def test_remembered_keeps_refusals_and_drops_refused_preemptions_when_not_applied() -> None:
    world = World()
    world.gcs.refuse = {node_id_of(f"tpu-a-{i}") for i in range(4)}
    plan = (await world.execute()).plan
    deadline = NOW_S + 300  # monotonic seconds
    preempting = MappingProxyType({"tpu-a": deadline, "tpu-x": deadline})
    plan = replace(plan, memory=replace(plan.memory, preempting=preempting))
    failed = Executed(plan, PatchOutcome("transient"), refused=frozenset({TPU_A}))

    before = Memory(awaiting_write=MappingProxyType({"cpu": "waiting"}))
    kept = failed.remembered(before)
    assert dict(kept.preempting) == {"tpu-x": deadline}  # a refused slice's deadline is retried
    assert kept.refused == plan.memory.refused and TPU_A[1] in kept.refused
    assert kept.awaiting_write == before.awaiting_write  # the rest as it was


# --- the write backoff ---------------------------------------------------------------------------


def _backoff() -> WriteBackoff:
    return WriteBackoff(Backoff(initial=1.0, cap=60.0, uniform=lambda lo, hi: hi))


@pytest.mark.parametrize(
    ("outcome", "closed_for"),
    [
        (PatchOutcome("throttled", retry_after=7.0), 7.0),
        (PatchOutcome("throttled", retry_after=10_000.0), 60.0),  # capped: MAX_RETRY_AFTER_S
        (PatchOutcome("throttled"), 1.0),
        (PatchOutcome("transient"), 1.0),
        (PatchOutcome("forbidden"), 1.0),
        (PatchOutcome("gone"), 0.0),  # nothing to write to: no backoff
    ],
)
def test_write_backoff_after_a_failed_write(outcome: PatchOutcome, closed_for: float) -> None:
    backoff = _backoff()
    assert backoff.open(100.0)
    backoff.failed(outcome, 100.0)
    assert backoff.open(100.0) is (closed_for == 0)
    assert backoff.open(100.0 + closed_for)
    assert closed_for == 0 or not backoff.open(100.0 + closed_for - 0.01)


def test_write_backoff_grows_until_a_write_applies() -> None:
    backoff = _backoff()
    delays = []
    for now in (0.0, 10.0, 20.0):
        backoff.crashed(now)
        delays.append(backoff.not_before - now)
    backoff.applied()
    backoff.failed(PatchOutcome("transient"), 30.0)
    assert delays == [1.0, 2.0, 4.0] and backoff.not_before == 31.0


# --- how a reconcile ends ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "step", "cause"),
    [
        ("throttled", Step.BACKOFF, None),
        ("gone", Step.BLIND, None),
        ("transient", Step.FAILED, "patch_transient"),
        ("invalid", Step.FAILED, "patch_invalid"),
        ("forbidden", Step.FAILED, "patch_forbidden"),
    ],
)
def test_a_write_not_applied(kind: Any, step: Step, cause: str | None) -> None:
    outcome = Outcome.write_failed(PatchOutcome(kind, message="HTTP x"), "patch")
    assert (outcome.step, outcome.cause) == (step, cause)
    assert outcome.text == f"patch {kind}: HTTP x" and not outcome.achieved


def test_a_step_before_the_patch_that_failed() -> None:
    assert Outcome.step_failed(None, ()) is None
    assert Outcome.step_failed(PatchOutcome("throttled"), ()) is None  # asked to wait: no fault
    record = Outcome.step_failed(PatchOutcome("transient", message="HTTP 500"), {TPU_A})
    assert record is not None and record.cause == "record_transient"  # the record comes first
    drain = Outcome.step_failed(None, {TPU_A, ("cpu", "c-1")})
    assert drain is not None and drain.step is Step.FAILED
    assert drain.text == "drain failed for cpu/c-1, tpu/tpu-a" and drain.cause == "drain_error"


def test_blind_names_the_inputs_not_fresh() -> None:
    assert Outcome.blind(frozenset(), demand=True) is None
    held = Outcome.blind(frozenset({"pods", "gcs"}), demand=True)
    assert held is not None and held.step is Step.BLIND and held.demand
    assert held.text == "blind: gcs, pods not fresh" and not held.achieved


def test_a_drain_that_erred_is_work_not_done_until_answered_or_out_of_backoff() -> None:
    errors = DrainErrors()
    done = Outcome.done("applied")
    errors.answered({TPU_A}, {TPU_A})
    still = errors.judge(done, refused={"tpu-a"})
    assert still is not None and still.step is Step.BACKOFF and "tpu/tpu-a" in still.text
    assert errors.judge(None, refused={"tpu-a"}) is None  # a replan stays a replan
    failed = Outcome(Step.FAILED, "patch transient")
    assert errors.judge(failed, refused={"tpu-a"}) is failed  # a failure is not hidden
    errors.answered({TPU_A}, ())  # a later drain of it answered
    assert errors.judge(done, refused={"tpu-a"}) is done
    errors.answered({TPU_A}, {TPU_A})
    assert errors.judge(done, refused=set()) is done  # it left the refusal backoff


# --- the schedule --------------------------------------------------------------------------------


def test_schedule_skips_only_settled_unchanged_inputs_and_wakes_for_idle_timeouts() -> None:
    schedule = Schedule()
    assert not schedule.unchanged("a", 0.0)  # nothing settled yet
    schedule.settled("a")
    assert schedule.unchanged("a", 0.0) and not schedule.unchanged("b", 0.0)
    assert schedule.seconds_to_wake(0.0) is None
    schedule.planned(10.0, now=100.0)  # the first idle slice times out in 10 s
    assert schedule.seconds_to_wake(100.0) == pytest.approx(10.0 + WAKE_MARGIN_S)
    assert schedule.unchanged("a", 105.0) and not schedule.unchanged("a", 111.0)  # due: plan
    assert schedule.seconds_to_wake(200.0) == 0.0
    schedule.planned(-5.0, now=100.0)  # already past: never a spin
    assert schedule.seconds_to_wake(100.0) == pytest.approx(MIN_WAKE_S)
    schedule.settled(None)
    assert not schedule.unchanged("a", 100.0)


# --- the report to Ray ---------------------------------------------------------------------------


def test_report_for_a_decision_made_with_and_without_ray_state() -> None:
    rc, pods, reply = drain_busy_and_scale_up()
    report = report_for(_decision(rc, pods, reply), 1, launches_asked=True)
    assert report is not None and [g.group for g in report.launching] == ["cpu"]
    quiet = report_for(_decision(rc, pods, reply), 1, launches_asked=False)
    assert quiet is not None and quiet.launching == ()  # not written: not launching
    blind = decide(Observation.parse(raycluster=rc, pods=pods), Memory(), Policy(), NOW)
    assert report_for(blind, 1, launches_asked=True) is None


# --- record --------------------------------------------------------------------------------------


def _recorder(events: FakeEvents) -> Recorder:
    return Recorder(events, Progress(0.0, 60.0, 3), wall=lambda: NOW, metrics=Metrics())


def _applied(decision: Decision) -> Executed:
    return Executed(decision.plan, PatchOutcome("applied"), "patch")


def _said(outcome: Outcome, *attempts: Attempt, began: float = 0.0, ended: float = 0.0) -> Any:
    return ReconcileReport(outcome, attempts, began=began, ended=ended)


async def test_recorder_says_an_applied_plan_in_events_and_the_status() -> None:
    events = FakeEvents()
    recorder = _recorder(events)
    rc, pods, reply = drain_busy_and_scale_up()
    decision = _decision(rc, pods, reply)
    applied = Attempt(Seen(), decision, Carried.SENT, _applied(decision))
    recorder.record(_said(Outcome.done("applied"), applied, began=4.9, ended=5.0))
    await recorder.settle()  # Events go out in the background

    assert sorted(reason for reason, _ in events.recorded) == ["ScaledDown", "ScaledUp"]
    assert recorder.status.last_decision is decision
    assert [(d["group"], d["dry_run"]) for d in recorder.status.recent] == [
        ("tpu", False),
        ("cpu", False),
    ]
    recorder.record(_said(Outcome(Step.SKIPPED, "skipped"), began=6.0, ended=6.0))
    status = recorder.status
    assert status.reconciles == 2 and status.last_outcome == "applied"  # a skip says nothing
    assert status.progress.last_achieved == 5.0 and status.progress.health(6.0)[0]


async def test_recorder_dry_run_records_decisions_without_events() -> None:
    events = FakeEvents()
    recorder = _recorder(events)
    rc, pods, reply = drain_busy_and_scale_up()
    dry = Attempt(Seen(), _decision(rc, pods, reply), Carried.NOT_WRITTEN)
    recorder.record(_said(Outcome(Step.DRY_RUN, "dry run"), dry))
    assert events.recorded == [] and not recorder._background
    assert {d["dry_run"] for d in recorder.status.recent} == {True}


@pytest.mark.parametrize("event", [True, False], ids=["the RayCluster exists", "no object"])
async def test_recorder_says_a_target_not_served_in_an_error_line_and_an_event_where_it_can(
    event: bool,
) -> None:
    """A target not served says so in an error line, and in an Event on the
    RayCluster when there is one to attach it to (a 401/403 on the pods; not a name naming
    nothing, nor a CRD version not served)."""
    from structlog.testing import capture_logs

    events = FakeEvents()
    recorder = _recorder(events)
    problem = "pods of RayCluster default/rc: not allowed to list/watch them (HTTP 403)"
    with capture_logs() as logs:
        recorder.not_served(problem, event=event)
    await asyncio.gather(*list(recorder._background))
    assert [(x["log_level"], x["problem"]) for x in logs if x["event"] == "target not served"] == [
        ("error", problem)
    ]
    assert events.recorded == ([("TargetNotServed", problem)] if event else [])


def _blocked_count(metrics: Metrics, path: str) -> float:
    value = metrics.sample("kuberay_scaler_deletions_blocked_total", {"path": path})
    return value or 0.0


async def test_what_the_gate_dropped_is_said_by_the_recorder_when_planned_and_after_drains(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The gate's drops reach the recorder from both places it judges: the plan (the
    decision) and after the drains answered (`Executed.blocked`); execute itself counts
    nothing."""
    rc, pods, reply = drain_busy_and_scale_up()
    planned = Blocked("tpu", "tpu-a", "tpu-a-0", KeepKind.GATE_ABSENT, "test_planned")
    drained = Blocked("tpu", "tpu-a", "tpu-a-1", KeepKind.GATE_ABSENT, "test_after_drains")
    real_decide = reconciler_module.decide

    def decide_with_a_drop(*args: Any, **kwargs: Any) -> Decision:
        return replace(real_decide(*args, **kwargs), blocked=(planned,))

    async def execute_with_a_drop(decision: Decision, **kwargs: Any) -> Executed:
        return replace(await execute(decision, **kwargs), blocked=(drained,))

    monkeypatch.setattr(reconciler_module, "decide", decide_with_a_drop)
    monkeypatch.setattr(reconciler_module, "execute", execute_with_a_drop)
    loop = make_loop(rc, pods, reply)
    metrics = loop.reconciler.metrics
    before = (_blocked_count(metrics, "test_planned"), _blocked_count(metrics, "test_after_drains"))
    report = await loop.reconciler.run()
    assert report.blocked == (planned, drained)
    assert (
        _blocked_count(metrics, "test_planned"),
        _blocked_count(metrics, "test_after_drains"),
    ) == before  # not said yet
    loop.reconciler.recorder.record(report)
    after = (_blocked_count(metrics, "test_planned"), _blocked_count(metrics, "test_after_drains"))
    assert after == (before[0] + 1, before[1] + 1)
