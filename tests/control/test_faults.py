"""Reconciler fault paths of issue 11 against the fakes behind the Protocols. Every test asserts an
invariant (no busy, undrained or partial deletion; targets within [min, max]; nothing lost), not
only that a path ran."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from structlog.testing import capture_logs

from kuberay_scaler.adapters.kube.transport import MAX_RETRY_AFTER_S
from kuberay_scaler.app import Daemon
from kuberay_scaler.core.model.drains import DrainReason
from kuberay_scaler.core.patch.intent import DRAINING_ANNOTATION
from kuberay_scaler.loop.config import LoopConfig
from kuberay_scaler.runtime.settings import load_settings
from tests.control.fakes import Loop, WriteCall, make_loop, run_for
from tests.control.worlds import idle_slices_loop, scale_up_world, spec_group, workers_to_delete
from tests.factories import (
    cluster,
    group,
    head_node,
    node,
    node_id_of,
    slice_pods,
    state,
    tasks,
    tpu_group,
    tpu_slice_nodes,
)

GRACE_S = 180.0  # the default KUBERAY_SCALER_MISSING_NODE_GRACE_S


def busy_slice_loop(**kw: Any) -> Loop:
    """One 4-host slice whose pods (by their own timestamps) have run for an hour, busy in Ray."""
    pods = slice_pods("tpu", "tpu-a", 4, age_s=3700, running_for_s=3600)
    nodes = [head_node(), *tpu_slice_nodes("tpu-a", 4, idle_s=None)]
    return make_loop(cluster(tpu_group(replicas=1, max_replicas=4)), pods, state(nodes), **kw)


def assert_nothing_deleted(loop: Loop) -> None:
    """Invariant: the busy slice is neither named for deletion nor scaled away."""
    assert workers_to_delete(loop) == [], "busy slice deleted without a drain"
    assert spec_group(loop)["replicas"] == 1
    assert loop.gcs.drains == [], "busy slice drained"


async def test_one_gcs_reply_without_a_running_slices_nodes_replaces_nothing() -> None:
    """Item 1 / catalogue row 19: a partial reply (GCS restart window) is not a broken slice."""
    loop = busy_slice_loop()
    await run_for(loop, 30, state([head_node(), *tpu_slice_nodes("tpu-a", 4, idle_s=None)]))
    loop.clock.advance(1)
    loop.see_ray(state([head_node()]))  # one reply lacks the slice's nodes
    await loop.reconciler.reconcile()
    assert_nothing_deleted(loop)


async def test_gcs_restart_window_replaces_nothing_until_a_full_grace_of_fresh_replies() -> None:
    loop = busy_slice_loop()
    await run_for(loop, 30, state([head_node(), *tpu_slice_nodes("tpu-a", 4, idle_s=None)]))
    await run_for(loop, 60, None)  # GCS down for a minute
    # A new GCS without the slice's nodes for almost a full grace: still nothing is judged.
    await run_for(loop, GRACE_S - 10, state([head_node()]), epoch=2)
    assert_nothing_deleted(loop)


async def test_a_node_truly_gone_for_a_full_grace_is_replaced() -> None:
    """The other side of the rule: a slice whose node stays missing is still replaced, once its
    other hosts are no longer busy (a broken slice is never deleted over busy work: it is kept,
    KeepKind.BROKEN_BUT_BUSY), their Ray nodes drained first."""
    loop = busy_slice_loop()
    await run_for(loop, 30, state([head_node(), *tpu_slice_nodes("tpu-a", 4, idle_s=None)]))
    three = state([head_node(), *tpu_slice_nodes("tpu-a", 4, idle_s=None)[:3]])
    await run_for(loop, GRACE_S + 10, three)
    assert_nothing_deleted(loop)  # broken, but three hosts still run work
    three_idle = state([head_node(), *tpu_slice_nodes("tpu-a", 4, idle_s=10)[:3]])
    await run_for(loop, 5, three_idle)
    assert sorted(loop.gcs.drained) == sorted(node_id_of(f"tpu-a-{i}") for i in range(3))
    assert sorted(workers_to_delete(loop)) == [f"tpu-a-{i}" for i in range(4)]  # whole slice


async def test_a_slow_plan_never_blocks_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 3: planning runs in a worker thread; probes (here: a ticker) keep being served."""
    loop = busy_slice_loop()
    real = loop.reconciler.decide

    def slow(*args: Any) -> Any:
        time.sleep(0.5)  # a plan that takes long (10^6 hosts before the bounds)
        return real(*args)

    monkeypatch.setattr(loop.reconciler, "decide", slow)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    try:
        await loop.reconciler.reconcile()
    finally:
        task.cancel()
    assert ticks >= 1, "the event loop was blocked for the whole plan"
    assert loop.reconciler.status.last_decision is not None


