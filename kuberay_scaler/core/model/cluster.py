"""The RayCluster as the planner sees it: worker groups with KubeRay's defaults applied."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from types import MappingProxyType
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")

INT32_MAX = 2_147_483_647
# Bounds on numbers read from a RayCluster. The CRD allows far more; past these a group is skipped
# with a problem instead of costing minutes and gigabytes per plan (docs/reliability.md).
MAX_HOSTS_PER_SLICE = 4096  # numOfHosts; the largest TPU slices have about 2,300 hosts
MAX_GROUP_HOSTS = 10_000  # replicas (and minReplicas) × numOfHosts; 5× Ray's tested 2,000 nodes
MAX_RESOURCE = (2**63 - 1) / 10_000  # Ray keeps resource amounts as int64 in 1/10000 units
DEFAULT_IDLE_TIMEOUT_S = 60.0
EMPTY: Mapping[str, str] = MappingProxyType({})


def frozen_map(items: Mapping[K, V] | None = None) -> Mapping[K, V]:
    """A read-only copy, so frozen dataclasses really are immutable."""
    return MappingProxyType(dict(items or {}))


class UpscalingMode(StrEnum):
    DEFAULT = "Default"
    AGGRESSIVE = "Aggressive"
    CONSERVATIVE = "Conservative"


@dataclass(frozen=True)
class Problem:
    """Something wrong with the input, attached to a group where one is to blame."""

    message: str
    group: str | None = None

    def __str__(self) -> str:
        return f"group {self.group!r}: {self.message}" if self.group else self.message


@dataclass(frozen=True)
class ContainerShape:
    """Resources of a group's Ray container (limits win over requests, as Ray reads them)."""

    name: str
    cpu: float | None = None
    memory_bytes: float | None = None
    gpu: float | None = None  # the first limit (then request) whose name ends in "gpu", as Ray
    tpu: float | None = None  # google.com/tpu
    # Other accelerators by the Ray resource a node gets for them (e.g. neuron_cores, HPU).
    accelerators: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class Budget:
    """How many slices of a group may leave at once by voluntary disruption: `count` slices,
    or `percent` of the group's slices (rounded up; "0" and "0%" forbid it)."""

    count: int | None = None
    percent: float | None = None

    def allowed(self, slices: int) -> int:
        if self.percent is None:
            return self.count if self.count is not None else slices
        return math.ceil(self.percent * slices / 100 - 1e-9)

    def __str__(self) -> str:
        return f"{self.percent:g}%" if self.percent is not None else str(self.count)


def parse_budget(text: str) -> Budget:
    """ "N" (slices) or "N%" (of the group's slices); raises ValueError naming the form."""
    raw = text.strip()
    number = raw[:-1].strip() if raw.endswith("%") else raw
    if not number.isascii() or not number.isdigit() or len(number) > 5:
        raise ValueError(f"{text!r} is not a count of slices or a percentage like 10%")
    if raw.endswith("%"):
        if int(number) > 100:
            raise ValueError(f"{text!r}: a percentage is at most 100%")
        return Budget(percent=float(number))
    return Budget(count=int(number))


@dataclass(frozen=True)
class WorkerGroup:
    """One entry of spec.workerGroupSpecs, with KubeRay's defaults applied."""

    name: str
    index: int  # position in spec.workerGroupSpecs: JSON-patch paths point here
    replicas: int  # as stored (default 0); KubeRay runs clamp(replicas) × num_of_hosts pods
    replicas_present: bool  # False when the key is absent: patches must `add`, not `replace`
    min_replicas: int
    max_replicas: int
    num_of_hosts: int
    idle_timeout_s: float | None
    priority: int
    suspend: bool
    ray_start_params: Mapping[str, str]
    resources: Mapping[str, str]
    labels: Mapping[str, str]
    container: ContainerShape
    node_selector: Mapping[str, str]
    workers_to_delete: tuple[str, ...]
    # The group's own provisioning deadline (template annotation ANNOTATION_MAX_PROVISION);
    # None: the cluster default.
    max_provision_s: float | None = None
    # Disruption rules the group sets on its template's annotations (None: the daemon's default).
    disruption_budget: Budget | None = None
    scale_down_delay_s: float | None = None
    # How the entry stores the keys the patch guards (a `test` on a stored value, an `add` where
    # the key is absent): the guards are built from these, never from the raw object again.
    num_of_hosts_present: bool = False
    scale_strategy_present: bool = False  # scaleStrategy is a map
    workers_to_delete_present: bool = False  # the key is in it (null counts)
    workers_to_delete_null: bool = False  # ... and is null

    @property
    def is_multi_host(self) -> bool:
        return self.num_of_hosts > 1

    @property
    def effective_replicas(self) -> int:
        """What KubeRay will run: replicas clamped into [min, max]; 0 when suspended."""
        if self.suspend:
            return 0
        return max(self.min_replicas, min(self.replicas, self.max_replicas))


@dataclass(frozen=True)
class SpecWriter:
    """A field manager that owns part of the spec (a metadata.managedFields entry whose FieldsV1
    has `f:spec`). workerGroupSpecs is an atomic list in KubeRay's CRD, so FieldsV1 cannot name
    the writer of one group's replicas: the spec's writers are the finest naming there is."""

    manager: str
    time: str  # as stored (RFC 3339, which sorts as text); "" when absent


@dataclass(frozen=True)
class AutoscalerOptions:
    idle_timeout_s: float | None = None
    upscaling_mode: UpscalingMode = UpscalingMode.DEFAULT


@dataclass(frozen=True)
class ClusterSpec:
    """A parsed RayCluster: the groups that parsed, and a named problem for each that did not."""

    name: str
    namespace: str
    uid: str
    resource_version: str
    in_tree_autoscaling: bool
    suspended: bool
    autoscaler: AutoscalerOptions
    groups: tuple[WorkerGroup, ...]
    problems: tuple[Problem, ...] = ()
    head_container_name: str = "ray-head"
    skipped_groups: tuple[str, ...] = field(default=())
    # Our draining record (patch/intent.py): group → slice keys recorded; malformed: none.
    draining: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    draining_record: str | None = None  # the annotation as stored (its removal is guarded by it)
    has_annotations: bool = False  # metadata.annotations is a map (else the record `add`s it)
    # Who last wrote the spec, newest first: names another writer that overrode our replicas
    # (loop/handsoff.py). Not a planning input: the reconcile's inputs fingerprint leaves it out.
    spec_writers: tuple[SpecWriter, ...] = ()

    def group(self, name: str) -> WorkerGroup | None:
        return self._by_name.get(name)

    @cached_property
    def _by_name(self) -> Mapping[str, WorkerGroup]:
        # Looked up once per pod and per host: an index, not a scan of the group list. The first
        # group of a name wins, as the scan did (duplicates are a RayCluster problem anyway).
        index: dict[str, WorkerGroup] = {}
        for g in self.groups:
            index.setdefault(g.name, g)
        return index
