"""The control loop against fakes: writes in order, one observation per reconcile, and the
invariants (no undrained or partial deletion, targets within [min, max], no duplicate scale-up)
on the fault paths the writer and the GCS can produce."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kuberay_scaler.core.model.cluster import DEFAULT_IDLE_TIMEOUT_S
from kuberay_scaler.core.model.reasons import Action, ScaleDownKind
from kuberay_scaler.core.patch.intent import DRAINING_ANNOTATION
from kuberay_scaler.loop.config import LoopConfig
from kuberay_scaler.loop.reconciler import MAX_REPLANS
from kuberay_scaler.loop.trigger import WAKE_MARGIN_S
from tests.control.fakes import Loop, WriteCall, make_loop, reply_of
from tests.control.worlds import idle_slices_loop, scale_up_loop, spec_group, workers_to_delete
from tests.factories import (
    cluster,
    group,
    head_node,
    node_id_of,
    slice_pods,
    state,
    tasks,
    tpu_group,
    tpu_slice_nodes,
)


def assert_deleted_only_drained_whole_slices(loop: Loop, hosts: int = 4) -> None:
    """Invariant: every pod named for deletion had its Ray node drained, slice by slice."""
    named = workers_to_delete(loop)
    assert all(node_id_of(p) in loop.gcs.drained for p in named), "undrained deletion"
    refused = loop.gcs.refuse | loop.gcs.fail
    assert not any(node_id_of(p) in refused for p in named), "deleted a slice that refused"
    replicas = {p.rsplit("-", 1)[0] for p in named}
    assert len(named) == hosts * len(replicas), f"partial slice deleted: {named}"


async def test_scale_up_is_patched_once_and_not_repeated_while_the_cache_lags() -> None:
    loop = scale_up_loop()
    stale_copy = loop.view.current()
    assert stale_copy is not None
    await loop.reconciler.reconcile()
    assert len(loop.writer.applied) == 1
    assert spec_group(loop)["replicas"] == 2
    loop.view.observe(stale_copy)  # the watch has not delivered our write yet
    loop.clock.advance(1)
    loop.see_ray(state([head_node()], [tasks({"CPU": 8}, 2)]))
    await loop.reconciler.reconcile()
    assert len(loop.writer.calls) == 1, "scaled up twice for the same demand"
    assert spec_group(loop)["replicas"] == 2


async def test_idle_slice_is_recorded_then_drained_then_deleted_with_the_record() -> None:
    loop = idle_slices_loop("tpu-a")
    await loop.reconciler.reconcile()
    record, patch = loop.writer.calls
    assert [op["path"] for op in record.ops] == ["/metadata/annotations"]
    assert sorted(loop.gcs.drained) == sorted(node_id_of(f"tpu-a-{i}") for i in range(4))
    assert {d.cluster_id for d in loop.gcs.drains} == {"cluster-1"}
    assert patch.outcome.kind == "applied"
    assert spec_group(loop)["replicas"] == 0
    assert sorted(workers_to_delete(loop)) == [f"tpu-a-{i}" for i in range(4)]
    assert DRAINING_ANNOTATION not in loop.server.obj["metadata"]["annotations"]
    assert_deleted_only_drained_whole_slices(loop)
    await asyncio.sleep(0)  # Events are sent in the background
    assert [r for r, _ in loop.events.recorded] == ["ScaledDown"]


async def test_a_refused_drain_keeps_that_slice_and_deletes_the_other() -> None:
    loop = idle_slices_loop("tpu-a", "tpu-b")
    # No host of tpu-a accepts (a partly accepted slice is deleted whole: see test_faults.py).
    loop.gcs.refuse = {node_id_of(f"tpu-a-{i}") for i in range(4)}
    await loop.reconciler.reconcile()
    assert spec_group(loop)["replicas"] == 1
    assert sorted(workers_to_delete(loop)) == [f"tpu-b-{i}" for i in range(4)]
    assert DRAINING_ANNOTATION not in loop.server.obj["metadata"]["annotations"]
    assert_deleted_only_drained_whole_slices(loop)


async def test_every_drain_refused_keeps_the_record_for_the_retry_and_deletes_nothing() -> None:
    loop = idle_slices_loop("tpu-a")
    loop.gcs.fail = {node_id_of(f"tpu-a-{i}") for i in range(4)}
    await loop.reconciler.reconcile()
    assert spec_group(loop)["replicas"] == 1
    assert workers_to_delete(loop) == []
    # The slice backs off (Memory.refused); its record stays, so a retry never rewrites it.
    assert DRAINING_ANNOTATION in loop.server.obj["metadata"]["annotations"]
    assert len(loop.writer.calls) == 1


async def test_a_stale_patch_is_replanned_at_most_max_replans_times() -> None:
    loop = scale_up_loop()
    loop.writer.answer(409, times=10)
    assert await loop.reconciler.reconcile() is None
    assert len(loop.writer.calls) == MAX_REPLANS
    assert loop.view.refreshes == MAX_REPLANS
    assert "replicas" not in spec_group(loop) or spec_group(loop)["replicas"] == 0
    assert "stale" in loop.reconciler.status.last_outcome


async def test_a_stale_patch_then_success_applies_once() -> None:
    loop = scale_up_loop()
    loop.writer.answer(409)
    await loop.reconciler.reconcile()
    assert [c.outcome.kind for c in loop.writer.calls] == ["stale", "applied"]
    assert spec_group(loop)["replicas"] == 2


async def test_throttled_patch_waits_for_retry_after() -> None:
    loop = scale_up_loop()
    loop.writer.answer(429, retry_after=5)
    await loop.reconciler.reconcile()
    await loop.reconciler.reconcile()
    assert len(loop.writer.calls) == 1, "wrote again inside Retry-After"
    loop.clock.advance(6)
    loop.see_ray(state([head_node()], [tasks({"CPU": 8}, 2)]))
    await loop.reconciler.reconcile()
    assert [c.outcome.kind for c in loop.writer.calls] == ["throttled", "applied"]
    assert spec_group(loop)["replicas"] == 2


@pytest.mark.parametrize("status", [500, 403])
async def test_failed_patch_backs_off_and_the_loop_goes_on(status: int) -> None:
    loop = scale_up_loop()
    loop.writer.answer(status)
    await loop.reconciler.reconcile()
    await loop.reconciler.reconcile()
    assert len(loop.writer.calls) == 1, "no backoff after a failed write"
    kind = loop.writer.calls[0].outcome.kind
    assert kind in loop.reconciler.status.last_outcome or "backoff" in (
        loop.reconciler.status.last_outcome
    )
    assert "replicas" not in spec_group(loop) or spec_group(loop)["replicas"] == 0


async def test_a_refused_record_write_drains_nothing() -> None:
    loop = idle_slices_loop("tpu-a")
    loop.writer.answer(503)
    await loop.reconciler.reconcile()
    assert loop.gcs.drains == [], "drained without the intent recorded"
    assert workers_to_delete(loop) == []


async def test_drains_are_pinned_to_the_observation_the_plan_was_made_from() -> None:
    loop = idle_slices_loop("tpu-a")
    planned_from = reply_of(state([head_node(), *tpu_slice_nodes("tpu-a", 4, idle_s=900)]), 5)
    loop.see_ray(planned_from)
    newer = reply_of(state([head_node()]), 1)  # a replaced GCS that knows none of these nodes

    def gcs_replaced_mid_reconcile(call: WriteCall) -> None:
        loop.see_ray(newer, cluster_id="cluster-2", epoch=2)

    loop.writer.after_apply = gcs_replaced_mid_reconcile
    await loop.reconciler.reconcile()
    # The fresh read right before draining sees the new GCS: nothing is drained or deleted.
    assert loop.gcs.drains == [] and workers_to_delete(loop) == []
    assert spec_group(loop)["replicas"] == 1
    (report,) = loop.gcs.reports  # told from the observation the plan was made from
    assert report.observed_state_version == 5
    decision = loop.reconciler.status.last_decision
    assert decision is not None and decision.gcs is not None
    assert decision.gcs.cluster_id == "cluster-1"


async def test_unknown_or_stale_gcs_holds_and_writes_nothing() -> None:
    loop = scale_up_loop()
    loop.clock.advance(LoopConfig().gcs_stale_after_s + 1)  # the observation is now stale
    result = await loop.reconciler.reconcile()
    assert result is not None and result.held is not None
    assert loop.writer.calls == []
    loop.see_ray(None)
    result = await loop.reconciler.reconcile()
    assert result is not None and result.held is not None
    assert loop.writer.calls == []


async def test_dry_run_decides_the_writes_and_sends_none() -> None:
    loop = idle_slices_loop("tpu-a", config=LoopConfig(dry_run=True))
    await loop.reconciler.reconcile()
    decision = loop.reconciler.status.last_decision
    assert decision is not None and len(decision.writes) == 3
    assert loop.writer.calls == [] and loop.gcs.drains == []


async def test_an_exception_in_decide_is_caught_and_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = scale_up_loop()

    def broken(*_: Any) -> Any:
        raise RuntimeError("planner bug")

    monkeypatch.setattr(loop.reconciler, "decide", broken)
    assert await loop.reconciler.reconcile() is None
    assert loop.reconciler.status.reconciles == 1
    assert loop.writer.calls == []


async def test_recreated_raycluster_drops_memory_and_expectations() -> None:
    loop = scale_up_loop()
    await loop.reconciler.reconcile()
    assert loop.reconciler.observer.expectations.groups() == {"cpu"}
    fresh = cluster(group("cpu", max_replicas=5))
    fresh["metadata"]["uid"] = "uid-2"
    loop.server.obj = fresh
    await loop.view.refresh()
    loop.see_ray(state([head_node()]))
    await loop.reconciler.reconcile()
    assert loop.reconciler.observer.expectations.groups() == frozenset()


async def test_decision_metrics_are_labelled_from_the_enums() -> None:
    labels = {"group": "tpu", "action": "scale_down", "reason": "idle"}
    loop = idle_slices_loop("tpu-a")
    before = loop.reconciler.metrics.sample("kuberay_scaler_decisions_total", labels) or 0.0
    await loop.reconciler.reconcile()
    after = loop.reconciler.metrics.sample("kuberay_scaler_decisions_total", labels)
    assert after == before + 1
    assert Action.SCALE_DOWN.value == labels["action"]
    assert ScaleDownKind.IDLE.value == labels["reason"]


async def test_a_422_failed_test_is_stale_and_replanned_but_a_422_invalid_is_not() -> None:
    loop = scale_up_loop()
    loop.writer.answer(422, kind="stale")
    await loop.reconciler.reconcile()
    assert [c.outcome.kind for c in loop.writer.calls] == ["stale", "applied"]
    other = scale_up_loop()
    other.writer.answer(422)
    await other.reconciler.reconcile()
    assert [c.outcome.kind for c in other.writer.calls] == ["invalid"]
    assert "replicas" not in spec_group(other) or spec_group(other)["replicas"] == 0


async def test_an_idle_slice_below_its_timeout_wakes_the_loop_when_the_timeout_is_due() -> None:
    # Idle clocks move with time alone (the poller's content check ignores them), so the loop
    # must plan again when the first idle slice reaches its timeout, not at the next resync.
    pods = slice_pods("tpu", "tpu-a", 4)
    loop = make_loop(
        cluster(tpu_group(replicas=1)),
        pods,
        state([head_node(), *tpu_slice_nodes("tpu-a", 4, idle_s=20)]),
    )
    await loop.reconciler.reconcile()
    assert loop.writer.calls == []
    wake = loop.reconciler.seconds_to_wake()
    assert wake == pytest.approx(DEFAULT_IDLE_TIMEOUT_S - 20 + WAKE_MARGIN_S)

    loop.clock.advance(wake / 2)  # a change that changes nothing, before the timeout: skipped
    loop.see_ray(state([head_node(), *tpu_slice_nodes("tpu-a", 4, idle_s=20 + wake / 2)]))
    await loop.reconciler.reconcile({"pods"})
    assert loop.reconciler.skipped == 1

    loop.clock.advance(wake / 2)  # the same change once the timeout is due: planned
    loop.see_ray(state([head_node(), *tpu_slice_nodes("tpu-a", 4, idle_s=20 + wake)]))
    await loop.reconciler.reconcile({"pods"})
    assert loop.reconciler.skipped == 1
    assert sorted(workers_to_delete(loop)) == [f"tpu-a-{i}" for i in range(4)]
    assert_deleted_only_drained_whole_slices(loop)
    assert loop.reconciler.seconds_to_wake() is None  # nothing idle is left below its timeout


async def test_no_idle_slice_below_its_timeout_means_no_early_wake() -> None:
    loop = idle_slices_loop("tpu-a")  # idle past the timeout: deleted now, nothing left to wait for
    await loop.reconciler.reconcile()
    assert loop.reconciler.seconds_to_wake() is None
