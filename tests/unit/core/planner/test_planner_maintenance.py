"""GKE maintenance on a slice's nodes (issue 33): the node facts, and the disruption stage's
rule: an idle slice there leaves first, a busy one gets a replacement ahead of the window and
its drain starts one preemption deadline before it (docs/planner.md, "GKE maintenance")."""

from __future__ import annotations

from typing import Any

from kuberay_scaler.core.model.plan import DeleteKind, GroupDecision, Memory, Plan
from kuberay_scaler.core.model.ray import RayNode
from kuberay_scaler.core.model.reasons import (
    Disruption,
    DisruptionKind,
    ScaleDown,
    ScaleDownKind,
)
from kuberay_scaler.core.model.signals import (
    IMPENDING_NODE_TERMINATION,
    SCHEDULED_MAINTENANCE_TIME,
    NodeMaintenance,
)
from kuberay_scaler.core.parse.nodes import node_maintenance, slim_node
from kuberay_scaler.core.planner.pipeline import plan as plan_fn
from kuberay_scaler.core.planner.policy import Policy
from tests.factories import (
    NOW,
    NOW_S,
    cluster,
    head_node,
    slice_pods,
    snapshot_of,
    state,
    tpu_group,
    tpu_slice_nodes,
)

T0 = NOW.timestamp()  # the monotonic reading where the nodes' idle clocks are stamped


def raw_node(
    name: str, *, label: str | None = None, note: str | None = None, taint: bool = False
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "resourceVersion": "7", "labels": {"a": "b"}}
    if label is not None:
        meta["labels"][SCHEDULED_MAINTENANCE_TIME] = label
    if note is not None:
        meta["annotations"] = {SCHEDULED_MAINTENANCE_TIME: note, "x": "y"}
    taints = [{"key": "other", "effect": "NoSchedule"}]
    if taint:
        taints.append({"key": IMPENDING_NODE_TERMINATION, "effect": "NoSchedule"})
    return {"metadata": meta, "spec": {"taints": taints}}


def test_a_node_announces_its_window_by_label_annotation_or_taint() -> None:
    start = int(T0) + 600
    assert node_maintenance(raw_node("n1", label=str(start))) == NodeMaintenance("n1", start * 1000)
    assert node_maintenance(raw_node("n2", note=str(start))) == NodeMaintenance("n2", start * 1000)
    assert node_maintenance(raw_node("n3", taint=True)) == NodeMaintenance("n3", None, True)
    assert node_maintenance(raw_node("n4")) is None
    assert node_maintenance(raw_node("n5", label="soon")) is None  # not a number: not guessed
    slim = slim_node(raw_node("n6", label=str(start), taint=True))
    assert node_maintenance(slim) == NodeMaintenance("n6", start * 1000, True)
    assert slim["metadata"]["labels"] == {SCHEDULED_MAINTENANCE_TIME: str(start)}
    assert [t["key"] for t in slim["spec"]["taints"]] == [IMPENDING_NODE_TERMINATION]


