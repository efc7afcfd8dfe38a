"""Issue 20, promise 1: the reproduced ways a busy host was deleted without an accepted drain,
each against the fakes behind the loop's Protocols. Every test asserts the gate invariant on
every write the fake API server applied (`assert_gate_held`), not only that a path ran."""

from __future__ import annotations

from typing import Any

from kuberay_scaler.core.model.drains import DrainReason
from kuberay_scaler.core.model.ray import NodeStatus, RayNode, RayState
from kuberay_scaler.core.model.reasons import Keep, KeepKind
from kuberay_scaler.core.planner.deadlines import Deadlines
from kuberay_scaler.core.planner.gate import Blocked
from kuberay_scaler.core.planner.policy import Policy
from kuberay_scaler.loop.reconcile_report import ReconcileReport
from tests.control.fakes import Loop, make_loop, reply_of, run_for
from tests.control.test_faults import kill_between_record_and_patch, restarted
from tests.control.worlds import (
    broken_busy_slice_world,
    named_pods,
    spec_group,
    workers_to_delete,
)
from tests.factories import (
    cluster,
    cpu_nodes,
    group,
    head_node,
    node_id_of,
    slice_pods,
    state,
    tasks,
    tpu_group,
    tpu_slice_nodes,
)

GRACE_S = 180.0  # the default missing-node grace


def assert_gate_held(loop: Loop, busy: set[str]) -> None:
    """No pod whose Ray node runs work was named without an accepted idle-termination drain, or
    a preemption drain whose notice is over (the gate's (d))."""
    accepted = {d.node_id for d in loop.gcs.drains if d.reason is DrainReason.IDLE_TERMINATION}
    accepted -= loop.gcs.refuse | loop.gcs.busy
    now_ms = loop.clock.wall().timestamp() * 1000
    accepted |= {
        d.node_id
        for d in loop.gcs.drains
        if d.reason is DrainReason.PREEMPTION
        and d.node_id not in loop.gcs.refuse
        and d.deadline_ms <= now_ms
    }
    for pod in named_pods(loop) & busy:
        assert node_id_of(pod) in accepted, f"busy pod {pod} named without an accepted drain"


def two_busy_slices_above_max() -> tuple[Loop, list[RayNode]]:
    pods = slice_pods("tpu", "tpu-a", 4) + slice_pods("tpu", "tpu-b", 4)
    nodes = [
        head_node(),
        *tpu_slice_nodes("tpu-a", 4, idle_s=None),
        *tpu_slice_nodes("tpu-b", 4, idle_s=None),
    ]
    # A notice longer than the test: no slice reaches the gate's (d) while it settles, so any
    # busy pod named here was named on a missing node's account.
    policy = Policy(deadlines=Deadlines(preempt_deadline_s=3600.0))
    rc = cluster(tpu_group(replicas=2, max_replicas=1))
    loop = make_loop(rc, pods, state(nodes), policy=policy)
    loop.gcs.busy = {n.node_id for n in nodes if n.status is NodeStatus.RUNNING}
    return loop, nodes


BUSY = {f"tpu-{k}-{i}" for k in "ab" for i in range(4)}


async def test_surplus_path_and_one_partial_reply_deletes_no_busy_slice() -> None:
    loop, nodes = two_busy_slices_above_max()
    await run_for(loop, GRACE_S + 20, state(nodes))  # both seen busy for longer than the grace
    without_b = [n for n in nodes if not n.instance_id.startswith("tpu-b")]
    loop.clock.advance(1)
    loop.see_ray(state(without_b))  # one reply omits slice b's nodes
    await loop.reconciler.reconcile()
    assert_gate_held(loop, BUSY)
    assert not named_pods(loop) & BUSY


