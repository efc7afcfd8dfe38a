"""Typed reasons: every decision carries a kind and fields; text is only their rendering."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from kuberay_scaler.core.model.plan import DeleteKind
from kuberay_scaler.core.model.reasons import (
    Action,
    DemandKind,
    Hold,
    HoldKind,
    ScaleDown,
    ScaleDownKind,
    SliceFault,
)
from tests.factories import (
    cluster,
    cpu_nodes,
    group,
    head_node,
    plan_of,
    pod,
    slice_pods,
    state,
    tasks,
    tpu_group,
    tpu_slice_nodes,
)


@pytest.mark.parametrize("kind", list(HoldKind))
def test_every_hold_kind_renders_a_sentence(kind: HoldKind) -> None:
    hold = Hold(kind, "g", detail="d", count=2, limit=3, until=datetime(2026, 1, 1, tzinfo=UTC))
    text = str(hold)
    assert text and "None" not in text


def test_scale_up_action_and_metric_label_come_from_the_demand_kind() -> None:
    result = plan_of(cluster(group("cpu")), ray=state([head_node()], [tasks({"CPU": 1}, 3)]))
    decision = result.group("cpu")
    assert decision is not None
    assert decision.action is Action.SCALE_UP
    assert decision.reason_code == DemandKind.TASK.value


def test_idle_scale_down_label_is_the_scale_down_kind() -> None:
    pods = [pod("cpu-a", "cpu")]
    nodes = [head_node(), *cpu_nodes(["cpu-a"], idle_s=900)]
    result = plan_of(cluster(group("cpu", replicas=1)), pods, state(nodes))
    decision = result.group("cpu")
    assert decision is not None
    assert decision.action is Action.SCALE_DOWN
    assert decision.reason_code == ScaleDownKind.IDLE.value
    (deletion,) = decision.deletions
    assert isinstance(deletion.reason, ScaleDown)
    assert deletion.reason.slice == deletion.slice_key


def test_replace_label_is_the_slice_fault() -> None:
    pods = slice_pods("tpu", "tpu-a", 4, age_s=900, running_for_s=300)
    nodes = [head_node(), *tpu_slice_nodes("tpu-a", 4, idle_s=5)[:3]]
    result = plan_of(cluster(tpu_group(replicas=1)), pods, state(nodes))
    decision = result.group("tpu")
    assert decision is not None
    assert decision.action is Action.REPLACE
    assert [d.kind for d in decision.deletions] == [DeleteKind.REPLACE]
    assert decision.reason_code == SliceFault.RAY_NODE_MISSING.value


def test_summary_documents_carry_kind_and_text() -> None:
    result = plan_of(
        cluster(group("cpu", max_replicas=1)), ray=state([head_node()], [tasks({"CPU": 8}, 3)])
    )
    (doc,) = result.summary()["groups"]
    kinds = {(r["type"], r["kind"]) for r in doc["reasons"]}
    assert kinds == {("ScaleUp", "task"), ("Waiting", "at_max_replicas")}
    assert all(r["text"] for r in doc["reasons"])
