"""Scale-down: idle slices leave (longest idle first, never below minReplicas), and drains a
previous run recorded are finished."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from kuberay_scaler.model.cluster import DEFAULT_IDLE_TIMEOUT_S, ClusterSpec, WorkerGroup
from kuberay_scaler.model.plan import DeleteKind, GroupDecision, Plan, SliceDeletion
from kuberay_scaler.model.reasons import (
    Keep,
    KeepKind,
    Reason,
    Replace,
    ScaleDown,
    ScaleDownKind,
)
from kuberay_scaler.model.slices import GroupSlices, Slice, SliceMap, SliceState

SliceRef = tuple[str | None, str | None]  # (group, slice key) of a bin demand uses


def idle_deletions(
    slices: GroupSlices,
    keep_at_least: int,
    needed: set[SliceRef],
    timeout_s: float,
    reasons: list[Reason],
) -> list[SliceDeletion]:
    """Idle slices past `timeout_s` that demand does not use, while more than `keep_at_least`
    replicas (after this plan's additions) stay."""
    group = slices.group
    idle: list[tuple[int, Slice]] = []
    for sl in slices.by_state(SliceState.COMPLETE):
        idle_ms = sl.idle_ms()
        if idle_ms is None or idle_ms < timeout_s * 1000 or (group.name, sl.key) in needed:
            continue
        idle.append((idle_ms, sl))
    idle.sort(key=lambda pair: (-pair[0], pair[1].key))  # longest idle first
    chosen = idle[: max(0, keep_at_least)]
    if len(chosen) < len(idle):
        reasons.append(
            Keep(KeepKind.MIN_REPLICAS, len(idle) - len(chosen), min_replicas=group.min_replicas)
        )
    out = []
    for idle_ms, sl in chosen:
        why = ScaleDown(ScaleDownKind.IDLE, sl.key, len(sl.hosts), idle_ms / 1000, timeout_s)
        reasons.append(why)
        out.append(deletion(sl, DeleteKind.IDLE, why))
    return out


def idle_timeout(group: WorkerGroup, spec: ClusterSpec, override_s: float | None) -> float:
    """The daemon's override, else the group's, else the cluster's, else KubeRay's default."""
    for candidate in (override_s, group.idle_timeout_s, spec.autoscaler.idle_timeout_s):
        if candidate is not None:
            return candidate
    return DEFAULT_IDLE_TIMEOUT_S


def deletion(sl: Slice, kind: DeleteKind, why: ScaleDown | Replace) -> SliceDeletion:
    return SliceDeletion(
        slice_key=sl.key, pods=sl.pod_names, node_ids=sl.node_ids, kind=kind, reason=why
    )


def finish_recorded_drains(result: Plan, draining: Mapping[str, tuple[str, ...]]) -> Plan:
    """Add a deletion for every recorded slice that still exists and is not yet being deleted."""
    if not draining or result.slice_map is None or result.held:
        return result
    groups = tuple(_finish(d, result.slice_map, draining.get(d.group, ())) for d in result.groups)
    return replace(result, groups=groups)


def _finish(d: GroupDecision, slice_map: SliceMap, keys: tuple[str, ...]) -> GroupDecision:
    gs = slice_map.groups.get(d.group)
    if not keys or gs is None or d.held:
        return d
    planned = {x.slice_key for x in d.deletions}
    extra = [
        deletion(sl, DeleteKind.IDLE, ScaleDown(ScaleDownKind.RECORDED_DRAIN, sl.key))
        for sl in gs.slices
        if sl.key in keys and sl.key not in planned and sl.state is not SliceState.TERMINATING
    ]
    if not extra:
        return d
    floor = gs.group.min_replicas
    base = d.target if d.target != d.current or d.deletions else gs.group.effective_replicas
    return replace(
        d,
        deletions=(*d.deletions, *extra),
        target=max(floor, base - len(extra)),
        reasons=(*d.reasons, *(x.reason for x in extra)),
    )
