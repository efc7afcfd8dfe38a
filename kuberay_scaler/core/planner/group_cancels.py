"""A group's one cancellations result: what an unavailable group has coming (cancel.py) and
its queued slices no demand wants (queued.py), the latter within what the group may still lose
(minReplicas). The target drops by `Cancellations.replicas`, folded once by the decision."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from kuberay_scaler.core.model.reasons import Keep, KeepKind, Reason, ScaleDown
from kuberay_scaler.core.planner.cancel import Cancelled, cancellations
from kuberay_scaler.core.planner.gate import Evidence
from kuberay_scaler.core.planner.groups import GroupNotes
from kuberay_scaler.core.planner.queued import QueuedCancels
from kuberay_scaler.core.planner.queues import GroupQueue


@dataclass(frozen=True)
class Cancellations:
    """The group's one cancellations result: what an unavailable group has coming, and its
    queued slices no demand wants (within minReplicas); the target drops by `replicas`."""

    unavailable: Cancelled = field(default_factory=Cancelled)
    queued: QueuedCancels = field(default_factory=QueuedCancels)

    @property
    def replicas(self) -> int:
        return self.unavailable.replicas + len(self.queued.deletions)


def group_cancellations(
    g: GroupNotes, added: int, virtual: int, ev: Evidence, queue: GroupQueue
) -> Cancellations:
    """An unavailable group's cancels, then the queued slices no demand wants, the latter
    trimmed to what the group may still lose (`_within_min`)."""
    unavailable = (
        cancellations(g.slices, g.availability, ev, virtual)
        if g.availability is not None
        else Cancelled()
    )
    group = g.slices.group
    keep = group.effective_replicas + added - group.min_replicas - unavailable.replicas
    keep -= len(g.released)
    return Cancellations(unavailable, _within_min(queue.cancels, keep, group.min_replicas))


def _within_min(cancels: QueuedCancels, keep: int, min_replicas: int) -> QueuedCancels:
    """The queued cancels that fit what the group may still lose after this plan's other
    cancels and releases (`keep`): each path alone stops at minReplicas, together too."""
    if len(cancels.deletions) <= max(0, keep):
        return cancels
    kept = cancels.deletions[: max(0, keep)]
    keys = {x.slice_key for x in kept}
    reasons: list[Reason] = [
        r for r in cancels.reasons if not isinstance(r, ScaleDown) or r.slice in keys
    ]
    spared = len(cancels.deletions) - len(kept)
    reasons.append(Keep(KeepKind.MIN_REPLICAS, spared, min_replicas=min_replicas))
    return replace(cancels, deletions=kept, reasons=tuple(reasons))
