"""The observation: everything one reconcile decides from, parsed.

Only parsed values: the daemon builds them once per change (loop/observe.py: the RayCluster
parsed once per object, pods by the PodCache), the `plan` command from files, through the same
parsers (`Observation.parse`). Nothing past core/parse/ reads the raw RayCluster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from kuberay_scaler.core.liveness import HostClock
from kuberay_scaler.core.model.cluster import ClusterSpec, Problem
from kuberay_scaler.core.model.hosts import Host
from kuberay_scaler.core.model.ray import RayObservation
from kuberay_scaler.core.model.reasons import Hold
from kuberay_scaler.core.model.signals import CapacityEvent, NodeMaintenance
from kuberay_scaler.core.parse.pods import parse_pods
from kuberay_scaler.core.parse.raycluster import parse_raycluster


@dataclass(frozen=True)
class Observation:
    """Everything one reconcile decides from, read once and parsed."""

    spec: ClusterSpec  # the RayCluster, parsed (with our draining record and the patch guards)
    hosts: Sequence[Host] = ()  # the pods, parsed
    pod_problems: Sequence[Problem] = ()
    # Ray's state as last read, parsed; None, or a state of None: unknown or stale (it holds).
    gcs: RayObservation | None = None
    synced: bool = True  # pod cache and RayCluster view trustworthy
    # Groups whose last write is not observed yet → what is awaited (from the loop's expectations).
    awaiting_write: Mapping[str, str | Hold] = field(default_factory=lambda: MappingProxyType({}))
    clock: HostClock | None = None  # the daemon's own liveness memory; None: pod timestamps
    # Capacity news read from Events (empty where the Role cannot read them), oldest first.
    capacity_events: tuple[CapacityEvent, ...] = ()
    # GKE maintenance announced on nodes, node name → window (empty without the nodes
    # permission: deploy/node-maintenance).
    node_maintenance: Mapping[str, NodeMaintenance] = field(
        default_factory=lambda: MappingProxyType({})
    )

    @classmethod
    def parse(
        cls,
        raycluster: object,
        pods: Sequence[Any] = (),
        gcs: RayObservation | None = None,
        **rest: Any,
    ) -> Observation:
        """An observation of raw objects (a RayCluster and its pods as the API returns them),
        parsed as the daemon parses them; `rest`: the other fields."""
        spec = parse_raycluster(raycluster)
        hosts, problems = parse_pods(list(pods), spec)
        return cls(spec, tuple(hosts), tuple(problems), gcs, **rest)
