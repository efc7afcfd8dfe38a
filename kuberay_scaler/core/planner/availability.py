"""Group availability: one pure stage from the slice map, capacity Events and last frame's
availability to each group's new availability and the transitions.

Signals, fastest first:

- a scale-up failure Event (STOCKOUT / QUOTA / SCALE_UP_FAILED) newer than the last one judged
  marks the group unavailable at once, unless a `TriggeredScaleUp` newer than it says the
  node-level autoscaler is still trying (then suspect: never fight its own fallbacks);
- `NotTriggerScaleUp` → suspect; while the pods it named stay Unschedulable with no newer
  `TriggeredScaleUp` for `grace_s` → unavailable(unschedulable);
- ErrImagePull / ImagePullBackOff / CrashLoopBackOff on a host of a slice not up →
  unavailable(image);
- replicas asked for that have had no pods for the group's provisioning deadline (KubeRay could
  not create them; its own FailedToCreateWorkerPod Event is the fast path) → unavailable(quota);
- a slice not up within the group's provisioning deadline → unavailable(provisioning-deadline).

Unschedulable pods alone (no Events readable, or none yet) make a group suspect only: every new
TPU pod is Unschedulable until its node exists, so only the deadline judges them then.

An unavailable group stays so for its backoff (`initial_s`, doubling per consecutive spell,
capped at `cap_s`; monotonic seconds), then probes: it may add one slice. A slice beyond those
complete when it was marked coming up → available (failures forgotten); a failure signal while
probing → unavailable again with the doubled backoff.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from kuberay_scaler.core.backoff import exponential_delay
from kuberay_scaler.core.defaults import (
    CAPACITY_GRACE_S,
    MAX_PROVISION_TIME_S,
    UNAVAILABLE_BACKOFF_S,
    UNAVAILABLE_MAX_BACKOFF_S,
)
from kuberay_scaler.core.liveness import HostClock
from kuberay_scaler.core.model.availability import (
    Availability,
    AvailabilityChange,
    ChangeKind,
    GroupAvailability,
    UnavailableCause,
)
from kuberay_scaler.core.model.hosts import Host, HostPhase
from kuberay_scaler.core.model.reasons import SliceFault
from kuberay_scaler.core.model.signals import CapacityEvent, CapacitySignal
from kuberay_scaler.core.model.slices import GroupSlices, Slice, SliceMap, SliceState

IMAGE_FAILURES = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "CrashLoopBackOff", "InvalidImageName"}
)
UNSCHEDULABLE = "Unschedulable"
_FAILED = {
    CapacitySignal.STOCKOUT: UnavailableCause.STOCKOUT,
    CapacitySignal.QUOTA: UnavailableCause.QUOTA,
    CapacitySignal.SCALE_UP_FAILED: UnavailableCause.STOCKOUT,
}
_NOT_UP = (SliceFault.NOT_UP_IN_TIME, SliceFault.HOSTS_MISSING)
_TRIGGERED = CapacitySignal.SCALE_UP_TRIGGERED
_NOT_TRIGGERED = CapacitySignal.NO_SCALE_UP


@dataclass(frozen=True)
class AvailabilityPolicy:
    initial_s: float = UNAVAILABLE_BACKOFF_S  # KUBERAY_SCALER_UNAVAILABLE_BACKOFF_S
    cap_s: float = UNAVAILABLE_MAX_BACKOFF_S  # KUBERAY_SCALER_UNAVAILABLE_MAX_BACKOFF_S
    grace_s: float = CAPACITY_GRACE_S  # Unschedulable after NotTriggerScaleUp
    deadline_s: float = MAX_PROVISION_TIME_S  # the cluster default provisioning deadline


@dataclass(frozen=True)
class AvailabilityResult:
    groups: Mapping[str, GroupAvailability]
    changes: tuple[AvailabilityChange, ...]
    # Seconds until time alone may turn a group unavailable (a provisioning deadline, a
    # suspect group's grace): the loop plans again then, not at its next resync.
    next_deadline_s: float | None = None


@dataclass(frozen=True)
class _Signals:
    """What this frame says about one group."""

    failure: GroupAvailability | None = None  # the fields of an unavailable state, if any
    suspicion: GroupAvailability | None = None  # the fields of a suspect state, if any
    came_up: bool = False  # a slice beyond those complete when it was marked is complete
    newest_failure_ms: int = 0  # the newest failure Event seen (judged from now on)
    no_pods_since: float | None = None
    complete: frozenset[str] = frozenset()  # the group's complete slices now


def judge_availability(
    slice_map: SliceMap,
    events: Iterable[CapacityEvent],
    previous: Mapping[str, GroupAvailability],
    policy: AvailabilityPolicy,
    mono_s: float,
    clock: HostClock | None = None,
    held: Iterable[str] = (),
) -> AvailabilityResult:
    """Each group's availability now. `held`: groups whose last write is not observed yet
    (their missing pods are not judged: the write that asks for them is still on its way)."""
    by_group = _events_by_group(slice_map, events)
    skip_no_pods = frozenset(held)
    groups: dict[str, GroupAvailability] = {}
    changes: list[AvailabilityChange] = []
    for name, gs in slice_map.groups.items():
        before = previous.get(name, GroupAvailability(since_mono=mono_s))
        found = _signals(gs, by_group.get(name, []), before, policy, mono_s, clock, skip_no_pods)
        if before.unavailable or found.failure is not None:  # only then read (a 10k-slice walk)
            complete = _complete(gs)
            came_up = bool(complete - before.complete_at_mark)
            found = replace(found, complete=complete, came_up=came_up)
        after, change = _next(name, before, found, policy, mono_s)
        groups[name] = after
        if change is not None:
            changes.append(change)
    ahead = [
        left
        for name, gs in slice_map.groups.items()
        if (left := _time_left(gs, groups[name], policy, mono_s, clock)) is not None
    ]
    return AvailabilityResult(MappingProxyType(groups), tuple(changes), min(ahead, default=None))


def _time_left(
    gs: GroupSlices,
    now: GroupAvailability,
    policy: AvailabilityPolicy,
    mono_s: float,
    clock: HostClock | None,
) -> float | None:
    """Seconds until the first judgement time alone brings to a group not unavailable yet: a
    slice coming up reaching the group's provisioning deadline, replicas without pods reaching
    it, a suspect group's grace ending. None when none is ahead."""
    if now.unavailable:
        return None
    deadline = group_deadline_s(gs, policy.deadline_s)
    ends: list[float] = []
    if clock is not None:
        ends += [
            deadline - max((clock.age_s.get(h.pod_name, 0.0) for h in sl.hosts), default=0.0)
            for sl in gs.coming_up
        ]
    if now.no_pods_since_mono is not None:
        ends.append(now.no_pods_since_mono + deadline - mono_s)
    if now.state is Availability.SUSPECT:
        ends.append(now.since_mono + policy.grace_s - mono_s)
    ahead = [end for end in ends if end > 0]
    return min(ahead, default=None)


