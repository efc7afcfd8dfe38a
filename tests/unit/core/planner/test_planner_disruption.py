"""Disruption under the user's control: do-not-disrupt, the scale-down delay after a
scale-up, budgets, and slices a host of which is going (DisruptionTarget)."""

from __future__ import annotations

from datetime import timedelta
from types import MappingProxyType
from typing import Any

import pytest

from kuberay_scaler.core.decision import Drain, Observation, Patch, decide
from kuberay_scaler.core.model.cluster import Budget, parse_budget
from kuberay_scaler.core.model.plan import DeleteKind, GroupDecision, Memory, Plan
from kuberay_scaler.core.model.ray import RayNode, RayObservation
from kuberay_scaler.core.model.reasons import (
    Disruption,
    DisruptionKind,
    Replace,
    ScaleDown,
    ScaleDownKind,
)
from kuberay_scaler.core.parse.pods import parse_pod, slim_pod
from kuberay_scaler.core.parse.raycluster import parse_raycluster
from kuberay_scaler.core.patch import ops as json_patch
from kuberay_scaler.core.planner.pipeline import plan as plan_fn
from kuberay_scaler.core.planner.policy import Policy
from tests.factories import (
    NOW,
    NOW_S,
    cluster,
    cpu_nodes,
    deleted_pods,
    going,
    group,
    head_node,
    node_id_of,
    plan_of,
    pod,
    slice_pods,
    snapshot_of,
    state,
    tasks,
    tpu_group,
    tpu_slice_nodes,
)

KARPENTER = ("karpenter.sh/do-not-disrupt", "true")
SAFE_TO_EVICT = ("cluster-autoscaler.kubernetes.io/safe-to-evict", "false")
BUDGET_KEY = "kuberay-scaler.ray.io/disruption-budget"
DELAY_KEY = "kuberay-scaler.ray.io/scale-down-delay-after-add-seconds"
# The monotonic reading: the nodes here are stamped on the wall clock (NOW), and idle age is
# measured on the planner's monotonic tick, so the two coincide at the start (as in `plan`).
T0 = NOW.timestamp()


def annotated(p: dict[str, Any], key: str, value: str) -> dict[str, Any]:
    p["metadata"].setdefault("annotations", {})[key] = value
    return p


def with_annotations(g: dict[str, Any], **notes: str) -> dict[str, Any]:
    g["template"]["metadata"] = {"annotations": dict(notes)}
    return g


def tpu_slices(
    *idle: float | None, busy_hosts: tuple[int, ...] = (0, 1, 2, 3)
) -> tuple[list[dict[str, Any]], list[RayNode]]:
    """One v6e-16 slice per entry (tpu-a, tpu-b, ...): idle seconds, or None for busy."""
    pods: list[dict[str, Any]] = []
    nodes: list[RayNode] = [head_node()]
    for i, seconds in enumerate(idle):
        key = f"tpu-{chr(ord('a') + i)}"
        pods += slice_pods("tpu", key, 4, age_s=3600 + i)
        hosts = busy_hosts if seconds is None else ()
        nodes += tpu_slice_nodes(key, 4, idle_s=seconds or 0, busy_hosts=hosts)
    return pods, nodes


def decision_of(result: Plan, name: str = "tpu") -> GroupDecision:
    found = result.group(name)
    assert found is not None
    return found


def disruptions(d: GroupDecision, kind: DisruptionKind) -> list[Disruption]:
    return [r for r in d.reasons if isinstance(r, Disruption) and r.kind is kind]


def run(
    rc: dict[str, Any],
    pods: list[dict[str, Any]],
    nodes: list[RayNode],
    *,
    memory: Memory | None = None,
    policy: Policy | None = None,
    mono_s: float = T0,
    **kw: Any,
) -> Plan:
    snap = snapshot_of(rc, pods)
    ray = state(nodes, **kw)
    return plan_fn(snap, ray, memory or Memory(), policy or Policy(), NOW, mono_s=mono_s)


