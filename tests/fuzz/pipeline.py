"""The daemon's decision path on raw input, for the fuzz tests: RayCluster dict + pod list +
serialized GetClusterResourceStateReply → `decide()` → the intent record → drains answered as Ray
answers them → `after_drains` (via `refused_outright`) → the object as the guarded patch leaves it.

Ray's answer to an IDLE_TERMINATION drain (docs/ray-gcs.md, tested against a real head in
tests/ray): refused for a node that is busy (RUNNING), accepted otherwise (idle, draining, dead
or unknown ids); an accepted node then drains. Preemption drains delete nothing in this patch.
"""

from __future__ import annotations

import copy
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Any

import jsonpatch
from ray.core.generated import autoscaler_pb2

from kuberay_scaler.adapters.ray_gcs.poller import observation_of
from kuberay_scaler.core.decision import (
    Decision,
    DrainResults,
    Observation,
    Patch,
    after_drains,
    decide,
)
from kuberay_scaler.core.model.plan import Memory, Plan
from kuberay_scaler.core.parse.raycluster import parse_raycluster
from kuberay_scaler.core.patch.ops import ops_json
from kuberay_scaler.core.planner.policy import Policy

# The daemon's monotonic reading, far from the wall clock's number as a real one is: the reply
# is stamped on it (app.py) and the planner's timers run on it.
MONO_S = 10_000.0

BUSY = 1  # autoscaler.proto NodeStatus RUNNING


@dataclass(frozen=True)
class Outcome:
    decision: Decision
    plan: Plan  # as carried out (refused drains put back)
    after: dict[str, Any]  # the RayCluster once the record and the patch are applied
    refused: frozenset[tuple[str, str]]
    drained: frozenset[str]  # node ids (hex) whose drain Ray accepted


def node_statuses(reply: bytes) -> dict[str, int]:
    parsed = autoscaler_pb2.GetClusterResourceStateReply.FromString(reply)
    return {
        bytes(n.node_id).hex(): int(n.status) for n in parsed.cluster_resource_state.node_states
    }


def refused_outright(
    decision: Decision, refused: Collection[tuple[str, str]], base: Any
) -> tuple[Plan, Patch | None]:
    """The plan and patch once some idle drains were refused by every host (the others all
    accepted): `after_drains` given those answers, over `base` (the object the record left)."""
    accepted = frozenset(
        n
        for d in decision.drains
        if not d.preempt and (d.group, d.slice_key) not in refused
        for n in d.node_ids
    )
    results = DrainResults(
        accepted=accepted,
        refused=MappingProxyType({ref: "refused" for ref in refused}),
        base=parse_raycluster(base),  # as the daemon parses the object its record write left
    )
    writes = after_drains(decision, results)
    return writes.plan, writes.patch


def run_daemon_path(rc: dict[str, Any], pods: list[Any], reply: bytes, now: datetime) -> Outcome:
    parsed = autoscaler_pb2.GetClusterResourceStateReply.FromString(reply)
    observed = Observation.parse(
        raycluster=rc,
        pods=pods,
        gcs=observation_of(
            parsed, observed_at=MONO_S, cluster_id="c0", epoch=0, read_at_ms=int(MONO_S * 1000)
        ),
    )
    decision = decide(observed, Memory(), Policy(), now, mono_s=MONO_S)
    base = copy.deepcopy(rc)
    if decision.record is not None:
        base = jsonpatch.apply_patch(base, ops_json(decision.record.ops))
    status = node_statuses(reply)
    refused, drained = set(), set()
    for drain in decision.drains:
        if drain.preempt:
            continue
        if any(status.get(n) == BUSY for n in drain.node_ids):
            refused.add((drain.group, drain.slice_key))
        else:
            drained.update(drain.node_ids)
    result, patch = refused_outright(decision, refused, base)
    after = jsonpatch.apply_patch(base, ops_json(patch.ops)) if patch is not None else base
    return Outcome(decision, result, after, frozenset(refused), frozenset(drained))
