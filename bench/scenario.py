"""A large, seeded cluster for the planner benchmark: one input, two planners.

The input is built once as API-shaped objects: a RayCluster dict, pod dicts and a
`ClusterResourceState` protobuf, exactly what the daemon reads from the API server and the GCS.
Our planner parses them with the daemon's own parsers; Ray's scheduler gets the same protobufs.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field, replace
from typing import Any

from ray.core.generated import autoscaler_pb2, common_pb2

CLUSTER = "bench"
CPU_GROUPS = [(f"cpu-{cpu}-{zone}", cpu, zone) for cpu in (4, 8, 16, 32) for zone in "ab"]
GPU_GROUPS = [("gpu-1", 1, 8), ("gpu-2", 2, 16), ("gpu-4", 4, 32), ("gpu-8", 8, 64)]
# name, GKE accelerator, topology, hosts per slice, Ray generation, pod type
TPU_GROUPS = [
    ("v6e-4", "tpu-v6e-slice", "2x2", 1, "V6E", "v6e-4"),
    ("v6e-8", "tpu-v6e-slice", "2x4", 2, "V6E", "v6e-8"),
    ("v6e-16", "tpu-v6e-slice", "4x4", 4, "V6E", "v6e-16"),
    ("v6e-32", "tpu-v6e-slice", "4x8", 8, "V6E", "v6e-32"),
    ("v4-16", "tpu-v4-podslice", "2x2x2", 2, "V4", "v4-16"),
    ("v4-32", "tpu-v4-podslice", "2x2x4", 4, "V4", "v4-32"),
    ("v5p-16", "tpu-v5p-slice", "2x2x2", 2, "V5P", "v5p-16"),
    ("v5e-16", "tpu-v5-lite-podslice", "4x4", 4, "V5LITEPOD", "v5litepod-16"),
]
SLICES_PER_KIND = {"cpu": 60, "gpu": 30, "tpu": 50}  # 8×60 + 4×30 + 8×50 = 1,000 slices
TASK_BUNDLES = 6_000
GiB = 2**30


@dataclass(frozen=True)
class Scale:
    """How big the generated cluster and its demand are (1.0: the documented benchmark)."""

    slices: float = 1.0
    demand: float = 1.0


@dataclass
class Scenario:
    raycluster: dict[str, Any]
    pods: list[dict[str, Any]] = field(default_factory=list)
    state: Any = field(default_factory=autoscaler_pb2.ClusterResourceState)
    num_slices: int = 0
    num_bundles: int = 0
    # group → (resources, labels) of one of its hosts, to pin demand to groups that can serve it
    offers: dict[str, tuple[dict[str, float], dict[str, str]]] = field(default_factory=dict)

    def reply(self) -> Any:
        reply = autoscaler_pb2.GetClusterResourceStateReply()
        reply.cluster_resource_state.CopyFrom(self.state)
        return reply


def build(seed: int = 7, scale: Scale = Scale(), pinned: bool = False) -> Scenario:
    """The benchmark input; `pinned` gives every bundle a `pool=<group>` selector.

    Unpinned, each planner picks groups by its own policy (ours: accelerators conserved, then
    priority, then the smallest slice; Ray's: a utilization score), so their per-group targets
    differ by design. Pinned, both must use the same group, and what remains is packing and
    counting (hosts against slices).
    """
    rnd = random.Random(seed)
    groups: list[dict[str, Any]] = []
    sc = Scenario(raycluster={})
    _add_head(sc)
    for name, cpu, zone in CPU_GROUPS:
        _add_group(sc, rnd, groups, _cpu_group(name, cpu, zone), _cpu_host(cpu), scale, "cpu")
    for name, gpus, cpu in GPU_GROUPS:
        _add_group(sc, rnd, groups, _gpu_group(name, gpus, cpu), _gpu_host(gpus, cpu), scale, "gpu")
    for spec in TPU_GROUPS:
        host = _tpu_host(spec[4], spec[5])
        _add_group(sc, rnd, groups, _tpu_group(*spec[:4]), host, scale, "tpu")
    sc.raycluster = _raycluster(groups)
    _add_demand(sc, rnd, scale.demand)
    if pinned:
        _pin(sc, rnd)
    return sc


def _add_group(
    sc: Scenario,
    rnd: random.Random,
    groups: list[dict[str, Any]],
    group: dict[str, Any],
    host: HostKind,
    scale: Scale,
    kind: str,
) -> None:
    group["labels"] = {**group.get("labels", {}), "pool": group["groupName"]}
    groups.append(group)
    # KubeRay passes the group's labels to `ray start --labels`: its hosts carry them.
    host = replace(host, labels={**host.labels, **group["labels"]})
    sc.offers[group["groupName"]] = (host.resources, host.labels)
    _add_slices(sc, rnd, group, _count(kind, scale), host)


def _count(kind: str, scale: Scale) -> int:
    return max(1, round(SLICES_PER_KIND[kind] * scale.slices))


def _raycluster(groups: list[dict[str, Any]]) -> dict[str, Any]:
    head = {"name": "ray-head", "resources": {"limits": {"cpu": "8", "memory": "32Gi"}}}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": CLUSTER, "namespace": "default", "uid": "u-1", "resourceVersion": "1"},
        "spec": {
            "enableInTreeAutoscaling": True,
            "autoscalerOptions": {"idleTimeoutSeconds": 60, "upscalingMode": "Default"},
            "headGroupSpec": {
                "rayStartParams": {"num-cpus": "0"},
                "template": {"spec": {"containers": [head]}},
            },
            "workerGroupSpecs": groups,
        },
    }


def _group(name: str, limits: dict[str, str], hosts: int = 1, **extra: Any) -> dict[str, Any]:
    pod_spec: dict[str, Any] = {
        "containers": [{"name": "ray-worker", "resources": {"limits": limits}}]
    }
    if "nodeSelector" in extra:
        pod_spec["nodeSelector"] = extra.pop("nodeSelector")
    return {
        "groupName": name,
        "replicas": 0,
        "minReplicas": 0,
        "maxReplicas": 0,
        "numOfHosts": hosts,
        "rayStartParams": {},
        "template": {"spec": pod_spec},
        **extra,
    }


def _cpu_group(name: str, cpu: int, zone: str) -> dict[str, Any]:
    return _group(name, {"cpu": str(cpu), "memory": f"{4 * cpu}Gi"}, labels={"zone": zone})


def _gpu_group(name: str, gpus: int, cpu: int) -> dict[str, Any]:
    limits = {"cpu": str(cpu), "memory": f"{4 * cpu}Gi", "nvidia.com/gpu": str(gpus)}
    return _group(name, limits)


def _tpu_group(name: str, accelerator: str, topology: str, hosts: int) -> dict[str, Any]:
    limits = {"cpu": "24", "memory": "200Gi", "google.com/tpu": "4"}
    selector = {
        "cloud.google.com/gke-tpu-accelerator": accelerator,
        "cloud.google.com/gke-tpu-topology": topology,
    }
    return _group(name, limits, hosts, nodeSelector=selector)


@dataclass(frozen=True)
class HostKind:
    """Resources and labels a host of a group reports to Ray (as a real host would)."""

    resources: dict[str, float]
    labels: dict[str, str]
    tpu_generation: str | None = None
    tpu_pod_type: str | None = None


def _cpu_host(cpu: int) -> HostKind:
    return HostKind({"CPU": cpu, "memory": 4.0 * cpu * GiB}, {})


def _gpu_host(gpus: int, cpu: int) -> HostKind:
    return HostKind({"CPU": cpu, "GPU": gpus, "memory": 4.0 * cpu * GiB}, {})


def _tpu_host(generation: str, pod_type: str) -> HostKind:
    resources = {
        "CPU": 24,
        "TPU": 4,
        "memory": 200.0 * GiB,
        f"accelerator_type:TPU-{generation}": 1,
    }
    labels = {"ray.io/accelerator-type": f"TPU-{generation}", "ray.io/tpu-pod-type": pod_type}
    return HostKind(resources, labels, generation, pod_type)


def _add_head(sc: Scenario) -> None:
    node = sc.state.node_states.add()
    node.node_id = b"head".ljust(28, b"\0")
    node.instance_id = f"{CLUSTER}-head"
    node.ray_node_type_name = "headgroup"
    node.status = autoscaler_pb2.NodeStatus.IDLE
    node.total_resources.update({"node:__internal_head__": 1, "memory": 32.0 * GiB})
    node.available_resources.update(node.total_resources)
    node.idle_duration_ms = 3_600_000
    sc.pods.append(_pod(f"{CLUSTER}-head", "headgroup", None, None, head=True))


def _add_slices(
    sc: Scenario, rnd: random.Random, group: dict[str, Any], count: int, kind: HostKind
) -> None:
    hosts = group["numOfHosts"]
    name = group["groupName"]
    for i in range(count):
        key = f"{name}-{i:04d}"
        mood = rnd.random()  # 75 % busy, 15 % idle long, 10 % idle briefly
        idle_ms = None if mood < 0.75 else (600_000 if mood < 0.9 else 10_000)
        for h in range(hosts):
            pod_name = f"{key}-{h}"
            replica = key if hosts > 1 else None
            sc.pods.append(_pod(pod_name, name, replica, h if hosts > 1 else None))
            _add_node(sc, pod_name, name, kind, key, h, idle_ms)
    group["replicas"] = count
    group["maxReplicas"] = count + 250
    group["minReplicas"] = rnd.choice([0, 0, 1, 2])
    sc.num_slices += count


def _add_node(
    sc: Scenario,
    pod_name: str,
    group: str,
    kind: HostKind,
    key: str,
    host: int,
    idle_ms: int | None,
) -> None:
    node = sc.state.node_states.add()
    node.node_id = pod_name.encode().ljust(28, b"\0")[:28]
    node.instance_id = pod_name
    node.ray_node_type_name = group
    total = dict(kind.resources)
    labels = {"ray.io/node-group": group, **kind.labels}
    if kind.tpu_pod_type:
        total[key] = 1
        if host == 0:
            total[f"TPU-{kind.tpu_pod_type}-head"] = 1
        labels |= {"ray.io/tpu-slice-name": key, "ray.io/tpu-worker-id": str(host)}
    node.total_resources.update(total)
    node.labels.update(labels)
    if idle_ms is None:
        node.status = autoscaler_pb2.NodeStatus.RUNNING
        busy = {"CPU": 0.0, "GPU": 0.0, "TPU": 0.0}
        node.available_resources.update({k: busy.get(k, v) for k, v in total.items()})
    else:
        node.status = autoscaler_pb2.NodeStatus.IDLE
        node.idle_duration_ms = idle_ms
        node.available_resources.update(total)


def _pod(
    name: str, group: str, replica: str | None, host: int | None, head: bool = False
) -> dict[str, Any]:
    labels = {
        "ray.io/cluster": CLUSTER,
        "ray.io/node-type": "head" if head else "worker",
        "ray.io/group": group,
    }
    if replica is not None:
        labels["ray.io/worker-group-replica-name"] = replica
        labels["ray.io/replica-host-index"] = str(host)
    container = "ray-head" if head else "ray-worker"
    return {
        "metadata": {"name": name, "labels": labels, "creationTimestamp": "2026-11-30T00:00:00Z"},
        "spec": {"containers": [{"name": container}]},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {"name": container, "state": {"running": {"startedAt": "2026-11-30T00:00:10Z"}}}
            ],
        },
    }


# ---- demand: 6,000 task/actor bundles in 300 entries and 1,000 placement groups (4,000) ----

TASK_SHAPES: list[tuple[dict[str, float], dict[str, str]]] = [
    ({"CPU": 1}, {}),
    ({"CPU": 2}, {}),
    ({"CPU": 4}, {}),
    ({"CPU": 8}, {}),
    ({"CPU": 1}, {"zone": "a"}),
    ({"CPU": 4}, {"zone": "b"}),
    ({"CPU": 4, "GPU": 1}, {}),
    ({"GPU": 4}, {}),
    ({"CPU": 1, "TPU": 4}, {}),
    ({"TPU": 4}, {"ray.io/accelerator-type": "TPU-V4"}),
]


def _add_demand(sc: Scenario, rnd: random.Random, scale: float) -> None:
    entries = max(1, round(300 * scale))
    total = round(TASK_BUNDLES * scale)
    counts = _split(rnd, total, entries)
    for i, count in enumerate(counts):
        resources, labels = TASK_SHAPES[i % len(TASK_SHAPES)]
        # Distinct memory asks keep the 300 entries distinct, as real tasks' shapes are.
        shape = {**resources, "memory": float((i + 1) * 2**20)}
        entry = sc.state.pending_resource_requests.add()
        _fill(entry.request, shape, labels)
        entry.count = count
        sc.num_bundles += count
    _add_gangs(sc, rnd, scale)


def _split(rnd: random.Random, total: int, parts: int) -> list[int]:
    cuts = sorted(rnd.sample(range(1, total), parts - 1)) if parts > 1 else []
    edges = [0, *cuts, total]
    return [b - a for a, b in itertools.pairwise(edges)]


Bundles = list[tuple[dict[str, float], dict[str, str]]]
# How many placement groups of each kind (at scale 1): 300 + 800 + 1,800 + 400 + 700 bundles.
GANG_KINDS: list[tuple[int, str, Bundles]] = [
    (200, "STRICT_SPREAD", [({"TPU": 4}, {})] * 4),
    (300, "PACK", [({"CPU": 2}, {})] * 6),
    (100, "STRICT_PACK", [({"CPU": 1}, {})] * 4),
    (100, "SPREAD", [({"GPU": 1}, {})] * 7),
]
RESERVATIONS = 300  # step 1 of a TPU slice reservation, spread over the TPU pod types


def _add_gangs(sc: Scenario, rnd: random.Random, scale: float) -> None:
    tpu_types = [spec[5] for spec in TPU_GROUPS]
    gangs = [_reservation(tpu_types[i % len(tpu_types)]) for i in range(_n(RESERVATIONS, scale))]
    gangs += [
        (kind, bundles) for count, kind, bundles in GANG_KINDS for _ in range(_n(count, scale))
    ]
    rnd.shuffle(gangs)  # the GCS lists them in no particular order
    for number, (strategy, bundles) in enumerate(gangs):
        _gang(sc, f"{number:032x}", strategy, bundles)


def _n(count: int, scale: float) -> int:
    return max(1, round(count * scale))


def _reservation(pod_type: str) -> tuple[str, Bundles]:
    selector = {"ray.io/tpu-worker-id": "0", "ray.io/tpu-pod-type": pod_type}
    return "PACK", [({f"TPU-{pod_type}-head": 1}, selector)]


def _gang(
    sc: Scenario, pg: str, strategy: str, bundles: list[tuple[dict[str, float], dict[str, str]]]
) -> None:
    gang = sc.state.pending_gang_resource_requests.add()
    gang.details = f"{pg}:{strategy}|PENDING"
    chosen = gang.bundle_selectors.add()
    for resources, labels in bundles:
        for target in (gang.requests.add(), chosen.resource_requests.add()):
            _fill(target, resources, labels)
            if strategy == "STRICT_SPREAD":
                target.placement_constraints.add().anti_affinity.label_name = f"_PG_{pg}"
            elif strategy == "STRICT_PACK":
                target.placement_constraints.add().affinity.label_name = f"_PG_{pg}"
        sc.num_bundles += 1


def _fill(request: Any, resources: dict[str, float], labels: dict[str, str]) -> None:
    request.resources_bundle.update(resources)
    if labels:
        selector = request.label_selectors.add()
        for key, value in labels.items():
            constraint = selector.label_constraints.add()
            constraint.label_key = key
            constraint.operator = common_pb2.LabelSelectorOperator.LABEL_OPERATOR_IN
            constraint.label_values.append(value)


# ---- pinning: every bundle names one group that can serve it (label `pool`) ----


def _pin(sc: Scenario, rnd: random.Random) -> None:
    for entry in sc.state.pending_resource_requests:
        pool = _pool_for(sc, rnd, [entry.request])
        if pool:
            _add_pool(entry.request, pool)
    for gang in sc.state.pending_gang_resource_requests:
        chosen = list(gang.bundle_selectors[0].resource_requests)
        pool = _pool_for(sc, rnd, chosen)
        if pool:
            for request in [*chosen, *gang.requests]:
                _add_pool(request, pool)


def _pool_for(sc: Scenario, rnd: random.Random, requests: list[Any]) -> str | None:
    """A group whose host fits every request (one group for a whole gang); None: leave as is."""
    if any(_selects(r, "ray.io/tpu-pod-type") for r in requests):
        return None  # slice reservations already name their pod type
    able = [name for name in sorted(sc.offers) if all(_fits(sc.offers[name], r) for r in requests)]
    return rnd.choice(able) if able else None


def _selects(request: Any, key: str) -> bool:
    return any(c.label_key == key for s in request.label_selectors for c in s.label_constraints)


def _fits(offer: tuple[dict[str, float], dict[str, str]], request: Any) -> bool:
    resources, labels = offer
    if any(resources.get(k, 0.0) < v for k, v in request.resources_bundle.items() if k != "memory"):
        return False
    return all(
        labels.get(c.label_key) in c.label_values
        for s in request.label_selectors
        for c in s.label_constraints
    )


def _add_pool(request: Any, pool: str) -> None:
    selector = request.label_selectors[0] if request.label_selectors else None
    if selector is None:
        selector = request.label_selectors.add()
    constraint = selector.label_constraints.add()
    constraint.label_key = "pool"
    constraint.operator = common_pb2.LabelSelectorOperator.LABEL_OPERATOR_IN
    constraint.label_values.append(pool)
