"""The slice map: pods grouped into slices by KubeRay's labels (or the legacy ones), joined with
Ray's nodes by instance id, and each slice judged with a reason."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kuberay_scaler.adapters.ray_gcs.state import parse_ray_state
from kuberay_scaler.core.model.cluster import ClusterSpec
from kuberay_scaler.core.model.hosts import Host
from kuberay_scaler.core.model.ray import RayNode, RayState
from kuberay_scaler.core.model.slices import Slice, SliceMap, SliceState
from kuberay_scaler.core.parse.pods import parse_pods
from kuberay_scaler.core.parse.raycluster import parse_raycluster
from kuberay_scaler.core.slicemap import SliceTimeouts, build_slice_map
from tests.factories import (
    NOW,
    NOW_MS,
    cluster,
    group,
    node,
    pod,
    slice_pods,
    state,
    tpu_slice_nodes,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "ray_state"
TIMEOUTS = SliceTimeouts(max_provision_s=900, missing_node_grace_s=180)


def spec_of(*groups: dict[str, Any]) -> ClusterSpec:
    return parse_raycluster(cluster(*groups, name="rc"))


TPU_SPEC = spec_of(group("cpu", max_replicas=10), group("tpu", hosts=4, tpu="4", replicas=2))


def hosts_of(pods: list[dict[str, Any]], spec: ClusterSpec = TPU_SPEC) -> list[Host]:
    hosts, problems = parse_pods(pods, spec)
    assert problems == []
    return hosts


def slice_map(
    pods: list[dict[str, Any]],
    nodes: list[RayNode] | None,
    spec: ClusterSpec = TPU_SPEC,
) -> SliceMap:
    ray = state(nodes) if nodes is not None else None
    return build_slice_map(spec, hosts_of(pods, spec), ray, NOW, TIMEOUTS)


def only_slice(result: SliceMap, group_name: str = "tpu") -> Slice:
    [one] = result.groups[group_name].slices
    return one


def test_kuberay_multi_host_cluster_groups_pods_into_complete_slices() -> None:
    pods = slice_pods("tpu", "tpu-aaaaa", 4) + slice_pods("tpu", "tpu-bbbbb", 4, age_s=300)
    nodes = tpu_slice_nodes("tpu-aaaaa", 4, idle_s=90) + tpu_slice_nodes("tpu-bbbbb", 4)

    result = slice_map(pods, nodes)

    first, second = result.groups["tpu"].slices  # oldest first
    assert (first.key, second.key) == ("tpu-aaaaa", "tpu-bbbbb")
    assert first.state is SliceState.COMPLETE and second.state is SliceState.COMPLETE
    assert first.reason == "4 of 4 hosts up"
    assert first.pod_names == tuple(f"tpu-aaaaa-{i}" for i in range(4))
    assert [h.host_index for h in first.hosts] == [0, 1, 2, 3]
    assert len(first.node_ids) == 4
    assert first.idle_ms(NOW_MS) == 90_000
    assert first.counts_as_capacity
    assert result.problems == ()


def test_hosts_are_ordered_by_host_index_not_name() -> None:
    pods = [
        pod(f"tpu-x-{name}", "tpu", replica="tpu-x", host_index=index)
        for name, index in (("a", 3), ("b", 0), ("c", 2), ("d", 1))
    ]

    sl = only_slice(slice_map(pods, None))

    assert sl.pod_names == ("tpu-x-b", "tpu-x-d", "tpu-x-c", "tpu-x-a")


def legacy_pod(name: str, replica: str, worker: int, **kw: Any) -> dict[str, Any]:
    raw = pod(name, "tpu", legacy_replica=replica, **kw)
    raw["spec"]["containers"][0]["env"] = [{"name": "TPU_WORKER_ID", "value": str(worker)}]
    return raw


def test_legacy_replica_index_cluster_is_grouped_the_same_way() -> None:
    # Older operators: no KubeRay slice labels; the GKE webhook's replicaIndex=<group>-<index>.
    pods = [legacy_pod(f"rc-tpu-worker-{c}", "tpu-0", i) for i, c in enumerate("pqrs")]
    pods += [legacy_pod(f"rc-tpu-worker-{c}", "tpu-1", i) for i, c in enumerate("klmn")]
    nodes = [
        node(p["metadata"]["name"], labels={"ray.io/tpu-worker-id": str(i % 4)})
        for i, p in enumerate(pods)
    ]

    result = slice_map(pods, nodes)

    by_key = {s.key: s for s in result.groups["tpu"].slices}
    assert set(by_key) == {"tpu-0", "tpu-1"}
    assert all(s.state is SliceState.COMPLETE for s in by_key.values())
    assert [h.host_index for h in by_key["tpu-1"].hosts] == [0, 1, 2, 3]
    assert result.problems == ()


def test_single_host_pods_are_each_their_own_slice() -> None:
    pods = [pod("cpu-1", "cpu"), pod("cpu-2", "cpu", phase="Pending")]

    result = slice_map(pods, [node("cpu-1")])

    one, two = sorted(result.groups["cpu"].slices, key=lambda s: s.key)
    assert (one.key, one.state, one.reason) == ("cpu-1", SliceState.COMPLETE, "1 of 1 hosts up")
    assert (two.key, two.state) == ("cpu-2", SliceState.PENDING)
    assert two.reason == "0 of 1 hosts running (ContainerCreating)"


def test_partial_slice_young_then_broken_with_reason() -> None:
    young = only_slice(slice_map(slice_pods("tpu", "tpu-p", 2, age_s=60), []))
    old = only_slice(slice_map(slice_pods("tpu", "tpu-p", 2, age_s=1000), []))

    assert (young.state, young.reason) == (SliceState.PARTIAL, "2 of 4 hosts")
    assert (old.state, old.reason) == (SliceState.BROKEN, "2 of 4 hosts")
    assert not young.counts_as_capacity


def test_a_failed_host_breaks_the_slice_and_is_named() -> None:
    pods = slice_pods("tpu", "tpu-f", 4)
    pods[2]["status"] = {"phase": "Failed", "reason": "Evicted"}

    sl = only_slice(slice_map(pods, tpu_slice_nodes("tpu-f", 4)))

    assert sl.state is SliceState.BROKEN
    assert sl.reason == "host 2 pod Failed (Evicted)"
    assert not sl.counts_as_capacity


def test_ray_node_missing_past_the_grace_breaks_the_slice() -> None:
    pods = slice_pods("tpu", "tpu-m", 4, age_s=400, running_for_s=200)
    nodes = tpu_slice_nodes("tpu-m", 4)[:3]  # host 3 never joined

    sl = only_slice(slice_map(pods, nodes))

    assert sl.state is SliceState.BROKEN
    assert sl.reason == "Ray node of tpu-m-3 missing for 3 min"


def test_ray_node_missing_within_the_grace_is_pending() -> None:
    pods = slice_pods("tpu", "tpu-m", 4, age_s=100, running_for_s=60)

    sl = only_slice(slice_map(pods, tpu_slice_nodes("tpu-m", 4)[:3]))

    assert (sl.state, sl.reason) == (SliceState.PENDING, "3 of 4 hosts joined Ray")
    assert sl.counts_as_capacity


def test_a_dead_ray_node_counts_as_missing() -> None:
    pods = slice_pods("tpu", "tpu-d", 4, age_s=4000, running_for_s=3600)
    nodes = tpu_slice_nodes("tpu-d", 4)
    nodes[1] = node("tpu-d-1", dead=True)

    sl = only_slice(slice_map(pods, nodes))

    assert sl.state is SliceState.BROKEN
    assert sl.reason == "Ray node of tpu-d-1 missing for 60 min"


def test_without_ray_state_missing_nodes_are_not_judged() -> None:
    pods = slice_pods("tpu", "tpu-u", 4, age_s=4000, running_for_s=3600)

    sl = only_slice(slice_map(pods, None))

    assert sl.state is SliceState.COMPLETE
    assert sl.nodes == {}


def test_pending_host_in_a_young_slice_then_too_old() -> None:
    pods = slice_pods("tpu", "tpu-s", 4, age_s=120)
    pods[1]["status"] = {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
    }
    young = only_slice(slice_map(pods, tpu_slice_nodes("tpu-s", 4)))
    for raw in pods:
        raw["metadata"]["creationTimestamp"] = (NOW - timedelta(hours=1)).strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        )
    old = only_slice(slice_map(pods, tpu_slice_nodes("tpu-s", 4)))

    assert young.state is SliceState.PENDING
    assert young.reason == "3 of 4 hosts running (Unschedulable)"
    assert old.state is SliceState.BROKEN
    assert old.reason == "not up after 60 min: 3 of 4 hosts running (Unschedulable)"


def test_more_hosts_than_num_of_hosts_is_broken() -> None:
    extra = pod("tpu-o-extra", "tpu", replica="tpu-o", host_index=3)  # a place taken twice
    pods = [*slice_pods("tpu", "tpu-o", 4), extra]

    sl = only_slice(slice_map(pods, None))

    assert (sl.state, sl.reason) == (SliceState.BROKEN, "5 hosts, more than numOfHosts 4")


def test_a_whole_slice_of_an_older_num_of_hosts_is_outdated_not_broken() -> None:
    """NumOfHosts lowered 5 -> 4 under a live slice (host indexes 0..4, all Running
    and in Ray): built to the older spec, it serves on; one host down makes it broken."""
    pods = slice_pods("tpu", "tpu-o", 5)
    nodes = tpu_slice_nodes("tpu-o", 5)

    sl = only_slice(slice_map(pods, nodes))

    assert sl.state is SliceState.OUTDATED and sl.counts_as_capacity
    assert sl.reason == (
        "built to an older spec (5 hosts, numOfHosts 4 now): serves until idle, then removed first"
    )
    pods[2]["status"]["phase"] = "Failed"
    assert only_slice(slice_map(pods, nodes)).state is SliceState.BROKEN


def test_a_terminating_host_makes_the_whole_slice_terminating() -> None:
    pods = slice_pods("tpu", "tpu-t", 4)
    pods[3]["metadata"]["deletionTimestamp"] = "2026-11-30T12:00:00Z"

    sl = only_slice(slice_map(pods, tpu_slice_nodes("tpu-t", 4)))

    assert (sl.state, sl.reason) == (SliceState.TERMINATING, "1 host(s) terminating")
    assert not sl.counts_as_capacity
    assert sl.idle_ms(NOW_MS) is None


def test_workers_to_delete_marks_the_whole_slice() -> None:
    spec = spec_of(group("tpu", hosts=4, scaleStrategy={"workersToDelete": ["tpu-w-0"]}))

    sl = only_slice(slice_map(slice_pods("tpu", "tpu-w", 4), tpu_slice_nodes("tpu-w", 4), spec))

    assert (sl.state, sl.reason) == (SliceState.TERMINATING, "named in workersToDelete")
    assert sl.marked_for_deletion


def test_multi_host_pods_without_slice_labels_are_left_alone_and_reported() -> None:
    pods = [pod(f"tpu-bare-{i}", "tpu", age_s=5000) for i in range(4)]
    pods[0]["status"] = {"phase": "Failed"}

    result = slice_map(pods, [])

    slices = result.groups["tpu"].slices
    assert len(slices) == 4
    assert all(s.state is SliceState.PARTIAL for s in slices)  # never BROKEN: never replaced
    assert any(s.reason == "slice unknown: no replica label (pod Failed)" for s in slices)
    [problem] = result.problems
    assert problem.group == "tpu"
    assert "4 pod(s) carry neither" in problem.message


def test_head_and_orphans_are_set_apart() -> None:
    spec = parse_raycluster(cluster(group("cpu"), group("bad", hosts=0), name="rc"))
    pods = [
        pod("rc-head", "", head=True, container="ray-head"),
        pod("cpu-1", "cpu"),
        pod("old-1", "removed"),
        pod("bad-1", "bad"),
    ]

    result = slice_map(pods, None, spec)

    assert [h.pod_name for h in result.head] == ["rc-head"]
    assert sorted(h.pod_name for h in result.orphans) == ["bad-1", "old-1"]
    assert [s.key for s in result.groups["cpu"].slices] == ["cpu-1"]
    assert "bad" not in result.groups
    # The skipped group already has its problem in the spec; the removed group gets one here.
    assert [p.message for p in result.problems] == ["pod old-1 is in no worker group of the spec"]


def test_tpu_worker_id_must_match_the_host_index() -> None:
    nodes = tpu_slice_nodes("tpu-l", 4)
    nodes[1], nodes[2] = (
        node("tpu-l-1", labels={"ray.io/tpu-slice-name": "tpu-l", "ray.io/tpu-worker-id": "2"}),
        node("tpu-l-2", labels={"ray.io/tpu-slice-name": "tpu-l", "ray.io/tpu-worker-id": "1"}),
    )

    result = slice_map(slice_pods("tpu", "tpu-l", 4), nodes)

    messages = sorted(p.message for p in result.problems)
    assert messages == [
        "pod tpu-l-1 is host 1 but Ray says TPU worker 2",
        "pod tpu-l-2 is host 2 but Ray says TPU worker 1",
    ]


def test_tpu_slice_names_must_agree_with_the_pods_slices() -> None:
    nodes = tpu_slice_nodes("tpu-a", 4) + tpu_slice_nodes("tpu-b", 4)
    swapped = node(
        "tpu-b-3", labels={"ray.io/tpu-slice-name": "tpu-a", "ray.io/tpu-worker-id": "3"}
    )
    nodes[-1] = swapped
    pods = slice_pods("tpu", "tpu-a", 4) + slice_pods("tpu", "tpu-b", 4, age_s=300)

    result = slice_map(pods, nodes)

    messages = [p.message for p in result.problems]
    assert "slice tpu-b: hosts report different TPU slice names ['tpu-a', 'tpu-b']" in messages
    assert "TPU slice tpu-a spans slices tpu-a and tpu-b" in messages


def test_ray_node_type_must_be_the_pods_group() -> None:
    result = slice_map([pod("cpu-1", "cpu")], [node("cpu-1", group_name="tpu")])

    [problem] = result.problems
    assert problem.message == "pod cpu-1 is in group cpu but its Ray node has type tpu"


def test_captured_idle_slice_joins_its_pods() -> None:
    # The pods KubeRay would have made for the capture in fixtures/ray_state (see its README).
    spec = spec_of(group("cpu-group"), group("tpu-group", hosts=4, tpu="4"))
    names = ("b7x2k", "c4m9p", "d2q8r", "f6t3w")
    pods = [
        pod(
            f"raycluster-tpu-tpu-group-worker-{n}",
            "tpu-group",
            replica="tpu-group-q8m4z",
            host_index=i,
        )
        for i, n in enumerate(names)
    ] + [pod("raycluster-tpu-cpu-group-worker-h2k9d", "cpu-group")]
    ray = parse_ray_state((FIXTURES / "idle_tpu_slice.json").read_text(), read_at_ms=NOW_MS)

    result = build_slice_map(spec, hosts_of(pods, spec), ray, NOW, TIMEOUTS)

    tpu = only_slice(result, "tpu-group")
    assert (tpu.key, tpu.state) == ("tpu-group-q8m4z", SliceState.COMPLETE)
    assert len(tpu.node_ids) == 4
    assert tpu.idle_ms(NOW_MS) == min(
        n.idle_ms(NOW_MS) for n in ray.nodes if n.node_type == "tpu-group"
    )
    assert only_slice(result, "cpu-group").state is SliceState.COMPLETE
    assert result.problems == ()


# --- property: whatever the pods, the map is consistent ------------------------------------------

POD_STATES: list[dict[str, Any]] = [
    {"phase": "Running"},
    {"phase": "Pending"},
    {"phase": "Failed", "reason": "Evicted"},
    {"phase": "Unknown"},
    {"deleting": True},
]


@st.composite
def cluster_pods(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[RayNode]]:
    pods: list[dict[str, Any]] = []
    nodes: list[RayNode] = []
    for index in range(draw(st.integers(0, 12))):
        group_name = draw(st.sampled_from(["cpu", "tpu", "gone"]))
        replica = draw(st.sampled_from([None, "tpu-a", "tpu-b"]))
        host_index = draw(st.one_of(st.none(), st.integers(0, 5)))
        kind = draw(st.sampled_from(POD_STATES))
        name = f"p{index}"
        raw = pod(
            name,
            group_name,
            replica=replica,
            host_index=host_index,
            phase=kind.get("phase", "Running"),
            deleting="deleting" in kind,
            age_s=draw(st.sampled_from([30, 600, 5000])),
        )
        raw["status"].update({k: v for k, v in kind.items() if k == "reason"})
        pods.append(raw)
        if draw(st.booleans()):
            nodes.append(
                node(name, dead=draw(st.booleans()), idle_s=draw(st.sampled_from([None, 0, 90])))
            )
    return pods, nodes


@settings(max_examples=150, deadline=None)
@given(cluster_pods(), st.booleans())
def test_every_worker_lands_in_exactly_one_place(
    drawn: tuple[list[dict[str, Any]], list[RayNode]], ray_known: bool
) -> None:
    pods, nodes = drawn
    ray: RayState | None = state(nodes) if ray_known else None
    hosts = hosts_of(pods)

    result = build_slice_map(TPU_SPEC, hosts, ray, NOW, TIMEOUTS)

    placed = [h.pod_name for gs in result.groups.values() for s in gs.slices for h in s.hosts]
    placed += [h.pod_name for h in result.orphans]
    assert sorted(placed) == sorted(h.pod_name for h in hosts)
    for gs in result.groups.values():
        assert len({s.key for s in gs.slices}) == len(gs.slices)
        for sl in gs.slices:
            assert all(h.slice_key == sl.key and h.group == sl.group for h in sl.hosts)
            assert set(sl.nodes) <= set(sl.pod_names)
            assert sl.reason
            if sl.state is SliceState.COMPLETE:
                assert len(sl.hosts) == gs.group.num_of_hosts
                assert all(h.is_capacity for h in sl.hosts)
                assert not ray_known or len(sl.nodes) == len(sl.hosts)
