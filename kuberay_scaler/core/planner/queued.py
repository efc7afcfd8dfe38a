"""Queued slices: cancel one that no demand has used for the idle timeout. Pure.

A queued slice is held by a scheduling gate (Kueue has not admitted its workload slice): it
counts as capacity on its way (planner/capacity.py), so pending demand lands on it and it is
`needed`. Once nothing has used it for the group's idle timeout — the same patience an idle
slice gets, measured on the monotonic clock from the first plan that found it unneeded — it is
cancelled whole: its pods never ran (the deletion gate's (c)), so nothing is drained, and the
target drops by one (it is not replaced). Never below minReplicas. A queued slice any of whose
pods has a Ray node, or whose siblings cannot be told apart, is left alone. While Ray's view settles
(`HostClock.settling`: a GCS restart, a blind spell, the daemon's start) no timer runs: they
start again once it has settled, so a reply that lacks the demand for a moment cancels nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from types import MappingProxyType

from kuberay_scaler.core.model.labels import LABEL_LEGACY_REPLICA, LABEL_REPLICA_NAME
from kuberay_scaler.core.model.plan import DeleteKind, SliceDeletion
from kuberay_scaler.core.model.reasons import Keep, KeepKind, Reason, ScaleDown, ScaleDownKind
from kuberay_scaler.core.model.slices import GroupSlices, Slice, SliceState
from kuberay_scaler.core.planner.gate import Evidence, gone_from_ray

SliceRef = tuple[str | None, str | None]


def _no_since() -> Mapping[str, float]:
    return MappingProxyType({})


@dataclass(frozen=True)
class QueuedCancels:
    """One group's queued slices to cancel, why, and since when each unneeded one has been."""

    deletions: tuple[SliceDeletion, ...] = ()
    reasons: tuple[Reason, ...] = ()
    unneeded_since: Mapping[str, float] = field(default_factory=_no_since)  # key → mono_s
    wake_s: float | None = None  # seconds until the next one falls due


def queued_cancellations(
    slices: GroupSlices,
    needed: Set[SliceRef],
    keep_at_least: int,
    timeout_s: float,
    since: Mapping[str, float],
    mono_s: float,
    ev: Evidence | None,
) -> QueuedCancels:
    """Queued slices of the group that demand has not used for `timeout_s` (`since`: the last
    plan's memory of when each became unneeded), at most `keep_at_least` of them."""
    if ev is None or ev.clock.settling is not None:
        # Right after a GCS restart, a blind spell or the daemon's start, a reply may lack the
        # demand that needs these slices: no timer starts or runs until Ray's view settles.
        return QueuedCancels()
    name = slices.group.name
    unneeded: dict[str, float] = {}
    due: list[tuple[float, Slice]] = []
    waits: list[float] = []
    for sl in slices.by_state(SliceState.QUEUED):
        if (name, sl.key) in needed or not _never_ran(sl, slices.group.is_multi_host, ev):
            continue
        start = unneeded[sl.key] = min(since.get(sl.key, mono_s), mono_s)
        waited = mono_s - start
        if waited >= timeout_s:
            due.append((waited, sl))
        else:
            waits.append(timeout_s - waited)
    due.sort(key=lambda pair: (-pair[0], pair[1].key))  # unneeded longest first
    chosen = due[: max(0, keep_at_least)]
    reasons: list[Reason] = []
    deletions: list[SliceDeletion] = []
    for waited, sl in chosen:
        why = ScaleDown(ScaleDownKind.CANCEL_QUEUED, sl.key, len(sl.hosts), waited, timeout_s)
        reasons.append(why)
        deletions.append(SliceDeletion(sl.key, sl.pod_names, (), DeleteKind.CANCEL, why))
    if len(chosen) < len(due):
        floor = slices.group.min_replicas
        reasons.append(Keep(KeepKind.MIN_REPLICAS, len(due) - len(chosen), min_replicas=floor))
    return QueuedCancels(
        tuple(deletions),
        tuple(reasons),
        MappingProxyType(unneeded),
        min(waits) if waits else None,
    )


def _never_ran(sl: Slice, multi_host: bool, ev: Evidence | None) -> bool:
    """No host has (or, as far as the daemon saw, ever had) a Ray node: nothing to drain."""
    if sl.nodes or sl.marked_for_deletion or not sl.hosts or ev is None:
        return False
    if multi_host and not _identified(sl):
        return False  # siblings unknown (no replica label): never chosen
    return all(gone_from_ray(h, ev) for h in sl.hosts)


def _identified(sl: Slice) -> bool:
    labels = sl.hosts[0].labels
    return LABEL_REPLICA_NAME in labels or LABEL_LEGACY_REPLICA in labels
