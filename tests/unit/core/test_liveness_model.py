"""The liveness tracker against a plain model of what it must remember (hypothesis).

The tracker keeps last-seen times only for instances that left the latest fresh reply (a reply
like the last costs no walk of its nodes); the model keeps, the plain way, the time of the last
fresh reply that showed each instance alive. Whatever the sequence of pod listings, fresh
replies, unknown spells and gaps, the two must give the same missing times and the same set of
instances seen.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from kuberay_scaler.core.liveness import LivenessTracker
from kuberay_scaler.core.model.cluster import EMPTY
from kuberay_scaler.core.model.hosts import Host, HostPhase

NAMES = ("a", "b", "c", "d", "e")
STALE_S = 15.0


def host(name: str) -> Host:
    return Host(
        pod_name=name, group="g", is_head=False, phase=HostPhase.RUNNING, detail="",
        labels=EMPTY, node_name=None, created_at=None, slice_key=name, replica_index=None,
        host_index=None, uid=f"uid-{name}",
    )  # fmt: skip


@dataclass
class Model:
    """What the tracker must know, kept the plain way."""

    first_running: dict[str, float] = field(default_factory=dict)
    last_seen: dict[str, float] = field(default_factory=dict)
    latest: frozenset[str] = frozenset()
    streak_start: float | None = None
    last_fresh: float | None = None

    def pods(self, now: float, names: set[str]) -> None:
        self.first_running = {n: self.first_running.get(n, now) for n in names}

    def ray(self, now: float, alive: frozenset[str] | None) -> None:
        if alive is None:
            self.streak_start = self.last_fresh = None
            return
        if self.last_fresh is not None and now - self.last_fresh > STALE_S:
            self.streak_start = None
        if self.streak_start is None:
            self.streak_start = now
        self.last_fresh = now
        self.latest = alive
        self.last_seen.update(dict.fromkeys(alive, now))
        for name in [n for n in self.last_seen if n not in self.first_running]:
            if name not in alive:
                del self.last_seen[name]

    def missing(self, now: float) -> dict[str, float]:
        if self.streak_start is None:
            return {}
        out = {}
        for name, running in self.first_running.items():
            if name in self.latest:
                continue
            since = max(self.last_seen.get(name, running), running, self.streak_start)
            out[name] = max(0.0, now - since)
        return out


STEPS = st.lists(
    st.tuples(
        st.sampled_from(["pods", "ray", "same", "unknown"]),
        st.sets(st.sampled_from(NAMES)),
        st.sampled_from([0.5, 1.0, 3.0, 20.0]),  # time to the step (20 s: a stale gap)
    ),
    min_size=1,
    max_size=25,
)


@given(steps=STEPS)
@settings(max_examples=200, deadline=None)
def test_the_tracker_remembers_what_a_plain_last_seen_map_would(
    steps: list[tuple[str, set[str], float]],
) -> None:
    tracker = LivenessTracker(grace_s=60.0, stale_after_s=STALE_S)
    model = Model()
    now, last_alive = 100.0, frozenset[str]()
    for kind, names, dt in steps:
        now += dt
        if kind == "pods":
            tracker.observe_pods(now, [host(n) for n in sorted(names)])
            model.pods(now, names)
        elif kind == "unknown":
            tracker.observe_ray(now, "epoch", None)
            model.ray(now, None)
        else:
            # "same": the very set object of the last reply (the poller's unchanged state)
            alive = last_alive if kind == "same" else frozenset(names)
            tracker.observe_ray(now, "epoch", alive)
            model.ray(now, alive)
            last_alive = alive
        clock = tracker.clock(now)
        assert dict(clock.missing_s) == model.missing(now)
        assert clock.seen == frozenset(model.last_seen)