async def test_first_reply_after_a_gcs_restart_deletes_no_busy_slice() -> None:
    loop, nodes = two_busy_slices_above_max()
    await run_for(loop, GRACE_S + 20, state(nodes))
    without_b = [n for n in nodes if not n.instance_id.startswith("tpu-b")]
    loop.clock.advance(2)
    loop.see_ray(state(without_b), epoch=2)  # the GCS came back; b's raylets not re-registered
    await loop.reconciler.reconcile()
    assert not named_pods(loop) & BUSY


async def test_restart_adoption_with_two_hosts_missing_deletes_nothing_busy() -> None:
    loop = await kill_between_record_and_patch(("tpu-a",))
    survivors = tpu_slice_nodes("tpu-a", 4, idle_s=None)[2:]  # the slice turned busy
    again = restarted(loop, [head_node(), *survivors])
    again.gcs.busy = {n.node_id for n in survivors}
    again.see_ray(state([head_node(), *survivors]), epoch=2)  # the GCS restarted too
    await again.reconciler.reconcile()
    assert workers_to_delete(again) == [] and spec_group(again)["replicas"] == 1


async def test_restart_adoption_with_all_hosts_missing_deletes_nothing_at_once() -> None:
    loop = await kill_between_record_and_patch(("tpu-a",))
    again = restarted(loop, [head_node()])
    again.see_ray(state([head_node()]), epoch=2)
    await again.reconciler.reconcile()
    assert workers_to_delete(again) == [] and spec_group(again)["replicas"] == 1


def _twice(first: RayNode, second: RayNode) -> RayState:
    return state([head_node(), first, second])


async def test_two_alive_entries_for_one_pod_busy_wins_whatever_the_order() -> None:
    pods = slice_pods("cpu", "cpu-a", 1)
    idle = cpu_nodes(["cpu-a-0"], idle_s=900)[0]
    busy = cpu_nodes(["cpu-a-0"], free_cpu=0)[0]
    busy = RayNode(**{**busy.__dict__, "node_id": "ab" * 28})  # a second raylet on the pod
    for first, second in ((busy, idle), (idle, busy)):
        rc = cluster(group("cpu", replicas=1, max_replicas=4))
        loop = make_loop(rc, pods, _twice(first, second))
        await loop.reconciler.reconcile()
        assert workers_to_delete(loop) == [], f"order {first.status}, {second.status}"
        assert spec_group(loop)["replicas"] == 1
        # The plan itself saw the pod busy (not only the fresh read before the drain): no
        # deletion planned, so no draining record written and no drain sent.
        assert loop.writer.calls == [], f"order {first.status}, {second.status}: written"
        assert loop.gcs.drains == []


async def test_available_above_total_absorbs_no_other_groups_demand() -> None:
    rc = cluster(group("small", replicas=1, max_replicas=4), group("big", cpu="8", max_replicas=4))
    pods = slice_pods("small", "small-a", 1)
    liar = cpu_nodes(["small-a-0"], "small", cpu=8)[0]
    liar = RayNode(**{**liar.__dict__, "available": {"CPU": 1000.0, "memory": 32 * 2**30}})
    loop = make_loop(rc, pods, reply_of(state([head_node(), liar], [tasks({"CPU": 1}, 24)])))
    await loop.reconciler.reconcile()
    groups = {g["groupName"]: g for g in loop.server.obj["spec"]["workerGroupSpecs"]}
    added = sum(int(g.get("replicas", 0)) for g in groups.values()) - 1
    assert added >= 2, "demand the lying node cannot hold was not served"


async def test_a_drain_that_raises_does_not_stop_the_other_groups_scale_up() -> None:
    """KUBERAY_SCALER_DRAIN_DEADLINE_S=1e300 made every drain raise (int64 overflow) after the
    record was written; the other group's scale-up in the same decision was never written."""
    rc = cluster(tpu_group(replicas=1), group("cpu", cpu="32", max_replicas=5))
    pods = slice_pods("tpu", "tpu-a", 4)
    nodes = [head_node(), *tpu_slice_nodes("tpu-a", 4, idle_s=900)]
    loop = make_loop(rc, pods, state(nodes, [tasks({"CPU": 30}, 2)]))

    async def overflow(node_ids: Any, **_: Any) -> object:
        raise ValueError("Value out of range: 10**303")

    loop.gcs.drain = overflow  # type: ignore[method-assign]
    await loop.reconciler.reconcile()
    tpu, cpu = loop.server.obj["spec"]["workerGroupSpecs"]
    assert cpu["replicas"] == 2, "the other group's scale-up was lost"
    assert workers_to_delete(loop) == [] and tpu["replicas"] == 1  # undrained: kept


