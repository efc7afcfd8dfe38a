"""Builders of API-shaped pod and RayCluster dicts and of Ray state (parsed, and as the GCS
sends it), for pure unit tests."""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from ray.core.generated import autoscaler_pb2

from kuberay_scaler.core.model.cluster import frozen_map
from kuberay_scaler.core.model.plan import Memory, Plan, Snapshot, mono_of
from kuberay_scaler.core.model.ray import (
    HEAD_RESOURCE,
    Bundle,
    GangDemand,
    GangStrategy,
    LabelConstraint,
    LabelSelector,
    NodeStatus,
    RayNode,
    RayState,
    TaskDemand,
    epoch_ms,
)
from kuberay_scaler.core.parse.pods import parse_pods
from kuberay_scaler.core.parse.raycluster import parse_raycluster
from kuberay_scaler.core.planner.pipeline import plan
from kuberay_scaler.core.planner.policy import Policy

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SAMPLES = FIXTURES / "rayclusters"  # our own RayClusters (see its README), nothing from outside
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
NOW_MS = epoch_ms(NOW)
# NOW as the planner's monotonic reading (seconds) where no mono_s is passed: the wall clock
# stands in, so Memory's timers of such plans are NOW_S + their seconds.
NOW_S = mono_of(None, NOW)


def sample(name: str) -> dict[str, Any]:
    """A RayCluster from tests/fixtures/rayclusters, with metadata the API server would add."""
    docs = [d for d in yaml.safe_load_all((SAMPLES / name).read_text()) if d]
    obj: dict[str, Any] = next(d for d in docs if d.get("kind") == "RayCluster")
    obj["metadata"].update(namespace="default", uid="uid-1", resourceVersion="100")
    return obj


def cluster(*groups: dict[str, Any], name: str = "rc", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name, "namespace": "default", "uid": "uid-1", "resourceVersion": "7"},
        "spec": {
            "headGroupSpec": {"template": {"spec": {"containers": [{"name": "ray-head"}]}}},
            "workerGroupSpecs": list(groups),
            **spec,
        },
    }


def group(
    name: str,
    *,
    replicas: int = 0,
    min_replicas: int = 0,
    max_replicas: int = 10,
    hosts: int = 1,
    cpu: str = "8",
    tpu: str | None = None,
    topology: str | None = None,
    accelerator: str = "tpu-v6e-slice",
    **extra: Any,
) -> dict[str, Any]:
    limits: dict[str, str] = {"cpu": cpu, "memory": "32Gi"}
    container = {"name": "ray-worker", "resources": {"limits": limits}}
    pod_spec: dict[str, Any] = {"containers": [container]}
    if tpu:
        limits["google.com/tpu"] = tpu
        pod_spec["nodeSelector"] = {
            "cloud.google.com/gke-tpu-accelerator": accelerator,
            "cloud.google.com/gke-tpu-topology": topology or "4x4",
        }
    return {
        "groupName": name,
        "replicas": replicas,
        "minReplicas": min_replicas,
        "maxReplicas": max_replicas,
        "numOfHosts": hosts,
        "rayStartParams": {},
        "template": {"spec": pod_spec},
        **extra,
    }


def tpu_group(name: str = "tpu", *, replicas: int = 0, **kw: Any) -> dict[str, Any]:
    """A v6e-16 group: 4 hosts of 4 chips (topology 4x4), like the v6e-16 sample."""
    kw.setdefault("hosts", 4)
    kw.setdefault("tpu", "4")
    kw.setdefault("topology", "4x4")
    kw.setdefault("cpu", "24")
    return group(name, replicas=replicas, **kw)


