"""The gang deadline (issue 32, item 3): a gang (a pending placement group needing k slices of
one type) still incomplete at its group's provisioning deadline hands its slices back — idle
ones drained through the gate, never-ran ones cancelled — unless the demand is elastic, and
the whole gang is planned again through the fallback order."""

from __future__ import annotations

from html import escape
from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st

from kuberay_scaler.adapters.web.slices_page import render_slices
from kuberay_scaler.core.decision import Observation, decide
from kuberay_scaler.core.model.labels import ANNOTATION_MAX_PROVISION
from kuberay_scaler.core.model.plan import DeleteKind, Memory, Plan
from kuberay_scaler.core.model.ray import GangStrategy, RayNode, RayObservation, TaskDemand
from kuberay_scaler.core.model.reasons import Keep, KeepKind, ScaleDown, ScaleDownKind
from kuberay_scaler.core.planner.policy import Policy
from kuberay_scaler.loop.report import report_from_plan
from tests.factories import (
    KUEUE_ELASTIC_GATE,
    NOW,
    cluster,
    gang,
    head_node,
    plan_of,
    selector_bundle,
    slice_pods,
    state,
    targets,
    tpu_group,
    tpu_slice_nodes,
)

WORKER = selector_bundle({"CPU": 1, "TPU": 4}, {"ray.io/tpu-pod-type": "v6e-16"})
GANG = gang(GangStrategy.STRICT_SPREAD, *([WORKER] * 16))  # 4 × v6e-16


def _cluster(a_replicas: int = 4, **a: Any) -> dict[str, Any]:
    """Two v6e-16 groups (say two zones): `tpu-a` launched the gang, `tpu-b` could host it."""
    return cluster(
        tpu_group("tpu-a", replicas=a_replicas, max_replicas=8, priority=10, **a),
        tpu_group("tpu-b", max_replicas=8),
    )


def _world(
    age_s: float, *, busy: tuple[str, ...] = (), up: int = 3
) -> tuple[list[dict[str, Any]], list[RayNode]]:
    """tpu-a: `up` slices up (idle 30 s, below the idle timeout), the rest of the 4 Pending;
    every pod created `age_s` ago."""
    pods: list[dict[str, Any]] = []
    nodes = [head_node()]
    for i in range(4):
        replica = f"a-{i}"
        if i < up:
            pods += slice_pods("tpu-a", replica, 4, age_s=age_s, running_for_s=age_s - 200)
            nodes += tpu_slice_nodes(
                replica,
                4,
                group_name="tpu-a",
                idle_s=30,
                busy_hosts=(0, 1, 2, 3) if replica in busy else (),
            )
        else:
            pods += slice_pods("tpu-a", replica, 4, age_s=age_s, phase="Pending")
    return pods, nodes


def _plan(
    age_s: float,
    *,
    busy: tuple[str, ...] = (),
    elastic: bool = False,
    deadline_s: str | None = None,
    **a: Any,
) -> Plan:
    pods, nodes = _world(age_s, busy=busy)
    constraint = [TaskDemand(WORKER, 16)] if elastic else []
    ray = state(nodes, gangs=[GANG], constraint=constraint)
    rc = _cluster(**a)
    if deadline_s is not None:
        meta = {"annotations": {ANNOTATION_MAX_PROVISION: deadline_s}}
        rc["spec"]["workerGroupSpecs"][0]["template"]["metadata"] = meta
    return plan_of(rc, pods, ray)


def _released(result: Plan, group: str = "tpu-a") -> list[str]:
    decision = result.group(group)
    assert decision is not None
    return sorted(
        x.slice_key
        for x in decision.deletions
        if isinstance(x.reason, ScaleDown) and x.reason.kind is ScaleDownKind.GANG_DEADLINE
    )


def test_before_the_deadline_the_partial_gang_waits_and_is_reported() -> None:
    result = _plan(age_s=240)  # 4 min, deadline 15 min (the default)
    assert _released(result) == []
    assert targets(result) == {"tpu-a": 4, "tpu-b": 0}
    [line] = result.gangs
    assert str(line) == "gang 4 × v6e-16: 3 up, 1 pending 4 min, deadline 15 min"
    a = result.group("tpu-a")
    assert a is not None
    [kept] = [r for r in a.reasons if isinstance(r, Keep) and r.kind is KeepKind.GANG_WAITING]
    assert str(kept) == f"3 idle slice(s) kept for a gang: {line}"
    assert (
        result.queue_wake_s is not None and abs(result.queue_wake_s - (900 - 240 + 1)) < 1
    )  # just past it


