"""Whether a worker group can get capacity: a typed state per group, kept across frames.

`available` → `suspect` → `unavailable{cause}`; an unavailable group backs off (monotonic
seconds, doubling per failure, capped), then is **probed**: one slice is tried again, and its
hosts coming up make the group available again, a failure doubles the wait. The planner's
stage `core/planner/availability.py` moves these values; everything else reads them.

Timers (`since_mono`, `until_mono`) are on the daemon's monotonic clock (`mono_s`); wall times
(`at_ms`, epoch ms) come from the signal itself (an Event's timestamp) and are only shown.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum


class Availability(StrEnum):
    AVAILABLE = "available"
    # Something says capacity may not come (Unschedulable pods, NotTriggerScaleUp, a scale-up
    # retried after a failure): shown, and judged again every frame; nothing is cancelled.
    SUSPECT = "suspect"
    UNAVAILABLE = "unavailable"


class UnavailableCause(StrEnum):
    STOCKOUT = "stockout"  # a scale-up failed for want of capacity (GCE out of resources)
    QUOTA = "quota"  # cloud quota, a namespace ResourceQuota, or replicas that got no pods
    UNSCHEDULABLE = "unschedulable"  # pods Unschedulable and the autoscaler says it cannot help
    IMAGE = "image"  # ErrImagePull / ImagePullBackOff / CrashLoopBackOff on a slice's hosts
    PROVISIONING_DEADLINE = "provisioning-deadline"  # a slice not up within the group's deadline


@dataclass(frozen=True)
class GroupAvailability:
    """One group's availability as of the last frame."""

    state: Availability = Availability.AVAILABLE
    cause: UnavailableCause | None = None  # UNAVAILABLE (and kept while probing)
    detail: str = ""  # what said so, e.g. the Event's message or "3 pod(s) Unschedulable"
    source: str = ""  # who said so: "cluster-autoscaler", "pods", "provisioning deadline"
    at_ms: int | None = None  # when the signal was posted (wall, epoch ms): shown only
    since_mono: float = 0.0  # when this state began (monotonic s)
    until_mono: float | None = None  # UNAVAILABLE: when the backoff ends and the probe starts
    failures: int = 0  # consecutive unavailable spells: the backoff doubles with each
    probing: bool = False  # the backoff ended: one slice is being tried again
    # The newest failure Event already judged (wall ms): older Events never mark it again.
    seen_failure_ms: int = 0
    # Complete slices when it became unavailable: a slice beyond these coming up is success.
    complete_at_mark: frozenset[str] = frozenset()
    # Since when replicas asked for have had no pods (monotonic s; None: none missing).
    no_pods_since_mono: float | None = None

    @property
    def unavailable(self) -> bool:
        return self.state is Availability.UNAVAILABLE

    @property
    def blocks_launch(self) -> bool:
        """No slice may be added (unavailable and not probing)."""
        return self.unavailable and not self.probing

    def __str__(self) -> str:
        if self.state is Availability.AVAILABLE:
            return "available"
        said = _said(self)
        if self.state is Availability.SUSPECT:
            return f"suspect: {said}"
        cause = self.cause.value if self.cause else "?"
        probe = ", probing with one slice" if self.probing else ""
        return f"unavailable ({cause}): {said}{probe}"


class ChangeKind(StrEnum):
    """Why a group's availability moved (the transitions a plan reports)."""

    SUSPECTED = "suspected"  # available → suspect
    CLEARED = "cleared"  # suspect → available (the signal went away)
    MARKED = "marked_unavailable"  # available/suspect → unavailable
    PROBE = "probe"  # the backoff ended: one slice is tried again
    PROBE_FAILED = "probe_failed"  # the probe failed: unavailable again, the backoff doubled
    RECOVERED = "recovered"  # a new slice came up: available again


@dataclass(frozen=True)
class AvailabilityChange:
    """One transition of one group, with what caused it."""

    group: str
    kind: ChangeKind
    before: Availability
    after: GroupAvailability
    backoff_s: float = 0.0  # MARKED / PROBE_FAILED: how long until the probe

    @property
    def cause(self) -> str:
        """The metrics label: the unavailable cause, or the state it went to."""
        return self.after.cause.value if self.after.cause else self.after.state.value

    def __str__(self) -> str:
        a = self.after
        if self.kind in (ChangeKind.MARKED, ChangeKind.PROBE_FAILED):
            again = "probe failed; " if self.kind is ChangeKind.PROBE_FAILED else ""
            return f"{self.group} {again}unavailable ({self.cause}): {_said(a)}"
        if self.kind is ChangeKind.PROBE:
            return f"{self.group}: backoff over, probing with one slice"
        if self.kind is ChangeKind.RECOVERED:
            return f"{self.group} available again: a new slice came up"
        if self.kind is ChangeKind.SUSPECTED:
            return f"{self.group} suspect: {_said(a)}"
        return f"{self.group} available: nothing says otherwise any more"


def _said(a: GroupAvailability) -> str:
    return f"{a.detail} ({said_by(a)})" if a.source else a.detail


def said_by(a: GroupAvailability) -> str:
    """Who said so and when, as people read it: "cluster-autoscaler, 12:03:10"."""
    if a.at_ms is None:
        return a.source
    at = datetime.fromtimestamp(a.at_ms / 1000, UTC).strftime("%H:%M:%S")
    return f"{a.source}, {at}"
