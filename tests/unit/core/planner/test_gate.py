"""The deletion gate (core/planner/gate.py) and `decision.after_drains`, tabled: each clause of the
gate's rule, each kind after the drains. Pure: no fakes, no I/O."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

import jsonpatch
import pytest

from kuberay_scaler.core.decision import (
    DrainResults,
    LastRead,
    Observation,
    after_drains,
    decide,
    drains_to_send,
)
from kuberay_scaler.core.defaults import DRAIN_DEADLINE_S, DRAIN_RETRY_S
from kuberay_scaler.core.liveness import HostClock
from kuberay_scaler.core.model.hosts import HostPhase
from kuberay_scaler.core.model.plan import Memory
from kuberay_scaler.core.model.ray import RayObservation
from kuberay_scaler.core.model.reasons import Keep, KeepKind, ScaleDown, ScaleDownKind
from kuberay_scaler.core.parse.pods import parse_pods
from kuberay_scaler.core.parse.raycluster import parse_raycluster
from kuberay_scaler.core.patch.ops import ops_json
from kuberay_scaler.core.planner.gate import evidence_for, pod_blocker
from kuberay_scaler.core.planner.policy import Policy
from tests.factories import (
    NOW,
    NOW_S,
    cluster,
    head_node,
    node,
    node_id_of,
    slice_pods,
    state,
    tpu_group,
    tpu_slice_nodes,
)

GRACE = 180.0
POD = "tpu-a-0"


def _host(phase: str = "Running") -> list:  # type: ignore[type-arg]
    rc = cluster(tpu_group(replicas=1))
    pods = slice_pods("tpu", "tpu-a", 4, phase=phase)
    return parse_pods(pods, parse_raycluster(rc))[0]


@pytest.mark.parametrize(
    ("case", "phase", "entries", "missing_s", "seen", "accepted", "deadline_s", "verdict"),
    [
        ("a: drained now", "Running", ["idle"], None, True, True, None, None),
        ("alive, not drained", "Running", ["idle"], None, True, False, None, "not_drained"),
        ("busy, not drained", "Running", ["busy"], None, True, False, None, "not_drained"),
        ("b: DEAD", "Running", ["dead"], None, True, False, None, None),
        ("b: absent the whole grace", "Running", [], GRACE, True, False, None, None),
        ("absent, not long enough", "Running", [], GRACE - 1, True, False, None, "absent"),
        ("c: never a node, Pending", "Pending", [], None, False, False, None, None),
        ("had a node, not Running", "Pending", [], 10.0, True, False, None, "absent"),
        ("never a node, Running", "Running", [], 10.0, False, False, None, "absent"),
        ("d: deadline passed", "Running", ["busy"], None, True, False, -1, None),
        ("deadline ahead", "Running", ["busy"], None, True, False, 60, "not_drained"),
        (
            "two raylets, one drained",
            "Running",
            ["idle", "busy"],
            None,
            True,
            True,
            None,
            "not_drained",
        ),
    ],
)
def test_each_clause_of_the_gate(
    case: str,
    phase: str,
    entries: list[str],
    missing_s: float | None,
    seen: bool,
    accepted: bool,
    deadline_s: float | None,
    verdict: str | None,
) -> None:
    nodes = []
    for i, status in enumerate(entries):
        n = node(POD, dead=status == "dead", idle_s=None if status == "busy" else 5)
        nodes.append(n if i == 0 else type(n)(**{**n.__dict__, "node_id": f"{i:02d}" * 28}))
    clock = HostClock(
        missing_s=MappingProxyType({POD: missing_s} if missing_s is not None else {}),
        seen=frozenset({POD} if seen else ()),
    )
    deadlines = {"tpu-a": NOW_S + deadline_s} if deadline_s is not None else {}
    ev = evidence_for(_host(phase), state(nodes), clock, GRACE, NOW, deadlines)
    took = frozenset({nodes[0].node_id} if accepted and nodes else ())
    got = pod_blocker(POD, "tpu-a", ev, took, NOW_S)
    assert (got.value.removeprefix("gate_") if got else None) == verdict, case


def test_ray_unknown_blocks_a_running_pod_without_a_node() -> None:
    ev = evidence_for(_host(), None, HostClock(), GRACE, NOW)
    assert pod_blocker(POD, "tpu-a", ev, frozenset(), NOW_S) is KeepKind.GATE_RAY_UNKNOWN
    assert _host()[0].phase is HostPhase.RUNNING


def _idle_decision(*keys: str):  # type: ignore[no-untyped-def]
    pods = [p for k in keys for p in slice_pods("tpu", k, 4)]
    nodes = [head_node(), *(n for k in keys for n in tpu_slice_nodes(k, 4, idle_s=900))]
    rc = cluster(tpu_group(replicas=len(keys)))
    observed = Observation.parse(rc, pods, RayObservation(state(nodes), 0.0, cluster_id="c"))
    return decide(observed, Memory(), Policy(), NOW)


def _kinds(writes, group: str = "tpu") -> dict[str, object]:  # type: ignore[no-untyped-def]
    d = writes.plan.group(group)
    return {r.slice: r.kind for r in d.reasons if isinstance(r, Keep | ScaleDown) and r.slice}


@pytest.mark.parametrize(
    ("case", "last_nodes", "uid", "verdict"),
    [
        ("the drained raylets idle", "idle", "u-tpu-a-1", None),
        ("the drained raylet exited (DEAD)", "dead", "u-tpu-a-1", None),
        ("the drained raylet gone from the read", "gone", "u-tpu-a-1", None),
        ("a new raylet took work", "reborn", "u-tpu-a-1", KeepKind.GATE_NOT_DRAINED),
        ("the pod recreated (new uid)", "gone", "u-tpu-a-1-new", KeepKind.GATE_POD_REPLACED),
        ("the read after the drains failed", None, "u-tpu-a-1", KeepKind.GATE_RAY_UNKNOWN),
    ],
)
def test_the_evidence_is_newer_than_every_drain_answer(
    case: str, last_nodes: str | None, uid: str, verdict: KeepKind | None
) -> None:
    """Every host of tpu-a accepted its drain; what the read made after the last
    answer shows of tpu-a-1 decides, not the read before the drains."""
    decision = _idle_decision("tpu-a")
    drained = tpu_slice_nodes("tpu-a", 4, idle_s=900)
    one = drained[1]
    if last_nodes is None:
        last = None
    else:
        rest = [n for n in drained if n is not one]
        shown = {
            "idle": [one],
            "dead": [replace(one, status=type(one.status).DEAD)],
            "gone": [],
            "reborn": [replace(tpu_slice_nodes("tpu-a", 4, idle_s=None)[1], node_id="cd" * 28)],
        }[last_nodes]
        last = state([head_node(), *rest, *shown])
    uids = {f"tpu-a-{i}": f"u-tpu-a-{i}" for i in range(4)} | {"tpu-a-1": uid}
    results = DrainResults(
        accepted=frozenset(n.node_id for n in drained),
        last=LastRead(last, MappingProxyType(uids)),
    )
    writes = after_drains(decision, results)
    named = {p for g in writes.plan.groups for x in g.deletions for p in x.pods}
    if verdict is None:
        assert named == {f"tpu-a-{i}" for i in range(4)} and not writes.blocked, case
    else:
        assert named == set(), case  # the slice kept whole
        assert [(b.pod, b.kind) for b in writes.blocked][:1] in (
            [("tpu-a-1", verdict)],
            [("tpu-a-0", verdict)],
        ), case
        assert _kinds(writes)["tpu-a"] is verdict, case


def test_after_drains_tables_every_kind() -> None:
    decision = _idle_decision("tpu-a", "tpu-b", "tpu-c", "tpu-d")
    accepted = {node_id_of(f"tpu-a-{i}") for i in range(4)}
    accepted |= {node_id_of(f"tpu-c-{i}") for i in (0, 1, 3)}
    results = DrainResults(
        accepted=frozenset(accepted),
        refused=MappingProxyType({("tpu", "tpu-b"): "busy", ("tpu", "tpu-c"): "1/4 busy"}),
        not_sent=MappingProxyType({("tpu", "tpu-d"): Keep(KeepKind.NO_LONGER_IDLE, slice="tpu-d")}),
    )
    writes = after_drains(decision, results)
    kinds = _kinds(writes)
    assert kinds["tpu-a"] is ScaleDownKind.IDLE  # every host accepted: deleted
    assert kinds["tpu-b"] is KeepKind.DRAIN_REFUSED  # none accepted: kept whole
    assert kinds["tpu-c"] is ScaleDownKind.PARTLY_DRAINED  # the rest drained for preemption
    assert kinds["tpu-d"] is KeepKind.NO_LONGER_IDLE
    # The deadlines set once the drains answered are wake-ups too: tpu-c's notice,
    # tpu-b's (and tpu-d's) refused-drain backoff.
    assert writes.plan.next_wake_s == pytest.approx(min(DRAIN_DEADLINE_S, DRAIN_RETRY_S), abs=1)
    d = writes.plan.group("tpu")
    assert d is not None and [x.slice_key for x in d.deletions] == ["tpu-a"]
    assert d.target == 3 and not writes.blocked
    (rest,) = writes.drains
    assert rest.preempt and rest.node_ids == (node_id_of("tpu-c-2"),)
    assert "tpu-c" in writes.plan.memory.preempting
    assert {"tpu-b", "tpu-d"} <= set(writes.plan.memory.refused)  # both back off


def test_the_dry_path_shows_the_same_gate() -> None:
    """`plan` and /debug/plan build the patch through the gate with every drain assumed
    accepted: what they show is what the daemon writes when Ray accepts."""
    decision = _idle_decision("tpu-a")
    assert decision.record is not None and decision.patch is not None
    planned_from = cluster(tpu_group(replicas=1))  # as `_idle_decision` builds it
    base = jsonpatch.apply_patch(planned_from, ops_json(decision.record.ops))
    assumed = DrainResults.assumed(decision.drains)
    again = after_drains(decision, replace(assumed, base=parse_raycluster(base)))
    assert again.patch == decision.patch
    assert not decision.blocked and not again.blocked


def test_a_deletion_with_nothing_to_drain_is_kept_when_the_fresh_read_has_its_node_back() -> None:
    """Found by the state machine: judged gone (absent past the grace), replaced with nothing
    to drain, while the GCS read right before the patch has the node alive again."""
    rc = cluster(tpu_group(replicas=1))
    pods = slice_pods("tpu", "tpu-a", 4)
    nodes = tpu_slice_nodes("tpu-a", 4, idle_s=5)
    pod_names = [p["metadata"]["name"] for p in pods]
    clock = HostClock(missing_s=MappingProxyType(dict.fromkeys(pod_names, 2 * GRACE)))
    observed = Observation.parse(
        rc, pods, RayObservation(state([head_node()]), 0.0, cluster_id="c"), clock=clock
    )
    decision = decide(observed, Memory(), Policy(), NOW)
    d = decision.plan.group("tpu")
    assert d is not None and [x.slice_key for x in d.deletions] == ["tpu-a"]
    assert decision.drains == ()  # nothing alive to drain in the plan's view
    send, kept = drains_to_send(decision, state([head_node(), *nodes]), "c")
    assert send == () and kept[("tpu", "tpu-a")].kind is KeepKind.RAY_NODE_BACK
    writes = after_drains(decision, DrainResults(not_sent=MappingProxyType(kept)))
    assert not writes.blocked and not writes.plan.group("tpu").deletions  # type: ignore[union-attr]


def test_a_blocked_deletion_is_counted_by_path_and_logged_at_error() -> None:
    from structlog.testing import capture_logs

    from kuberay_scaler.core.planner.gate import Blocked
    from kuberay_scaler.loop.execute import Executed
    from kuberay_scaler.loop.health import Outcome, Progress
    from kuberay_scaler.loop.reconcile_report import Attempt, Carried, ReconcileReport, Seen
    from kuberay_scaler.loop.record import Recorder
    from kuberay_scaler.runtime.metrics import Metrics
    from tests.control.fakes import FakeEvents

    metrics = Metrics()

    def count() -> float:
        value = metrics.sample("kuberay_scaler_deletions_blocked_total", {"path": "above_max"})
        return value or 0.0

    observed = Observation.parse(cluster(tpu_group()), [])
    decision = decide(observed, Memory(), Policy(), NOW)
    blocked = (Blocked("tpu", "tpu-b", "tpu-b-0", KeepKind.GATE_ABSENT, "above_max"),)
    executed = Executed(decision.plan, blocked=blocked)
    attempt = Attempt(Seen(), decision, Carried.SENT, executed)
    with capture_logs() as logs:
        Recorder(FakeEvents(), Progress(0.0, 60.0, 3), metrics=metrics).record(
            ReconcileReport(Outcome.done("nothing to patch"), (attempt,))
        )
    assert count() == 1
    (line,) = [x for x in logs if x["log_level"] == "error"]
    assert line["path"] == "above_max" and line["kind"] == "gate_absent"


# `gate()` itself: the planner paths agree with it by themselves, so no test above and no
# control test fails when it passes everything. These hand it deletions a path got wrong.


def test_the_gate_drops_a_deletion_a_path_got_wrong_and_puts_the_target_back() -> None:
    """After the drains: tpu-b's drain was never answered (a path that forgot it): its pods
    may not be named, whatever the plan says; the slice stays and replicas go back up."""
    from kuberay_scaler.core.planner.gate import Blocked

    decision = _idle_decision("tpu-a", "tpu-b")
    planned = decision.plan.group("tpu")
    assert planned is not None and {x.slice_key for x in planned.deletions} == {"tpu-a", "tpu-b"}
    results = DrainResults(accepted=frozenset(node_id_of(f"tpu-a-{i}") for i in range(4)))
    writes = after_drains(decision, results)
    assert writes.blocked == (
        Blocked("tpu", "tpu-b", "tpu-b-0", KeepKind.GATE_NOT_DRAINED, "idle"),
    )
    d = writes.plan.group("tpu")
    assert d is not None and [x.slice_key for x in d.deletions] == ["tpu-a"]
    assert d.target == 1
    assert Keep(KeepKind.GATE_NOT_DRAINED, slice="tpu-b", detail="tpu-b-0") in d.reasons
    assert writes.patch is not None
    sent = ops_json(writes.patch.ops)
    named = {n for op in sent if isinstance(op.get("value"), list) for n in op["value"]}
    assert not {f"tpu-b-{i}" for i in range(4)} & named


def _hosts_and_nodes(keys: tuple[str, ...], rc: dict) -> tuple[list, list]:  # type: ignore[type-arg]
    pods = [p for k in keys for p in slice_pods("tpu", k, 4)]
    nodes = [head_node(), *(n for k in keys for n in tpu_slice_nodes(k, 4, idle_s=900))]
    return parse_pods(pods, parse_raycluster(rc))[0], nodes


def test_the_gate_refuses_a_host_absent_from_ray_even_with_every_drain_accepted() -> None:
    """The plan's own gate (every drain assumed accepted): a Running host whose Ray node is
    absent from the reply, not for the whole grace, keeps its slice whole."""
    from kuberay_scaler.core.planner.gate import gate

    plan = _idle_decision("tpu-a", "tpu-b").plan
    hosts, nodes = _hosts_and_nodes(("tpu-a", "tpu-b"), cluster(tpu_group(replicas=2)))
    shown = state([n for n in nodes if n.instance_id != "tpu-b-2"])
    clock = HostClock(missing_s=MappingProxyType({"tpu-b-2": 10.0}), seen=frozenset({"tpu-b-2"}))
    ev = evidence_for(hosts, shown, clock, GRACE, NOW)
    gated, blocked = gate(plan, ev, frozenset(n.node_id for n in nodes), NOW_S)
    assert [(b.slice_key, b.pod, b.kind, b.path) for b in blocked] == [
        ("tpu-b", "tpu-b-2", KeepKind.GATE_ABSENT, "idle")
    ]
    d = gated.group("tpu")
    assert d is not None and [x.slice_key for x in d.deletions] == ["tpu-a"] and d.target == 1


def test_the_gate_refuses_everything_ray_unknown_and_never_puts_a_target_above_max() -> None:
    """No fresh GCS reply: no Running host may be named; surplus deletions put back leave
    the target at maxReplicas (KubeRay clamps to it), not above."""
    from kuberay_scaler.core.planner.gate import gate

    keys = ("tpu-a", "tpu-b", "tpu-c")
    rc = cluster(tpu_group(replicas=3, max_replicas=1))
    hosts, nodes = _hosts_and_nodes(keys, rc)
    pods = [p for k in keys for p in slice_pods("tpu", k, 4)]
    observed = Observation.parse(rc, pods, RayObservation(state(nodes), 0.0, cluster_id="c"))
    plan = decide(observed, Memory(), Policy(), NOW).plan
    planned = plan.group("tpu")
    assert planned is not None and len(planned.deletions) == 2 and planned.target == 1
    ev = evidence_for(hosts, None, HostClock(seen=frozenset(h.pod_name for h in hosts)), GRACE, NOW)
    gated, blocked = gate(plan, ev, frozenset(n.node_id for n in nodes), NOW_S)
    assert len(blocked) == 2 and {b.kind for b in blocked} == {KeepKind.GATE_RAY_UNKNOWN}
    d = gated.group("tpu")
    assert d is not None and d.deletions == () and d.target == 1
