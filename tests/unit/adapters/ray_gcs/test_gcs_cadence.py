"""The GCS poll cadence (adapters/ray_gcs/cadence.py) and what the poller charges to it.

What must hold: an idle cluster is polled at the target interval while that costs at most the
idle cap of a core, and further apart (cost / cap) beyond it, never past the configured ceiling;
moving state and pending demand are polled faster, never slower than idle. A poll is charged its
own synchronous work only: CPU that other coroutines burn while the RPC is awaited is not its.
Clocks are injected: nothing here depends on how fast the machine is.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from ray.core.generated import autoscaler_pb2

from kuberay_scaler.adapters.ray_gcs.cadence import (
    BUSY_FLOOR_S,
    IDLE_CAP,
    IDLE_INTERVAL_S,
    IDLE_MID_CAP,
    IDLE_MID_MAX_S,
    Cadence,
)
from kuberay_scaler.adapters.ray_gcs.poller import GcsPoller
from kuberay_scaler.core.model.ray import RayObservation
from tests.factories import one_node_reply

IDLE = autoscaler_pb2.NodeStatus.Value("IDLE")
RUNNING = autoscaler_pb2.NodeStatus.Value("RUNNING")
QUIET = {"demand_pending": False, "last_change": 0.0, "now": 100.0}
PENDING = {"demand_pending": True, "last_change": 0.0, "now": 100.0}
MOVED = {"demand_pending": False, "last_change": 98.0, "now": 100.0}


def test_idle_small_clusters_are_polled_at_the_target_interval() -> None:
    cadence = Cadence(ceiling_s=5.0)
    assert IDLE_INTERVAL_S == 0.4
    assert cadence.next_interval(cost_s=0.0, **QUIET) == IDLE_INTERVAL_S
    assert cadence.next_interval(cost_s=0.0005, **QUIET) == IDLE_INTERVAL_S  # 100 pods
    # Up to 0.5 % of a core the target holds: 2 ms every 0.4 s.
    assert cadence.next_interval(cost_s=0.002, **QUIET) == pytest.approx(IDLE_INTERVAL_S)


def test_polls_that_are_not_cheap_keep_to_the_mid_cap_for_at_most_0_6_s() -> None:
    cadence = Cadence(ceiling_s=5.0)
    assert IDLE_MID_MAX_S == 0.6
    # 1k nodes, ~2.5 ms a poll: 0.5 % of a core, 0.5 s apart.
    assert cadence.next_interval(cost_s=0.0025, **QUIET) == pytest.approx(0.0025 / IDLE_MID_CAP)
    assert cadence.next_interval(cost_s=0.005, **QUIET) == pytest.approx(IDLE_MID_MAX_S)
    # Costlier polls (10k nodes, ~18 ms quiet) wait 0.6 s, until the 5 % cap asks for more.
    assert cadence.next_interval(cost_s=0.018, **QUIET) == pytest.approx(IDLE_MID_MAX_S)
    assert cadence.next_interval(cost_s=0.03, **QUIET) == pytest.approx(IDLE_MID_MAX_S)
    assert cadence.next_interval(cost_s=0.04, **QUIET) == pytest.approx(0.8)


def test_idle_polls_above_the_cap_stretch_to_cost_over_cap_up_to_the_ceiling() -> None:
    cadence = Cadence(ceiling_s=5.0)
    # 10k nodes: ~60 ms of own work a poll under load -> 1.2 s apart, 5 % of a core.
    assert cadence.next_interval(cost_s=0.06, **QUIET) == pytest.approx(0.06 / IDLE_CAP)
    assert cadence.next_interval(cost_s=0.06, **QUIET) == pytest.approx(1.2)
    assert cadence.next_interval(cost_s=0.2, **QUIET) == pytest.approx(4.0)
    assert cadence.next_interval(cost_s=1.0, **QUIET) == 5.0  # the ceiling


def test_moving_state_and_pending_demand_poll_faster_never_slower_than_idle() -> None:
    cadence = Cadence(ceiling_s=5.0)
    assert cadence.next_interval(cost_s=0.0005, **MOVED) == BUSY_FLOOR_S
    assert cadence.next_interval(cost_s=0.0005, **PENDING) == BUSY_FLOOR_S
    assert cadence.next_interval(cost_s=0.002, **PENDING) == pytest.approx(0.2)  # 1 % of a core
    assert cadence.next_interval(cost_s=0.01, **MOVED) == pytest.approx(0.2)  # 5 % of a core
    # Where the busy budget would wait longer than idle does, idle's interval holds.
    assert cadence.next_interval(cost_s=0.03, **PENDING) == pytest.approx(IDLE_MID_MAX_S)
    assert cadence.next_interval(cost_s=0.08, **PENDING) == pytest.approx(1.6)
    for cost in (0.0, 0.001, 0.01, 0.03, 0.1, 0.5, 2.0):
        idle = cadence.next_interval(cost_s=cost, **QUIET)
        assert cadence.next_interval(cost_s=cost, **PENDING) <= idle
        assert cadence.next_interval(cost_s=cost, **MOVED) <= idle


def test_the_ceiling_wins_even_below_the_target() -> None:
    assert Cadence(ceiling_s=0.1).next_interval(cost_s=0.0005, **QUIET) == 0.1
    assert Cadence(ceiling_s=0.1).next_interval(cost_s=0.5, **MOVED) == 0.1
    assert Cadence(ceiling_s=1.0).next_interval(cost_s=0.5, **QUIET) == 1.0


def test_the_moving_window_ends_five_seconds_after_the_change() -> None:
    cadence = Cadence(ceiling_s=5.0)
    assert cadence.next_interval(cost_s=0.0, demand_pending=False, last_change=95.1, now=100.0) == (
        BUSY_FLOOR_S
    )
    assert cadence.next_interval(cost_s=0.0, demand_pending=False, last_change=95.0, now=100.0) == (
        IDLE_INTERVAL_S
    )


# ---- what a poll is charged -----------------------------------------------------------------


class _Cpu:
    """A CPU clock only the test moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _BytesSource:
    """Like `GcsClient`: the reply as bytes. While a call is in flight, another task runs (the
    test's `busy`), as the event loop runs a reconcile or pod events during a real RPC."""

    cluster_id = "A"

    def __init__(self, replies: list[bytes], busy: asyncio.Event, done: asyncio.Event) -> None:
        self.replies, self.busy, self.done = replies, busy, done

    async def get_cluster_resource_state(self) -> Any:  # never used when the bytes call exists
        raise AssertionError("the poller should read bytes")

    async def get_cluster_resource_state_bytes(self) -> bytes:
        self.done.clear()
        self.busy.set()
        await self.done.wait()  # the other task runs now
        return self.replies.pop(0)


