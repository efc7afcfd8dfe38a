"""Why a group is left as it is: one typed reason per kind of slice that stays. Pure."""

from __future__ import annotations

from collections.abc import Sequence, Set

from kuberay_scaler.core.model.reasons import Unchanged, UnchangedKind
from kuberay_scaler.core.model.slices import GroupSlices, Slice, SliceState

SliceRef = tuple[str | None, str | None]

_STATE_KINDS = {
    SliceState.PENDING: UnchangedKind.PENDING,
    SliceState.QUEUED: UnchangedKind.QUEUED,
    SliceState.PARTIAL: UnchangedKind.PARTIAL,
    SliceState.BROKEN: UnchangedKind.BROKEN,
    SliceState.TERMINATING: UnchangedKind.TERMINATING,
}


def why_unchanged(
    slices: GroupSlices,
    needed: Set[SliceRef],
    timeout_s: float,
    now_ms: int,
    leaving: Sequence[str] = (),
) -> list[Unchanged]:
    """The slices that stay (not in `leaving`), grouped by why they stay, at `now_ms`."""
    staying = [s for s in slices.slices if s.key not in leaving]
    if not staying:
        if leaving:
            return []
        # No pods at all, but replicas may still ask for slices: the planner counts pending
        # demand on those (KubeRay is creating them), which is why nothing more is asked for.
        awaited = slices.group.effective_replicas
        if awaited:
            return [Unchanged(UnchangedKind.AWAITING_PODS, awaited)]
        return [Unchanged(UnchangedKind.NO_SLICES)]
    buckets: dict[UnchangedKind, list[Slice]] = {}
    for sl in staying:
        kind = _kind(sl, slices.group.name, needed, timeout_s, now_ms)
        buckets.setdefault(kind, []).append(sl)
    return [_reason(kind, members, timeout_s, now_ms) for kind, members in buckets.items()]


def _kind(
    sl: Slice, group: str, needed: Set[SliceRef], timeout_s: float, now_ms: int
) -> UnchangedKind:
    if sl.state not in (SliceState.COMPLETE, SliceState.OUTDATED):  # outdated ones serve
        return _STATE_KINDS[sl.state]
    idle_ms = sl.idle_ms(now_ms)
    if idle_ms is None:
        return UnchangedKind.BUSY
    if (group, sl.key) in needed:
        return UnchangedKind.NEEDED
    return UnchangedKind.IDLE_BELOW_TIMEOUT if idle_ms < timeout_s * 1000 else UnchangedKind.KEPT


def _reason(kind: UnchangedKind, members: list[Slice], timeout_s: float, now_ms: int) -> Unchanged:
    first = members[0]
    if kind is UnchangedKind.IDLE_BELOW_TIMEOUT:
        longest = max((s.idle_ms(now_ms) or 0) for s in members) / 1000
        return Unchanged(kind, len(members), first.key, idle_s=longest, timeout_s=timeout_s)
    detail = first.reason if kind in _STATE_KINDS.values() else ""
    if kind is UnchangedKind.BUSY:
        detail = _busy_detail(first)
    return Unchanged(kind, len(members), first.key, detail=detail)


def _busy_detail(sl: Slice) -> str:
    busy = [
        h.pod_name for h in sl.hosts if h.pod_name in sl.nodes and not sl.nodes[h.pod_name].idle
    ]
    return f"{len(busy)} of {len(sl.hosts)} hosts running work"