# --- parsing: the annotations and the condition survive the informer's transform -------------


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        (*KARPENTER, "karpenter.sh/do-not-disrupt=true"),
        (*SAFE_TO_EVICT, "cluster-autoscaler.kubernetes.io/safe-to-evict=false"),
        ("karpenter.sh/do-not-disrupt", "false", None),
        ("cluster-autoscaler.kubernetes.io/safe-to-evict", "true", None),
    ],
)
def test_do_not_disrupt_annotations_are_read_through_slim_pod(
    key: str, value: str, expected: str | None
) -> None:
    spec = parse_raycluster(cluster(tpu_group(replicas=1)))
    raw = annotated(slice_pods("tpu", "tpu-a", 4)[0], key, value)
    annotated(raw, "kubectl.kubernetes.io/last-applied-configuration", "{" + "x" * 4000 + "}")
    host = parse_pod(raw, spec)
    assert not isinstance(host, Exception) and getattr(host, "do_not_disrupt", "?") == expected
    slim = slim_pod(raw)
    assert parse_pod(slim, spec) == host
    assert "kubectl.kubernetes.io/last-applied-configuration" not in slim["metadata"].get(
        "annotations", {}
    )


def test_disruption_target_condition_is_read_through_slim_pod() -> None:
    spec = parse_raycluster(cluster(tpu_group(replicas=1)))
    raw = going(slice_pods("tpu", "tpu-a", 4)[1], "EvictionByEvictionAPI")
    host = parse_pod(raw, spec)
    assert getattr(host, "disruption_target", None) == "EvictionByEvictionAPI"
    assert parse_pod(slim_pod(raw), spec) == host
    raw["status"]["conditions"][-1]["status"] = "False"  # reset: no longer going
    assert getattr(parse_pod(raw, spec), "disruption_target", "?") is None


@pytest.mark.parametrize(
    ("text", "slices", "allowed"),
    [("10", 4, 10), ("0", 4, 0), ("20%", 5, 1), ("25%", 10, 3), ("0%", 9, 0), ("100%", 7, 7)],
)
def test_budget_forms(text: str, slices: int, allowed: int) -> None:
    assert parse_budget(text).allowed(slices) == allowed


@pytest.mark.parametrize("text", ["", "-1", "1.5", "ten", "101%", "%", "1e3"])
def test_bad_budget_is_refused_with_its_form(text: str) -> None:
    with pytest.raises(ValueError, match=r"percentage|at most"):
        parse_budget(text)


def test_a_bad_group_annotation_skips_the_group_with_a_named_problem() -> None:
    spec = parse_raycluster(cluster(with_annotations(tpu_group(), **{BUDGET_KEY: "lots"})))
    assert spec.groups == () and BUDGET_KEY in str(spec.problems[0])


# --- do-not-disrupt ----------------------------------------------------------------------------


@pytest.mark.parametrize("note", [KARPENTER, SAFE_TO_EVICT])
def test_do_not_disrupt_keeps_an_idle_slice_from_scale_down(note: tuple[str, str]) -> None:
    pods, nodes = tpu_slices(900.0, 600.0)
    annotated(pods[2], *note)  # a host of tpu-a, the longest idle
    d = decision_of(run(cluster(tpu_group(replicas=2)), pods, nodes))
    assert [x.slice_key for x in d.deletions] == ["tpu-b"]
    assert d.target == 1
    (why,) = disruptions(d, DisruptionKind.DO_NOT_DISRUPT)
    assert why.slice == "tpu-a" and why.detail == f"{note[0]}={note[1]}"


def test_do_not_disrupt_never_blocks_replacing_a_broken_slice() -> None:
    pods, nodes = tpu_slices(900.0)
    annotated(pods[0], *KARPENTER)
    pods[3]["status"]["phase"] = "Failed"
    nodes = [n for n in nodes if n.instance_id != "tpu-a-3"]
    d = decision_of(run(cluster(tpu_group(replicas=1)), pods, nodes))
    (x,) = d.deletions
    assert x.kind is DeleteKind.REPLACE and isinstance(x.reason, Replace)


def test_above_max_a_do_not_disrupt_slice_goes_last_of_its_kind() -> None:
    pods, nodes = tpu_slices(900.0, 600.0)
    annotated(pods[0], *KARPENTER)  # tpu-a: the longest idle, otherwise first to go
    d = decision_of(run(cluster(tpu_group(replicas=2, max_replicas=1)), pods, nodes))
    assert [x.slice_key for x in d.deletions] == ["tpu-b"]
    assert not disruptions(d, DisruptionKind.ABOVE_MAX_DESPITE)