def test_cpu_other_coroutines_burn_during_the_call_is_not_charged_to_the_poll() -> None:
    cpu, clock = _Cpu(), _Cpu()
    own_s, reconcile_s = 0.001, 2.0

    def own_work(_: RayObservation) -> None:
        cpu.now += own_s  # what the poll itself does with the reply (here: after the parse)

    async def run() -> list[float]:
        busy, done = asyncio.Event(), asyncio.Event()
        replies = [one_node_reply(v, idle_ms=1000 * v).SerializeToString() for v in range(1, 8)]
        poller = GcsPoller(
            _BytesSource(replies, busy, done),
            interval_s=5.0,
            cpu_clock=cpu,
            monotonic=clock,
            on_observation=own_work,
        )

        async def reconciler() -> None:  # a 2 s reconcile during every poll's await
            while True:
                await busy.wait()
                busy.clear()
                cpu.now += reconcile_s
                await asyncio.sleep(0)
                done.set()

        other = asyncio.create_task(reconciler())
        charged = []
        for _ in range(7):
            observation = await poller.poll_once()
            assert observation.known
            charged.append(poller.last_poll_cpu_s)
        other.cancel()
        clock.now += 10.0  # the first poll's change is 10 s old: idle
        assert poller.next_interval() == IDLE_INTERVAL_S  # charged 1 ms, not 2 s
        return charged

    assert asyncio.run(run()) == pytest.approx([own_s] * 7)