def test_past_the_deadline_the_gang_is_released_and_fitted_whole_elsewhere() -> None:
    result = _plan(age_s=1000)  # past the 900 s deadline; a-3 never came
    a = result.group("tpu-a")
    assert a is not None
    assert _released(result) == ["a-0", "a-1", "a-2"]
    by_key = {x.slice_key: x for x in a.deletions}
    assert by_key["a-3"].kind is DeleteKind.CANCEL and by_key["a-3"].node_ids == ()
    for key in ("a-0", "a-1", "a-2"):  # they ran: drained first, every host
        assert by_key[key].kind is DeleteKind.IDLE and len(by_key[key].node_ids) == 4
    assert targets(result) == {"tpu-a": 0, "tpu-b": 4}  # all k in the other group
    [line] = result.gangs
    assert line.released and "released" in str(line)


def test_the_per_group_deadline_annotation_judges_the_gang() -> None:
    result = _plan(age_s=400, deadline_s="300")
    assert _released(result) == ["a-0", "a-1", "a-2"]
    assert targets(result) == {"tpu-a": 0, "tpu-b": 4}


def test_elastic_demand_keeps_its_slices() -> None:
    """Ray Train's request_resources floor asks for the same slices: it takes what fits, and
    releasing them would only make the floor ask again."""
    result = _plan(age_s=1000, elastic=True)
    assert _released(result) == []
    [line] = result.gangs
    assert line.elastic and "elastic" in str(line)


def test_a_gang_waiting_on_a_queued_slice_is_never_released() -> None:
    """A slice held by Kueue's gate waits for admission, not capacity: no deadline judges it."""
    pods, nodes = _world(age_s=1000)
    pods = [p for p in pods if not p["metadata"]["name"].startswith("a-3-")]
    pods += slice_pods("tpu-a", "a-3", 4, age_s=1000, gates=(KUEUE_ELASTIC_GATE,))
    result = plan_of(_cluster(), pods, state(nodes, gangs=[GANG]))
    assert _released(result) == []
    [line] = result.gangs
    assert str(line) == "gang 4 × v6e-16: 3 up, 1 queued, deadline 15 min"


def test_a_busy_slice_is_never_released() -> None:
    result = _plan(age_s=1000, busy=("a-1",))
    assert _released(result) == ["a-0", "a-2"]
    a = result.group("tpu-a")
    assert a is not None and "a-1" not in {x.slice_key for x in a.deletions}


def test_min_replicas_bounds_the_release() -> None:
    result = _plan(age_s=1000, min_replicas=2)
    a = result.group("tpu-a")
    assert a is not None and a.target >= 2
    assert len(_released(result)) <= 4 - 2 - 1  # the pending slice counts against it first


def test_the_release_passes_decide_and_its_gate() -> None:
    pods, nodes = _world(age_s=1000)
    ray = state(nodes, gangs=[GANG])
    decision = decide(
        Observation.parse(_cluster(), pods, RayObservation(ray, 0.0)), Memory(), Policy(), NOW
    )
    a = decision.plan.group("tpu-a")
    assert a is not None
    drained = {x.slice_key for x in a.deletions if x.kind is DeleteKind.IDLE}
    assert drained == {"a-0", "a-1", "a-2"}
    # Every released slice's hosts are drained before its pods are deleted.
    assert decision.drains, "the released slices are drained first"


_KINDS = ("idle", "busy", "pending", "joining")


def _slice(replica: str, kind: str, age_s: float) -> tuple[list[dict[str, Any]], list[RayNode]]:
    """One slice of tpu-a launched `age_s` ago: up and idle, up and busy, pending (never ran),
    or joining (two hosts ran and joined Ray, two still Pending)."""
    ran = age_s - min(age_s, 60)
    if kind in ("idle", "busy"):
        pods = slice_pods("tpu-a", replica, 4, age_s=age_s, running_for_s=ran)
        busy = (0, 1, 2, 3) if kind == "busy" else ()
        nodes = tpu_slice_nodes(replica, 4, group_name="tpu-a", idle_s=30, busy_hosts=busy)
        return pods, nodes
    if kind == "pending":
        return slice_pods("tpu-a", replica, 4, age_s=age_s, phase="Pending"), []
    pods = [
        *slice_pods("tpu-a", replica, 4, age_s=age_s, running_for_s=ran)[:2],
        *(
            p
            for p in slice_pods("tpu-a", replica, 4, age_s=age_s, phase="Pending")
            if p["metadata"]["name"].endswith(("-2", "-3"))
        ),
    ]
    nodes = tpu_slice_nodes(replica, 4, group_name="tpu-a", idle_s=30)[:2]
    return pods, nodes