def test_above_max_a_do_not_disrupt_slice_still_goes_when_it_must() -> None:
    pods, nodes = tpu_slices(900.0, 600.0)
    annotated(pods[0], *KARPENTER)
    d = decision_of(run(cluster(tpu_group(replicas=2, max_replicas=0)), pods, nodes))
    assert sorted(x.slice_key for x in d.deletions) == ["tpu-a", "tpu-b"]
    assert d.target == 0
    (why,) = disruptions(d, DisruptionKind.ABOVE_MAX_DESPITE)
    assert why.slice == "tpu-a"


def test_above_max_an_idle_do_not_disrupt_slice_goes_before_a_busy_one() -> None:
    # The annotation protects work: preempting a busy slice to spare an idle one stops more.
    pods, nodes = tpu_slices(900.0, None)
    annotated(pods[0], *KARPENTER)
    d = decision_of(run(cluster(tpu_group(replicas=2, max_replicas=1)), pods, nodes))
    assert [x.slice_key for x in d.deletions] == ["tpu-a"] and d.preempt == ()


# --- scale-down delay after a scale-up -------------------------------------------------------


def test_idle_slices_wait_for_the_delay_after_the_group_added_one() -> None:
    pods, nodes = tpu_slices(900.0)
    memory = Memory(scaled_up_at=MappingProxyType({"tpu": T0 - 100}))
    result = run(cluster(tpu_group(replicas=1)), pods, nodes, memory=memory)
    d = decision_of(result)
    assert d.deletions == () and d.target == 1
    (why,) = disruptions(d, DisruptionKind.SCALE_DOWN_DELAY)
    assert why.count == 1 and why.wait_s == pytest.approx(200.0)
    assert result.next_idle_expiry_s == pytest.approx(200.0)  # the loop plans again then
    assert result.memory.scaled_up_at == {"tpu": T0 - 100}


def test_after_the_delay_the_idle_slice_goes_and_the_memory_is_forgotten() -> None:
    pods, nodes = tpu_slices(900.0)
    memory = Memory(scaled_up_at=MappingProxyType({"tpu": T0 - 300}))
    result = run(cluster(tpu_group(replicas=1)), pods, nodes, memory=memory)
    assert deleted_pods(result, "tpu") == [f"tpu-a-{i}" for i in range(4)]
    assert "tpu" not in result.memory.scaled_up_at


def test_the_delay_runs_on_the_monotonic_clock_not_the_wall() -> None:
    pods, nodes = tpu_slices(900.0)
    memory = Memory(scaled_up_at=MappingProxyType({"tpu": T0 - 100}))
    snap = snapshot_of(cluster(tpu_group(replicas=1)), pods)
    # The wall clock jumps an hour ahead (NTP step); the nodes' idle times move with it.
    later = NOW + timedelta(hours=1)
    result = plan_fn(snap, state(nodes), memory, Policy(), later, mono_s=T0)
    assert decision_of(result).deletions == ()


def test_a_plan_that_adds_a_slice_starts_the_delay() -> None:
    pods, nodes = tpu_slices(None)
    result = run(
        cluster(tpu_group(replicas=1)),
        pods,
        nodes,
        tasks=[tasks({"TPU": 4}, 4)],
    )
    assert decision_of(result).target == 2
    assert result.memory.scaled_up_at == {"tpu": T0}


def test_a_group_annotation_sets_its_own_delay() -> None:
    pods, nodes = tpu_slices(900.0)
    rc = cluster(with_annotations(tpu_group(replicas=1), **{DELAY_KEY: "60"}))
    memory = Memory(scaled_up_at=MappingProxyType({"tpu": T0 - 100}))
    result = run(rc, pods, nodes, memory=memory)
    assert len(decision_of(result).deletions) == 1
    rules = decision_of(result).rules
    assert rules is not None and (rules.scale_down_delay_after_add_s, rules.delay_from) == (
        60.0,
        "group",
    )


