"""decide(): one observation → the plan and every write it takes, in order. Pure.

The daemon executes the writes (control/execute.py), the `plan` command prints them and
/debug/plan shows them; all three build them here, so they cannot disagree. The writes are:

1. `RecordIntent`: annotate the RayCluster with the slices about to be drained, so a restart in
   the middle finishes the scale-down instead of forgetting it;
2. one `Drain` per idle slice (every host, pinned to the GCS the plan was made from), one per
   broken slice being replaced whose hosts' Ray nodes are still alive (and idle: a busy broken
   slice is kept by the planner), and one per busy slice above maxReplicas with reason
   preemption (not deleted by this patch);
3. `Patch`: the guarded JSON patch (replicas, workersToDelete, the record cleared).

The patch is computed as if every drain is accepted; `patch_after_drains` gives the one to send
when some are refused (their slices are kept and the targets put back).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from types import MappingProxyType
from typing import Any

from kuberay_scaler.defaults import DRAIN_DEADLINE_S
from kuberay_scaler.liveness import HostClock
from kuberay_scaler.model.cluster import ClusterSpec, Problem
from kuberay_scaler.model.hosts import Host
from kuberay_scaler.model.plan import DeleteKind, Memory, Plan, SliceDeletion, Snapshot
from kuberay_scaler.model.ray import RayObservation, RayState
from kuberay_scaler.model.reasons import Hold, PlanProblem, ProblemKind
from kuberay_scaler.parse.pods import parse_pods
from kuberay_scaler.parse.raycluster import parse_raycluster
from kuberay_scaler.patch.intent import clear_ops, read_draining, record_ops, with_record
from kuberay_scaler.patch.ops import Op, PatchError, build_patch, drop_deletions
from kuberay_scaler.planner.core import Policy, plan


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


@dataclass(frozen=True)
class RecordIntent:
    """Annotate the RayCluster with the slices about to be drained (group → slice keys)."""

    draining: Mapping[str, tuple[str, ...]]
    ops: tuple[Op, ...]


@dataclass(frozen=True)
class Drain:
    """Drain every Ray node of one slice; the slice is deleted only if all accept."""

    group: str
    slice_key: str
    node_ids: tuple[str, ...]  # hex
    cluster_id: str | None  # the GCS the plan was made from
    deadline_ms: int  # epoch milliseconds
    message: str
    # Reason preemption: a busy slice above maxReplicas, deleted by a later plan once drained
    # or past `deadline_ms` (never by this decision's patch). Otherwise idle termination.
    preempt: bool = False
    # Hosts of the slice already gone from Ray (drained before a restart): the slice is deleted
    # whole whatever its remaining hosts answer (control/execute.py, partial drains).
    hosts_gone: int = 0
    # A broken slice being replaced: its live hosts are drained like idle ones, and the fresh
    # GCS read before draining is made even when some hosts are gone (control/execute.py).
    broken: bool = False


@dataclass(frozen=True)
class Patch:
    """The guarded JSON patch that applies the plan (opens with the uid guard)."""

    ops: tuple[Op, ...]


Write = RecordIntent | Drain | Patch


@dataclass(frozen=True)
class Decision:
    plan: Plan
    writes: tuple[Write, ...]
    raycluster: Mapping[str, Any]  # the object planned from (the patch's base)
    gcs: RayObservation | None = None
    error: str | None = None  # the plan no longer fits the object (replan)

    @property
    def drains(self) -> tuple[Drain, ...]:
        return tuple(w for w in self.writes if isinstance(w, Drain))

    @property
    def record(self) -> RecordIntent | None:
        return next((w for w in self.writes if isinstance(w, RecordIntent)), None)

    @property
    def patch(self) -> Patch | None:
        return next((w for w in self.writes if isinstance(w, Patch)), None)

    def document(self) -> dict[str, Any]:
        """The plan and its writes as `plan` prints them and /debug/plan shows them."""
        patch = self.patch
        return {
            **self.plan.summary(),
            "writes": [write_document(w) for w in self.writes],
            "patch": list(patch.ops) if patch else [],
        }


def decide(
    observed: Observation,
    memory: Memory,
    policy: Policy,
    now: datetime,
    drain_deadline_s: float = DRAIN_DEADLINE_S,
) -> Decision:
    """Plan from `observed` at `now` and list the writes that carry the plan out."""
    raw = observed.raycluster
    spec = observed.spec if observed.spec is not None else parse_raycluster(raw)
    if observed.parsed_pods is not None:
        hosts, pod_problems = observed.parsed_pods
    else:
        hosts, pod_problems = parse_pods(list(observed.pods), spec)
    snapshot = Snapshot(spec, tuple(hosts), observed.synced, tuple(pod_problems), observed.clock)
    ray, ray_problem = _ray_state(observed.gcs)
    memory = replace(
        memory,
        awaiting_write=MappingProxyType(dict(observed.awaiting_write)),
        draining=MappingProxyType(read_draining(raw)),
    )
    result = plan(snapshot, ray, memory, policy, now)
    if ray_problem is not None:
        result = replace(result, problems=(*result.problems, ray_problem))
    try:
        writes = writes_for(raw, result, observed.gcs, now, drain_deadline_s)
    except PatchError as err:
        return Decision(result, (), raw, observed.gcs, error=str(err))
    return Decision(result, writes, raw, observed.gcs)


def writes_for(
    raw: Mapping[str, Any],
    result: Plan,
    gcs: RayObservation | None,
    now: datetime,
    drain_deadline_s: float,
) -> tuple[Write, ...]:
    """Record → drains → patch for `result` planned from `raw`; raises PatchError."""
    if not result.changes:
        return ()
    draining = _slices_to_drain(result)
    writes: list[Write] = []
    base = raw
    if draining:
        writes.append(
            RecordIntent(
                draining=MappingProxyType({g: tuple(keys) for g, keys in draining.items()}),
                ops=tuple(record_ops(raw, draining)),
            )
        )
        base = with_record(raw, draining)
        deadline_ms = int((now.timestamp() + drain_deadline_s) * 1000)
        writes += _drains(result, gcs.cluster_id if gcs else None, deadline_ms)
    writes += _preemptions(result, gcs.cluster_id if gcs else None)
    ops = _patch_ops(base, result)
    if ops:
        writes.append(Patch(tuple(ops)))
    return tuple(writes)


def patch_after_drains(
    decision: Decision, refused: Collection[tuple[str, str]], base: Mapping[str, Any]
) -> tuple[Plan, Patch | None]:
    """The plan and patch once some drains were refused: those slices stay, targets go back.

    `base` is the RayCluster as the record write left it (the patch's `test`s must match it).
    Raises PatchError when the plan no longer fits `base`.
    """
    result = drop_deletions(decision.plan, refused)
    ops = _patch_ops(base, result)
    return result, (Patch(tuple(ops)) if ops else None)


def write_document(write: Write) -> dict[str, Any]:
    if isinstance(write, RecordIntent):
        return {
            "write": "record_intent",
            "draining": {g: list(k) for g, k in write.draining.items()},
            "ops": list(write.ops),
        }
    if isinstance(write, Drain):
        return {
            "write": "drain",
            "group": write.group,
            "slice": write.slice_key,
            "node_ids": list(write.node_ids),
            "cluster_id": write.cluster_id,
            "reason": "preemption" if write.preempt else "idle_termination",
            "deadline_ms": write.deadline_ms,
            "message": write.message,
        }
    return {"write": "patch", "ops": list(write.ops)}


def _ray_state(gcs: RayObservation | None) -> tuple[RayState | None, PlanProblem | None]:
    if gcs is None or gcs.state is not None or not gcs.unusable:
        return (gcs.state if gcs else None), None
    return None, PlanProblem(ProblemKind.RAY_STATE, gcs.error or "unusable GCS reply")


# Deletions whose joined hosts are drained (idle termination) before the patch, all or nothing.
DRAINED_FIRST = (DeleteKind.IDLE, DeleteKind.SURPLUS)


def _drained_first(x: SliceDeletion) -> bool:
    # A replaced broken slice is drained too when some host's Ray node is alive (the planner
    # keeps it if any is busy, so those are idle); hosts with no Ray node need no drain.
    return x.kind in DRAINED_FIRST or (x.kind is DeleteKind.REPLACE and bool(x.node_ids))


def _slices_to_drain(result: Plan) -> dict[str, list[str]]:
    return {
        d.group: [x.slice_key for x in d.deletions if _drained_first(x)]
        for d in result.groups
        if any(_drained_first(x) for x in d.deletions)
    }


def _preemptions(result: Plan, cluster_id: str | None) -> list[Drain]:
    """Busy slices above maxReplicas: drained with the deadline the planner keeps for them."""
    return [
        Drain(
            group=d.group,
            slice_key=x.slice_key,
            node_ids=x.node_ids,
            cluster_id=cluster_id,
            deadline_ms=int(result.memory.preempting[x.slice_key].timestamp() * 1000),
            message=f"kuberay-scaler: {x.reason}",
            preempt=True,
        )
        for d in result.groups
        for x in d.preempt
        if x.node_ids
    ]


def _drains(result: Plan, cluster_id: str | None, deadline_ms: int) -> list[Drain]:
    return [
        Drain(
            group=d.group,
            slice_key=x.slice_key,
            node_ids=x.node_ids,
            cluster_id=cluster_id,
            deadline_ms=deadline_ms,
            message=_drain_message(x),
            hosts_gone=_hosts_gone(result, d.group, x.slice_key, len(x.node_ids)),
            broken=x.kind is DeleteKind.REPLACE,
        )
        for d in result.groups
        for x in d.deletions
        if _drained_first(x) and x.node_ids
    ]


def _drain_message(x: SliceDeletion) -> str:
    if x.kind is DeleteKind.REPLACE:
        return f"kuberay-scaler: slice {x.slice_key} broken, replaced: {x.reason}"
    return f"kuberay-scaler: slice {x.slice_key} idle"


def _hosts_gone(result: Plan, group: str, key: str, joined: int) -> int:
    gs = result.slice_map.groups.get(group) if result.slice_map else None
    sl = next((s for s in gs.slices if s.key == key), None) if gs else None
    return max(0, sl.expected_hosts - joined) if sl else 0


def _patch_ops(base: Mapping[str, Any], result: Plan) -> list[Op]:
    # The record goes with the patch that deletes its slices (or with their drains refused).
    return build_patch(base, result) + clear_ops(base)
