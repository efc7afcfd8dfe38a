"""The observation: everything one reconcile decides from, parsed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from kuberay_scaler.core.liveness import HostClock
from kuberay_scaler.core.model.cluster import ClusterSpec, Problem
from kuberay_scaler.core.model.hosts import Host
from kuberay_scaler.core.model.ray import RayObservation
from kuberay_scaler.core.model.reasons import (
    Hold,
)
from kuberay_scaler.core.model.signals import CapacityEvent, NodeMaintenance


@dataclass(frozen=True)
class Observation:
    """Everything one reconcile decides from, read once."""

    raycluster: Mapping[str, Any]
    pods: Sequence[Any] = ()
    # Ray's state as last read, parsed; None, or a state of None: unknown or stale (it holds).
    gcs: RayObservation | None = None
    synced: bool = True  # pod cache and RayCluster view trustworthy
    # Groups whose last write is not observed yet → what is awaited (from the loop's expectations).
    awaiting_write: Mapping[str, str | Hold] = field(default_factory=lambda: MappingProxyType({}))
    clock: HostClock | None = None  # the daemon's own liveness memory; None: pod timestamps
    # `pods` already parsed (the daemon's PodCache, once per watch event); `pods` is then unused.
    parsed_pods: tuple[Sequence[Host], Sequence[Problem]] | None = None
    spec: ClusterSpec | None = None  # `raycluster` already parsed (the daemon parses it once)
    # Capacity news read from Events (empty where the Role cannot read them), oldest first.
    capacity_events: tuple[CapacityEvent, ...] = ()
    # GKE maintenance announced on nodes, node name → window (empty without the nodes
    # permission: deploy/node-maintenance).
    node_maintenance: Mapping[str, NodeMaintenance] = field(
        default_factory=lambda: MappingProxyType({})
    )