def test_the_delay_never_holds_back_honouring_max_replicas() -> None:
    pods, nodes = tpu_slices(900.0, 600.0)
    memory = Memory(scaled_up_at=MappingProxyType({"tpu": T0 - 1}))
    rc = cluster(tpu_group(replicas=2, max_replicas=1))
    d = decision_of(run(rc, pods, nodes, memory=memory))
    assert [x.slice_key for x in d.deletions] == ["tpu-a"]


# --- budgets -----------------------------------------------------------------------------------


def cpu_idle(count: int) -> tuple[list[dict[str, Any]], list[RayNode]]:
    names = [f"w-{i}" for i in range(count)]
    pods = [pod(n, "cpu", age_s=3600) for n in names]
    nodes = [head_node()]
    for i, n in enumerate(names):
        nodes += cpu_nodes([n], idle_s=900 + i)  # w-<last> the longest idle
    return pods, nodes


def test_today_a_small_group_scales_all_its_idle_slices_down_at_once() -> None:
    pods, nodes = cpu_idle(6)
    d = decision_of(run(cluster(group("cpu", replicas=6)), pods, nodes), "cpu")
    assert len(d.deletions) == 6 and not disruptions(d, DisruptionKind.BUDGET)
    assert d.rules is not None and (d.rules.budget, d.rules.budget_from) == ("10", "default")


def test_a_group_budget_limits_the_slices_leaving_at_once_longest_idle_first() -> None:
    pods, nodes = cpu_idle(6)
    rc = cluster(with_annotations(group("cpu", replicas=6), **{BUDGET_KEY: "2"}))
    d = decision_of(run(rc, pods, nodes), "cpu")
    assert [x.slice_key for x in d.deletions] == ["w-5", "w-4"]
    assert d.target == 4
    (why,) = disruptions(d, DisruptionKind.BUDGET)
    assert (why.count, why.limit, why.in_flight) == (4, 2, 0)


def test_a_percentage_budget_rounds_up() -> None:
    pods, nodes = cpu_idle(6)
    rc = cluster(with_annotations(group("cpu", replicas=6), **{BUDGET_KEY: "20%"}))
    d = decision_of(run(rc, pods, nodes), "cpu")
    assert len(d.deletions) == 2  # 20 % of 6 is 1.2


def test_slices_already_leaving_count_against_the_budget() -> None:
    pods, nodes = cpu_idle(6)
    pods.append(pod("w-gone", "cpu", age_s=3600, deleting=True))  # terminating
    memory = Memory(draining=MappingProxyType({"cpu": ("w-0",)}))
    rc = cluster(with_annotations(group("cpu", replicas=6), **{BUDGET_KEY: "3"}))
    d = decision_of(run(rc, pods, nodes, memory=memory), "cpu")
    kinds = {x.slice_key: x.reason.kind for x in d.deletions}
    # w-0's recorded drain is finished (it was leaving already); one more may start.
    assert kinds == {"w-5": ScaleDownKind.IDLE, "w-0": ScaleDownKind.RECORDED_DRAIN}
    (why,) = disruptions(d, DisruptionKind.BUDGET)
    assert why.in_flight == 2


def test_the_env_default_budget_applies_without_an_annotation() -> None:
    pods, nodes = cpu_idle(4)
    policy = Policy(disruption_budget=Budget(count=1))
    d = decision_of(run(cluster(group("cpu", replicas=4)), pods, nodes, policy=policy), "cpu")
    assert [x.slice_key for x in d.deletions] == ["w-3"]


# --- DisruptionTarget: a slice that is going -------------------------------------------------