def daemon_probing(loop: Loop) -> Daemon:
    """The daemon's real probes and /debug/plan, reading this loop."""
    daemon = Daemon(load_settings({"RAY_CLUSTER_NAME": "rc"}))
    daemon.reconciler, daemon._recorder = loop.reconciler, loop.reconciler.recorder
    return daemon


def failures_metric(loop: Loop, cause: str) -> float:
    metrics = loop.reconciler.metrics
    value = metrics.sample("kuberay_scaler_reconcile_failures_total", {"cause": cause})
    return value or 0.0


async def test_a_loop_that_keeps_failing_fails_healthz_and_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Item 4 / catalogue row 22: exceptions in reconcile are no longer a silent stall."""
    loop = busy_slice_loop(config=LoopConfig(unhealthy_after_failures=3))
    daemon = daemon_probing(loop)
    await loop.reconciler.reconcile()
    assert daemon._healthy()[0]
    real = loop.reconciler.decide
    before = failures_metric(loop, "RuntimeError")

    def broken(*_: Any) -> Any:
        raise RuntimeError("planner bug")

    monkeypatch.setattr(loop.reconciler, "decide", broken)
    for _ in range(2):
        loop.clock.advance(1)
        await loop.reconciler.reconcile()
    assert daemon._healthy()[0]  # two failures: not yet
    loop.clock.advance(1)
    await loop.reconciler.reconcile()
    healthy, why = daemon._healthy()
    assert not healthy and "3 reconciles failed" in why and "planner bug" in why
    document = daemon._plan_document()
    assert document is not None and "planner bug" in document["last_error"]
    assert failures_metric(loop, "RuntimeError") == before + 3
    assert loop.writer.calls == []  # nothing was written meanwhile

    monkeypatch.setattr(loop.reconciler, "decide", real)
    loop.clock.advance(1)
    await loop.reconciler.reconcile()
    assert daemon._healthy()[0]  # recovered
    metrics = loop.reconciler.metrics
    stamp = metrics.sample("kuberay_scaler_last_successful_reconcile_timestamp_seconds")
    assert stamp == loop.clock.wall().timestamp()


async def test_no_successful_reconcile_for_t_seconds_fails_healthz(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = busy_slice_loop(config=LoopConfig(unhealthy_after_failures=1000, unhealthy_after_s=120))
    daemon = daemon_probing(loop)
    await loop.reconciler.reconcile()

    def broken(*_: Any) -> Any:
        raise ValueError("bad input")

    monkeypatch.setattr(loop.reconciler, "decide", broken)
    loop.clock.advance(100)
    await loop.reconciler.reconcile()
    assert daemon._healthy()[0]
    loop.clock.advance(30)
    await loop.reconciler.reconcile()
    healthy, why = daemon._healthy()
    assert not healthy and "no successful reconcile for 130 s" in why


def test_the_thresholds_are_settings() -> None:
    settings = load_settings(
        {
            "RAY_CLUSTER_NAME": "rc",
            "KUBERAY_SCALER_UNHEALTHY_AFTER_FAILURES": "3",
            "KUBERAY_SCALER_UNHEALTHY_AFTER_S": "120",
        }
    )
    assert (settings.unhealthy_after_failures, settings.unhealthy_after_s) == (3, 120.0)


async def test_a_write_that_keeps_failing_counts_as_a_failed_reconcile() -> None:
    loop = make_loop(
        cluster(group("cpu", max_replicas=5)),
        [],
        state([head_node()], [tasks({"CPU": 8}, 2)]),
        config=LoopConfig(unhealthy_after_failures=2),
    )
    before = failures_metric(loop, "patch_forbidden")
    for _ in range(2):
        loop.writer.answer(403)
        loop.clock.advance(120)  # past the write backoff
        loop.see_ray(state([head_node()], [tasks({"CPU": 8}, 2)]))
        await loop.reconciler.reconcile()
    healthy, why = loop.reconciler.health()
    assert not healthy and "forbidden" in why
    assert failures_metric(loop, "patch_forbidden") == before + 2
    assert spec_group(loop)["replicas"] == 0  # nothing was applied


async def test_a_partly_drained_slice_is_kept_then_deleted_whole_past_its_deadline() -> None:
    """Item 2 / catalogue row 20, under the deletion gate: a host that refused keeps
    its slice (never deleted over it); the refusing host is drained for preemption with the
    drain deadline, and the slice leaves whole once that passes and it is judged broken."""
    loop = idle_slices_loop("tpu-a", "tpu-b")
    loop.gcs.refuse = {node_id_of("tpu-a-2")}  # turned busy between the fresh read and its drain
    await loop.reconciler.reconcile()
    assert sorted(workers_to_delete(loop)) == [f"tpu-b-{i}" for i in range(4)]  # whole only
    assert spec_group(loop)["replicas"] == 1
    every_host = {node_id_of(f"{k}-{i}") for k in ("tpu-a", "tpu-b") for i in range(4)}
    assert {
        d.node_id for d in loop.gcs.drains if d.reason is DrainReason.IDLE_TERMINATION
    } == every_host
    (preempted,) = [d for d in loop.gcs.drains if d.reason is DrainReason.PREEMPTION]
    assert preempted.node_id == node_id_of("tpu-a-2")  # the rest, for preemption
    plan = loop.reconciler.status.last_decision
    assert plan is not None and "tpu-a" in loop.reconciler.memory.preempting

    # Ray: the accepted hosts exited (DEAD), host 2 drains its work. Past the deadline and the
    # grace, the broken slice is replaced whole, without another drain.
    loop.gcs.refuse = set()
    pods = loop.pods.pods
    loop.pods.pods = [p for p in pods if not p["metadata"]["name"].startswith("tpu-b")]
    exited = [node(f"tpu-a-{i}", group_name="tpu", dead=True) for i in (0, 1, 3)] + [
        node("tpu-a-2", group_name="tpu", draining=True, resources={"CPU": 24}, available={})
    ]
    drains_before = len(loop.gcs.drains)
    await run_for(loop, GRACE_S + 30, state([head_node(), *exited]))
    assert sorted(workers_to_delete(loop)) == [f"tpu-a-{i}" for i in range(4)]
    assert len(loop.gcs.drains) == drains_before


async def test_a_slice_busy_in_the_fresh_read_is_not_drained_at_all() -> None:
    loop = idle_slices_loop("tpu-a", "tpu-b")
    now_busy = [head_node(), *tpu_slice_nodes("tpu-a", 4, idle_s=900)]
    now_busy += tpu_slice_nodes("tpu-b", 4, busy_hosts=(1,))
    loop.gcs.fresh = state(now_busy)  # the plan saw tpu-b idle; the GCS now says host 1 is busy
    await loop.reconciler.reconcile()
    assert sorted(workers_to_delete(loop)) == [f"tpu-a-{i}" for i in range(4)]
    assert not any(d.node_id == node_id_of(f"tpu-b-{i}") for d in loop.gcs.drains for i in range(4))
    assert spec_group(loop)["replicas"] == 1  # tpu-b kept whole, no host of it drained


async def test_no_fresh_read_no_drain() -> None:
    loop = idle_slices_loop("tpu-a")
    loop.gcs.fresh_fails = True
    await loop.reconciler.reconcile()
    assert loop.gcs.drains == [] and workers_to_delete(loop) == []
    assert spec_group(loop)["replicas"] == 1


class KilledNine(BaseException):
    """kill -9: the process stops at this point; nothing after it runs, nothing is cleaned up."""


def killed_after_the_record(loop: Loop) -> None:
    def kill(call: WriteCall) -> None:
        if any(op.get("path") == "/metadata/annotations" for op in call.ops):
            raise KilledNine

    loop.writer.after_apply = kill


def restarted(loop: Loop, nodes: list[Any]) -> Loop:
    """A new daemon process: fresh memory and expectations, the same API server and pods."""
    again = make_loop(loop.server.obj, loop.pods.pods, state(nodes), clock=loop.clock)
    again.writer.calls.clear()
    return again


async def kill_between_record_and_patch(keys: tuple[str, ...]) -> Loop:
    loop = idle_slices_loop(*keys)
    killed_after_the_record(loop)
    with pytest.raises(KilledNine):
        await loop.reconciler.reconcile()
    assert DRAINING_ANNOTATION in loop.server.obj["metadata"]["annotations"]
    assert workers_to_delete(loop) == [] and spec_group(loop)["replicas"] == len(keys)
    return loop


def assert_deleted_once_whole(loop: Loop, keys: tuple[str, ...], replicas_before: int) -> None:
    named = sorted(workers_to_delete(loop))
    assert named == sorted(f"{k}-{i}" for k in keys for i in range(4)), named  # whole, no half
    assert spec_group(loop)["replicas"] == replicas_before - len(keys)  # decremented once
    assert DRAINING_ANNOTATION not in loop.server.obj["metadata"]["annotations"]


async def test_restart_after_the_record_adopts_and_finishes_an_idle_slice() -> None:
    """Item 10 / catalogue row 24: the drain never went out; the new process drains and deletes
    the recorded slice, once."""
    loop = await kill_between_record_and_patch(("tpu-a",))
    nodes = [head_node(), *tpu_slice_nodes("tpu-a", 4, idle_s=30)]  # idle, but not for long
    again = restarted(loop, nodes)
    await again.reconciler.reconcile()
    assert sorted(again.gcs.drained) == sorted(node_id_of(f"tpu-a-{i}") for i in range(4))
    assert_deleted_once_whole(again, ("tpu-a",), 1)
    # A second reconcile of the new process deletes nothing more (nothing twice).
    again.clock.advance(5)
    again.see_ray(state(nodes))
    await again.reconciler.reconcile()
    assert_deleted_once_whole(again, ("tpu-a",), 1)


async def test_restart_after_the_drains_deletes_the_exited_slice_without_waiting() -> None:
    """The drains were accepted before the kill: those raylets have exited and the GCS lists
    them DEAD. The slice is deleted at once, not left for the missing-node timer."""
    loop = await kill_between_record_and_patch(("tpu-a",))
    dead = [node(f"tpu-a-{i}", group_name="tpu", dead=True) for i in range(4)]
    again = restarted(loop, [head_node(), *dead])
    await again.reconciler.reconcile()
    assert_deleted_once_whole(again, ("tpu-a",), 1)


async def test_restart_with_the_slices_nodes_absent_waits_a_full_grace() -> None:
    """Absent from the replies is not "already drained" (a restarted GCS lists no
    one yet): the restarted daemon deletes the slice only after a full grace without them."""
    loop = await kill_between_record_and_patch(("tpu-a",))
    again = restarted(loop, [head_node()])
    await again.reconciler.reconcile()
    assert workers_to_delete(again) == [] and spec_group(again)["replicas"] == 1
    await run_for(again, GRACE_S + 10, state([head_node()]))
    assert_deleted_once_whole(again, ("tpu-a",), 1)


async def test_restart_after_part_of_the_drains_keeps_a_slice_whose_survivors_are_busy() -> None:
    """Hosts 0, 1 exited, hosts 2, 3 turned busy: never deleted over them (the slice
    turns broken and leaves by the bounded broken-but-busy path)."""
    loop = await kill_between_record_and_patch(("tpu-a",))
    survivors = tpu_slice_nodes("tpu-a", 4, busy_hosts=(2, 3))[2:]
    dead = [node(f"tpu-a-{i}", group_name="tpu", dead=True) for i in (0, 1)]
    again = restarted(loop, [head_node(), *dead, *survivors])
    again.gcs.busy = {n.node_id for n in survivors}
    await again.reconciler.reconcile()
    await run_for(again, 60, state([head_node(), *dead, *survivors]))
    assert workers_to_delete(again) == [] and spec_group(again)["replicas"] == 1


async def test_restart_after_the_record_keeps_a_slice_that_turned_busy() -> None:
    """The documented rule: no host exited and the slice is busy now: it is kept whole and the
    record is cleared (never a busy deletion)."""
    loop = await kill_between_record_and_patch(("tpu-a",))
    busy = [head_node(), *tpu_slice_nodes("tpu-a", 4, idle_s=None)]
    again = restarted(loop, busy)
    await again.reconciler.reconcile()
    assert workers_to_delete(again) == [] and spec_group(again)["replicas"] == 1
    assert DRAINING_ANNOTATION not in again.server.obj["metadata"]["annotations"]


def overrides_metric(loop: Loop, group_name: str) -> float:
    metrics = loop.reconciler.metrics
    value = metrics.sample("kuberay_scaler_overrides_total", {"group": group_name})
    return value or 0.0


async def test_another_writer_resetting_replicas_is_named_and_not_fought() -> None:
    """Item 8 / catalogue row 13: a GitOps tool resets replicas; we say so and back off
    exponentially per group instead of re-patching after every reset."""
    loop, demand = scale_up_world()
    await loop.reconciler.reconcile()
    assert spec_group(loop)["replicas"] == 2 and len(loop.writer.applied) == 1
    before = overrides_metric(loop, "cpu")

    async def reset_by_gitops() -> None:
        loop.server.edit(["spec", "workerGroupSpecs", 0, "replicas"], 0)
        await loop.view.refresh()

    async def minutes(count: int) -> None:
        for _ in range(count):
            loop.clock.advance(60)
            loop.see_ray(demand)
            await loop.reconciler.reconcile()

    await reset_by_gitops()
    with capture_logs() as logs:
        await minutes(1)
    await loop.reconciler.recorder.settle()  # Events are said at the reconcile's end
    assert [e for e in logs if e["event"] == "replicas overridden by another writer"]
    assert any(reason == "OverriddenByAnotherWriter" for reason, _ in loop.events.recorded)
    assert overrides_metric(loop, "cpu") == before + 1
    assert len(loop.writer.applied) == 1, "re-patched right after the other writer's reset"
    assert spec_group(loop)["replicas"] == 0  # their value stands for now
    await minutes(2)  # the first backoff (2 min) passes: we try once more
    assert len(loop.writer.applied) == 2 and spec_group(loop)["replicas"] == 2
    await reset_by_gitops()
    await minutes(3)  # second override: the backoff doubles (4 min), no write in 3 min
    assert len(loop.writer.applied) == 2 and spec_group(loop)["replicas"] == 0
    assert overrides_metric(loop, "cpu") == before + 2
    decision = loop.reconciler.status.last_decision
    assert decision is not None
    held = decision.plan.group("cpu")
    assert held is not None and held.held is not None and "another writer" in str(held.held)


async def test_a_huge_retry_after_is_honoured_but_capped() -> None:
    """A 429 asking for a day must not stop the group for a day (capped like the transport)."""
    loop, demand = scale_up_world()
    loop.writer.answer(429, retry_after=86_400)
    await loop.reconciler.reconcile()
    loop.clock.advance(MAX_RETRY_AFTER_S / 2)
    loop.see_ray(demand)
    await loop.reconciler.reconcile()
    assert len(loop.writer.calls) == 1, "wrote again inside Retry-After"
    loop.clock.advance(MAX_RETRY_AFTER_S / 2 + 1)
    loop.see_ray(demand)
    await loop.reconciler.reconcile()
    assert [c.outcome.kind for c in loop.writer.calls] == ["throttled", "applied"]
    assert spec_group(loop)["replicas"] == 2  # within [min, max], written once