@settings(max_examples=150, deadline=None)
@given(
    kinds=st.lists(st.sampled_from(_KINDS), min_size=1, max_size=3).map(
        lambda ks: ["idle", *ks]  # a gang with at least one slice up and idle
    ),
    age_s=st.one_of(
        st.sampled_from([60.0, 300.0, 650.0, 1000.0, 2500.0]),
        st.floats(min_value=0, max_value=3000),
    ),
    deadline_s=st.sampled_from([None, "120", "600"]),
    elastic=st.booleans(),
    min_replicas=st.integers(min_value=0, max_value=2),
)
def test_no_partial_gang_holds_idle_slices_past_its_deadline(
    kinds: list[str], age_s: float, deadline_s: str | None, elastic: bool, min_replicas: int
) -> None:
    """Invariants, for a gang of 4 × v6e-16 launched together in tpu-a `age_s` ago: past the
    deadline with a slice that never came, no idle slice of the incomplete gang is kept (beyond
    minReplicas), unless the demand is elastic; before it, nothing is released; nothing busy
    is ever released; nothing that ran is removed undrained (cancels only for never-ran)."""
    pods: list[dict[str, Any]] = []
    nodes: list[RayNode] = [head_node()]
    for i, kind in enumerate(kinds):
        p, n = _slice(f"a-{i}", kind, age_s)
        pods, nodes = pods + p, nodes + n
    rc = _cluster(a_replicas=len(kinds), min_replicas=min_replicas)
    if deadline_s is not None:
        meta = {"annotations": {ANNOTATION_MAX_PROVISION: deadline_s}}
        rc["spec"]["workerGroupSpecs"][0]["template"]["metadata"] = meta
    constraint = [TaskDemand(WORKER, 16)] if elastic else []
    result = plan_of(rc, pods, state(nodes, gangs=[GANG], constraint=constraint))
    a = result.group("tpu-a")
    assert a is not None
    kind_of = {f"a-{i}": k for i, k in enumerate(kinds)}
    joined = {n.instance_id: n for n in nodes}
    for x in a.deletions:
        assert kind_of[x.slice_key] != "busy", f"busy slice {x.slice_key} released"
        ran = [p for p in x.pods if p in joined]
        if x.kind is DeleteKind.CANCEL:
            assert not ran, f"{x.slice_key} ran and was cancelled undrained"
        else:
            assert {joined[p].node_id for p in ran} <= set(x.node_ids), "ran, not drained"
    released = _released(result)
    event(f"released {len(released)}")
    deadline = float(deadline_s or 900)
    idle = [k for k, kind in kind_of.items() if kind in ("idle", "joining")]  # ran, all idle
    if age_s < deadline - 1 or elastic:  # (pods' timestamps are whole seconds)
        assert released == []
    elif age_s > deadline + 1 and "pending" in kinds:
        kept_idle = [k for k in idle if k not in released]
        budget = len(kinds) - min_replicas - kinds.count("pending")
        assert len(released) >= min(len(idle), max(0, budget)), (kept_idle, budget)
        assert a.target >= min(min_replicas, len(kinds))


def test_the_gang_is_reported_in_ray_status_and_debug_slices() -> None:
    waiting = _plan(age_s=240)
    line = "gang 4 × v6e-16: 3 up, 1 pending 4 min, deadline 15 min"
    report = report_from_plan(waiting, int(NOW.timestamp()))
    pending = [p for p in report.pending_pods if p.pod_name.startswith("a-3-")]
    assert len(pending) == 4 and all(p.detail.endswith(f"; {line}") for p in pending)
    [group_doc] = [g for g in waiting.summary()["groups"] if g["name"] == "tpu-a"]
    assert [g["text"] for g in group_doc["gangs"]] == [line]
    assert escape(line) in render_slices(waiting.summary())

    released = _plan(age_s=1000)
    report = report_from_plan(released, int(NOW.timestamp()))
    [failed] = [f for f in report.failed if "gang" in f.reason]
    assert failed.group == "tpu-a" and failed.count == 12  # 3 slices × 4 hosts handed back
    assert "released, re-planned whole" in failed.reason


def test_ray_trains_request_for_the_whole_gang_is_shown_and_never_released() -> None:
    """Ray Train v2 asks for its whole worker group through request_resources: a gang too,
    elastic (a floor takes what fits), so it is reported but never released."""
    pods, nodes = _world(age_s=1000)
    result = plan_of(_cluster(), pods, state(nodes, constraint=[TaskDemand(WORKER, 16)]))
    assert _released(result) == []
    [line] = result.gangs
    assert str(line) == (
        "gang 4 × v6e-16: 3 up, 1 pending 17 min, deadline 15 min;"
        " elastic (request_resources): past it, kept"
    )


def test_a_gang_with_a_driver_bundle_still_needs_four_slices() -> None:
    """A placement group with a CPU bundle beside its 16 TPU workers (mixed bundles: fitted
    one by one): the CPU bundle shares a TPU host, k stays 4."""
    pods, nodes = _world(age_s=240)
    pg = gang(GangStrategy.PACK, selector_bundle({"CPU": 1}, {}), *([WORKER] * 16))
    result = plan_of(_cluster(), pods, state(nodes, gangs=[pg]))
    [line] = result.gangs
    assert (line.slices, line.up, line.pending) == (4, 3, 1)