def test_a_going_busy_slice_is_drained_at_once_and_replaced_ahead() -> None:
    pods, nodes = tpu_slices(None, None)
    going(pods[1])  # tpu-a-1 is being preempted
    result = run(cluster(tpu_group(replicas=2)), pods, nodes)
    d = decision_of(result)
    assert d.deletions == ()  # nothing deleted: the eviction removes the pod
    (drain,) = d.preempt
    assert drain.slice_key == "tpu-a" and drain.kind is DeleteKind.PREEMPT
    assert set(drain.node_ids) == {node_id_of(f"tpu-a-{i}") for i in range(4)}
    assert isinstance(drain.reason, ScaleDown)
    assert drain.reason.kind is ScaleDownKind.DISRUPTION_TARGET
    assert drain.reason.cause == "PreemptionByScheduler"
    assert result.memory.preempting["tpu-a"] == NOW_S + 30
    assert d.target == 3 and d.action.value == "scale_up"
    assert d.reason_code == DisruptionKind.REPLACED_AHEAD.value
    assert dict(result.memory.replaced_ahead) == {"tpu-a": "tpu"}
    assert result.memory.scaled_up_at == {}  # no growth: the scale-down delay is not started


def test_a_going_slice_is_drained_and_replaced_once() -> None:
    pods, nodes = tpu_slices(None, None)
    going(pods[1])
    rc = cluster(tpu_group(replicas=2))
    first = run(rc, pods, nodes)
    rc["spec"]["workerGroupSpecs"][0]["replicas"] = 3  # the write was applied
    again = run(rc, pods, nodes, memory=first.memory, mono_s=T0 + 5)
    d = decision_of(again)
    assert d.preempt == () and d.target == 3 and d.deletions == ()
    assert again.memory.preempting["tpu-a"] == first.memory.preempting["tpu-a"]
    assert disruptions(d, DisruptionKind.GOING)


def test_an_idle_slice_takes_the_work_of_a_going_slice_instead_of_a_new_one() -> None:
    pods, nodes = tpu_slices(None, 900.0)
    going(pods[0])
    d = decision_of(run(cluster(tpu_group(replicas=2)), pods, nodes))
    assert d.target == 2 and d.deletions == ()  # tpu-b is not scaled down: it is the home
    (why,) = disruptions(d, DisruptionKind.SPARE_KEPT)
    assert why.slice == "tpu-b"
    assert [x.slice_key for x in d.preempt] == ["tpu-a"]


def test_a_going_slice_at_max_replicas_is_drained_without_a_replacement() -> None:
    pods, nodes = tpu_slices(None, None)
    going(pods[0], "DeletionByTaintManager")
    d = decision_of(run(cluster(tpu_group(replicas=2, max_replicas=2)), pods, nodes))
    assert d.target == 2 and [x.slice_key for x in d.preempt] == ["tpu-a"]
    assert disruptions(d, DisruptionKind.NO_ROOM)


def test_an_idle_going_slice_needs_no_replacement() -> None:
    pods, nodes = tpu_slices(10.0)  # idle, below the idle timeout
    going(pods[0])
    d = decision_of(run(cluster(tpu_group(replicas=1)), pods, nodes))
    assert d.target == 1 and not disruptions(d, DisruptionKind.REPLACED_AHEAD)


def test_a_going_slice_not_yet_in_ray_is_not_drained_and_gets_no_deadline() -> None:
    pods = slice_pods("tpu", "tpu-a", 4, phase="Pending")
    going(pods[0])
    result = run(cluster(tpu_group(replicas=1)), pods, [head_node()])
    assert decision_of(result).preempt == () and "tpu-a" not in result.memory.preempting


def test_decide_drains_a_going_slice_for_preemption_and_deletes_nothing() -> None:
    pods, nodes = tpu_slices(None, None)
    going(pods[2])
    observed = Observation.parse(
        cluster(tpu_group(replicas=2)), pods, RayObservation(state(nodes), 0.0, cluster_id="c")
    )
    decision = decide(observed, Memory(), Policy(), NOW, mono_s=T0)
    drains = [w for w in decision.writes if isinstance(w, Drain)]
    assert [(d.slice_key, d.preempt) for d in drains] == [("tpu-a", True)]
    assert drains[0].deadline_ms == int((NOW + timedelta(seconds=30)).timestamp() * 1000)
    (patch,) = [w for w in decision.writes if isinstance(w, Patch)]
    paths = {op.path: op.value for op in patch.ops if isinstance(op, json_patch.Replace)}
    assert paths.get("/spec/workerGroupSpecs/0/replicas") == 3
    assert not any("workersToDelete" in p for p in paths)