def _events_by_group(
    slice_map: SliceMap, events: Iterable[CapacityEvent]
) -> dict[str, list[CapacityEvent]]:
    events = tuple(events)
    out: dict[str, list[CapacityEvent]] = {}
    if not events:
        return out
    owner = {pod: name for name, gs in slice_map.groups.items() for pod in _hosts(gs)}
    for ev in events:
        group = ev.group or (owner.get(ev.pod) if ev.pod else None)
        if group is not None:
            out.setdefault(group, []).append(ev)
    return out


def _hosts(gs: GroupSlices) -> Iterable[str]:
    return (h.pod_name for sl in gs.slices for h in sl.hosts)


def _signals(
    gs: GroupSlices,
    events: list[CapacityEvent],
    before: GroupAvailability,
    policy: AvailabilityPolicy,
    mono_s: float,
    clock: HostClock | None,
    skip_no_pods: frozenset[str],
) -> _Signals:
    """The strongest signal of this frame, fastest source first (see the module docstring)."""
    failed = [e for e in events if e.signal in _FAILED]
    newest_failure = max(failed, key=_at, default=None)
    triggered_ms = max((e.last_seen_ms for e in events if e.signal is _TRIGGERED), default=0)
    no_pods = _no_pods_since(gs, before, mono_s) if gs.group.name not in skip_no_pods else None
    base = _Signals(
        newest_failure_ms=max(
            before.seen_failure_ms, newest_failure.last_seen_ms if newest_failure else 0
        ),
        no_pods_since=no_pods,
    )
    stuck = [(sl, h) for sl in gs.coming_up for h in sl.hosts if h.phase is HostPhase.PENDING]
    found = (
        _failure_event(newest_failure, triggered_ms, before)
        or _image(stuck)
        or _deadline(gs, policy, clock)
        or _no_pods(gs, no_pods, policy, mono_s)
        or _refused(stuck, events, triggered_ms, before, policy, mono_s)
        or _unschedulable(stuck)
    )
    if found is None:
        return base
    if found.state is Availability.UNAVAILABLE:
        return replace(base, failure=found)
    return replace(base, suspicion=found)