async def test_a_refused_drain_backs_off_instead_of_retrying_every_round() -> None:
    """Every host refuses (busy in Ray while the poll still says idle). Today: ~95 rounds in
    20 s, 380 DrainNode calls, 190 RayCluster writes. Bounded on a fake clock: at most one
    drain round until the slice's idle state changes or the backoff passes."""
    pods = slice_pods("tpu", "tpu-a", 4)
    nodes = [head_node(), *tpu_slice_nodes("tpu-a", 4, idle_s=900)]
    loop = make_loop(cluster(tpu_group(replicas=1)), pods, state(nodes))
    loop.gcs.refuse = {node_id_of(f"tpu-a-{i}") for i in range(4)}
    for _ in range(95):  # 95 rounds in 20 s
        loop.clock.advance(20 / 95)
        loop.see_ray(state(nodes))
        await loop.reconciler.reconcile({"timer"})
    assert len(loop.gcs.drains) <= 2 * 4, f"{len(loop.gcs.drains)} DrainNode calls"
    # One write: the draining record, kept for the retry and never written again (with the
    # record rewritten on the retry round this was 2).
    assert len(loop.writer.calls) == 1, f"{len(loop.writer.calls)} RayCluster writes"
    assert workers_to_delete(loop) == []


async def test_a_broken_busy_slice_is_kept_bounded_then_preempted_and_replaced_whole() -> None:
    """A Failed host, its Ray node DEAD, the others busy (a placement group
    rescheduling onto a slice that can never be whole): kept at most broken_busy_max_s, then
    its live hosts are drained for preemption, and past that deadline it is replaced whole."""
    loop, ray = broken_busy_slice_world(
        Policy(deadlines=Deadlines(broken_busy_max_s=600, preempt_deadline_s=120))
    )
    await run_for(loop, 590, ray)
    assert loop.gcs.drains == [] and workers_to_delete(loop) == []
    kept = _reasons(loop)
    assert any(r.kind is KeepKind.BROKEN_BUT_BUSY and "of at most 600 s" in r.detail for r in kept)

    await run_for(loop, 30, ray)  # past the bound: the live hosts are drained for preemption
    live = {node_id_of(f"tpu-a-{i}") for i in (0, 1, 3)}
    assert {d.node_id for d in loop.gcs.drains} == live
    assert {d.reason for d in loop.gcs.drains} == {DrainReason.PREEMPTION}
    assert workers_to_delete(loop) == []
    assert any("drained for preemption" in m for _, m in loop.events.recorded)
    report = loop.gcs.reports[-1]  # what `ray status` shows
    assert any("drained for preemption" in f.reason for f in report.failed)

    await run_for(loop, 130, ray)  # past the preemption deadline: replaced whole
    assert sorted(workers_to_delete(loop)) == [f"tpu-a-{i}" for i in range(4)]
    assert len(loop.gcs.drains) == 3  # never drained again for idle termination


def _reasons(loop: Loop) -> list[Any]:
    decision = loop.reconciler.status.last_decision
    assert decision is not None
    return [r for g in decision.plan.groups for r in g.reasons if isinstance(r, Keep)]


# --- issue 30: the gate judges the last read, made after the drains answered ------------------


