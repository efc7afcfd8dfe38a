"""Invariants of `plan` over generated clusters, pods, Ray state and demand (hypothesis)."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field, replace
from typing import Any
from unittest import mock

import jsonpatch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kuberay_scaler.core import slicemap
from kuberay_scaler.core.model.plan import (
    DeleteKind,
    Memory,
    Plan,
    ReplaceBackoff,
    ReservationMark,
)
from kuberay_scaler.core.model.ray import (
    Bundle,
    GangDemand,
    GangStrategy,
    NodeStatus,
    RayNode,
    TaskDemand,
)
from kuberay_scaler.core.model.reasons import HoldKind, ScaleDown, ScaleDownKind
from kuberay_scaler.core.model.slices import SliceState
from kuberay_scaler.core.parse.raycluster import parse_raycluster
from kuberay_scaler.core.patch.ops import build_patch, ops_json
from kuberay_scaler.core.planner import pipeline
from kuberay_scaler.core.planner.bins import Bin, copies_that_fit, give_back, place_copies, take
from kuberay_scaler.core.planner.deadlines import Deadlines
from kuberay_scaler.core.planner.needs import need_of
from kuberay_scaler.core.planner.policy import Policy
from kuberay_scaler.core.planner.pool import Pool
from tests.factories import (
    KUEUE_ELASTIC_GATE,
    NOW,
    NOW_S,
    bundle,
    cluster,
    cpu_nodes,
    gang,
    group,
    head_node,
    plan_of,
    pod,
    selector_bundle,
    slice_pods,
    slice_reservation,
    state,
    tpu_group,
    tpu_slice_nodes,
)
from tests.unit.core.patch.test_patch_ops import planned_spec

TOPOLOGY = {1: "2x2", 2: "2x4", 4: "4x4"}  # v6e: 4 chips per host
SLICE_STATES = (
    "idle",
    "busy",
    "one_busy",
    "pending",
    "partial",
    "failed",
    "terminating",
    "queued",  # held by Kueue's scheduling gate
)
# Hypothesis favours small draws; a middle value keeps rare branches rare (about one in six).
_rarely = st.integers(0, 5).map(lambda v: v == 3)
PROPERTY_SETTINGS = settings(
    max_examples=int(os.environ.get("PLANNER_EXAMPLES", "120")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@dataclass
class Scenario:
    rc: dict[str, Any]
    pods: list[dict[str, Any]] = field(default_factory=list)
    nodes: list[RayNode] = field(default_factory=list)
    tasks: list[TaskDemand] = field(default_factory=list)
    gangs: list[GangDemand] = field(default_factory=list)
    constraint: list[TaskDemand] = field(default_factory=list)
    memory: Memory = field(default_factory=Memory)
    policy: Policy = field(default_factory=Policy)
    slice_names: list[str] = field(default_factory=list)
    pod_types: list[str] = field(default_factory=list)
    queued: list[str] = field(default_factory=list)  # keys of queued slices

    def plan(self, shuffle: random.Random | None = None) -> Plan:
        pods, nodes = list(self.pods), list(self.nodes)
        if shuffle:
            shuffle.shuffle(pods)
            shuffle.shuffle(nodes)
        ray = state(nodes, self.tasks, self.gangs, self.constraint)
        return plan_of(self.rc, pods, ray, memory=self.memory, policy=self.policy)


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    sc = Scenario(rc={}, nodes=[head_node()])
    raws = [_draw_group(draw, sc, i) for i in range(draw(st.integers(1, 3)))]
    sc.rc = cluster(*raws, autoscalerOptions=_draw_options(draw))
    sc.tasks = draw(st.lists(_task(sc), min_size=draw(st.sampled_from([1, 0])), max_size=4))
    sc.gangs = draw(st.lists(_gang(sc), max_size=3))
    sc.constraint = draw(st.lists(_task(sc, pinned=False), max_size=2))
    sc.memory = _draw_memory(draw, [r["groupName"] for r in raws], sc.queued)
    override = draw(st.sampled_from([None, None, 1.0, 300.0]))
    sc.policy = Policy(deadlines=Deadlines(idle_timeout_override_s=override))
    return sc


def _draw_group(draw: st.DrawFn, sc: Scenario, index: int) -> dict[str, Any]:
    name = f"g{index}"
    tpu = draw(st.booleans())
    hosts = draw(st.sampled_from([1, 2, 4])) if tpu else 1
    low = draw(st.integers(0, 2))
    high = low + draw(st.sampled_from([3, 1, 0, 5]))
    extra: dict[str, Any] = {"priority": draw(st.integers(0, 2))}
    if draw(st.booleans()):
        extra["idleTimeoutSeconds"] = draw(st.sampled_from([0, 30, 600]))
    cpu = draw(st.sampled_from([4, 8]))
    if tpu:
        raw = tpu_group(name, hosts=hosts, topology=TOPOLOGY[hosts], min_replicas=low)
        raw["maxReplicas"] = high
        sc.pod_types.append(f"v6e-{4 * hosts}")
    else:
        raw = group(name, min_replicas=low, max_replicas=high, cpu=str(cpu))
    raw.update(extra)
    if draw(_rarely):  # The group's own disruption budget
        budget = draw(st.sampled_from(["0", "1", "50%"]))
        notes = {"kuberay-scaler.ray.io/disruption-budget": budget}
        raw["template"]["metadata"] = {"annotations": notes}
    shape = (hosts, tpu, cpu)
    keys = [_draw_slice(draw, sc, name, shape, i) for i in range(draw(st.integers(0, 4)))]
    # Mostly as many replicas as slices; sometimes more (launching) or fewer.
    raw["replicas"] = max(0, len(keys) + draw(st.sampled_from([0, 0, 0, 1, -1, 3])))
    if draw(_rarely) and keys:
        raw["scaleStrategy"] = {"workersToDelete": [f"{keys[0]}-0"]}
    elif draw(_rarely):
        raw["scaleStrategy"] = {"workersToDelete": ["long-gone-pod"]}
    return raw


def _draw_slice(
    draw: st.DrawFn, sc: Scenario, name: str, shape: tuple[int, bool, int], index: int
) -> str:
    hosts, tpu, cpu = shape
    key = f"{name}-s{index}"
    kind = draw(st.sampled_from(SLICE_STATES))
    idle = draw(st.sampled_from([0.0, 30.0, 120.0, 900.0]))
    age = 3600 + index
    if kind == "queued":
        age_s = draw(st.sampled_from([30, 5000]))
        sc.pods += slice_pods(name, key, hosts, age_s=age_s, gates=(KUEUE_ELASTIC_GATE,))
        sc.queued.append(key if hosts > 1 else f"{key}-0")  # a single host's slice: its pod
        return key
    if kind == "pending":
        sc.pods += slice_pods(
            name, key, hosts, phase="Pending", age_s=draw(st.sampled_from([30, 5000]))
        )
        return key
    pods = slice_pods(name, key, hosts, age_s=age, deleting=kind == "terminating")
    if kind == "partial":
        pods = pods[: max(1, hosts - 1)] if hosts > 1 else pods
    if kind == "failed":
        pods[-1]["status"]["phase"] = "Failed"
    if draw(_rarely):  # A pod asks not to be disrupted
        pods[0]["metadata"]["annotations"] = {"karpenter.sh/do-not-disrupt": "true"}
    if draw(_rarely):  # A host is going (eviction, preemption)
        cond = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
        pods[-1]["status"]["conditions"] = [cond]
    sc.pods += pods
    busy: tuple[int, ...] = ()
    if kind == "busy":
        busy = tuple(range(hosts))
    elif kind == "one_busy":
        busy = (draw(st.integers(0, hosts - 1)),)
    if tpu:
        nodes = tpu_slice_nodes(
            key, hosts, pod_type=f"v6e-{4 * hosts}", idle_s=idle, busy_hosts=busy, group_name=name
        )
        sc.slice_names.append(key)
    else:
        nodes = cpu_nodes([f"{key}-0"], name, cpu=cpu, idle_s=idle, free_cpu=0 if busy else None)
    sc.nodes += nodes[: len(pods)]
    return key


def _draw_options(draw: st.DrawFn) -> dict[str, Any]:
    options: dict[str, Any] = {
        "upscalingMode": draw(st.sampled_from(["Default", "Aggressive", "Conservative"]))
    }
    if draw(st.booleans()):
        options["idleTimeoutSeconds"] = draw(st.sampled_from([10, 60, 600]))
    return options


def _draw_memory(draw: st.DrawFn, names: list[str], queued: list[str]) -> Memory:
    awaiting = {n: "write in flight" for n in names if draw(_rarely)}
    backoff = {
        n: ReplaceBackoff(NOW_S + draw(st.sampled_from([-60, 60])), 1, 1)
        for n in names
        if draw(_rarely)
    }
    # Groups that added a slice lately (the scale-down delay runs) or long ago.
    added = {n: NOW.timestamp() - draw(st.sampled_from([10, 1000])) for n in names if draw(_rarely)}
    # Queued slices unneeded long ago (their cancel is due if no demand uses them) or just now;
    # some groups served slice reservations lately.
    now_s = NOW.timestamp()
    unneeded = {k: now_s - draw(st.sampled_from([0.0, 3600.0])) for k in queued}
    marks = {
        n: ReservationMark(now_s - draw(st.sampled_from([10.0, 3600.0])), draw(st.integers(1, 3)))
        for n in names
        if draw(_rarely)
    }
    return Memory(
        backoff=backoff,
        awaiting_write=awaiting,
        scaled_up_at=added,
        queued_unneeded_since=unneeded,
        reservations=marks,
    )


SHAPES = [{"TPU": 4}, {"CPU": 1}, {"CPU": 4}, {"CPU": 8}, {"TPU": 4, "CPU": 1}, {"GPU": 1}]


def _task(sc: Scenario, pinned: bool = True) -> st.SearchStrategy[TaskDemand]:
    plain = st.builds(
        lambda r, n: TaskDemand(bundle=bundle(r), count=n),
        st.sampled_from(SHAPES),
        st.sampled_from([6, 1, 20, 3]),
    )
    if not pinned or not sc.slice_names:
        return plain
    pinned_tasks = st.builds(
        lambda s, n: TaskDemand(
            bundle=selector_bundle({"TPU": 4}, {"ray.io/tpu-slice-name": s}), count=n
        ),
        st.sampled_from(sc.slice_names),
        st.integers(1, 4),
    )
    return st.one_of(plain, pinned_tasks)


def _gang(sc: Scenario) -> st.SearchStrategy[GangDemand]:
    bundles = st.lists(st.sampled_from(SHAPES[:5]), min_size=1, max_size=5)
    generic = st.builds(
        lambda s, bs: gang(s, *(bundle(b) for b in bs)),
        st.sampled_from(list(GangStrategy)),
        bundles,
    )
    if not sc.pod_types:
        return generic
    return st.one_of(generic, st.sampled_from(sc.pod_types).map(slice_reservation))


def _slices(result: Plan) -> dict[tuple[str, str], Any]:
    assert result.slice_map is not None
    return {(name, sl.key): sl for name, gs in result.slice_map.groups.items() for sl in gs.slices}


@given(scenarios())
@PROPERTY_SETTINGS
def test_targets_stay_within_min_and_max(sc: Scenario) -> None:
    result = sc.plan()
    for d in result.groups:
        gs = result.slice_map.groups[d.group] if result.slice_map else None
        assert gs is not None
        low, high = gs.group.min_replicas, gs.group.max_replicas
        if d.target != d.current:
            assert low <= d.target <= high, d
        if low <= d.current <= high:
            assert low <= d.target <= high, d


@given(scenarios())
@PROPERTY_SETTINGS
def test_only_whole_slices_are_ever_deleted(sc: Scenario) -> None:
    result = sc.plan()
    slices = _slices(result)
    named: list[str] = []
    for d in result.groups:
        for deletion in d.deletions:
            sl = slices[(d.group, deletion.slice_key)]
            assert set(deletion.pods) == set(sl.pod_names)
            if deletion.kind is DeleteKind.IDLE:
                assert len(deletion.pods) == d.num_of_hosts
                assert len(deletion.node_ids) == d.num_of_hosts
            named += deletion.pods
    assert len(named) == len(set(named))  # no pod twice


@given(scenarios())
@PROPERTY_SETTINGS
def test_no_slice_with_a_busy_host_is_deleted_as_idle(sc: Scenario) -> None:
    result = sc.plan()
    slices = _slices(result)
    for d in result.groups:
        for deletion in d.deletions:
            if deletion.kind is not DeleteKind.IDLE:
                continue
            sl = slices[(d.group, deletion.slice_key)]
            for host in sl.hosts:
                node = sl.nodes.get(host.pod_name)
                assert node is not None and node.status is NodeStatus.IDLE


@given(scenarios())
@PROPERTY_SETTINGS
def test_disruption_rules_hold(sc: Scenario) -> None:
    """A do-not-disrupt slice never leaves by idle scale-down; a going slice with a
    live Ray node is drained for preemption by some path (or already being deleted whole)."""
    result = sc.plan()
    slices = _slices(result)
    for d in result.groups:
        for x in d.deletions:
            sl = slices[(d.group, x.slice_key)]
            if isinstance(x.reason, ScaleDown) and x.reason.kind is ScaleDownKind.IDLE:
                # A going slice (DisruptionTarget) leaves anyway: the annotation holds back only
                # what we would choose.
                assert sl.do_not_disrupt is None or sl.going, x
        if d.held is not None and d.held.kind is not HoldKind.WORKERS_TO_DELETE_PENDING:
            continue
        handled = {x.slice_key for x in (*d.deletions, *d.preempt)}
        for (owner, key), sl in slices.items():
            if owner != d.group or not sl.going or not sl.node_ids:
                continue
            if sl.state is SliceState.TERMINATING:
                continue
            assert key in handled or key in result.memory.preempting, (key, d)


@given(scenarios())
@PROPERTY_SETTINGS
def test_a_queued_slice_is_only_ever_cancelled_undrained_never_replaced(sc: Scenario) -> None:
    """Queued slices (Kueue-gated, issue 32) are never replaced nor drained; a cancel names a
    queued slice's every pod and no Ray node; above maxReplicas one may go as a surplus with no
    work (undrained)."""
    result = sc.plan()
    slices = _slices(result)
    for d in result.groups:
        for deletion in d.deletions:
            sl = slices[(d.group, deletion.slice_key)]
            if deletion.kind is DeleteKind.CANCEL:  # queued, or never ran in an unavailable group
                assert sl.state not in (SliceState.COMPLETE, SliceState.OUTDATED), deletion
                assert deletion.node_ids == ()
                assert set(deletion.pods) == set(sl.pod_names)
            elif sl.state is SliceState.QUEUED:  # only above maxReplicas, as a surplus
                assert deletion.kind is DeleteKind.SURPLUS and deletion.node_ids == (), deletion
        assert all(x.slice_key not in sc.queued for x in d.preempt)


def _more_of_the_same(sc: Scenario, data: st.DataObject) -> tuple[Scenario, bool]:
    """The same demand, with some counts raised and some placement groups repeated (and
    whether a placement group was repeated)."""
    extra = st.sampled_from([0, 1, 5, 20])
    repeated = [g for g in sc.gangs if data.draw(st.booleans())]
    more = replace(
        sc,
        tasks=[replace(t, count=t.count + data.draw(extra)) for t in sc.tasks],
        gangs=sc.gangs + repeated,
        constraint=[replace(t, count=t.count + data.draw(extra)) for t in sc.constraint],
    )
    return more, bool(repeated)


def _hosts_asked(result: Plan) -> int:
    return sum(g.target * g.num_of_hosts for g in result.groups)


@given(scenarios(), st.data())
@PROPERTY_SETTINGS
def test_more_demand_never_yields_fewer_replicas(sc: Scenario, data: st.DataObject) -> None:
    """More of the demand already pending never lowers the hosts asked for, and never a
    group's target when only task counts rose.

    Demand of a *new* shape is left out on purpose: first-fit-decreasing packing is not
    monotone in that case (see test_known_packing_anomaly_with_a_new_shape). A repeated
    placement group is such a case for one group: it may take the idle slices another task
    used, so that task's new slice opens in another group beside the placement group's (found
    by hypothesis: g0's one 1-CPU host went to a new slice of g2, which 8-CPU tasks needed);
    the hosts asked for in all still never drop.
    """
    before = sc.plan()
    more, repeated = _more_of_the_same(sc, data)
    after = more.plan()
    assert _hosts_asked(after) >= _hosts_asked(before), (before.groups, after.groups)
    if repeated:
        return
    for b, a in zip(before.groups, after.groups, strict=True):
        assert a.target >= b.target, (b, a)


def test_known_packing_anomaly_with_a_new_shape() -> None:
    """Found by hypothesis; documents a limit of greedy packing rather than a wish.

    An idle 8-CPU host and 8-CPU tasks that only its group can take (at maxReplicas). Alone,
    one such task takes the whole idle host and the 1-CPU tasks need two 4-CPU hosts; add a
    1-CPU placement group and it takes one CPU of the idle host first, the 8-CPU task no longer
    fits there, and the 1-CPU tasks fill the rest: the 4-CPU group needs nothing.
    """
    rc = cluster(
        group("big", replicas=1, max_replicas=3, cpu="8"),
        group("small", replicas=0, max_replicas=3, cpu="4"),
    )
    pods = [pod("big-a", "big")]
    nodes = [head_node(), *cpu_nodes(["big-a"], "big", idle_s=0)]
    demand = [TaskDemand(bundle({"CPU": 1}), 6), TaskDemand(bundle({"CPU": 8}), 6)]
    before = Scenario(rc=rc, pods=pods, nodes=nodes, tasks=demand)
    after = replace(before, gangs=[gang(GangStrategy.STRICT_SPREAD, bundle({"CPU": 1}))])
    assert [g.target for g in before.plan().groups] == [3, 2]
    assert [g.target for g in after.plan().groups] == [3, 0]


@given(scenarios(), st.randoms(use_true_random=False))
@PROPERTY_SETTINGS
def test_same_input_in_any_order_gives_the_same_plan(sc: Scenario, rnd: random.Random) -> None:
    first, second = sc.plan(), sc.plan(shuffle=rnd)
    assert first.summary() == second.summary()
    spec = parse_raycluster(sc.rc)
    assert ops_json(build_patch(spec, first)) == ops_json(build_patch(spec, second))
    assert first.memory == second.memory


@given(scenarios())
@PROPERTY_SETTINGS
def test_applied_patch_gives_exactly_the_planned_spec(sc: Scenario) -> None:
    result = sc.plan()
    patched = jsonpatch.apply_patch(
        sc.rc, ops_json(build_patch(parse_raycluster(sc.rc), result)), in_place=False
    )
    assert patched == planned_spec(sc.rc, result)


def test_generated_scenarios_cover_scale_up_scale_down_and_replacement() -> None:
    """The generator is not vacuous: fixed draws reach each kind of decision."""
    up = Scenario(rc=cluster(tpu_group("t")), nodes=[head_node()], gangs=[slice_reservation()])
    assert up.plan().groups[0].target == 1
    pods = slice_pods("t", "t-a", 4)
    idle = tpu_slice_nodes("t-a", 4, idle_s=900, group_name="t")
    down = Scenario(rc=cluster(tpu_group("t", replicas=1)), pods=pods, nodes=[head_node(), *idle])
    assert down.plan().groups[0].target == 0
    failed = [pod("c-a", "c", phase="Failed")]
    broken = Scenario(rc=cluster(group("c", replicas=1)), pods=failed, nodes=[head_node()])
    assert broken.plan().groups[0].deletions[0].kind is DeleteKind.REPLACE


BIN_RESOURCES = st.fixed_dictionaries(
    {
        "CPU": st.sampled_from([0.0, 1.0, 3.0, 4.0, 8.0]),
        "TPU": st.sampled_from([0.0, 4.0]),
        "memory": st.sampled_from([0.0, 2.0, 16.0]),
    }
)
BINS = st.lists(st.tuples(BIN_RESOURCES, st.sampled_from(["a", "b", "c"])), max_size=30)
POOL_SHAPES = [
    *SHAPES[:5],
    {"CPU": 3},
    {"CPU": 1, "memory": 2},
    {"CPU": 3, "memory": 16},
    {"CPU": 1, "node:__internal_implicit_resource_x": 0.5},  # on every host at 1, unlisted
]
OPS = st.lists(
    st.tuples(
        st.sampled_from(["place", "fit", "undo", "add"]),
        st.sampled_from(POOL_SHAPES),
        st.sampled_from([None, "a", "b"]),  # a `pool` label the bundle selects, or none
        st.integers(1, 9),
    ),
    max_size=25,
)


@given(BINS, OPS, BINS)
@PROPERTY_SETTINGS
def test_pool_shortcuts_choose_the_bins_a_plain_scan_would(
    bins: list[tuple[dict[str, float], str]],
    ops: list[tuple[str, dict[str, float], str | None, int]],
    later: list[tuple[dict[str, float], str]],
) -> None:
    """The pool's views, trees and cursors are only a faster first fit, never a different one."""
    fast = Pool(_bins(bins))
    slow = _bins(bins)
    taken: list[tuple[int, Bundle]] = []
    for op, resources, pool_label, count in ops:
        unit = selector_bundle(resources, {"pool": pool_label}) if pool_label else bundle(resources)
        if op == "place":
            assert fast.place(need_of(unit), count, False) == place_copies(unit, count, slow)
        elif op == "fit":
            got = fast.first_fit(need_of(unit), False)
            want = next((b for b in slow if copies_that_fit(unit, b.free, b.labels)), None)
            assert (got and got.name) == (want and want.name)
            if got is not None and want is not None:
                take(got, unit)
                take(want, unit)
                taken.append((int(got.name), unit))
        elif op == "add":  # planned hosts join the end of every order
            added, later = later[:count], later[count:]
            fast.add(_bins(added, start=len(slow), planned=True))
            slow.extend(_bins(added, start=len(slow), planned=True))
        elif taken:
            index, back = taken.pop()
            returned = next(b for b in fast.bins if int(b.name) == index)
            give_back(returned, back)
            give_back(slow[index], back)
            fast.released([returned])
        assert [b.free for b in sorted(fast.bins, key=lambda b: int(b.name))] == [
            b.free for b in slow
        ]


def _bins(
    bins: list[tuple[dict[str, float], str]], start: int = 0, planned: bool = False
) -> list[Bin]:
    # Zero-padded names: the pool's preference order (by name here) is the list order.
    return [
        Bin(f"{start + i:03d}", "g", None, dict(free), {"pool": label}, planned=planned)
        for i, (free, label) in enumerate(bins)
    ]


@given(scenarios(), st.data())
@PROPERTY_SETTINGS
def test_shortcuts_decide_what_the_full_paths_decide(sc: Scenario, data: st.DataObject) -> None:
    """The slice map's whole-slice shortcut and the bin-less capacity of a frame without demand
    (both taken for speed at 100k hosts) change no plan: same slices, states, reasons, targets."""
    # Some Running pods lose their Ray node (not joined yet, or gone), some demand goes.
    keep = data.draw(st.lists(st.booleans(), min_size=len(sc.nodes), max_size=len(sc.nodes)))
    sc.nodes = [n for n, kept in zip(sc.nodes, keep, strict=True) if kept or n.is_head]
    if data.draw(st.booleans()):
        sc.tasks, sc.gangs, sc.constraint = [], [], []
    fast = sc.plan()
    real_capacity = pipeline.build_capacity  # type: ignore[attr-defined]

    def with_bins(*args: Any, **kwargs: Any) -> Any:
        return real_capacity(*args, **{**kwargs, "bins": True})

    with (
        mock.patch.object(slicemap, "_whole", lambda *_: False),
        mock.patch.object(pipeline, "build_capacity", with_bins),
    ):
        full = sc.plan()
    assert fast.groups == full.groups
    assert fast.slice_map == full.slice_map
    assert fast.problems == full.problems
    assert fast.infeasible == full.infeasible
