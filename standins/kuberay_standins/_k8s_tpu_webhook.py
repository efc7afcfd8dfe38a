"""What the GKE KubeRay TPU webhook (plus GKE's TPU device plugin) adds to a TPU pod at admission.

With KubeRay's multi-host labels present it reuses their replica and host indices; without them
(older operators) it assigns the legacy ``replicaIndex=<group>-<i>`` label and a TPU_WORKER_ID
itself. Deviation: when every existing slice is full the real webhook picks "number of slices
seen" as the next index, which can collide after a gap; we take the lowest unused index.
"""

from __future__ import annotations

import copy
import math
from typing import Any

TPU_RESOURCE = "google.com/tpu"
LEGACY_REPLICA_INDEX = "replicaIndex"
REPLICA_INDEX = "ray.io/worker-group-replica-index"
HOST_INDEX = "ray.io/replica-host-index"
ACCELERATOR_SELECTOR = "cloud.google.com/gke-tpu-accelerator"
TOPOLOGY_SELECTOR = "cloud.google.com/gke-tpu-topology"

# GKE accelerator -> TPU generation; v4 and v5p pod types count TensorCores (2 per chip).
_GENERATIONS = {
    "tpu-v4-podslice": ("v4", 2),
    "tpu-v5-lite-podslice": ("v5litepod", 1),
    "tpu-v5-lite-device": ("v5litepod", 1),
    "tpu-v5p-slice": ("v5p", 2),
    "tpu-v6e-slice": ("v6e", 1),
    "tpu7x": ("v7x", 1),
}


def _tpu_count(container: dict[str, Any]) -> int:
    resources = container.get("resources") or {}
    for section in ("requests", "limits"):
        value = (resources.get(section) or {}).get(TPU_RESOURCE)
        if value not in (None, "", "0", 0):
            return int(str(value))
    return 0


def topology_chips(topology: str) -> int:
    return math.prod(int(dim) for dim in topology.split("x"))


def accelerator_type(node_selector: dict[str, str]) -> str | None:
    """``v6e-16`` for a tpu-v6e-slice with topology 4x4 (the Ray/GKE pod type name)."""
    generation = _GENERATIONS.get(node_selector.get(ACCELERATOR_SELECTOR, ""))
    topology = node_selector.get(TOPOLOGY_SELECTOR)
    if generation is None or not topology:
        return None
    name, cores_per_chip = generation
    return f"{name}-{topology_chips(topology) * cores_per_chip}"


def _env_value(container: dict[str, Any], name: str) -> str | None:
    for item in container.get("env") or []:
        if item.get("name") == name:
            return str(item.get("value", ""))
    return None


def _set_env_default(container: dict[str, Any], name: str, value: str) -> None:
    if _env_value(container, name) in (None, ""):
        container.setdefault("env", []).append({"name": name, "value": value})


def _legacy_indices(group: str, hosts: int, group_pods: list[dict[str, Any]]) -> tuple[int, int]:
    """Lowest slice with room (else a new one), and the lowest free worker id in it."""
    slices: dict[int, set[int]] = {}
    for pod in group_pods:
        meta = pod.get("metadata") or {}
        label = (meta.get("labels") or {}).get(LEGACY_REPLICA_INDEX, "")
        if meta.get("deletionTimestamp") or not label.startswith(f"{group}-"):
            continue
        tpu_containers = [c for c in pod["spec"]["containers"] if _tpu_count(c)]
        assigned = _env_value(tpu_containers[0], "TPU_WORKER_ID") if tpu_containers else None
        index = int(label.rsplit("-", 1)[1])
        slices.setdefault(index, set()).add(int(assigned) if assigned else 0)
    open_slices = [i for i, ids in slices.items() if len(ids) < hosts]
    replica_index = min(open_slices) if open_slices else _lowest_free(set(slices))
    return replica_index, _lowest_free(slices.get(replica_index, set()))


def _lowest_free(used: set[int]) -> int:
    index = 0
    while index in used:
        index += 1
    return index


def mutate_tpu_pod(pod: dict[str, Any], group_pods: list[dict[str, Any]]) -> dict[str, Any]:
    """Return ``pod`` as admitted: TPU env, slice hostname and (legacy) replicaIndex label."""
    containers = pod.get("spec", {}).get("containers") or []
    tpu_containers = [c for c in containers if _tpu_count(c)]
    if not tpu_containers:
        return pod
    admitted = copy.deepcopy(pod)
    labels = admitted.setdefault("metadata", {}).setdefault("labels", {})
    group = labels.get("ray.io/group", "")
    selector = admitted["spec"].get("nodeSelector") or {}
    topology = selector.get(TOPOLOGY_SELECTOR, "")
    chips_per_host = sum(_tpu_count(c) for c in tpu_containers)
    hosts = max(topology_chips(topology) // chips_per_host, 1) if topology else 1
    if REPLICA_INDEX in labels and HOST_INDEX in labels:
        replica_index, worker_id = int(labels[REPLICA_INDEX]), int(labels[HOST_INDEX])
    else:
        replica_index, worker_id = _legacy_indices(group, hosts, group_pods)
        labels[LEGACY_REPLICA_INDEX] = f"{group}-{replica_index}"
    cluster = labels.get("ray.io/cluster", "")
    if hosts > 1:
        admitted["spec"]["hostname"] = f"{group}-{replica_index}-{worker_id}"
        admitted["spec"]["subdomain"] = f"{cluster}-headless"
    for container in [c for c in admitted["spec"]["containers"] if _tpu_count(c)]:
        _inject_env(container, group, cluster, replica_index, worker_id, hosts, selector)
    return admitted


def _inject_env(
    container: dict[str, Any],
    group: str,
    cluster: str,
    replica_index: int,
    worker_id: int,
    hosts: int,
    selector: dict[str, str],
) -> None:
    _set_env_default(container, "TPU_WORKER_ID", str(worker_id))
    _set_env_default(container, "TPU_NAME", f"{group}-{replica_index}")
    if hosts > 1:
        names = ",".join(f"{group}-{replica_index}-{h}.{cluster}-headless" for h in range(hosts))
        _set_env_default(container, "TPU_WORKER_HOSTNAMES", names)
    pod_type = accelerator_type(selector)
    if pod_type:
        _set_env_default(container, "TPU_ACCELERATOR_TYPE", pod_type)
    if selector.get(TOPOLOGY_SELECTOR):
        _set_env_default(container, "TPU_TOPOLOGY", selector[TOPOLOGY_SELECTOR])
