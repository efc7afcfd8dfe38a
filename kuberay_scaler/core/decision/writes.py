"""The writes that carry a plan out, in order: record intent → drains → guarded patch.

`writes_for` runs the deletion gate with every drain assumed accepted, so a slice it would
refuse is never drained, and `plan` / /debug/plan show the patch the daemon sends when Ray
accepts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType

from kuberay_scaler.core.model.cluster import ClusterSpec
from kuberay_scaler.core.model.plan import DeleteKind, Plan, SliceDeletion, mono_of, shown
from kuberay_scaler.core.model.ray import RayObservation
from kuberay_scaler.core.patch.intent import clear_ops, record_ops, with_record
from kuberay_scaler.core.patch.ops import Op, build_patch
from kuberay_scaler.core.planner.gate import Blocked, Evidence, gate


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
    # A broken slice being replaced: its live hosts are drained like idle ones.
    broken: bool = False
    pods: tuple[str, ...] = ()  # the slice's pods (the fresh read checks each one)


@dataclass(frozen=True)
class Patch:
    """The guarded JSON patch that applies the plan (opens with the uid guard)."""

    ops: tuple[Op, ...]


Write = RecordIntent | Drain | Patch


def writes_for(
    spec: ClusterSpec,
    result: Plan,
    gcs: RayObservation | None,
    now: datetime,
    drain_deadline_s: float,
    ev: Evidence,
    *,
    mono_s: float | None = None,
) -> tuple[Plan, tuple[Write, ...], tuple[Blocked, ...]]:
    """The plan past the gate, and its record → drains → patch; raises PatchError. `now` is
    the wall clock (the drain deadlines Ray reads), `mono_s` the monotonic one (`mono_of`;
    None: `now` stands in).

    The gate runs before any drain is sent (every drain assumed accepted): a slice it would
    refuse is not drained at all, so no host of it exits for nothing.
    """
    if not result.changes:
        stale = _stale_record(spec, result)
        return result, ((Patch(tuple(stale)),) if stale else ()), ()
    mono = mono_of(mono_s, now)
    cluster_id = gcs.cluster_id if gcs else None
    deadline_ms = int((now.timestamp() + drain_deadline_s) * 1000)
    drains = _drains(result, cluster_id, deadline_ms, ev, mono)
    result, blocked = gate(result, ev, assumed_accepted(drains), mono)
    kept = {(x.group, x.slice_key) for x in _drained_first_deletions(result)}
    drains = [d for d in drains if (d.group, d.slice_key) in kept]
    draining = _slices_to_drain(result, ev, mono)
    writes: list[Write] = []
    base = spec
    if draining and not _recorded(spec, draining):
        writes.append(
            RecordIntent(
                draining=MappingProxyType({g: tuple(keys) for g, keys in draining.items()}),
                ops=tuple(record_ops(spec, draining)),
            )
        )
        base = with_record(spec, draining)
    writes += drains
    writes += _preemptions(result, cluster_id, mono, now)
    ops = _patch_ops(base, result)
    if ops:
        writes.append(Patch(tuple(ops)))
    return result, tuple(writes), blocked


def assumed_accepted(drains: Sequence[Drain]) -> frozenset[str]:
    """Every idle-termination drain accepted: the node ids `plan` and /debug/plan assume."""
    return frozenset(n for d in drains if not d.preempt for n in d.node_ids)


# Deletions whose joined hosts are drained (idle termination) before the patch, all or nothing.
DRAINED_FIRST = (DeleteKind.IDLE, DeleteKind.SURPLUS)


def _drained_first(x: SliceDeletion) -> bool:
    # A replaced broken slice is drained too when some host's Ray node is alive (the planner
    # keeps it if any is busy, so those are idle); hosts with no Ray node need no drain.
    return x.kind in DRAINED_FIRST or (x.kind is DeleteKind.REPLACE and bool(x.node_ids))


@dataclass(frozen=True)
class _Ref:
    group: str
    slice_key: str
    deletion: SliceDeletion


def _drained_first_deletions(result: Plan) -> list[_Ref]:
    return [
        _Ref(d.group, x.slice_key, x)
        for d in result.groups
        for x in d.deletions
        if _drained_first(x)
    ]


def _slices_to_drain(result: Plan, ev: Evidence, mono_s: float) -> dict[str, list[str]]:
    """Slices to record as draining; one whose notice is over gets no drain, so no record."""
    out: dict[str, list[str]] = {}
    for ref in _drained_first_deletions(result):
        if not _notice_over(ref.deletion, ev, mono_s):
            out.setdefault(ref.group, []).append(ref.slice_key)
    return out


def _notice_over(x: SliceDeletion, ev: Evidence, mono_s: float) -> bool:
    """Its preemption notice is over (the gate's (d)): deleted without another drain."""
    deadline = ev.deadlines.get(x.slice_key)
    return deadline is not None and deadline <= mono_s


def _recorded(spec: ClusterSpec, draining: Mapping[str, list[str]]) -> bool:
    """The object already records every slice about to be drained: never rewrite it."""
    held = spec.draining
    return all(set(keys) <= set(held.get(g, ())) for g, keys in draining.items())


def _stale_record(spec: ClusterSpec, result: Plan) -> list[Op]:
    """Clear a draining record none of whose slices this plan finishes because they turned busy
    or are gone; kept while one may still be finished (its hosts absent, not yet for the
    grace), is backing off from a refused drain (so a retry never rewrites it), or while Ray's
    view is unknown (a blind daemon writes nothing)."""
    recorded = spec.draining
    if not recorded or result.held is not None or result.slice_map is None:
        return []
    if any(k in result.memory.refused for keys in recorded.values() for k in keys):
        return []
    slices = {(g, s.key): s for g, gs in result.slice_map.groups.items() for s in gs.slices}
    waiting = [
        slices[(g, k)]
        for g, keys in recorded.items()
        for k in keys
        if (g, k) in slices and not slices[(g, k)].working_hosts
    ]
    return [] if waiting else clear_ops(spec)  # a slice still to finish keeps its record


def _preemptions(result: Plan, cluster_id: str | None, mono_s: float, now: datetime) -> list[Drain]:
    """Busy slices to drain for preemption, with the deadline the planner keeps for them (on the
    monotonic clock; Ray is told it on the wall clock)."""
    return [
        Drain(
            group=d.group,
            slice_key=x.slice_key,
            node_ids=x.node_ids,
            cluster_id=cluster_id,
            deadline_ms=int(
                shown(result.memory.preempting[x.slice_key], mono_s, now).timestamp() * 1000
            ),
            message=f"kuberay-scaler: {x.reason}",
            preempt=True,
            pods=x.pods,
        )
        for d in result.groups
        for x in d.preempt
        if x.node_ids
    ]


def _drains(
    result: Plan, cluster_id: str | None, deadline_ms: int, ev: Evidence, mono_s: float
) -> list[Drain]:
    out = []
    for ref in _drained_first_deletions(result):
        x = ref.deletion
        if _notice_over(x, ev, mono_s):
            # An idle-termination drain here would find it busy and keep it, forever.
            continue
        node_ids = ev.alive_node_ids(x.pods)  # every live raylet of the pods, duplicates too
        if not node_ids:
            continue
        out.append(
            Drain(
                group=ref.group,
                slice_key=x.slice_key,
                node_ids=node_ids,
                cluster_id=cluster_id,
                deadline_ms=deadline_ms,
                message=_drain_message(x),
                broken=x.kind is DeleteKind.REPLACE,
                pods=x.pods,
            )
        )
    return out


def _drain_message(x: SliceDeletion) -> str:
    if x.kind is DeleteKind.REPLACE:
        return f"kuberay-scaler: slice {x.slice_key} broken, replaced: {x.reason}"
    return f"kuberay-scaler: slice {x.slice_key} idle"


def _patch_ops(base: ClusterSpec, result: Plan) -> list[Op]:
    # The record goes with the patch that deletes its slices (or with their drains refused).
    return build_patch(base, result) + clear_ops(base)
