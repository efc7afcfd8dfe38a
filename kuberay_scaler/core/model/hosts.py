"""Pods of the cluster, reduced to what scaling decisions need."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from types import MappingProxyType
from typing import Generic, TypeVar

_T = TypeVar("_T")


class HostPhase(StrEnum):
    """Our classification of a pod, derived from phase, container state and deletion."""

    PENDING = "pending"  # not yet running: unscheduled, pulling, container waiting to start
    RUNNING = "running"  # Ray container running
    FAILED = "failed"  # Failed/Succeeded/Unknown phase or the Ray container terminated
    TERMINATING = "terminating"  # deletionTimestamp set: not capacity any more


@dataclass(frozen=True)
class Host:
    """One Ray pod (head or worker)."""

    pod_name: str
    group: str
    is_head: bool
    phase: HostPhase
    detail: str  # why it is in that phase, e.g. "Unschedulable", "CrashLoopBackOff"
    labels: Mapping[str, str]
    node_name: str | None
    created_at: datetime | None
    slice_key: str  # replica name, legacy replicaIndex, or the pod name for single-host groups
    replica_index: int | None
    host_index: int | None
    running_since: datetime | None = None  # when the Ray container started
    uid: str = ""
    # The pod annotation that keeps its slice from voluntary removal ("key=value"), if any.
    do_not_disrupt: str | None = None
    # The reason of the pod's DisruptionTarget=True condition (the pod is going), if any.
    disruption_target: str | None = None
    # spec.schedulingGates names: the scheduler leaves the pod alone until each is removed
    # (Kueue's `kueue.x-k8s.io/elastic-job`, `kueue.x-k8s.io/admission`, ...): queued, not slow.
    gates: tuple[str, ...] = ()

    @property
    def is_capacity(self) -> bool:
        """Only running, not-terminating hosts can serve work."""
        return self.phase is HostPhase.RUNNING


def _empty() -> Mapping[str, float]:
    return MappingProxyType({})


class Elapsed(Mapping[str, float], Generic[_T]):
    """Seconds since each pod's start, worked out when read: a frame reads the ages of the
    pods of slices not judged complete only, so a 10k-pod frame does not compute 10k of them.
    `starts` must not change afterwards (its owner builds a new one instead)."""

    __slots__ = ("_seconds", "_starts")

    def __init__(self, starts: Mapping[str, _T], seconds: Callable[[_T], float]) -> None:
        self._starts, self._seconds = starts, seconds

    def __getitem__(self, key: str) -> float:
        return self._seconds(self._starts[key])

    def __iter__(self) -> Iterator[str]:
        return iter(self._starts)

    def __len__(self) -> int:
        return len(self._starts)


@dataclass(frozen=True)
class HostClock:
    """Durations in seconds per pod name, as the slice map needs them."""

    # Running pods whose Ray node is absent from the latest fresh reply: how long it has been.
    missing_s: Mapping[str, float] = field(default_factory=_empty)
    # Every pod: how long it has existed (provisioning age).
    age_s: Mapping[str, float] = field(default_factory=_empty)
    # Set while Ray's view may judge no slice broken; says why.
    settling: str | None = None
    # Pods whose live Ray node the daemon has seen (the deletion gate: "never had a node").
    seen: frozenset[str] = frozenset()

    @classmethod
    def from_timestamps(
        cls, hosts: Iterable[Host], joined: Iterable[str], now: datetime
    ) -> HostClock:
        """For one-shot use without history (offline `plan`): trust the pods' own timestamps."""
        hosts = hosts if isinstance(hosts, tuple | list) else list(hosts)
        present = joined if isinstance(joined, Mapping) else dict.fromkeys(joined)
        running = HostPhase.RUNNING
        created = {h.pod_name: h.created_at for h in hosts if h.created_at is not None}
        missing = {
            h.pod_name: max(0.0, (now - h.running_since).total_seconds())
            for h in hosts
            if h.phase is running and h.running_since is not None and h.pod_name not in present
        }

        def age(start: datetime) -> float:
            return max(0.0, (now - start).total_seconds())

        return cls(MappingProxyType(missing), Elapsed(created, age), seen=frozenset(present))
