"""Pure decision rules of KubeRay v1.7.0's RayCluster controller (``reconcilePods``), rewritten
from its reading: what to delete and create per worker group, and how pods are built.

Nothing here does I/O; ``operator.py`` applies the plans to the API-server stand-in.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kuberay_standins.ray_start import set_container_command

CLUSTER_LABEL = "ray.io/cluster"
NODE_TYPE_LABEL = "ray.io/node-type"
GROUP_LABEL = "ray.io/group"
IS_RAY_NODE_LABEL = "ray.io/is-ray-node"
IDENTIFIER_LABEL = "ray.io/identifier"
REPLICA_NAME_LABEL = "ray.io/worker-group-replica-name"
REPLICA_INDEX_LABEL = "ray.io/worker-group-replica-index"
HOST_INDEX_LABEL = "ray.io/replica-host-index"
HEAD_GROUP = "headgroup"
_PROTECTED_LABELS = (NODE_TYPE_LABEL, GROUP_LABEL, CLUSTER_LABEL)
INT32_MAX = 2**31 - 1
DEFAULT_AUTOSCALER_IMAGE = "rayproject/ray:2.52.0"


def _int32(value: int) -> int:
    """Go int32 arithmetic wraps; the not-a-multiple error can only arise from that."""
    value &= 0xFFFFFFFF
    return value - 2**32 if value > INT32_MAX else value


def _int_field(group: dict[str, Any], key: str, default: int) -> int:
    value = group.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def num_of_hosts(group: dict[str, Any]) -> int:
    return _int_field(group, "numOfHosts", 1)


def desired_worker_pods(group: dict[str, Any]) -> int:
    """``clamp(replicas, min, max) * numOfHosts`` in int32, 0 when the group is suspended."""
    if group.get("suspend") is True:
        return 0
    minimum = _int_field(group, "minReplicas", 0)
    maximum = _int_field(group, "maxReplicas", INT32_MAX)
    replicas = group.get("replicas")
    if not isinstance(replicas, int) or replicas < minimum:
        wanted = minimum
    else:
        wanted = min(replicas, maximum)
    return _int32(wanted * num_of_hosts(group))


def autoscaling_enabled(cluster: dict[str, Any]) -> bool:
    return (cluster.get("spec") or {}).get("enableInTreeAutoscaling") is True


def autoscaler_v2(cluster: dict[str, Any]) -> bool:
    options = (cluster.get("spec") or {}).get("autoscalerOptions") or {}
    return autoscaling_enabled(cluster) and options.get("version") == "v2"


def workers_to_delete(group: dict[str, Any]) -> list[str]:
    victims = (group.get("scaleStrategy") or {}).get("workersToDelete") or []
    return [v for v in victims if isinstance(v, str)] if isinstance(victims, list) else []


# -- pod state --------------------------------------------------------------------------------


def pod_name(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["name"])


def pod_labels(pod: dict[str, Any]) -> dict[str, str]:
    return dict((pod.get("metadata") or {}).get("labels") or {})


def _ray_container_terminated(pod: dict[str, Any]) -> bool:
    containers = (pod.get("spec") or {}).get("containers") or []
    if not containers:
        return False
    ray_name = containers[0].get("name")  # KubeRay's Ray container is always index 0
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == ray_name:
            return "terminated" in (status.get("state") or {})
    return False


def unhealthy_reason(pod: dict[str, Any]) -> str | None:
    """Why KubeRay would delete this pod (``shouldDeletePod``), or None."""
    phase = (pod.get("status") or {}).get("phase")
    if phase in ("Failed", "Succeeded"):
        return f"pod {pod_name(pod)} is {phase}, a terminal state"
    restart_never = (pod.get("spec") or {}).get("restartPolicy") == "Never"
    if phase == "Running" and restart_never and _ray_container_terminated(pod):
        return f"pod {pod_name(pod)} has a terminated Ray container and restartPolicy Never"
    return None


# -- plans ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PodSlot:
    """One worker pod to create; indices are None where the path sets no such label."""

    replica_name: str | None = None
    replica_index: int | None = None
    host_index: int | None = None


@dataclass
class GroupPlan:
    deletes: list[tuple[str, str]] = field(default_factory=list)  # (pod name, reason)
    creates: list[PodSlot] = field(default_factory=list)
    error: str | None = None  # the reconcile error KubeRay would return (requeue)

    def delete(self, pods: list[dict[str, Any]], reason: str) -> None:
        known = {name for name, _ in self.deletes}
        self.deletes.extend((pod_name(p), reason) for p in pods if pod_name(p) not in known)


@dataclass(frozen=True)
class GroupPolicy:
    autoscaling: bool
    random_delete: bool  # ENABLE_RANDOM_POD_DELETE
    indexing: bool  # feature gate RayMultiHostIndexing

    @property
    def may_remove_surplus(self) -> bool:
        return not self.autoscaling or self.random_delete


def _lowest_free(used: set[int]) -> int:
    index = 0
    while index in used:
        index += 1
    return index


def _index_label(pod: dict[str, Any]) -> int | None:
    text = pod_labels(pod).get(REPLICA_INDEX_LABEL)
    return int(text) if text is not None and text.lstrip("-").isdigit() else None


def _by_replica(pods: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    replicas: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        name = pod_labels(pod).get(REPLICA_NAME_LABEL)
        if name is not None:
            replicas.setdefault(name, []).append(pod)
    return replicas


def not_a_multiple(group: dict[str, Any], desired: int) -> str:
    return (
        f"desired worker pods ({desired}) is not a multiple of NumOfHosts "
        f"({num_of_hosts(group)}) for group {group.get('groupName')}"
    )


def plan_multi_host(
    group: dict[str, Any],
    pods: list[dict[str, Any]],
    policy: GroupPolicy,
    new_replica_name: Callable[[], str],
    rng: random.Random,
) -> GroupPlan:
    """``reconcileMultiHostWorkerGroup``: slices are created and deleted whole."""
    plan = GroupPlan()
    hosts = num_of_hosts(group)
    replicas = _by_replica(pods)
    for name in sorted(replicas):
        if len(replicas[name]) < hosts:
            plan.delete(replicas[name], f"incomplete replica {name}")
            plan.error = f"cleaned up incomplete replica group {name}, requeueing"
            return plan
    broken = _unhealthy_replicas(pods, replicas)
    for name, reason in broken.items():
        plan.delete(replicas[name], reason)
    if _plan_requested_deletions(plan, group, pods, replicas):
        return plan
    valid = [name for name in replicas if name not in broken]
    desired = desired_worker_pods(group)
    if desired % hosts != 0:  # only int32 wrap-around can get here, as in KubeRay
        plan.error = not_a_multiple(group, desired)
        return plan
    missing = int(desired / hosts) - len(valid)
    if missing > 0:
        used = {i for name in valid if (i := _index_label(replicas[name][0])) is not None}
        for _ in range(missing):
            index = _lowest_free(used)
            used.add(index)
            replica = new_replica_name()
            plan.creates.extend(PodSlot(replica, index, host) for host in range(hosts))
    elif missing < 0 and policy.may_remove_surplus:
        for name in rng.sample(sorted(valid), -missing):
            plan.delete(replicas[name], "scaling down")
    return plan


def _unhealthy_replicas(
    pods: list[dict[str, Any]], replicas: dict[str, list[dict[str, Any]]]
) -> dict[str, str]:
    broken: dict[str, str] = {}
    for pod in pods:
        reason = unhealthy_reason(pod)
        name = pod_labels(pod).get(REPLICA_NAME_LABEL)
        if reason and name in replicas and name not in broken:
            broken[name] = f"unhealthy replica: {reason}"
    return broken


def _plan_requested_deletions(
    plan: GroupPlan,
    group: dict[str, Any],
    pods: list[dict[str, Any]],
    replicas: dict[str, list[dict[str, Any]]],
) -> bool:
    """A pod named in workersToDelete takes its whole replica with it."""
    by_name = {pod_name(p): p for p in pods}
    chosen: list[dict[str, Any]] = []
    for victim in workers_to_delete(group):
        if victim in by_name:
            chosen.extend(replicas.get(pod_labels(by_name[victim]).get(REPLICA_NAME_LABEL, ""), []))
    if not chosen:
        return False
    plan.delete(chosen, "autoscaler scale-down request")
    plan.error = f"deleted {len(chosen)} worker Pods based on ScaleStrategy, requeueing"
    return True


def plan_single_host(
    group: dict[str, Any], pods: list[dict[str, Any]], policy: GroupPolicy
) -> GroupPlan:
    """The per-pod path: every group when the gate is off, else groups with numOfHosts <= 1."""
    plan = GroupPlan()
    unhealthy = [p for p in pods if unhealthy_reason(p)]
    if unhealthy:
        for pod in unhealthy:
            plan.delete([pod], str(unhealthy_reason(pod)))
        plan.error = f"delete {len(unhealthy)} unhealthy worker Pods"
        return plan
    victims = workers_to_delete(group)
    # KubeRay deletes these names in the namespace without checking they belong to the group.
    plan.deletes.extend((victim, "workersToDelete") for victim in dict.fromkeys(victims))
    running = [p for p in pods if pod_name(p) not in set(victims)]
    missing = desired_worker_pods(group) - len(running)
    if missing > 0:
        used = {i for p in running if (i := _index_label(p)) is not None}
        for _ in range(missing):
            index = _lowest_free(used) if policy.indexing else None
            if index is not None:
                used.add(index)
            plan.creates.append(PodSlot(replica_index=index))
    elif missing < 0 and policy.may_remove_surplus:
        plan.delete(running[:-missing], "scaling down")
    return plan


# -- building pods ----------------------------------------------------------------------------


def _field_ref(path: str) -> dict[str, Any]:
    return {"valueFrom": {"fieldRef": {"fieldPath": path}}}


def _ray_env(cluster: dict[str, Any], node_type: str) -> list[dict[str, Any]]:
    name = cluster["metadata"]["name"]
    namespace = cluster["metadata"].get("namespace", "default")
    env: list[dict[str, Any]] = []
    if node_type == "worker":
        env.append({"name": "FQ_RAY_IP", "value": f"{name}-head-svc.{namespace}.svc.cluster.local"})
    env += [
        {"name": "RAY_CLUSTER_NAME", **_field_ref(f"metadata.labels['{CLUSTER_LABEL}']")},
        {"name": "RAY_CLUSTER_NAMESPACE", **_field_ref("metadata.namespace")},
        {"name": "RAY_CLOUD_INSTANCE_ID", **_field_ref("metadata.name")},
        {"name": "RAY_NODE_TYPE_NAME", **_field_ref(f"metadata.labels['{GROUP_LABEL}']")},
        {"name": "RAY_PORT", "value": "6379"},
    ]
    return env


def _labels(
    cluster: dict[str, Any],
    node_type: str,
    group_name: str,
    template_labels: dict[str, str],
    group_labels: dict[str, str],
) -> dict[str, str]:
    name = cluster["metadata"]["name"]
    labels = {
        IS_RAY_NODE_LABEL: "yes",
        CLUSTER_LABEL: name,
        NODE_TYPE_LABEL: node_type,
        GROUP_LABEL: group_name,
        IDENTIFIER_LABEL: f"{name}-{node_type}",
        "app.kubernetes.io/name": "kuberay",
        "app.kubernetes.io/created-by": "kuberay-operator",
    }
    for key, value in {**template_labels, **group_labels}.items():
        if key not in _PROTECTED_LABELS:
            labels[key] = value
    return labels


def _owner_reference(cluster: dict[str, Any]) -> dict[str, Any]:
    meta = cluster["metadata"]
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "name": meta["name"],
        "uid": meta.get("uid", ""),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _pod_from_template(
    cluster: dict[str, Any],
    spec: dict[str, Any],
    node_type: str,
    group_name: str,
    generate_name: str,
) -> dict[str, Any]:
    template = copy.deepcopy(spec.get("template") or {})
    template_meta = template.get("metadata") or {}
    pod_spec = template.get("spec") or {}
    containers = pod_spec.setdefault("containers", [])
    if containers:
        containers[0].setdefault("env", []).extend(_ray_env(cluster, node_type))
        meta = cluster["metadata"]
        head = f"{meta['name']}-head-svc.{meta.get('namespace', 'default')}.svc.cluster.local:6379"
        set_container_command(containers[0], node_type, spec.get("rayStartParams") or {}, head)
    if autoscaler_v2(cluster):
        pod_spec["restartPolicy"] = "Never"
    labels = _labels(
        cluster,
        node_type,
        group_name,
        dict(template_meta.get("labels") or {}),
        dict(spec.get("labels") or {}),
    )
    metadata = {
        "generateName": generate_name,
        "labels": labels,
        "annotations": dict(template_meta.get("annotations") or {}),
        "ownerReferences": [_owner_reference(cluster)],
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def build_head_pod(cluster: dict[str, Any]) -> dict[str, Any]:
    head = (cluster.get("spec") or {}).get("headGroupSpec") or {}
    name = cluster["metadata"]["name"]
    pod = _pod_from_template(cluster, head, "head", HEAD_GROUP, f"{name}-head-")
    if autoscaling_enabled(cluster):
        pod["spec"]["containers"].append(_autoscaler_container(cluster))
    return pod


def _autoscaler_container(cluster: dict[str, Any]) -> dict[str, Any]:
    options = (cluster.get("spec") or {}).get("autoscalerOptions") or {}
    name = cluster["metadata"]["name"]
    namespace = cluster["metadata"].get("namespace", "default")
    container: dict[str, Any] = {
        "name": "autoscaler",
        "image": options.get("image") or DEFAULT_AUTOSCALER_IMAGE,
        "command": options.get("command") or ["/bin/bash", "-lc", "--"],
        "args": options.get("args")
        or [f"ray kuberay-autoscaler --cluster-name {name} --cluster-namespace {namespace}"],
        "env": [
            {"name": "RAY_CLUSTER_NAME", "value": name},
            {"name": "RAY_CLUSTER_NAMESPACE", "value": namespace},
            {"name": "RAY_HEAD_POD_NAME", **_field_ref("metadata.name")},
            {"name": "KUBERAY_CRD_VER", "value": "v1"},
            *(options.get("env") or []),
        ],
        "resources": options.get("resources")
        or {
            "limits": {"cpu": "500m", "memory": "512Mi"},
            "requests": {"cpu": "500m", "memory": "512Mi"},
        },
    }
    return container


def build_worker_pod(
    cluster: dict[str, Any], group: dict[str, Any], slot: PodSlot
) -> dict[str, Any]:
    group_name = str(group.get("groupName"))
    prefix = f"{cluster['metadata']['name']}-{group_name}"[:50]
    pod = _pod_from_template(cluster, group, "worker", group_name, f"{prefix}-worker-")
    labels = pod["metadata"]["labels"]
    if slot.replica_index is not None:
        labels[REPLICA_INDEX_LABEL] = str(slot.replica_index)
    if slot.replica_name is not None:
        labels[REPLICA_NAME_LABEL] = slot.replica_name
        labels[HOST_INDEX_LABEL] = str(slot.host_index)
    return pod


def resolve_env(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    """The environment the kubelet would give ``container`` (fieldRefs resolved)."""
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        path = ((item.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
        env[item["name"]] = _resolve_field(pod, path) if path else str(item.get("value", ""))
    return env


def _resolve_field(pod: dict[str, Any], path: str) -> str:
    meta = pod.get("metadata") or {}
    if path.startswith("metadata.labels['"):
        return str((meta.get("labels") or {}).get(path[len("metadata.labels['") : -2], ""))
    if path.startswith("metadata."):
        return str(meta.get(path.split(".", 1)[1], ""))
    if path == "spec.nodeName":
        return str((pod.get("spec") or {}).get("nodeName", ""))
    return ""
