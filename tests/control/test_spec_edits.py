"""Spec edits acted on at the first RayCluster read after them (issue 22 item 1).

Under KubeRay's Role the daemon only GETs the RayCluster (poll mode, `PollCadence`), so an edit
reaches the loop as one read followed by a reconcile woken by "raycluster". Each test settles the
loop on the old spec, edits the stored object (the user's `kubectl edit`), shows that the
daemon's cached copy alone does not act on it, then does the one read and the change-woken
reconcile and asserts the edit is acted on there, with the invariants: every target within
[minReplicas, maxReplicas] of the spec as edited, and every pod named in `workersToDelete`
drained first. The e2e tier covers `maxReplicas` both ways, `minReplicas` raised and a new group
(tests/e2e/test_peer_autoscaler.py); these are the other edits the issue lists.
"""

from __future__ import annotations

from typing import Any

from kuberay_scaler.core.model.reasons import HoldKind, Keep, KeepKind
from kuberay_scaler.core.model.slices import SliceState
from kuberay_scaler.core.planner.deadlines import Deadlines
from kuberay_scaler.core.planner.policy import Policy
from tests.control.fakes import Loop, make_loop
from tests.control.worlds import busy_cpu_worker_world
from tests.factories import (
    cluster,
    cpu_nodes,
    group,
    head_node,
    node_id_of,
    pod,
    slice_pods,
    state,
    tasks,
    tpu_group,
    tpu_slice_nodes,
)

CHANGED = {"raycluster"}  # what the view's on_change fires after a GET that saw the edit


def _groups(loop: Loop) -> list[dict[str, Any]]:
    return loop.server.obj["spec"]["workerGroupSpecs"]  # type: ignore[no-any-return]


def _group(loop: Loop, name: str) -> dict[str, Any]:
    return next(g for g in _groups(loop) if g["groupName"] == name)


def _named(loop: Loop, name: str) -> list[str]:
    return sorted(_group(loop, name).get("scaleStrategy", {}).get("workersToDelete", []))


async def _settle(loop: Loop) -> None:
    """The loop has planned the old spec and has nothing left to do: a change-woken reconcile on
    the same inputs is skipped, so only a read that brings the edit can make it act."""
    await loop.reconciler.reconcile()
    calls = len(loop.writer.calls)
    await loop.reconciler.reconcile(set(CHANGED))
    assert len(loop.writer.calls) == calls


async def _edit_then_read(loop: Loop, path: list[str | int], value: Any) -> None:
    calls, drains = len(loop.writer.calls), len(loop.gcs.drains)
    loop.server.edit(path, value)
    loop.clock.advance(0.5)
    # Before the read: the cached copy is the old spec, nothing new is done.
    await loop.reconciler.reconcile(set(CHANGED))
    assert (len(loop.writer.calls), len(loop.gcs.drains)) == (calls, drains)
    loop.clock.advance(0.5)
    await loop.view.refresh()  # the first RayCluster GET after the edit
    await loop.reconciler.reconcile(set(CHANGED))


def _invariants(loop: Loop) -> None:
    drained = {d.node_id for d in loop.gcs.drains}
    for g in _groups(loop):
        assert g["minReplicas"] <= g["replicas"] <= g["maxReplicas"], g["groupName"]
        for name in g.get("scaleStrategy", {}).get("workersToDelete", []):
            assert node_id_of(name) in drained, f"{name} deleted undrained"


async def test_min_replicas_lowered_lets_idle_workers_go_at_the_first_read() -> None:
    names = ["cpu-a", "cpu-b", "cpu-c"]
    rc = cluster(group("cpu", replicas=3, min_replicas=3, max_replicas=5))
    nodes = [
        head_node(),
        *cpu_nodes(names[:2], idle_s=600),  # long past the 60 s idle timeout
        *cpu_nodes(names[2:], free_cpu=0),  # busy
    ]
    loop = make_loop(rc, [pod(n, "cpu") for n in names], state(nodes))
    await _settle(loop)
    assert _group(loop, "cpu")["replicas"] == 3 and not loop.gcs.drains  # held at min

    await _edit_then_read(loop, ["spec", "workerGroupSpecs", 0, "minReplicas"], 1)
    assert _group(loop, "cpu")["replicas"] == 1
    assert _named(loop, "cpu") == ["cpu-a", "cpu-b"]  # the idle ones; the busy one stays
    _invariants(loop)