def test_the_charge_is_the_median_of_the_last_polls_so_one_full_parse_does_not_space_them() -> None:
    cpu = _Cpu()
    costs = iter([0.3, 0.002, 0.002, 0.002])

    def own_work(_: RayObservation) -> None:
        cpu.now += next(costs)

    class Source:
        cluster_id = "A"
        version = 0

        async def get_cluster_resource_state(self) -> Any:
            self.version += 1
            return one_node_reply(self.version, idle_ms=1000 * self.version)

    async def run() -> list[float]:
        poller = GcsPoller(Source(), interval_s=5.0, cpu_clock=cpu, on_observation=own_work)
        charged = []
        for _ in range(4):
            await poller.poll_once()
            charged.append(poller._last_cost_s)
        return charged

    # The first (a full parse, 300 ms) is charged alone; two cheap polls outvote it.
    assert asyncio.run(run()) == pytest.approx([0.3, 0.151, 0.002, 0.002])


def test_a_reply_that_does_not_decode_is_unusable_and_no_new_epoch() -> None:
    class Source:
        cluster_id = "A"

        def __init__(self) -> None:
            self.replies = [
                one_node_reply(1, idle_ms=1000).SerializeToString(),
                b"\xff\xff\xff",
                one_node_reply(2, idle_ms=2000),
            ]

        async def get_cluster_resource_state(self) -> Any:
            raise AssertionError("the poller should read bytes")

        async def get_cluster_resource_state_bytes(self) -> Any:
            return self.replies.pop(0)

    async def run() -> list[RayObservation]:
        poller = GcsPoller(Source(), interval_s=5.0)
        return [await poller.poll_once() for _ in range(3)]

    first, garbage, after = asyncio.run(run())
    assert first.known and after.known
    assert not garbage.known and garbage.unusable
    assert garbage.error is not None and "cannot decode" in garbage.error
    assert (first.epoch, garbage.epoch, after.epoch) == (0, 0, 0)


def _polled_intervals(replies: list[Any]) -> list[float]:
    """Poll `replies` 0.4 s apart on a fake clock; the interval asked after each poll."""
    clock = _Cpu()

    class Source:
        cluster_id = "A"

        async def get_cluster_resource_state(self) -> Any:
            return replies.pop(0)

    async def run() -> list[float]:
        poller = GcsPoller(Source(), interval_s=5.0, monotonic=clock, cpu_clock=_Cpu())
        asked = []
        while replies:
            await poller.poll_once()
            asked.append(poller.next_interval())
            clock.now += 0.4
        return asked

    return asyncio.run(run())


@pytest.mark.parametrize(
    "replies",
    [
        # Two answers that contradict each other, one poll the one, the next the other (two GCS
        # behind one address, or a flapping one): the same two states, again and again.
        [one_node_reply(v, status=RUNNING if v % 2 else IDLE) for v in range(1, 61)],
        # A version that goes back every other poll (each looks like a GCS restart).
        [one_node_reply(10 - v % 2, status=RUNNING) for v in range(60)],
    ],
    ids=["content", "version"],
)
def test_contradictory_replies_do_not_speed_the_polls_up(replies: list[Any]) -> None:
    """Each flip counted as the state moving: polled at the 0.1 s floor, not 0.4."""
    asked = _polled_intervals(replies)
    assert asked[-1] == IDLE_INTERVAL_S, asked[-10:]


def test_a_state_that_keeps_moving_to_new_contents_is_still_polled_fast() -> None:
    replies = [
        one_node_reply(1, idle_ms=1000),
        *(one_node_reply(v, status=RUNNING) for v in range(2, 5)),
    ]
    for v, reply in enumerate(replies):
        reply.cluster_resource_state.node_states[0].instance_id = f"pod-{v}"
    assert _polled_intervals(replies)[-1] == BUSY_FLOOR_S
