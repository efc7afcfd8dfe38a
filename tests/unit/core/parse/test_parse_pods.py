"""Pod dicts → Hosts: identity labels, the Ray container found by name, odd states classified."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from kuberay_scaler.core.model.cluster import ClusterSpec
from kuberay_scaler.core.model.hosts import Host, HostPhase
from kuberay_scaler.core.parse.pods import parse_pod, parse_pods, pod_items
from kuberay_scaler.core.parse.raycluster import parse_raycluster
from tests.factories import NOW, cluster, group, pod

SPEC: ClusterSpec = parse_raycluster(cluster(group("cpu"), group("tpu", hosts=4), name="rc"))


def host(raw: dict[str, Any], spec: ClusterSpec = SPEC) -> Host:
    parsed = parse_pod(raw, spec)
    assert isinstance(parsed, Host), parsed
    return parsed


def with_status(raw: dict[str, Any], **status: Any) -> dict[str, Any]:
    raw["status"] = status
    return raw


def ray_container(state: dict[str, Any], name: str = "ray-worker") -> dict[str, Any]:
    return {"name": name, "state": state}


def test_multi_host_identity_from_kuberay_labels() -> None:
    raw = pod("tpu-abcde-2", "tpu", replica="tpu-abcde", host_index=2)
    raw["metadata"]["labels"]["ray.io/worker-group-replica-index"] = "1"

    h = host(raw)

    assert (h.pod_name, h.group, h.is_head) == ("tpu-abcde-2", "tpu", False)
    assert h.slice_key == "tpu-abcde"
    assert (h.replica_index, h.host_index) == (1, 2)
    assert h.phase is HostPhase.RUNNING
    assert h.is_capacity
    assert h.node_name == "node-1"
    assert h.uid == "u-tpu-abcde-2"
    assert h.created_at is not None and h.created_at.tzinfo is not None
    assert h.running_since is not None and h.running_since < NOW


def test_legacy_identity_from_replica_index_label_and_tpu_worker_id_env() -> None:
    raw = pod("tpu-worker-x1", "tpu", legacy_replica="tpu-1")
    raw["spec"]["containers"][0]["env"] = [
        {"name": "TPU_NAME", "value": "tpu-1"},
        {"name": "TPU_WORKER_ID", "value": "3"},
    ]

    h = host(raw)

    assert h.slice_key == "tpu-1"
    assert h.host_index == 3
    assert h.replica_index is None


def test_single_host_identity_is_the_pod_itself() -> None:
    h = host(pod("cpu-worker-q9", "cpu"))

    assert h.slice_key == "cpu-worker-q9"
    assert h.host_index is None


def test_head_pod() -> None:
    raw = pod("rc-head-abc", "", head=True, container="ray-head")

    h = host(raw)

    assert (h.is_head, h.group, h.phase) == (True, "headgroup", HostPhase.RUNNING)


def test_ray_container_is_found_by_name_not_position() -> None:
    raw = pod("cpu-1", "cpu")
    # The sidecar comes first and has terminated; the Ray container (second) is running.
    assert raw["status"]["containerStatuses"][0]["name"] == "sidecar"

    assert host(raw).phase is HostPhase.RUNNING

    raw["status"]["containerStatuses"].reverse()
    assert host(raw).phase is HostPhase.RUNNING


def test_orphan_pods_use_their_own_first_container() -> None:
    raw = pod("gone-1", "removed-group", container="main")
    raw["spec"]["containers"].append({"name": "sidecar"})

    assert host(raw).phase is HostPhase.RUNNING


def running_status() -> dict[str, Any]:
    return {"phase": "Running", "containerStatuses": [ray_container({"running": {}})]}


# design.md failure catalogue row 10: odd pod states, each with its class and the detail shown.
CLASSIFICATION = [
    pytest.param(
        {
            "phase": "Running",
            "containerStatuses": [
                ray_container({"running": {"startedAt": "2026-11-30T11:00:00Z"}})
            ],
        },
        None,
        HostPhase.RUNNING,
        "running",
        id="running",
    ),
    pytest.param(
        {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
        },
        None,
        HostPhase.PENDING,
        "Unschedulable",
        id="unschedulable",
    ),
    pytest.param(
        {
            "phase": "Pending",
            "containerStatuses": [ray_container({"waiting": {"reason": "ContainerCreating"}})],
        },
        None,
        HostPhase.PENDING,
        "ContainerCreating",
        id="creating",
    ),
    pytest.param(
        {
            "phase": "Pending",
            "containerStatuses": [ray_container({"waiting": {"reason": "ImagePullBackOff"}})],
        },
        None,
        HostPhase.PENDING,
        "ImagePullBackOff",
        id="image-pull",
    ),
    pytest.param(
        {
            "phase": "Running",
            "containerStatuses": [ray_container({"waiting": {"reason": "CrashLoopBackOff"}})],
        },
        None,
        HostPhase.PENDING,
        "CrashLoopBackOff",
        id="crashloop",
    ),
    pytest.param(
        {
            "phase": "Running",
            "containerStatuses": [ray_container({"terminated": {"reason": "Error"}})],
        },
        "Always",
        HostPhase.PENDING,
        "Ray container terminated (Error), restarting",
        id="terminated-will-restart",
    ),
    pytest.param(
        {
            "phase": "Running",
            "containerStatuses": [ray_container({"terminated": {"reason": "OOMKilled"}})],
        },
        "Never",
        HostPhase.FAILED,
        "Ray container terminated (OOMKilled)",
        id="terminated-restartPolicy-Never",
    ),
    pytest.param(
        {"phase": "Failed", "reason": "Evicted", "message": "low on memory"},
        None,
        HostPhase.FAILED,
        "pod Failed (Evicted)",
        id="evicted",
    ),
    pytest.param({"phase": "Failed"}, None, HostPhase.FAILED, "pod Failed", id="failed"),
    pytest.param({"phase": "Succeeded"}, None, HostPhase.FAILED, "pod Succeeded", id="succeeded"),
    pytest.param(
        {"phase": "Unknown", "reason": "NodeLost"},
        None,
        HostPhase.FAILED,
        "pod Unknown (NodeLost)",
        id="unknown",
    ),
    pytest.param({}, None, HostPhase.PENDING, "no status yet", id="no-status"),
    pytest.param(
        {"phase": "Running", "containerStatuses": [ray_container({"running": {}}, "other")]},
        None,
        HostPhase.PENDING,
        "pod Running",
        id="ray-container-status-missing",
    ),
]


@pytest.mark.parametrize(("status", "restart_policy", "phase", "detail"), CLASSIFICATION)
def test_pod_state_classification(
    status: dict[str, Any], restart_policy: str | None, phase: HostPhase, detail: str
) -> None:
    raw = with_status(pod("tpu-a-0", "tpu", replica="tpu-a", host_index=0), **status)
    if restart_policy:
        raw["spec"]["restartPolicy"] = restart_policy

    h = host(raw)

    assert (h.phase, h.detail) == (phase, detail)
    assert h.is_capacity is (phase is HostPhase.RUNNING)


def test_terminating_wins_over_everything_else() -> None:
    raw = with_status(pod("cpu-1", "cpu", deleting=True), **running_status())

    h = host(raw)

    assert (h.phase, h.detail) == (HostPhase.TERMINATING, "deletionTimestamp set")
    assert not h.is_capacity


@pytest.mark.parametrize(
    ("mutate", "why"),
    [
        (lambda p: p["metadata"]["labels"].pop("ray.io/group"), "has no ray.io/group label"),
        (lambda p: p["metadata"]["labels"].update({"ray.io/cluster": "other"}), "cluster 'other'"),
        (lambda p: p["metadata"]["labels"].pop("ray.io/cluster"), "no ray.io/cluster label"),
        (lambda p: p["metadata"].pop("name"), "has no metadata.name"),
        (lambda p: p.update(metadata="junk"), "has no metadata.name"),
    ],
    ids=["unlabeled", "foreign", "no-cluster-label", "nameless", "metadata-junk"],
)
def test_pods_we_cannot_use_become_problems(mutate: Any, why: str) -> None:
    bad = pod("cpu-bad", "cpu")
    mutate(bad)

    hosts, problems = parse_pods([pod("cpu-ok", "cpu"), bad, 42], SPEC)

    assert [h.pod_name for h in hosts] == ["cpu-ok"]
    assert len(problems) == 2
    assert why in problems[0].message
    assert problems[0].message.startswith("pod #1: ")
    assert "not an object but int" in problems[1].message


def test_pod_without_node_type_label_is_still_a_worker() -> None:
    raw = pod("cpu-1", "cpu")
    del raw["metadata"]["labels"]["ray.io/node-type"]  # crashes Ray's v2 loop; not ours

    h = host(raw)

    assert (h.is_head, h.group) == (False, "cpu")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("containerStatuses", 5),
        ("containerStatuses", {"name": "ray-worker"}),
        ("containerStatuses", [None, "x", {"name": "ray-worker", "state": "running"}]),
        ("conditions", "Unschedulable"),
        ("phase", ["Running"]),
    ],
)
def test_malformed_status_fields_never_raise(field: str, value: object) -> None:
    raw = pod("cpu-1", "cpu")
    raw["status"][field] = value

    h = host(raw)

    assert h.phase in (HostPhase.PENDING, HostPhase.RUNNING)


@pytest.mark.parametrize(
    ("labels", "host_index"),
    [
        ({"ray.io/replica-host-index": "²"}, None),
        ({"ray.io/replica-host-index": "-1"}, None),
        ({"ray.io/replica-host-index": "9" * 5000}, None),
        ({"ray.io/replica-host-index": "07"}, 7),
    ],
)
def test_odd_index_labels(labels: dict[str, str], host_index: int | None) -> None:
    raw = pod("tpu-a-0", "tpu", replica="tpu-a")
    raw["metadata"]["labels"].update(labels)

    assert host(raw).host_index == host_index


def test_times_without_zone_are_utc() -> None:
    raw = pod("cpu-1", "cpu")
    raw["metadata"]["creationTimestamp"] = "2026-11-30T11:00:00"

    assert host(raw).created_at == datetime(2026, 11, 30, 11, 0, tzinfo=UTC)


def test_garbage_times_and_node_names_are_dropped() -> None:
    raw = pod("cpu-1", "cpu")
    raw["metadata"]["creationTimestamp"] = "yesterday"
    raw["spec"]["nodeName"] = {"name": "n"}

    h = host(raw)

    assert (h.created_at, h.node_name) == (None, None)


def test_parse_pods_sorts_by_name() -> None:
    hosts, problems = parse_pods([pod("b", "cpu"), pod("a", "cpu")], SPEC)

    assert [h.pod_name for h in hosts] == ["a", "b"]
    assert problems == []


@pytest.mark.parametrize(
    ("pod_list", "count"),
    [
        ({"kind": "PodList", "items": [pod("a", "cpu")]}, 1),
        ({"kind": "PodList", "items": None}, 0),
        ([pod("a", "cpu"), pod("b", "cpu")], 2),
        ({"a": pod("a", "cpu")}, 1),
        ("not pods", 0),
        (None, 0),
    ],
)
def test_pod_items_accepts_the_usual_containers(pod_list: object, count: int) -> None:
    assert len(pod_items(pod_list)) == count