def test_plan_summary_shows_the_rules_and_each_reason() -> None:
    pods, nodes = tpu_slices(900.0)
    annotated(pods[0], *KARPENTER)
    summary = run(cluster(tpu_group(replicas=1)), pods, nodes).summary()
    (g,) = summary["groups"]
    assert g["disruption"]["budget"] == "10" and g["disruption"]["delay_from"] == "default"
    kinds = [r["kind"] for r in g["reasons"]]
    assert DisruptionKind.DO_NOT_DISRUPT.value in kinds


def test_plan_of_without_mono_uses_the_wall_clock() -> None:
    pods, nodes = tpu_slices(None)
    result = plan_of(
        cluster(tpu_group(replicas=1)), pods, state(nodes, tasks=[tasks({"TPU": 4}, 4)])
    )
    assert result.memory.scaled_up_at == {"tpu": NOW.timestamp()}


@pytest.mark.parametrize("kind", list(DisruptionKind))
def test_every_disruption_reason_reads_as_a_sentence_naming_its_slice(kind: DisruptionKind) -> None:
    text = str(Disruption(kind, "tpu-a", detail="x", wait_s=5.0, limit=2, in_flight=1))
    assert text and ("tpu-a" in text or "idle slice(s) kept" in text)


def test_debug_slices_names_the_rules_the_annotation_and_the_going_host() -> None:
    from kuberay_scaler.adapters.web.slices_page import render_slices

    pods, nodes = tpu_slices(900.0, None)
    annotated(pods[0], *SAFE_TO_EVICT)
    going(pods[5], "EvictionByEvictionAPI")  # tpu-b-1
    rc = cluster(with_annotations(tpu_group(replicas=2), **{BUDGET_KEY: "25%"}))
    doc = run(rc, pods, nodes).summary()
    slices = {s["slice"]: s for s in doc["groups"][0]["slices"]}
    assert (
        slices["tpu-a"]["do_not_disrupt"] == "cluster-autoscaler.kubernetes.io/safe-to-evict=false"
    )
    assert slices["tpu-b"]["going"] == "tpu-b-1: EvictionByEvictionAPI"
    page = render_slices(doc)
    assert "budget 25% (group)" in page and "300 s (default)" in page
    assert "going (DisruptionTarget tpu-b-1: EvictionByEvictionAPI)" in page
    assert "do-not-disrupt (cluster-autoscaler.kubernetes.io/safe-to-evict=false)" in page


def test_a_slice_drained_for_a_disruption_that_did_not_happen_is_replaced_at_its_deadline() -> None:
    pods, nodes = tpu_slices(None, None)
    going(pods[1])
    rc = cluster(tpu_group(replicas=2, max_replicas=2))  # no room: drained only
    first = run(rc, pods, nodes)
    assert dict(first.memory.disrupted) == {"tpu-a": "tpu"}
    pods[1]["status"]["conditions"] = []  # the condition is cleared: the pod stays
    drained = [n if not n.instance_id.startswith("tpu-a") else _draining(n) for n in nodes]
    early = run(rc, pods, drained, memory=first.memory)
    d = decision_of(early)
    assert d.deletions == () and disruptions(d, DisruptionKind.ABANDONED)
    assert early.next_idle_expiry_s == pytest.approx(30.0)  # the loop plans again at the deadline
    snap = snapshot_of(rc, pods)
    later = NOW + timedelta(seconds=31)
    result = plan_fn(snap, state(drained), first.memory, Policy(), later, mono_s=T0 + 31)
    (x,) = decision_of(result).deletions
    assert (x.slice_key, x.kind, x.node_ids) == ("tpu-a", DeleteKind.REPLACE, ())
    assert decision_of(result).target == 2  # replaced whole: KubeRay creates a fresh one


def _draining(n: RayNode) -> RayNode:
    from dataclasses import replace as copy

    from kuberay_scaler.core.model.ray import NodeStatus

    return copy(n, status=NodeStatus.DRAINING, idle_since_ms=None)


