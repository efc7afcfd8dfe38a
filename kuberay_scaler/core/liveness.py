"""When did the daemon itself last see each Ray node and each pod? Pure, on the monotonic clock.

The slice map must not judge a slice broken from one GCS reply that lacks its nodes (a GCS restart
window, a partial reply), nor from API-server timestamps compared with the daemon's wall clock
(clock skew). So the daemon keeps its own memory:

- a Ray node is missing only over consecutive fresh GCS replies without it, counted from when the
  daemon last saw it (or, never seen, from when the daemon first saw its pod Running);
- a fresh streak starts again after any unknown spell, a gap longer than `stale_after_s`, or a new
  GCS epoch (cluster id or restart): until one full grace of fresh replies has passed, Ray's view
  judges no slice broken (`HostClock.settling`);
- provisioning timers run from when the daemon first saw each pod. After a daemon restart they
  start again: a timer is never shorter than the truth, so nothing is replaced early.

`LivenessTracker` is the only stateful part; it takes `now` as an argument and never reads a clock.
`HostClock` is the frozen view of it that the pure slice map reads.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from types import MappingProxyType

from kuberay_scaler.core.model.hosts import Elapsed, Host, HostClock, HostPhase

__all__ = ["HostClock", "LivenessTracker"]


@dataclass
class _Pod:
    uid: str
    first_seen: float
    first_running: float | None = None


class LivenessTracker:
    """Remembers what fresh GCS replies and pod listings showed, and when (monotonic seconds)."""

    def __init__(self, *, grace_s: float, stale_after_s: float) -> None:
        if grace_s <= 0 or stale_after_s <= 0:
            raise ValueError("grace_s and stale_after_s must be positive")
        self._grace_s = grace_s
        self._stale_after_s = stale_after_s
        self._pods: dict[str, _Pod] = {}
        self._first_seen: dict[str, float] = {}  # pod name -> first seen; new per listing
        self._latest: frozenset[str] = frozenset()  # alive instances in the latest fresh reply
        self._latest_at: float | None = None  # when it came (an unknown spell keeps it)
        # Instances seen alive before but not in the latest fresh reply -> when last seen alive.
        # (Those in it were seen at `_latest_at`: a reply like the last costs no walk of them.)
        self._seen_before: dict[str, float] = {}
        self._seen: frozenset[str] | None = None  # latest | seen_before, built when asked
        self._streak_start: float | None = None  # first reply of the current fresh streak
        self._last_fresh: float | None = None
        self._epoch: object = None
        self._settle_cause = "no GCS reply yet"

    def observe_pods(self, now: float, hosts: Iterable[Host]) -> None:
        """Record the pods of one listing; pods no longer listed are forgotten."""
        current: dict[str, _Pod] = {}
        first_seen: dict[str, float] = {}
        for host in hosts:
            known = self._pods.get(host.pod_name)
            if known is None or (host.uid and known.uid and host.uid != known.uid):
                known = _Pod(uid=host.uid, first_seen=now)  # new pod, or a new one of that name
            if host.phase is HostPhase.RUNNING and known.first_running is None:
                known.first_running = now
            current[host.pod_name] = known
            first_seen[host.pod_name] = known.first_seen
        self._pods = current
        self._first_seen = first_seen  # a new dict: clocks handed out keep theirs

    def observe_ray(self, now: float, epoch: object, alive: Iterable[str] | None) -> None:
        """Record one GCS observation: alive instance ids, or None when the reply is unknown."""
        if alive is None:
            self._end_streak("GCS unreachable")
            return
        if self._epoch is not None and epoch != self._epoch:
            self._end_streak("new GCS (restarted or replaced)")
        elif self._last_fresh is not None and now - self._last_fresh > self._stale_after_s:
            self._end_streak(f"no fresh GCS reply for {now - self._last_fresh:.0f} s")
        self._epoch = epoch
        if self._streak_start is None:
            self._streak_start = now
        self._last_fresh = now
        latest = frozenset(alive)  # the same object when `alive` is the last reply's set
        if latest is not self._latest and latest != self._latest:
            self._replace_latest(latest)
        self._latest_at = now
        # Forget nodes of pods that are gone, so the map does not grow without bound.
        gone = [i for i in self._seen_before if i not in self._pods]
        for instance in gone:
            del self._seen_before[instance]
        if gone:
            self._seen = None

    def _replace_latest(self, latest: frozenset[str]) -> None:
        if self._latest_at is not None:
            for instance in self._latest - latest:
                self._seen_before[instance] = self._latest_at
        for instance in [i for i in self._seen_before if i in latest]:
            del self._seen_before[instance]
        self._latest = latest
        self._seen = None

    def _end_streak(self, cause: str) -> None:
        if self._streak_start is not None:
            self._settle_cause = cause
        self._streak_start = None
        self._last_fresh = None

    def clock(self, now: float) -> HostClock:
        """The view the slice map reads at monotonic time `now`."""

        def age(first_seen: float) -> float:
            return max(0.0, now - first_seen)

        return HostClock(
            missing_s=MappingProxyType(self._missing(now)),
            age_s=Elapsed(self._first_seen, age),
            settling=self._settling(now),
            seen=self._seen_instances(),
        )

    def _seen_instances(self) -> frozenset[str]:
        """Every instance a fresh reply showed alive and not forgotten."""
        if self._seen is None:
            self._seen = self._latest.union(self._seen_before)
        return self._seen

    def _settling(self, now: float) -> str | None:
        if self._streak_start is None:
            return f"{self._settle_cause}: Ray's view judges no slice"
        fresh_for = now - self._streak_start
        if fresh_for < self._grace_s:
            return (
                f"{self._settle_cause}; fresh GCS replies for {fresh_for:.0f} s of the"
                f" {self._grace_s:.0f} s grace: no slice judged broken by Ray's view yet"
            )
        return None

    def _missing(self, now: float) -> dict[str, float]:
        if self._streak_start is None:
            return {}
        out: dict[str, float] = {}
        for name, pod in self._pods.items():
            if pod.first_running is None or name in self._latest:
                continue
            since = max(self._seen_before.get(name, pod.first_running), pod.first_running)
            out[name] = max(0.0, now - max(since, self._streak_start))
        return out