async def test_a_removed_group_is_no_longer_planned_and_the_rest_is_patched_by_name() -> None:
    """Group `gpu` (index 0, one busy worker) removed: `cpu` moves to index 0. CPU demand at the
    same read is patched into `cpu` at its new index in one guarded patch (no stale replan); the
    removed group's pod is said as a problem, never drained or named for deletion by us (KubeRay
    owns the pods of a group that is gone)."""
    rc = cluster(
        group("gpu", replicas=1, max_replicas=2, cpu="4"),
        group("cpu", replicas=1, min_replicas=1, max_replicas=4),
    )
    nodes = [
        head_node(),
        *cpu_nodes(["cpu-a"], free_cpu=0),
        *cpu_nodes(["gpu-a"], "gpu", cpu=4, free_cpu=0),
    ]
    loop = make_loop(rc, [pod("cpu-a", "cpu"), pod("gpu-a", "gpu")], state(nodes))
    await _settle(loop)

    loop.see_ray(state(nodes, tasks=[tasks({"CPU": 8}, 1)]))  # demand, then the spec changes
    loop.reconciler.gcs_changed()
    await loop.reconciler.reconcile({"gcs"})
    assert _group(loop, "cpu")["replicas"] == 2  # the old spec: one raise, into `cpu`
    calls, refreshes = len(loop.writer.calls), loop.view.refreshes

    loop.server.edit(["spec", "workerGroupSpecs"], [_group(loop, "cpu")])
    loop.clock.advance(1)
    loop.see_ray(state(nodes, tasks=[tasks({"CPU": 8}, 2)]))
    await loop.view.refresh()
    result = await loop.reconciler.reconcile(set(CHANGED))
    assert result is not None
    assert [g.group for g in result.groups] == ["cpu"]
    assert [g["groupName"] for g in _groups(loop)] == ["cpu"]
    assert _group(loop, "cpu")["replicas"] == 3  # one more: the second task (one is pending)
    [call] = loop.writer.calls[calls:]
    assert call.outcome.kind == "applied"
    assert {"op": "test", "path": "/spec/workerGroupSpecs/0/groupName", "value": "cpu"} in call.ops
    assert loop.view.refreshes == refreshes + 1  # only the read that brought the edit
    assert any("gpu-a" in p.message for p in result.problems)
    assert node_id_of("gpu-a") not in {d.node_id for d in loop.gcs.drains}
    _invariants(loop)


async def test_suspend_stops_every_write_from_the_first_read() -> None:
    loop, nodes = busy_cpu_worker_world()
    await _settle(loop)

    loop.server.edit(["spec", "suspend"], True)
    loop.clock.advance(1)
    await loop.view.refresh()
    loop.see_ray(state(nodes, tasks=[tasks({"CPU": 8}, 2)]))  # demand that would scale up
    calls = len(loop.writer.calls)
    result = await loop.reconciler.reconcile(set(CHANGED))
    assert result is not None and result.held is not None
    assert result.held.kind is HoldKind.CLUSTER_SUSPENDED
    assert len(loop.writer.calls) == calls and not loop.gcs.drains
    assert _group(loop, "cpu")["replicas"] == 1

    # Resumed: the next read after it scales up for the same demand.
    loop.server.edit(["spec", "suspend"], False)
    loop.clock.advance(1)
    await loop.view.refresh()
    await loop.reconciler.reconcile(set(CHANGED))
    assert _group(loop, "cpu")["replicas"] == 3
    _invariants(loop)


async def test_a_suspended_group_gets_no_scale_up_from_the_first_read() -> None:
    loop, nodes = busy_cpu_worker_world()
    await _settle(loop)

    loop.server.edit(["spec", "workerGroupSpecs", 0, "suspend"], True)
    loop.clock.advance(1)
    await loop.view.refresh()
    loop.see_ray(state(nodes, tasks=[tasks({"CPU": 8}, 2)]))
    calls = len(loop.writer.calls)
    result = await loop.reconciler.reconcile(set(CHANGED))
    assert result is not None
    decision = result.group("cpu")
    assert decision is not None and not decision.changes
    assert len(loop.writer.calls) == calls and not loop.gcs.drains
    _invariants(loop)


async def test_group_idle_timeout_lowered_deletes_an_expired_worker_at_the_first_read() -> None:
    rc = cluster(group("cpu", replicas=2, max_replicas=4, idleTimeoutSeconds=600))
    nodes = [
        head_node(),
        *cpu_nodes(["cpu-a"], idle_s=120),  # within 600 s, past 60 s
        *cpu_nodes(["cpu-b"], free_cpu=0),
    ]
    loop = make_loop(rc, [pod("cpu-a", "cpu"), pod("cpu-b", "cpu")], state(nodes))
    await _settle(loop)
    assert _group(loop, "cpu")["replicas"] == 2 and not loop.gcs.drains

    await _edit_then_read(loop, ["spec", "workerGroupSpecs", 0, "idleTimeoutSeconds"], 60)
    assert _named(loop, "cpu") == ["cpu-a"]
    assert _group(loop, "cpu")["replicas"] == 1
    _invariants(loop)


async def test_cluster_idle_timeout_lowered_deletes_an_expired_worker_at_the_first_read() -> None:
    rc = cluster(
        group("cpu", replicas=2, max_replicas=4), autoscalerOptions={"idleTimeoutSeconds": 600}
    )
    nodes = [head_node(), *cpu_nodes(["cpu-a"], idle_s=120), *cpu_nodes(["cpu-b"], free_cpu=0)]
    loop = make_loop(rc, [pod("cpu-a", "cpu"), pod("cpu-b", "cpu")], state(nodes))
    await _settle(loop)
    assert not loop.gcs.drains

    await _edit_then_read(loop, ["spec", "autoscalerOptions", "idleTimeoutSeconds"], 60)
    assert _named(loop, "cpu") == ["cpu-a"]
    assert _group(loop, "cpu")["replicas"] == 1
    _invariants(loop)


