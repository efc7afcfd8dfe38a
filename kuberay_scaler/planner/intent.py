"""Finish scale-downs that a previous run recorded but did not complete (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from kuberay_scaler.model.plan import DeleteKind, GroupDecision, Plan, SliceDeletion
from kuberay_scaler.model.slices import SliceMap, SliceState


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
        SliceDeletion(
            slice_key=sl.key,
            pods=sl.pod_names,
            node_ids=sl.node_ids,
            kind=DeleteKind.IDLE,
            reason="finishing a drain recorded before a restart",
        )
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
        reasons=(*d.reasons, *(f"remove slice {x.slice_key}: {x.reason}" for x in extra)),
    )
