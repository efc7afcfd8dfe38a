"""One reconcile, one report, one recorder: a report built by hand drives the metrics, the log
lines, the Events and the status the probes read; a reconcile's own report says nothing until
it is recorded; and two recorders (two `Metrics`) in one process share no state."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from kuberay_scaler.adapters.web.server import Probes, make_app
from kuberay_scaler.core.decision import Decision
from kuberay_scaler.core.patch.ops import ops_json
from kuberay_scaler.loop.execute import Executed
from kuberay_scaler.loop.handsoff import Overridden
from kuberay_scaler.loop.health import Outcome, Progress, Reading, Step
from kuberay_scaler.loop.reconcile_report import (
    Attempt,
    Carried,
    ReconcileReport,
    Recreated,
    Seen,
)
from kuberay_scaler.loop.record import Recorder
from kuberay_scaler.runtime.metrics import Metrics
from tests.control.fakes import FakeEvents, Loop, make_loop
from tests.factories import NOW, cluster, group, head_node, state, tasks

DEMAND = {"CPU": 8}


def _scale_up_loop() -> Loop:
    return make_loop(
        cluster(group("cpu", max_replicas=5)), [], state([head_node()], [tasks(DEMAND, 2)])
    )


async def _applied_scale_up() -> tuple[Decision, Executed]:
    """A real decision and what became of its writes (a scale-up, applied), from a reconcile."""
    report = await _scale_up_loop().reconciler.run()
    (attempt,) = report.attempts
    assert attempt.decision is not None and attempt.executed is not None
    assert attempt.executed.applied
    return attempt.decision, attempt.executed


def _recorder(metrics: Metrics, events: FakeEvents | None = None) -> Recorder:
    progress = Progress(0.0, 60.0, 3)
    return Recorder(
        events or FakeEvents(), progress, wall=lambda: NOW, metrics=metrics, monotonic=lambda: 10.0
    )


async def test_a_hand_built_report_drives_the_metrics_the_log_lines_the_events_and_the_status() -> (
    None
):
    decision, executed = await _applied_scale_up()
    cpu = decision.plan.group("cpu")
    assert cpu is not None and cpu.changes
    notice = Overridden("cpu", ours=2, theirs=0, count=1, hands_off_s=120.0, managers=("argocd",))
    seen = Seen({"gcs": 0.0, "pods": 3.5}, Recreated("old-uid", "new-uid"), (notice,))
    report = ReconcileReport(
        Outcome.done("applied"),
        (Attempt(seen, decision, Carried.SENT, executed),),
        decision.plan,
        began=9.75,
        ended=10.0,
    )
    metrics, events = Metrics(), FakeEvents()
    recorder = _recorder(metrics, events)
    with capture_logs() as logs:
        recorder.record(report)
    await recorder.settle()  # Events go out in the background

    labels = {"group": "cpu", "action": cpu.action.value, "reason": cpu.reason_code}
    assert metrics.sample("kuberay_scaler_decisions_total", labels) == 1
    assert metrics.sample("kuberay_scaler_target_replicas", {"group": "cpu"}) == cpu.target
    assert metrics.sample("kuberay_scaler_reconciles_total", {"outcome": "ok"}) == 1
    assert metrics.sample("kuberay_scaler_reconcile_duration_seconds_count") == 1
    assert metrics.sample("kuberay_scaler_reconcile_duration_seconds_sum") == 0.25
    assert metrics.sample("kuberay_scaler_blind_seconds", {"source": "pods"}) == 3.5
    assert metrics.sample("kuberay_scaler_overrides_total", {"group": "cpu"}) == 1
    stamp = metrics.sample("kuberay_scaler_last_successful_reconcile_timestamp_seconds")
    assert stamp == NOW.timestamp()

    assert sorted(reason for reason, _ in events.recorded) == [
        "OverriddenByAnotherWriter",
        "ScaledUp",
    ]
    said = {(x["event"], x["log_level"]) for x in logs}
    assert {
        ("RayCluster recreated: dropping memory", "warning"),
        ("replicas overridden by another writer", "warning"),
        ("decision", "info"),
    } <= said
    (line,) = [x for x in logs if x["event"] == "decision"]
    assert (line["group"], line["dry_run"]) == ("cpu", False)

    status = recorder.status
    assert status.last_decision is decision and status.last_outcome == "applied"
    assert status.last_patch == ops_json(executed.sent) and status.last_patch
    assert status.reconciles == 1 and status.progress.last_achieved == 10.0


async def test_a_report_that_crashed_counts_the_failure_and_logs_the_exception() -> None:
    error = RuntimeError("planner bug")
    report = ReconcileReport(
        Outcome(Step.ERROR, f"RuntimeError: {error}", "RuntimeError"),
        reading=Reading(None, {}, failed=True),
        began=10.0,
        ended=10.0,
        crashed=error,
    )
    metrics = Metrics()
    recorder = _recorder(metrics)
    with capture_logs() as logs:
        recorder.record(report)
    (line,) = [x for x in logs if x["event"] == "reconcile failed"]
    assert line["log_level"] == "error" and line["exc_info"] is error
    assert metrics.sample("kuberay_scaler_reconcile_failures_total", {"cause": "RuntimeError"}) == 1
    assert metrics.sample("kuberay_scaler_reconciles_total", {"outcome": "error"}) == 1
    assert recorder.status.progress.failures == 1
    assert recorder.status.last_error == "RuntimeError: planner bug"


async def test_a_reconciles_report_says_nothing_until_the_recorder_says_it() -> None:
    """The steps only build the report: metrics, Events and the status move when it is
    recorded, and then as `reconcile()` (run + record) moves them."""
    loop = _scale_up_loop()
    metrics = loop.reconciler.metrics
    report = await loop.reconciler.run()
    assert report.outcome.step is Step.DONE and report.plan is not None
    assert metrics.sample("kuberay_scaler_reconciles_total", {"outcome": "ok"}) is None
    assert loop.reconciler.status.reconciles == 0 and loop.reconciler.status.last_decision is None
    assert report.reading is not None and report.ended >= report.began

    loop.reconciler.recorder.record(report)
    await loop.reconciler.recorder.settle()
    assert metrics.sample("kuberay_scaler_reconciles_total", {"outcome": "ok"}) == 1
    assert [reason for reason, _ in loop.events.recorded] == ["ScaledUp"]
    assert loop.reconciler.status.last_decision is report.attempts[0].decision


async def _served(metrics: Metrics) -> dict[str, float]:
    """Every sample /metrics serves for `metrics`, by name and labels."""
    probes = Probes(healthy=lambda: (True, ""), ready=lambda: (True, ""), plan=lambda: None)
    async with TestClient(TestServer(make_app(probes, metrics))) as client:
        reply = await client.get("/metrics")
        assert reply.status == 200
        text = await reply.text()
    return {
        f"{s.name}{sorted(s.labels.items())}": s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.endswith("_created")
    }


async def test_two_recorders_in_one_process_share_no_metrics_and_no_status() -> None:
    decision, executed = await _applied_scale_up()
    report = ReconcileReport(
        Outcome.done("applied"),
        (Attempt(Seen({"gcs": 7.0}), decision, Carried.SENT, executed),),
        decision.plan,
        began=9.0,
        ended=10.0,
    )
    first, second = Metrics(), Metrics()
    said, quiet = _recorder(first), _recorder(second)
    said.record(report)
    said.record(report)
    await said.settle()

    assert first.registry is not second.registry
    assert first.sample("kuberay_scaler_reconciles_total", {"outcome": "ok"}) == 2
    assert first.sample("kuberay_scaler_blind_seconds", {"source": "gcs"}) == 7.0
    assert second.sample("kuberay_scaler_reconciles_total", {"outcome": "ok"}) is None
    assert second.sample("kuberay_scaler_blind_seconds", {"source": "gcs"}) is None
    assert (said.status.reconciles, quiet.status.reconciles) == (2, 0)
    assert quiet.status.last_decision is None

    # /metrics serves each one's own values, under the same names.
    served: tuple[dict[str, Any], dict[str, Any]] = (await _served(first), await _served(second))
    ok = "kuberay_scaler_reconciles_total[('outcome', 'ok')]"
    assert served[0][ok] == 2 and ok not in served[1]
    names = [
        {n for n in s if n.startswith("kuberay_scaler_reconcile_duration_seconds")} for s in served
    ]
    assert names[0] == names[1] and names[0]
    assert served[1]["kuberay_scaler_reconcile_duration_seconds_count[]"] == 0


async def test_a_reconcile_that_replans_reports_each_pass_in_order_and_says_each() -> None:
    """A stale patch every time: three passes planned and sent, each re-observed after, and
    the reconcile fails as stale; the recorder says every pass (its patch, its decision)."""
    loop = _scale_up_loop()
    loop.writer.answer(409, times=10)
    report = await loop.reconciler.run()
    assert (report.outcome.step, report.outcome.cause) == (Step.FAILED, "stale")
    planned = [a for a in report.attempts if a.decision is not None]
    assert len(planned) == 3 and len(report.attempts) == 4  # the last pass only observed
    assert all(a.carried is Carried.SENT for a in planned)
    assert all(a.executed is not None and a.executed.replan for a in planned)
    assert [len(a.seen.blind) > 0 for a in report.attempts] == [True] * 4
    assert len(loop.writer.calls) == 3

    metrics = loop.reconciler.metrics
    loop.reconciler.recorder.record(report)
    assert metrics.sample("kuberay_scaler_reconcile_failures_total", {"cause": "stale"}) == 1
    last = planned[-1]
    assert last.executed is not None
    status = loop.reconciler.status
    assert status.last_decision is last.decision
    assert status.last_patch == ops_json(last.executed.sent)