async def test_idle_timeout_raised_keeps_a_worker_the_old_timeout_would_soon_delete() -> None:
    rc = cluster(group("cpu", replicas=1, max_replicas=4, idleTimeoutSeconds=60))
    nodes = [head_node(), *cpu_nodes(["cpu-a"], idle_s=30)]
    loop = make_loop(rc, [pod("cpu-a", "cpu")], state(nodes))
    await _settle(loop)

    loop.server.edit(["spec", "workerGroupSpecs", 0, "idleTimeoutSeconds"], 600)
    loop.clock.advance(1)
    await loop.view.refresh()
    await loop.reconciler.reconcile(set(CHANGED))
    # 31 s later the old timeout has passed: the new one holds, and the wake-up timer follows it.
    loop.clock.advance(31)
    loop.see_ray(state([head_node(), *cpu_nodes(["cpu-a"], idle_s=61)]))
    await loop.reconciler.reconcile({"timer"})
    assert not loop.gcs.drains and _named(loop, "cpu") == []
    assert _group(loop, "cpu")["replicas"] == 1
    _invariants(loop)


# --- issue 30: a slice built to an older spec is outdated, not broken ----------------------------


async def test_num_of_hosts_lowered_on_a_live_group_destroys_no_busy_slice() -> None:
    """numOfHosts 4 -> 2 on a group of two busy 4-host slices. Before: every slice "broken (4
    hosts, more than numOfHosts 2)": all 8 RUNNING hosts drained for preemption and deleted,
    and nothing said at the edit. Now they are outdated: they keep serving, are never drained
    for it, and the edit is named at once (a reason, an Event, /debug/slices)."""
    rc = cluster(tpu_group(replicas=2))
    pods = slice_pods("tpu", "tpu-a", 4) + slice_pods("tpu", "tpu-b", 4)
    busy = state(
        [
            head_node(),
            *tpu_slice_nodes("tpu-a", 4, idle_s=None),
            *tpu_slice_nodes("tpu-b", 4, busy_hosts=(0,)),
        ]
    )
    policy = Policy(
        deadlines=Deadlines(broken_busy_max_s=60, preempt_deadline_s=10)
    )  # short: a mistake shows fast
    loop = make_loop(rc, pods, busy, policy=policy)
    loop.gcs.busy = {n.node_id for n in busy.nodes}
    await _settle(loop)
    await _edit_then_read(loop, ["spec", "workerGroupSpecs", 0, "numOfHosts"], 2)
    for _ in range(20):  # 200 s: past the broken-busy bound and a preemption notice
        loop.clock.advance(10)
        loop.see_ray(busy)
        await loop.reconciler.reconcile({"timer"})
    assert loop.gcs.drains == [], "a busy slice built to the old spec was drained"
    assert _named(loop, "tpu") == []
    decision = loop.reconciler.status.last_decision
    assert decision is not None and decision.plan.slice_map is not None
    slices = decision.plan.slice_map.groups["tpu"].slices
    assert {s.state for s in slices} == {SliceState.OUTDATED}
    assert all("numOfHosts 2" in s.reason for s in slices)
    group = decision.plan.group("tpu")
    assert group is not None
    kept = [r for r in group.reasons if isinstance(r, Keep) and r.kind is KeepKind.OUTDATED]
    assert {r.slice for r in kept} == {"tpu-a", "tpu-b"}
    said = [m for reason, m in loop.events.recorded if reason == "SliceOutdated"]
    assert len(said) == 2 and all("numOfHosts 2" in m for m in said)  # once per slice
    doc = decision.plan.summary()["groups"][0]["slices"]
    assert {d["state"] for d in doc} == {"outdated"}  # what /debug/slices shows
    assert group.launching_hosts == 0  # both replicas have their pods: none is launching
    assert _group(loop, "tpu")["replicas"] == 2


async def test_an_idle_outdated_slice_is_removed_before_an_idle_current_one() -> None:
    """After numOfHosts 4 -> 2: an idle 4-host slice (outdated) and an idle 2-host one (current,
    idle longer); minReplicas lets one go: the outdated one goes."""
    rc = cluster(tpu_group(replicas=2, min_replicas=1, hosts=2))
    pods = slice_pods("tpu", "tpu-a", 4) + slice_pods("tpu", "tpu-c", 2)
    nodes = [
        head_node(),
        *tpu_slice_nodes("tpu-a", 4, idle_s=120),
        *tpu_slice_nodes("tpu-c", 2, idle_s=900),
    ]
    loop = make_loop(rc, pods, state(nodes))
    await loop.reconciler.reconcile()
    assert _named(loop, "tpu") == [f"tpu-a-{i}" for i in range(4)]
    drained = {d.node_id for d in loop.gcs.drains}
    assert drained == {node_id_of(f"tpu-a-{i}") for i in range(4)}
    assert _group(loop, "tpu")["replicas"] == 1