def _late_host_world() -> tuple[Loop, list[RayNode]]:
    """One idle 4-host slice (tpu-a) past its idle timeout, one busy slice (tpu-b) that stays."""
    pods = slice_pods("tpu", "tpu-a", 4) + slice_pods("tpu", "tpu-b", 4)
    nodes = [
        head_node(),
        *tpu_slice_nodes("tpu-a", 4, idle_s=900),
        *tpu_slice_nodes("tpu-b", 4, idle_s=None),
    ]
    loop = make_loop(cluster(tpu_group(replicas=2)), pods, state(nodes))
    return loop, nodes


def _answer_late(loop: Loop, meanwhile: Any) -> None:
    """tpu-a's drain answers only after `meanwhile()` ran: one host answers late, and in that
    time the world changes (a raylet replaced, a pod recreated)."""
    drain = loop.gcs.drain

    async def late(node_ids: Any, **kw: Any) -> Any:
        answer = await drain(node_ids, **kw)
        if node_id_of("tpu-a-3") in node_ids:
            meanwhile()
        return answer

    loop.gcs.drain = late  # type: ignore[method-assign]


def _gate_blocks(loop: Loop) -> list[Blocked]:
    """Every deletion the gate drops from here on, as each reconcile's report says them."""
    seen: list[Blocked] = []
    record = loop.reconciler.recorder.record

    def said(report: ReconcileReport) -> None:
        seen.extend(report.blocked)
        record(report)

    loop.reconciler.recorder.record = said  # type: ignore[method-assign]
    return seen


async def test_a_raylet_replaced_while_a_host_answers_late_is_never_named() -> None:
    """Tpu-a drained, tpu-a-3 answers 4 s late; meanwhile tpu-a-1's drained raylet
    exits and the container restarts: a new raylet (new node id, same pod) takes work. The
    patch was gated on the read before the drains and named tpu-a-1, RUNNING, never drained."""
    loop, nodes = _late_host_world()
    reborn = RayNode(
        **{**tpu_slice_nodes("tpu-a", 4, idle_s=None)[1].__dict__, "node_id": "cd" * 28}
    )
    old = next(n for n in nodes if n.instance_id == "tpu-a-1")
    after = [
        RayNode(**{**old.__dict__, "status": NodeStatus.DEAD}) if n is old else n for n in nodes
    ]

    def replace_raylet() -> None:
        loop.clock.advance(4)
        loop.gcs.fresh = state([*after, reborn])

    _answer_late(loop, replace_raylet)
    blocked = _gate_blocks(loop)
    await loop.reconciler.reconcile()
    assert loop.gcs.drains, "the idle slice was never drained"
    assert "tpu-a-1" not in named_pods(loop), "a pod running a new, undrained raylet was named"
    assert workers_to_delete(loop) == []  # the slice is kept whole: broken now, not idle
    assert [(b.pod, b.kind) for b in blocked] == [("tpu-a-1", KeepKind.GATE_NOT_DRAINED)]


async def test_a_pod_recreated_while_a_host_answers_late_is_never_named() -> None:
    """Issue 30, the other way: tpu-a-1's pod is recreated under the same name (a new uid) while
    tpu-a-3 answers late; its new raylet has not joined yet. The plan's pod is gone: the new
    one was never drained and must not be named."""
    loop, nodes = _late_host_world()
    old = next(n for n in nodes if n.instance_id == "tpu-a-1")
    after = [n for n in nodes if n is not old]

    def recreate_pod() -> None:
        loop.clock.advance(4)
        loop.pods.pods[1]["metadata"]["uid"] = "u-tpu-a-1-new"
        loop.gcs.fresh = state(after)

    _answer_late(loop, recreate_pod)
    blocked = _gate_blocks(loop)
    await loop.reconciler.reconcile()
    assert loop.gcs.drains, "the idle slice was never drained"
    assert "tpu-a-1" not in named_pods(loop), "a recreated pod (new uid) was named"
    assert workers_to_delete(loop) == []
    assert [(b.pod, b.kind) for b in blocked] == [("tpu-a-1", KeepKind.GATE_POD_REPLACED)]