def _failure_event(
    newest: CapacityEvent | None, triggered_ms: int, before: GroupAvailability
) -> GroupAvailability | None:
    """A scale-up failure not judged yet: unavailable, unless a scale-up the autoscaler
    triggered after it says it is still trying (suspect: never fight its own fallbacks)."""
    if newest is None or newest.last_seen_ms <= before.seen_failure_ms:
        return None
    if triggered_ms <= newest.last_seen_ms:
        return _from_event(newest, _FAILED[newest.signal])
    why = f"scale-up triggered again after: {newest.message}"
    return _suspect(why, newest.source, triggered_ms)


def _image(stuck: list[tuple[Slice, Host]]) -> GroupAvailability | None:
    for sl, h in stuck:
        if h.detail in IMAGE_FAILURES:
            detail = f"pod {h.pod_name} of slice {sl.key}: {h.detail}"
            return _failed(UnavailableCause.IMAGE, detail, "pods")
    return None


def _deadline(
    gs: GroupSlices, policy: AvailabilityPolicy, clock: HostClock | None
) -> GroupAvailability | None:
    late = _past_deadline(gs, policy, clock)
    return _failed(UnavailableCause.PROVISIONING_DEADLINE, late, "pods") if late else None


def _no_pods(
    gs: GroupSlices, since: float | None, policy: AvailabilityPolicy, mono_s: float
) -> GroupAvailability | None:
    """Replicas with no pods at all for the group's deadline. KubeRay's own
    FailedToCreateWorkerPod Event is the fast path (a QUOTA Event); without it an operator that
    is down or slow is no quota, and a shorter grace would cancel what it is creating."""
    if since is None or mono_s - since < group_deadline_s(gs, policy.deadline_s):
        return None
    detail = f"replicas without pods for {mono_s - since:.0f} s (KubeRay could not create them)"
    return _failed(UnavailableCause.QUOTA, detail, "pods")


def _refused(
    stuck: list[tuple[Slice, Host]],
    events: list[CapacityEvent],
    triggered_ms: int,
    before: GroupAvailability,
    policy: AvailabilityPolicy,
    mono_s: float,
) -> GroupAvailability | None:
    """NotTriggerScaleUp on a pod still Unschedulable, no scale-up triggered since: suspect,
    then unavailable once suspect (or probing) for the grace."""
    unschedulable = {h.pod_name for _, h in stuck if h.detail == UNSCHEDULABLE}
    refused = [
        e
        for e in events
        if e.signal is _NOT_TRIGGERED and e.last_seen_ms > triggered_ms and e.pod in unschedulable
    ]
    if not refused:
        return None
    newest = max(refused, key=_at)
    judged = before.state is Availability.SUSPECT or before.probing
    if judged and mono_s - before.since_mono >= policy.grace_s:
        return _from_event(newest, UnavailableCause.UNSCHEDULABLE)
    return _suspect(newest.message, newest.source, newest.last_seen_ms)


def _unschedulable(stuck: list[tuple[Slice, Host]]) -> GroupAvailability | None:
    """Unschedulable pods alone: every new TPU pod is, until its node exists. Suspect only."""
    count = sum(1 for _, h in stuck if h.detail == UNSCHEDULABLE)
    if not count:
        return None
    return _suspect(f"{count} pod(s) Unschedulable, waiting for a node", "pods", None)


def _at(e: CapacityEvent) -> int:
    return e.last_seen_ms


def _from_event(e: CapacityEvent, cause: UnavailableCause) -> GroupAvailability:
    return GroupAvailability(
        state=Availability.UNAVAILABLE,
        cause=cause,
        detail=e.message or e.reason,
        source=e.source,
        at_ms=e.last_seen_ms,
    )


def _failed(cause: UnavailableCause, detail: str, source: str) -> GroupAvailability:
    return GroupAvailability(
        state=Availability.UNAVAILABLE, cause=cause, detail=detail, source=source
    )


def _suspect(detail: str, source: str, at_ms: int | None) -> GroupAvailability:
    return GroupAvailability(
        state=Availability.SUSPECT, detail=detail, source=source, at_ms=at_ms or None
    )


def group_deadline_s(gs: GroupSlices, default_s: float) -> float:
    """The group's provisioning deadline: its own annotation, else the cluster default."""
    own = gs.group.max_provision_s
    return own if own is not None else default_s


