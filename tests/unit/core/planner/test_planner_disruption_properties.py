"""The disruption budget holds over any sequence of plans (item 2).

A group of single-host slices, some idle past the timeout, some busy, runs through a sequence
of plans as the daemon would: each plan's deletions are recorded as draining and their pods
turn terminating (the write applied), and between plans any of them may finish (the pods go,
the record is cleared) and hosts turn idle or busy. In every plan, the slices leaving after it
(terminating, recorded, deleted now) never exceed the budget, unless they already did before it
(then it starts none), and a do-not-disrupt slice is never scaled down. Some hosts' nodes
announce GKE maintenance (a window up to 2 h away, or the termination taint): an idle slice
given an idle removal for it counts against the budget like any, and no busy slice is removed.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from kuberay_scaler.core.defaults import PREEMPT_DEADLINE_S
from kuberay_scaler.core.model.cluster import parse_budget
from kuberay_scaler.core.model.plan import Memory
from kuberay_scaler.core.model.reasons import ScaleDown
from kuberay_scaler.core.model.signals import NodeMaintenance
from kuberay_scaler.core.planner.deadlines import Deadlines
from kuberay_scaler.core.planner.disruption import VOLUNTARY
from kuberay_scaler.core.planner.pipeline import plan
from kuberay_scaler.core.planner.policy import Policy
from tests.factories import NOW, cluster, cpu_nodes, group, head_node, pod, snapshot_of, state

BUDGETS = st.one_of(
    st.integers(0, 5).map(str), st.sampled_from([0, 10, 20, 34, 50, 100]).map(lambda p: f"{p}%")
)


@given(
    size=st.integers(1, 12),
    budget=BUDGETS,
    min_replicas=st.integers(0, 3),
    data=st.data(),
)
def test_no_plan_sequence_exceeds_the_budget(
    size: int, budget: str, min_replicas: int, data: st.DataObject
) -> None:
    names = [f"w-{i}" for i in range(size)]
    terminating: set[str] = set()
    recorded: set[str] = set()
    protected = set(data.draw(st.sets(st.sampled_from(names), max_size=2)))
    starts = st.one_of(st.none(), st.integers(0, 7200))  # None: the termination taint
    windows = data.draw(st.dictionaries(st.sampled_from(names), starts, max_size=3))
    going = {n for n, s in windows.items() if s is None or s <= PREEMPT_DEADLINE_S}
    maintenance = {
        f"node-{n}": NodeMaintenance(
            f"node-{n}",
            None if s is None else int((NOW.timestamp() + s) * 1000),
            s is None,
        )
        for n, s in windows.items()
    }
    replicas = size
    limit = parse_budget(budget)
    policy = Policy(deadlines=Deadlines(scale_down_delay_after_add_s=0), disruption_budget=limit)
    for step in range(data.draw(st.integers(1, 6))):
        present = [n for n in names if n not in terminating or not _gone(data, n)]
        names = present
        terminating &= set(present)
        recorded &= set(present)
        if data.draw(st.booleans()):
            recorded -= terminating  # the record is cleared once KubeRay deletes the pods
        busy = set(data.draw(st.sets(st.sampled_from(present), max_size=3))) if present else set()
        rc = cluster(
            group(
                "cpu",
                replicas=replicas,
                min_replicas=min(min_replicas, replicas),
                max_replicas=20,
            )
        )
        rc["spec"]["workerGroupSpecs"][0]["template"]["metadata"] = {
            "annotations": {"kuberay-scaler.ray.io/disruption-budget": budget}
        }
        pods = [_pod(n, n in terminating, n in protected) for n in present]
        nodes = [head_node()]
        for i, n in enumerate(present):
            if n not in terminating:
                nodes += cpu_nodes([n], idle_s=900 + i, free_cpu=0 if n in busy else None)
        memory = Memory(draining=MappingProxyType({"cpu": tuple(sorted(recorded))}))
        result = plan(
            snapshot_of(rc, pods),
            state(nodes),
            memory,
            policy,
            NOW,
            mono_s=step,
            maintenance=maintenance,
        )
        decision = result.group("cpu")
        assert decision is not None
        new = {
            x.slice_key
            for x in decision.deletions
            if isinstance(x.reason, ScaleDown) and x.reason.kind in VOLUNTARY
        }
        assert not new & busy, "no busy slice is removed by the idle path or for maintenance"
        new -= going  # a going slice's removal is not ours to hold back (docs/planner.md)
        before = len(terminating | recorded)
        after = len(terminating | recorded | new)
        allowed = limit.allowed(len(present))
        assert after <= max(allowed, before), (budget, before, new, allowed)
        assert not new & protected
        # The write applies: the deleted slices' pods terminate, recorded as draining.
        leaving = {x.slice_key for x in decision.deletions}
        terminating |= leaving
        recorded |= leaving
        replicas = decision.target


def _gone(data: st.DataObject, name: str) -> bool:
    return data.draw(st.booleans(), label=f"{name} gone")


def _pod(name: str, deleting: bool, protected: bool) -> dict[str, Any]:
    p = pod(name, "cpu", age_s=3600, deleting=deleting)
    p["spec"]["nodeName"] = f"node-{name}"
    if protected:
        p["metadata"]["annotations"] = {"karpenter.sh/do-not-disrupt": "true"}
    return p
