"""Builders of API-shaped pod and RayCluster dicts and of Ray state, for pure unit tests."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from kuberay_scaler.model.cluster import frozen_map
from kuberay_scaler.model.ray import (
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
)

SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "kuberay" / "v1.7.0"
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def sample(name: str) -> dict[str, Any]:
    """A RayCluster sample from shared/kuberay/v1.7.0, with metadata the API server would add."""
    obj: dict[str, Any] = yaml.safe_load((SAMPLES / name).read_text())
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
    pod_spec: dict[str, Any] = {"containers": [{"name": "ray-worker", "resources": {"limits": limits}}]}
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
) -> dict[str, Any]:
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
    meta: dict[str, Any] = {"name": name, "labels": labels, "creationTimestamp": _ts(created), "uid": f"u-{name}"}
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


def slice_pods(group_name: str, replica: str, hosts: int, **kw: Any) -> list[dict[str, Any]]:
    return [pod(f"{replica}-{i}", group_name, replica=replica, host_index=i, **kw) for i in range(hosts)]


def _ts(value: datetime) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%SZ")


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
) -> RayNode:
    total = dict(resources or {"CPU": 8})
    if head:
        total[HEAD_RESOURCE] = 1
    status = NodeStatus.DEAD if dead else (NodeStatus.IDLE if idle_s is not None else NodeStatus.RUNNING)
    return RayNode(
        node_id=f"{abs(hash(instance)):056x}"[:56],
        instance_id=instance,
        node_type=group_name,
        status=status,
        total=frozen_map(total),  # type: ignore[arg-type]
        available=frozen_map(available if available is not None else total),  # type: ignore[arg-type]
        labels=frozen_map(labels or {}),  # type: ignore[arg-type]
        idle_ms=int((idle_s or 0) * 1000),
        ip="127.0.0.1",
        is_head=head,
    )


def tpu_slice_nodes(replica: str, hosts: int, *, pod_type: str = "v6e-16", chips: float = 4,
                    idle_s: float | None = 0, busy_hosts: tuple[int, ...] = ()) -> list[RayNode]:
    out = []
    for i in range(hosts):
        res = {"CPU": 24, "TPU": chips, replica: 1, f"accelerator_type:TPU-{pod_type.split('-')[0].upper()}": 1}
        if i == 0:
            res[f"TPU-{pod_type}-head"] = 1
        labels = {
            "ray.io/tpu-slice-name": replica,
            "ray.io/tpu-worker-id": str(i),
            "ray.io/tpu-pod-type": pod_type,
        }
        busy = i in busy_hosts
        avail = {**res, "TPU": 0} if busy else res
        out.append(node(f"{replica}-{i}", resources=res, available=avail, labels=labels,
                        idle_s=None if busy else idle_s))
    return out


def state(nodes: list[RayNode] = (), tasks: list[TaskDemand] = (), gangs: list[GangDemand] = (),  # type: ignore[assignment]
          constraint: list[TaskDemand] = ()) -> RayState:  # type: ignore[assignment]
    return RayState(nodes=tuple(nodes), tasks=tuple(tasks), gangs=tuple(gangs), constraint=tuple(constraint))


def bundle(resources: dict[str, float], **selectors: str) -> Bundle:
    sel = ()
    if selectors:
        sel = (LabelSelector(tuple(LabelConstraint(k.replace("__", "/").replace("_", "-"), frozenset([v]))
                                   for k, v in selectors.items())),)
    return Bundle(resources=frozen_map(resources), selectors=sel)  # type: ignore[arg-type]


def selector_bundle(resources: dict[str, float], labels: dict[str, str]) -> Bundle:
    sel = (LabelSelector(tuple(LabelConstraint(k, frozenset([v])) for k, v in labels.items())),)
    return Bundle(resources=frozen_map(resources), selectors=sel)  # type: ignore[arg-type]


def tasks(resources: dict[str, float], count: int) -> TaskDemand:
    return TaskDemand(bundle=bundle(resources), count=count)


def gang(strategy: GangStrategy, *bundles: Bundle) -> GangDemand:
    return GangDemand(bundles=tuple(bundles), strategy=strategy)


def slice_reservation(pod_type: str = "v6e-16") -> GangDemand:
    """Step 1 of ray.util.tpu.SlicePlacementGroup: the head bundle of a new slice."""
    head = selector_bundle({f"TPU-{pod_type}-head": 1},
                           {"ray.io/tpu-worker-id": "0", "ray.io/tpu-pod-type": pod_type})
    return gang(GangStrategy.PACK, head)


def deep(obj: Any) -> Any:
    return copy.deepcopy(obj)