def _past_deadline(gs: GroupSlices, policy: AvailabilityPolicy, clock: HostClock | None) -> str:
    """A slice not up within the group's deadline, said; "" when none."""
    deadline = group_deadline_s(gs, policy.deadline_s)
    for sl in gs.by_state(SliceState.BROKEN):
        if sl.fault in _NOT_UP:
            return f"slice {sl.key}: {sl.reason}"
    if clock is None:
        return ""
    for sl in gs.coming_up:
        age = max((clock.age_s.get(h.pod_name, 0.0) for h in sl.hosts), default=0.0)
        if age > deadline:
            return f"slice {sl.key} not up after {age:.0f} s (deadline {deadline:.0f} s)"
    return ""


def _no_pods_since(gs: GroupSlices, before: GroupAvailability, mono_s: float) -> float | None:
    """Since when replicas asked for have had no pods; None while every replica has pods."""
    slices = len(gs.slices) - len(gs.by_state(SliceState.TERMINATING))
    if gs.group.effective_replicas <= slices:
        return None
    return before.no_pods_since_mono if before.no_pods_since_mono is not None else mono_s


def _complete(gs: GroupSlices) -> frozenset[str]:
    return frozenset(s.key for s in gs.by_state(SliceState.COMPLETE))


def backoff_s(failures: int, policy: AvailabilityPolicy) -> float:
    """The wait before the probe after `failures` consecutive unavailable spells (1 = first)."""
    return exponential_delay(failures - 1, policy.initial_s, policy.cap_s)


def _next(
    name: str,
    before: GroupAvailability,
    found: _Signals,
    policy: AvailabilityPolicy,
    mono_s: float,
) -> tuple[GroupAvailability, AvailabilityChange | None]:
    kept = replace(
        before, seen_failure_ms=found.newest_failure_ms, no_pods_since_mono=found.no_pods_since
    )
    if before.unavailable:
        return _while_unavailable(name, before, kept, found, policy, mono_s)
    if found.failure is not None:
        return _mark(name, before, kept, found, policy, mono_s, ChangeKind.MARKED)
    if found.suspicion is not None:
        since = before.since_mono if before.state is Availability.SUSPECT else mono_s
        after = replace(
            kept,
            state=Availability.SUSPECT,
            cause=None,
            detail=found.suspicion.detail,
            source=found.suspicion.source,
            at_ms=found.suspicion.at_ms,
            since_mono=since,
        )
        change = None if before.state is Availability.SUSPECT else ChangeKind.SUSPECTED
        return after, _change(name, before, after, change)
    if before.state is Availability.SUSPECT:
        after = _available(kept, mono_s, failures=kept.failures)
        return after, _change(name, before, after, ChangeKind.CLEARED)
    return kept, None


def _while_unavailable(
    name: str,
    before: GroupAvailability,
    kept: GroupAvailability,
    found: _Signals,
    policy: AvailabilityPolicy,
    mono_s: float,
) -> tuple[GroupAvailability, AvailabilityChange | None]:
    if before.until_mono is not None and mono_s < before.until_mono:
        return kept, None  # never sooner than its backoff
    if found.came_up:
        after = _available(kept, mono_s, failures=0)
        return after, _change(name, before, after, ChangeKind.RECOVERED)
    if before.probing and found.failure is not None:
        return _mark(name, before, kept, found, policy, mono_s, ChangeKind.PROBE_FAILED)
    if before.probing:
        return kept, None
    after = replace(kept, probing=True, since_mono=mono_s)
    return after, _change(name, before, after, ChangeKind.PROBE)


def _mark(
    name: str,
    before: GroupAvailability,
    kept: GroupAvailability,
    found: _Signals,
    policy: AvailabilityPolicy,
    mono_s: float,
    kind: ChangeKind,
) -> tuple[GroupAvailability, AvailabilityChange]:
    failure = found.failure
    assert failure is not None
    failures = before.failures + 1
    wait = backoff_s(failures, policy)
    after = replace(
        kept,
        state=Availability.UNAVAILABLE,
        cause=failure.cause,
        detail=failure.detail,
        source=failure.source,
        at_ms=failure.at_ms,
        since_mono=mono_s,
        until_mono=mono_s + wait,
        failures=failures,
        probing=False,
        complete_at_mark=found.complete,
    )
    return after, AvailabilityChange(name, kind, before.state, after, backoff_s=wait)


def _available(kept: GroupAvailability, mono_s: float, failures: int) -> GroupAvailability:
    return replace(
        kept,
        state=Availability.AVAILABLE,
        cause=None,
        detail="",
        source="",
        at_ms=None,
        since_mono=mono_s,
        until_mono=None,
        failures=failures,
        probing=False,
    )


def _change(
    name: str, before: GroupAvailability, after: GroupAvailability, kind: ChangeKind | None
) -> AvailabilityChange | None:
    return None if kind is None else AvailabilityChange(name, kind, before.state, after)