def on_nodes(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for p in pods:
        p["spec"]["nodeName"] = f"node-{p['metadata']['name']}"
    return pods


def tpu_slices(*idle: float | None) -> tuple[list[dict[str, Any]], list[RayNode]]:
    """One v6e-16 slice per entry (tpu-a, tpu-b, ...): idle seconds, or None for busy."""
    pods: list[dict[str, Any]] = []
    nodes: list[RayNode] = [head_node()]
    for i, seconds in enumerate(idle):
        key = f"tpu-{chr(ord('a') + i)}"
        pods += on_nodes(slice_pods("tpu", key, 4, age_s=3600 + i))
        hosts = (0, 1, 2, 3) if seconds is None else ()
        nodes += tpu_slice_nodes(key, 4, idle_s=seconds or 0, busy_hosts=hosts)
    return pods, nodes


def window_in(seconds: float, host: str = "tpu-a-1") -> dict[str, NodeMaintenance]:
    start_ms = int((T0 + seconds) * 1000)
    return {f"node-{host}": NodeMaintenance(f"node-{host}", start_ms)}


def run(
    pods: list[dict[str, Any]],
    nodes: list[RayNode],
    maintenance: dict[str, NodeMaintenance],
    *,
    replicas: int = 2,
    memory: Memory | None = None,
    mono_s: float = T0,
) -> Plan:
    snap = snapshot_of(cluster(tpu_group(replicas=replicas)), pods)
    return plan_fn(
        snap,
        state(nodes),
        memory or Memory(),
        Policy(),
        NOW,
        mono_s=mono_s,
        maintenance=maintenance,
    )


def decision_of(result: Plan) -> GroupDecision:
    found = result.group("tpu")
    assert found is not None
    return found


def disruptions(d: GroupDecision, kind: DisruptionKind) -> list[Disruption]:
    return [r for r in d.reasons if isinstance(r, Disruption) and r.kind is kind]


def test_a_busy_slice_with_maintenance_ahead_gets_a_replacement_and_is_not_drained_yet() -> None:
    pods, nodes = tpu_slices(None, None)
    result = run(pods, nodes, window_in(600))
    d = decision_of(result)
    assert d.preempt == () and d.deletions == ()
    assert d.target == 3 and d.reason_code == DisruptionKind.REPLACED_AHEAD.value
    (ahead,) = disruptions(d, DisruptionKind.REPLACED_AHEAD)
    assert ahead.slice == "tpu-a" and ahead.cause == "maintenance"
    assert "node-tpu-a-1" in str(ahead) and "maintenance" in str(ahead)
    (said,) = disruptions(d, DisruptionKind.MAINTENANCE)
    assert said.slice == "tpu-a" and "GKE maintenance on node node-tpu-a-1 at" in str(said)
    assert dict(result.memory.replaced_ahead) == {"tpu-a": "tpu"}
    again = run(pods, nodes, window_in(590), replicas=3, memory=result.memory, mono_s=T0 + 10)
    assert decision_of(again).target == 3  # once per slice


def test_a_far_window_only_names_it_and_wakes_the_loop_at_the_replace_ahead_lead() -> None:
    pods, nodes = tpu_slices(None, None)
    d = decision_of(run(pods, nodes, window_in(7200)))
    assert d.target == 2 and d.preempt == () and d.deletions == ()
    (said,) = disruptions(d, DisruptionKind.MAINTENANCE)
    assert said.wait_s is not None and abs(said.wait_s - (7200 - 1800)) < 1


def test_within_the_lead_the_loop_wakes_one_preemption_deadline_before_the_window() -> None:
    pods, nodes = tpu_slices(None, None)
    result = run(pods, nodes, window_in(600))
    (said,) = disruptions(decision_of(result), DisruptionKind.MAINTENANCE)
    assert said.wait_s is not None and abs(said.wait_s - (600 - 30)) < 1
    assert result.next_wake_s is not None and result.next_wake_s <= said.wait_s


def test_the_replacement_is_kept_until_the_window_not_idled_out() -> None:
    pods, nodes = tpu_slices(None, None)
    first = run(pods, nodes, window_in(600))
    assert decision_of(first).target == 3
    # The replacement (tpu-c) came up and has been idle past the idle timeout since.
    more_pods, more_nodes = tpu_slices(None, None, 900.0)
    later = run(more_pods, more_nodes, window_in(300), replicas=3, memory=first.memory)
    d = decision_of(later)
    assert d.deletions == () and d.target == 3
    (kept,) = disruptions(d, DisruptionKind.SPARE_KEPT)
    assert kept.slice == "tpu-c" and "replaced ahead of GKE maintenance" in str(kept)


def test_a_busy_slice_is_drained_one_preemption_deadline_before_the_window() -> None:
    pods, nodes = tpu_slices(None, None)
    # The monotonic clock is far from the wall: the deadline is the window on the tick's clock.
    result = run(pods, nodes, window_in(20), mono_s=T0 - 5000)
    d = decision_of(result)
    (drain,) = d.preempt
    assert drain.slice_key == "tpu-a" and drain.kind is DeleteKind.PREEMPT
    assert isinstance(drain.reason, ScaleDown) and drain.reason.kind is ScaleDownKind.MAINTENANCE
    assert "node-tpu-a-1" in str(drain.reason)
    assert result.memory.preempting["tpu-a"] == T0 - 5000 + 20  # monotonic seconds
    assert d.deletions == ()  # nothing busy is deleted: drained, the window takes it
    assert dict(result.memory.disrupted) == {"tpu-a": "tpu"}


def test_a_tainted_node_drains_its_slice_with_the_preemption_deadline() -> None:
    pods, nodes = tpu_slices(None, None)
    tainted = {"node-tpu-b-0": NodeMaintenance("node-tpu-b-0", None, True)}
    result = run(pods, nodes, tainted)
    d = decision_of(result)
    assert [x.slice_key for x in d.preempt] == ["tpu-b"]
    assert result.memory.preempting["tpu-b"] == NOW_S + 30
    assert d.target == 3  # its work gets a slice added ahead


def test_an_idle_slice_on_a_maintenance_node_leaves_before_the_other_idle_slices() -> None:
    # tpu-a idle past its timeout, tpu-b idle only just, on a node with maintenance in 2 h.
    pods, nodes = tpu_slices(900.0, 10.0)
    d = decision_of(run(pods, nodes, window_in(7200, "tpu-b-2")))
    (gone,) = d.deletions
    assert gone.slice_key == "tpu-b" and gone.kind is DeleteKind.IDLE  # drained, then deleted
    assert isinstance(gone.reason, ScaleDown)
    assert gone.reason.kind is ScaleDownKind.MAINTENANCE_FIRST
    assert "in place of idle slice tpu-a" in str(gone.reason)
    said = [r for r in d.reasons if isinstance(r, ScaleDown)]
    assert [r.slice for r in said] == ["tpu-b"]  # nothing says tpu-a leaves
    assert d.target == 1  # no more slices leave than before


def test_without_an_idle_removal_the_maintenance_slice_is_not_removed_early() -> None:
    pods, nodes = tpu_slices(10.0, 10.0)
    d = decision_of(run(pods, nodes, window_in(7200, "tpu-b-2")))
    assert d.deletions == () and d.target == 2


def test_no_node_facts_change_nothing() -> None:
    pods, nodes = tpu_slices(None, 900.0)
    with_facts = decision_of(run(pods, nodes, {"node-elsewhere": NodeMaintenance("x", 1)}))
    without = decision_of(run(pods, nodes, {}))
    assert with_facts.deletions == without.deletions and with_facts.target == without.target


def test_debug_slices_names_the_window() -> None:
    from kuberay_scaler.adapters.web.slices_page import render_slices

    pods, nodes = tpu_slices(None, None)
    result = run(pods, nodes, window_in(600))
    doc = result.summary()
    by_key = {s["slice"]: s for s in doc["groups"][0]["slices"]}
    assert "GKE maintenance on node node-tpu-a-1" in by_key["tpu-a"]["maintenance"]
    assert by_key["tpu-b"]["maintenance"] is None
    assert "maintenance (GKE maintenance on node node-tpu-a-1" in render_slices(doc)