def pod(
    name: str,
    group_name: str,
    *,
    cluster_name: str = "rc",
    replica: str | None = None,
    host_index: int | None = None,
    phase: str = "Running",
    container: str = "ray-worker",
    age_s: float = 600,
    running_for_s: float | None = None,
    deleting: bool = False,
    legacy_replica: str | None = None,
    head: bool = False,
    uid: str | None = None,
    gates: tuple[str, ...] = (),
) -> dict[str, Any]:
    """A Ray pod as KubeRay makes it. `gates`: held by these scheduling gates the way Kueue
    holds the pods of a workload it has not admitted (Pending, `PodScheduled=False` with
    reason `SchedulingGated`, no container statuses)."""
    if gates:
        return _gated(
            pod(
                name,
                group_name,
                cluster_name=cluster_name,
                replica=replica,
                host_index=host_index,
                age_s=age_s,
                legacy_replica=legacy_replica,
                container=container,
            ),
            gates,
        )
    labels = {
        "ray.io/cluster": cluster_name,
        "ray.io/node-type": "head" if head else "worker",
        "ray.io/group": "headgroup" if head else group_name,
    }
    if replica:
        labels["ray.io/worker-group-replica-name"] = replica
    if host_index is not None:
        labels["ray.io/replica-host-index"] = str(host_index)
    if legacy_replica:
        labels["replicaIndex"] = legacy_replica
    created = NOW - timedelta(seconds=age_s)
    started = NOW - timedelta(seconds=running_for_s if running_for_s is not None else age_s - 5)
    state: dict[str, Any] = (
        {"running": {"startedAt": _ts(started)}}
        if phase == "Running"
        else {"waiting": {"reason": "ContainerCreating"}}
    )
    meta: dict[str, Any] = {
        "name": name,
        "labels": labels,
        "creationTimestamp": _ts(created),
        "uid": uid or f"u-{name}",
    }
    if deleting:
        meta["deletionTimestamp"] = _ts(NOW)
    return {
        "metadata": meta,
        "spec": {"nodeName": "node-1", "containers": [{"name": container}]},
        "status": {
            "phase": phase,
            "containerStatuses": [
                {"name": "sidecar", "state": {"terminated": {"reason": "Completed"}}},
                {"name": container, "state": state},
            ],
        },
    }


def going(p: dict[str, Any], reason: str = "PreemptionByScheduler") -> dict[str, Any]:
    """`p` with a DisruptionTarget condition: the scheduler (or an eviction) is taking it."""
    cond = {"type": "DisruptionTarget", "status": "True", "reason": reason}
    p["status"].setdefault("conditions", []).append(cond)
    return p


KUEUE_ELASTIC_GATE = "kueue.x-k8s.io/elastic-job"  # Kueue's gate on pods of a workload slice


def _gated(running: dict[str, Any], gates: tuple[str, ...]) -> dict[str, Any]:
    out = copy.deepcopy(running)
    out["spec"].pop("nodeName", None)
    out["spec"]["schedulingGates"] = [{"name": g} for g in gates]
    out["status"] = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "SchedulingGated",
                "message": "Scheduling is blocked due to non-empty scheduling gates",
            }
        ],
    }
    return out


def slice_pods(group_name: str, replica: str, hosts: int, **kw: Any) -> list[dict[str, Any]]:
    return [
        pod(f"{replica}-{i}", group_name, replica=replica, host_index=i, **kw) for i in range(hosts)
    ]


def _ts(value: datetime) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%SZ")


def node_id_of(instance: str) -> str:
    """A stable 28-byte hex node id (Python's str hash changes between processes)."""
    return hashlib.sha256(instance.encode()).hexdigest()[:56]


def node(
    instance: str,
    *,
    group_name: str = "",
    resources: dict[str, float] | None = None,
    available: dict[str, float] | None = None,
    labels: dict[str, str] | None = None,
    idle_s: float | None = 0,
    head: bool = False,
    dead: bool = False,
    draining: bool = False,
) -> RayNode:
    """A Ray node; `idle_s=None` means busy (RUNNING without an idle duration)."""
    total = dict(resources or {"CPU": 8})
    if head:
        total[HEAD_RESOURCE] = 1
    if dead:
        status = NodeStatus.DEAD
    elif draining:
        status = NodeStatus.DRAINING
    else:
        status = NodeStatus.IDLE if idle_s is not None else NodeStatus.RUNNING
    return RayNode(
        node_id=node_id_of(instance),
        instance_id=instance,
        node_type=group_name,
        status=status,
        total=frozen_map(total),
        available=frozen_map(available if available is not None else total),
        labels=frozen_map(labels or {}),
        # Idle for `idle_s` at NOW, the moment the tests plan at.
        idle_since_ms=NOW_MS - int((idle_s or 0) * 1000) if status is NodeStatus.IDLE else None,
        ip="127.0.0.1",
        is_head=head,
    )


