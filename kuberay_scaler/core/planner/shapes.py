"""What one host of a worker group offers to Ray, derived the way Ray derives it on KubeRay."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from kuberay_scaler.core.model.cluster import WorkerGroup
from kuberay_scaler.core.model.labels import (
    ACCELERATOR_TYPE_LABEL,
    GKE_TPU_ACCELERATOR,
    GKE_TPU_TOPOLOGY,
    NODE_GROUP_LABEL,
    TPU_POD_TYPE_LABEL,
    TPU_TOPOLOGY_LABEL,
    TPU_WORKER_LABEL,
)
from kuberay_scaler.core.parse.quantity import parse_quantity, resources_json

TPU_GENERATIONS = {
    "tpu-v4-podslice": "v4",
    "tpu-v5-lite-device": "v5litepod",
    "tpu-v5-lite-podslice": "v5litepod",
    "tpu-v5p-slice": "v5p",
    "tpu-v6e-slice": "v6e",
    "tpu7x": "v7x",
}
SINGLE_CORE_GENERATIONS = ("v5litepod", "v6e")
STANDARD = ("CPU", "GPU", "TPU", "memory")
# Resources that make a host an accelerator host (plain demand is kept off those; contract §6).
ACCELERATORS = ("GPU", "TPU", "neuron_cores", "HPU")


class ShapeError(ValueError):
    """The group's resources cannot be worked out; the message says which field."""


@dataclass(frozen=True)
class HostShape:
    """Resources and labels of one host; host 0 of a TPU slice carries a little more."""

    resources: Mapping[str, float]
    labels: Mapping[str, str]

    @cached_property
    def accelerators(self) -> frozenset[str]:
        return frozenset(k for k in ACCELERATORS if self.resources.get(k, 0) > 0)


@dataclass(frozen=True)
class SliceShape:
    """The hosts one new replica of a group brings, in host-index order."""

    group: str
    hosts: tuple[HostShape, ...]
    tpu_pod_type: str | None

    @cached_property
    def accelerators(self) -> frozenset[str]:
        return frozenset().union(*(h.accelerators for h in self.hosts))


def tpu_pod_type(node_selector: Mapping[str, str]) -> str | None:
    """`v6e-16` from (tpu-v6e-slice, 4x4): generation and cores = chips × cores per chip."""
    generation = TPU_GENERATIONS.get(node_selector.get(GKE_TPU_ACCELERATOR, ""))
    topology = node_selector.get(GKE_TPU_TOPOLOGY, "")
    if not generation or not topology:
        return None
    try:
        chips = math.prod(int(d) for d in topology.lower().split("x"))
    except ValueError:
        return None
    cores = chips * (1 if generation in SINGLE_CORE_GENERATIONS else 2)
    return f"{generation}-{cores}"


def slice_shape(group: WorkerGroup) -> SliceShape:
    """Shape of a new replica of `group`; raises ShapeError when resources are unknowable."""
    base = host_resources(group)
    labels = {NODE_GROUP_LABEL: group.name, **group.labels}
    pod_type = tpu_pod_type(group.node_selector) if base.get("TPU", 0) > 0 else None
    hosts = []
    for index in range(group.num_of_hosts):
        resources, host_labels = dict(base), dict(labels)
        if pod_type:
            host_labels.update(_tpu_labels(pod_type, group.node_selector, index))
            resources[f"accelerator_type:TPU-{pod_type.split('-')[0].upper()}"] = 1.0
            if index == 0:
                resources[f"TPU-{pod_type}-head"] = 1.0
        hosts.append(HostShape(resources=resources, labels=host_labels))
    return SliceShape(group=group.name, hosts=tuple(hosts), tpu_pod_type=pod_type)


def _tpu_labels(pod_type: str, selector: Mapping[str, str], index: int) -> dict[str, str]:
    # The slice name is only known once the slice exists, so new slices never match a pin on it.
    return {
        TPU_WORKER_LABEL: str(index),
        TPU_POD_TYPE_LABEL: pod_type,
        TPU_TOPOLOGY_LABEL: selector.get(GKE_TPU_TOPOLOGY, ""),
        ACCELERATOR_TYPE_LABEL: f"TPU-{pod_type.split('-')[0].upper()}",
    }


def host_resources(group: WorkerGroup) -> dict[str, float]:
    """CPU, GPU, TPU, memory and custom resources of one host of `group`."""
    params, explicit = group.ray_start_params, _quantities(group.resources, "resources")
    custom = explicit or _custom_from_params(params)
    out: dict[str, float] = {k: v for k, v in custom.items() if k not in STANDARD}
    cpu = _first(explicit.get("CPU"), _param(params, "num-cpus"), group.container.cpu)
    if cpu is None:
        raise ShapeError("no CPU count: set rayStartParams num-cpus or the container's cpu")
    out["CPU"] = float(math.ceil(cpu))
    gpu = _first(explicit.get("GPU"), _param(params, "num-gpus"), group.container.gpu)
    if gpu:
        out["GPU"] = float(math.ceil(gpu))
    tpu = _first(explicit.get("TPU"), custom.get("TPU"), group.container.tpu)
    if tpu:
        out["TPU"] = float(math.ceil(tpu))
    memory = _first(explicit.get("memory"), _param(params, "memory"), group.container.memory_bytes)
    if memory:
        out["memory"] = float(math.ceil(memory))
    for resource, count in group.container.accelerators.items():
        # KubeRay adds these to `ray start --resources` unless the user already named them.
        out.setdefault(resource, float(math.ceil(count)))
    return out


def _first(*values: float | None) -> float | None:
    return next((v for v in values if v is not None), None)


def _param(params: Mapping[str, str], key: str) -> float | None:
    if key not in params:
        return None
    try:
        return parse_quantity(params[key])
    except ValueError:
        raise ShapeError(f"rayStartParams {key}={params[key]!r} is not a number") from None


def _quantities(values: Mapping[str, str], where: str) -> dict[str, float]:
    out = {}
    for key, raw in values.items():
        try:
            out[key] = parse_quantity(raw)
        except ValueError:
            raise ShapeError(f"{where} {key}={raw!r} is not a quantity") from None
    return out


def _custom_from_params(params: Mapping[str, str]) -> dict[str, float]:
    """rayStartParams `resources` is JSON, often wrapped in an extra pair of quotes."""
    raw = params.get("resources")
    if not raw:
        return {}
    try:
        return resources_json(raw)
    except ValueError as err:
        raise ShapeError(f"rayStartParams resources: {err}") from None
