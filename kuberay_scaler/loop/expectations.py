"""Expectations: remember what we just wrote until the cache shows it (time passed in).

After a patch the cached RayCluster can lag behind (a watch event in flight, or poll mode's next
GET). Planning from that stale copy would scale the same group up a second time. So after a
write the loop calls `expect(...)`, and plans nothing for a group while `pending(...)` is True:
until the observed group shows the written values, or `timeout` seconds pass (the write may
have been overwritten by someone else; then the fresh state is the truth to plan from).

`pending` only reads; `settle` (once per observation) drops what was met, timed out or whose
group is gone, so asking twice never changes the answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kuberay_scaler.core.defaults import WRITE_EXPECTATION_TIMEOUT_S


class ObservedGroup(Protocol):
    """What an expectation compares (model.cluster.WorkerGroup has it)."""

    @property
    def replicas(self) -> int: ...

    @property
    def workers_to_delete(self) -> tuple[str, ...]: ...


@dataclass(frozen=True)
class Expectation:
    """Values written to one worker group; None means "not written, don't check"."""

    replicas: int | None
    workers_to_delete: tuple[str, ...] | None
    deadline: float

    def met_by(self, group: ObservedGroup) -> bool:
        if self.replicas is not None and group.replicas != self.replicas:
            return False
        if self.workers_to_delete is None:
            return True
        return sorted(group.workers_to_delete) == sorted(self.workers_to_delete)


@dataclass
class Expectations:
    """Per-group expectations; `timeout` in the same unit as `now` (monotonic seconds)."""

    timeout: float = WRITE_EXPECTATION_TIMEOUT_S
    _by_group: dict[str, Expectation] = field(default_factory=dict)

    def expect(
        self,
        group: str,
        *,
        replicas: int | None = None,
        workers_to_delete: Sequence[str] | None = None,
        now: float,
    ) -> None:
        """Record a write to `group`; replaces any earlier expectation for it."""
        self._by_group[group] = Expectation(
            replicas=replicas,
            workers_to_delete=None if workers_to_delete is None else tuple(workers_to_delete),
            deadline=now + self.timeout,
        )

    def pending(self, group: str, observed: ObservedGroup | None, now: float) -> bool:
        """True while `group`'s last write is neither observed nor timed out. A group missing
        from the observed RayCluster (`None`) cannot show our write: its absence is the truth."""
        expectation = self._by_group.get(group)
        if expectation is None or observed is None or now >= expectation.deadline:
            return False
        return not expectation.met_by(observed)

    def settle(self, observed: Mapping[str, ObservedGroup], now: float) -> None:
        """Drop every expectation that is no longer pending against `observed`."""
        for name in [n for n in self._by_group if not self.pending(n, observed.get(n), now)]:
            del self._by_group[name]

    def forget(self, group: str | None = None) -> None:
        """Drop one group's expectation, or all of them (e.g. the RayCluster's UID changed)."""
        if group is None:
            self._by_group.clear()
        else:
            self._by_group.pop(group, None)

    def groups(self) -> frozenset[str]:
        """Groups with an expectation still recorded (met or not yet settled)."""
        return frozenset(self._by_group)