def head_node(cpu: float = 0) -> RayNode:
    return node("rc-head", group_name="headgroup", resources={"CPU": cpu}, head=True)


def cpu_nodes(
    pod_names: Iterable[str],
    group_name: str = "cpu",
    *,
    cpu: float = 8,
    idle_s: float | None = 0,
    free_cpu: float | None = None,
) -> list[RayNode]:
    """Plain hosts; `free_cpu` below `cpu` makes them busy."""
    out = []
    for name in pod_names:
        total = {"CPU": cpu, "memory": 32 * 2**30}
        avail = {**total, "CPU": cpu if free_cpu is None else free_cpu}
        busy = free_cpu is not None and free_cpu < cpu
        out.append(
            node(
                name,
                group_name=group_name,
                resources=total,
                available=avail,
                labels={"ray.io/node-group": group_name},
                idle_s=None if busy else idle_s,
            )
        )
    return out


def tpu_slice_nodes(
    replica: str,
    hosts: int,
    *,
    pod_type: str = "v6e-16",
    chips: float = 4,
    idle_s: float | None = 0,
    busy_hosts: tuple[int, ...] = (),
    group_name: str = "tpu",
    idle_per_host: Sequence[float] | None = None,
) -> list[RayNode]:
    """The Ray nodes of one TPU slice whose pods are `<replica>-<i>` (see slice_pods)."""
    out = []
    generation = pod_type.split("-")[0].upper()
    for i in range(hosts):
        res = {"CPU": 24, "TPU": chips, replica: 1, f"accelerator_type:TPU-{generation}": 1}
        if i == 0:
            res[f"TPU-{pod_type}-head"] = 1
        labels = {
            "ray.io/tpu-slice-name": replica,
            "ray.io/tpu-worker-id": str(i),
            "ray.io/tpu-pod-type": pod_type,
            "ray.io/node-group": group_name,
        }
        busy = i in busy_hosts
        avail = {**res, "TPU": 0} if busy else res
        host_idle = idle_per_host[i] if idle_per_host is not None else idle_s
        out.append(
            node(
                f"{replica}-{i}",
                group_name=group_name,
                resources=res,
                available=avail,
                labels=labels,
                idle_s=None if busy else host_idle,
            )
        )
    return out


def state(
    nodes: Sequence[RayNode] = (),
    tasks: Sequence[TaskDemand] = (),
    gangs: Sequence[GangDemand] = (),
    constraint: Sequence[TaskDemand] = (),
) -> RayState:
    return RayState(
        nodes=tuple(nodes), tasks=tuple(tasks), gangs=tuple(gangs), constraint=tuple(constraint)
    )


def bundle(resources: Mapping[str, float], **selectors: str) -> Bundle:
    """`bundle({"CPU": 1}, ray__io__x="v")` → selector `ray.io/x in (v)`."""
    sel: tuple[LabelSelector, ...] = ()
    if selectors:
        constraints = tuple(
            LabelConstraint(k.replace("__", "/").replace("_", "-"), frozenset([v]))
            for k, v in selectors.items()
        )
        sel = (LabelSelector(constraints),)
    return Bundle(resources=frozen_map(resources), selectors=sel)


def selector_bundle(resources: Mapping[str, float], labels: Mapping[str, str]) -> Bundle:
    sel = (LabelSelector(tuple(LabelConstraint(k, frozenset([v])) for k, v in labels.items())),)
    return Bundle(resources=frozen_map(resources), selectors=sel)


def tasks(resources: Mapping[str, float], count: int) -> TaskDemand:
    return TaskDemand(bundle=bundle(resources), count=count)


def gang(strategy: GangStrategy, *bundles: Bundle) -> GangDemand:
    return GangDemand(bundles=tuple(bundles), strategy=strategy)


