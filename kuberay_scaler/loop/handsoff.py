"""Another writer reset a group's replicas: leave the group alone instead of fighting it. Pure.

GitOps, `kubectl scale` or an in-tree autoscaler may set replicas after us. Once our own write to
a group has been observed (no expectation pending), replicas that differ from what we wrote are
an override: their value is the truth, and the group is held (`Hold(OVERRIDDEN)`) for
`initial_s`, doubling with each override up to `max_s`; an override older than `memory_s` no
longer counts toward the doubling.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from types import MappingProxyType

from kuberay_scaler.core import defaults as D
from kuberay_scaler.core.model.cluster import ClusterSpec
from kuberay_scaler.core.model.reasons import Hold, HoldKind


@dataclass(frozen=True)
class OverrideBackoff:
    initial_s: float = D.OVERRIDE_BACKOFF_S
    max_s: float = D.OVERRIDE_BACKOFF_MAX_S
    memory_s: float = D.OVERRIDE_MEMORY_S


@dataclass(frozen=True)
class Override:
    count: int  # overrides in a row (within `memory_s` of each other)
    until: float  # monotonic: hands off until then


@dataclass(frozen=True)
class Overridden:
    """One override noticed now (what the loop logs, counts and records as an Event)."""

    group: str
    ours: int
    theirs: int
    count: int
    hands_off_s: float
    managers: tuple[str, ...] = ()  # field managers that last wrote the spec, newest first


def _empty_written() -> Mapping[str, int]:
    return MappingProxyType({})


def _empty_overrides() -> Mapping[str, Override]:
    return MappingProxyType({})


@dataclass(frozen=True)
class HandsOff:
    """What we wrote per group, and the groups we leave alone."""

    written: Mapping[str, int] = field(default_factory=_empty_written)  # replicas we set
    overrides: Mapping[str, Override] = field(default_factory=_empty_overrides)

    def wrote(self, replicas: Mapping[str, int]) -> HandsOff:
        """Our write of these groups' replicas was applied."""
        return replace(self, written=MappingProxyType({**self.written, **replicas}))

    def holds(self, now: float, wall: datetime) -> dict[str, Hold]:
        """The groups left alone at monotonic `now` (`wall` is the same instant)."""
        return {
            name: Hold(
                HoldKind.OVERRIDDEN,
                name,
                failures=o.count,
                until=wall + timedelta(seconds=o.until - now),
            )
            for name, o in self.overrides.items()
            if now < o.until
        }


def hands_off(
    state: HandsOff,
    spec: ClusterSpec,
    awaiting: Callable[[str], bool],
    now: float,
    backoff: OverrideBackoff,
) -> tuple[HandsOff, tuple[Overridden, ...]]:
    """Notice the groups whose replicas another writer changed since our write was observed.

    `awaiting(group)` is True while our own write to it is not observed yet (not an override).
    """
    written = dict(state.written)
    overrides = dict(state.overrides)
    noticed = []
    for name, ours in state.written.items():
        group = spec.group(name)
        if group is None or awaiting(name) or group.replicas == ours:
            continue
        del written[name]  # their value is the truth until our next write
        last = overrides.get(name)
        count = 1 if last is None or now - last.until > backoff.memory_s else last.count + 1
        delay = min(backoff.max_s, backoff.initial_s * 2 ** (count - 1))
        overrides[name] = Override(count, now + delay)
        managers = tuple(w.manager for w in spec.spec_writers)
        noticed.append(Overridden(name, ours, group.replicas, count, delay, managers))
    if not noticed:
        return state, ()
    return HandsOff(MappingProxyType(written), MappingProxyType(overrides)), tuple(noticed)