def test_the_gate_lets_the_abandoned_slice_go_only_past_its_deadline() -> None:
    pods, nodes = tpu_slices(None, None)
    going(pods[1])
    rc = cluster(tpu_group(replicas=2, max_replicas=2))
    first = run(rc, pods, nodes)
    pods[1]["status"]["conditions"] = []
    drained = [n if not n.instance_id.startswith("tpu-a") else _draining(n) for n in nodes]
    later = NOW + timedelta(seconds=31)
    gcs = RayObservation(state(drained), 0.0, cluster_id="c")
    decision = decide(
        Observation.parse(rc, pods, gcs), first.memory, Policy(), later, mono_s=T0 + 31
    )
    assert decision.blocked == ()
    (patch,) = [w for w in decision.writes if isinstance(w, Patch)]
    sent = json_patch.ops_json(patch.ops)
    (strategy,) = [op["value"] for op in sent if op["path"].endswith("/scaleStrategy")]
    assert strategy == {"workersToDelete": [f"tpu-a-{i}" for i in range(4)]}
    assert not any(op["path"].endswith("/replicas") for op in sent)  # replaced whole
    assert not [w for w in decision.writes if isinstance(w, Drain)]  # no second drain


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"KUBERAY_SCALER_DISRUPTION_BUDGET": "lots"}, "KUBERAY_SCALER_DISRUPTION_BUDGET"),
        ({"KUBERAY_SCALER_DISRUPTION_BUDGET": "150%"}, "KUBERAY_SCALER_DISRUPTION_BUDGET"),
        (
            {"KUBERAY_SCALER_SCALE_DOWN_DELAY_AFTER_ADD_S": "-1"},
            "KUBERAY_SCALER_SCALE_DOWN_DELAY_AFTER_ADD_S",
        ),
    ],
)
def test_bad_disruption_settings_are_one_line_naming_the_variable(
    env: dict[str, str], named: str
) -> None:
    from kuberay_scaler.runtime.settings import ConfigError, load_settings

    with pytest.raises(ConfigError) as caught:
        load_settings(env)
    assert named in str(caught.value) and "\n" not in str(caught.value)


def test_env_defaults_reach_the_policy() -> None:
    from kuberay_scaler.runtime.policy import policy_from_settings
    from kuberay_scaler.runtime.settings import load_settings

    env = {
        "KUBERAY_SCALER_DISRUPTION_BUDGET": " 30% ",
        "KUBERAY_SCALER_SCALE_DOWN_DELAY_AFTER_ADD_S": "0",
    }
    settings = load_settings(env)
    assert settings.masked()["KUBERAY_SCALER_DISRUPTION_BUDGET"] == "30%"  # check-config
    policy = policy_from_settings(settings)
    assert (policy.disruption_budget, policy.deadlines.scale_down_delay_after_add_s) == (
        Budget(percent=30.0),
        0.0,
    )


def test_a_held_plan_still_shows_each_groups_rules() -> None:
    pods, _ = tpu_slices(900.0)
    rc = cluster(with_annotations(tpu_group(replicas=1), **{DELAY_KEY: "60"}))
    result = plan_of(rc, pods, None)  # Ray's demand unknown: the whole plan holds
    assert result.held is not None
    rules = decision_of(result).rules
    assert rules is not None
    assert (rules.budget, rules.budget_from, rules.scale_down_delay_after_add_s) == (
        "10",
        "default",
        60.0,
    )


def test_a_group_awaiting_its_write_keeps_the_disruption_memory_and_shows_its_rules() -> None:
    pods, nodes = tpu_slices(None, None)
    memory = Memory(
        awaiting_write=MappingProxyType({"tpu": "replicas 3"}),
        scaled_up_at=MappingProxyType({"tpu": T0 - 10}),
        replaced_ahead=MappingProxyType({"tpu-a": "tpu"}),
        disrupted=MappingProxyType({"tpu-a": "tpu", "gone": "tpu"}),
    )
    result = run(cluster(tpu_group(replicas=2)), pods, nodes, memory=memory)
    d = decision_of(result)
    assert d.held is not None and d.rules is not None
    assert result.memory.scaled_up_at == {"tpu": T0 - 10}
    assert dict(result.memory.replaced_ahead) == {"tpu-a": "tpu"}
    assert dict(result.memory.disrupted) == {"tpu-a": "tpu"}  # a slice gone is forgotten