def slice_reservation(pod_type: str = "v6e-16") -> GangDemand:
    """Step 1 of ray.util.tpu.SlicePlacementGroup: the head bundle of a new slice."""
    head = selector_bundle(
        {f"TPU-{pod_type}-head": 1},
        {"ray.io/tpu-worker-id": "0", "ray.io/tpu-pod-type": pod_type},
    )
    return gang(GangStrategy.PACK, head)


def pinned_slice_bundles(slice_name: str, hosts: int = 4, chips: float = 4) -> GangDemand:
    """Step 2 of SlicePlacementGroup: one bundle per host, pinned to one existing slice."""
    pinned = selector_bundle({"TPU": chips}, {"ray.io/tpu-slice-name": slice_name})
    return gang(GangStrategy.SPREAD, *([pinned] * hosts))


# GCS replies as the wire carries them (GetClusterResourceStateReply), for the adapter's parse and
# poller tests. Any other field of a NodeState or a ClusterResourceState passes as a keyword.
GCS_IDLE = autoscaler_pb2.NodeStatus.Value("IDLE")


def gcs_node(
    node_id: bytes = b"n1",
    instance_id: str = "pod-1",
    *,
    status: int = GCS_IDLE,
    idle_ms: int = 0,
    **fields: Any,
) -> Any:
    """A NodeState; maps (`total_resources`, `labels`...) as dicts, repeated fields as lists."""
    return autoscaler_pb2.NodeState(
        node_id=node_id, instance_id=instance_id, status=status, idle_duration_ms=idle_ms, **fields
    )


def gcs_request(resources: Mapping[str, float], count: int = 1) -> Any:
    """A ResourceRequestByCount: `count` tasks (or constraint bundles) of `resources`."""
    request = autoscaler_pb2.ResourceRequest(resources_bundle=resources)
    return autoscaler_pb2.ResourceRequestByCount(request=request, count=count)


def gcs_reply(
    version: int = 1, *, nodes: Iterable[Any] = (), demand: Iterable[Any] = (), **fields: Any
) -> Any:
    """A reply at state version `version`: `nodes` (gcs_node), pending `demand` (gcs_request)."""
    state = autoscaler_pb2.ClusterResourceState(
        cluster_resource_state_version=version,
        node_states=nodes,
        pending_resource_requests=demand,
        **fields,
    )
    return autoscaler_pb2.GetClusterResourceStateReply(cluster_resource_state=state)


def one_node_reply(version: int, *, status: int = GCS_IDLE, idle_ms: int = 0) -> Any:
    """A reply of one node (n1, pod-1): what the poller's change and cadence tests move."""
    return gcs_reply(version, nodes=[gcs_node(status=status, idle_ms=idle_ms)])


def deep(obj: Any) -> Any:
    return copy.deepcopy(obj)


def snapshot_of(rc: Mapping[str, Any], pods: Iterable[Mapping[str, Any]] = ()) -> Snapshot:
    """Parse a RayCluster dict and pod dicts the way the daemon does."""
    spec = parse_raycluster(rc)
    hosts, problems = parse_pods(list(pods), spec)
    return Snapshot(spec=spec, hosts=tuple(hosts), problems=tuple(problems))


def plan_of(
    rc: Mapping[str, Any],
    pods: Iterable[Mapping[str, Any]] = (),
    ray: RayState | None = None,
    *,
    memory: Memory | None = None,
    policy: Policy | None = None,
    now: datetime = NOW,
    synced: bool = True,
) -> Plan:
    """One call of `plan` on API-shaped input (ray=None means demand unknown)."""
    snap = snapshot_of(rc, pods)
    if not synced:
        snap = Snapshot(spec=snap.spec, hosts=snap.hosts, synced=False, problems=snap.problems)
    return plan(snap, ray, memory or Memory(), policy or Policy(), now)


def targets(result: Plan) -> dict[str, int]:
    return {g.group: g.target for g in result.groups}


def deleted_pods(result: Plan, group_name: str) -> list[str]:
    decision = result.group(group_name)
    assert decision is not None
    return [p for d in decision.deletions for p in d.pods]
