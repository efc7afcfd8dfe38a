"""One planning frame's givens besides the cluster and the moment (`model/plan.py` `At`, both
clocks): the capacity news (Events, maintenance). Frozen values, read by stages."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from kuberay_scaler.core.model.cluster import Problem
from kuberay_scaler.core.model.reasons import PlanProblem, ProblemKind
from kuberay_scaler.core.model.signals import CapacityEvent, NodeMaintenance


@dataclass(frozen=True)
class News:
    """This frame's capacity news: the Events and GKE maintenance."""

    events: tuple[CapacityEvent, ...] = ()
    # GKE maintenance on nodes, node name → announcement (empty without the nodes permission).
    maintenance: Mapping[str, NodeMaintenance] = field(default_factory=lambda: MappingProxyType({}))


NO_NEWS = News()


def problems_of(kind: ProblemKind, found: tuple[Problem, ...]) -> tuple[PlanProblem, ...]:
    """Problems of the input, tagged with where they were found."""
    return tuple(PlanProblem(kind, p.message, p.group) for p in found)
