"""Cancel what an unavailable group has coming: pure, one frozen result.

A slice of a group that cannot get capacity will not come: its pods never ran (none Running,
none ever had a Ray node: the deletion gate's (c), so no drain is needed) and it is cancelled
whole — its pods named in workersToDelete and the target lowered by it — never replaced
(KubeRay would recreate the same stuck pods). Replicas asked for that have no pods at all are
cancelled by the target alone. Never below minReplicas (KubeRay would run them anyway). A slice
any of whose pods ran is left to the other paths (idle, broken-but-busy, replace): cancelling is
only ever for work that never started.
"""

from __future__ import annotations

from dataclasses import dataclass

from kuberay_scaler.core.model.availability import GroupAvailability
from kuberay_scaler.core.model.hosts import HostPhase
from kuberay_scaler.core.model.labels import LABEL_LEGACY_REPLICA, LABEL_REPLICA_NAME
from kuberay_scaler.core.model.plan import DeleteKind, SliceDeletion
from kuberay_scaler.core.model.reasons import ScaleDown, ScaleDownKind
from kuberay_scaler.core.model.slices import GroupSlices, Slice, SliceState
from kuberay_scaler.core.planner.gate import Evidence, gone_from_ray

_CANCELLABLE = (SliceState.PENDING, SliceState.PARTIAL, SliceState.BROKEN)


@dataclass(frozen=True)
class Cancelled:
    deletions: tuple[SliceDeletion, ...] = ()
    without_pods: int = 0  # replicas with no pods cancelled by lowering the target
    reasons: tuple[ScaleDown, ...] = ()

    @property
    def replicas(self) -> int:
        return len(self.deletions) + self.without_pods

    @property
    def keys(self) -> frozenset[str]:
        return frozenset(x.slice_key for x in self.deletions)


def cancellations(
    gs: GroupSlices, availability: GroupAvailability, ev: Evidence, virtual: int
) -> Cancelled:
    """What of `gs` to cancel while the group is unavailable (not probing); `virtual`: its
    replicas asked for that have no pods."""
    if not availability.blocks_launch:
        return Cancelled()
    group = gs.group
    budget = max(0, group.effective_replicas - group.min_replicas)
    why = f"{group.name} {availability}"
    deletions: list[SliceDeletion] = []
    reasons: list[ScaleDown] = []
    for sl in gs.slices:
        if len(deletions) >= budget:
            break
        if _never_ran(sl, ev):
            reason = ScaleDown(
                ScaleDownKind.CANCEL_UNAVAILABLE, sl.key, hosts=len(sl.hosts), detail=why
            )
            reasons.append(reason)
            deletions.append(SliceDeletion(sl.key, sl.pod_names, (), DeleteKind.CANCEL, reason))
    without_pods = min(virtual, budget - len(deletions))
    if without_pods > 0:
        reasons.append(ScaleDown(ScaleDownKind.CANCEL_UNAVAILABLE, "", without_pods, detail=why))
    return Cancelled(tuple(deletions), without_pods, tuple(reasons))


def _never_ran(sl: Slice, ev: Evidence) -> bool:
    """Coming up (or broken before it came up) and no pod ever ran: no Ray node to drain."""
    if sl.state not in _CANCELLABLE or sl.marked_for_deletion or not sl.hosts:
        return False
    if sl.expected_hosts > 1 and not _identified(sl):
        return False  # siblings unknown (no replica label): never chosen
    return all(h.phase is HostPhase.PENDING and gone_from_ray(h, ev) for h in sl.hosts)


def _identified(sl: Slice) -> bool:
    labels = sl.hosts[0].labels
    return LABEL_REPLICA_NAME in labels or LABEL_LEGACY_REPLICA in labels
