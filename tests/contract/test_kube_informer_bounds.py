"""The informer's retry bounds against the API-server stand-in, on virtual time.

Every sleep the informer asks for is recorded and returns at once, so "seconds" below are the
informer's own backoff seconds, summed: the bounds are exact, never wall-clock timings.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence

import pytest
from kubernetes_asyncio.client import ApiClient

from kuberay_scaler.adapters.kube.informer import Change, Informer, Source
from kuberay_standins.apiserver import ApiServerStandIn
from tests.contract.conftest import NAMESPACE, eventually, pod, running, truth, view
from tests.contract.test_kube_informer import list_requests, watching

pytestmark = pytest.mark.contract


class VirtualTime:
    """The informer's clock and sleep: time passes only when the informer sleeps."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start
        self.slept: list[float] = []
        self.on_sleep: Callable[[], None] = lambda: None

    def clock(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        self.slept.append(delay)
        self.now += delay
        self.on_sleep()
        await asyncio.sleep(0)


async def test_a_watch_that_sees_one_event_then_410_again_and_again_relists_at_most_every_08_s(
    apiserver: ApiServerStandIn, api: ApiClient
) -> None:
    """Before: the event counted as progress, so each 410 relisted at once (80 LISTs in 20 s).

    Each LIST's virtual time is taken as the informer applies it (a relist notifies once, its
    request already recorded by the server), not read after this coroutine next looks: by then
    the informer may have slept again.
    """
    time = VirtualTime()
    list_times: list[float] = []

    def on_change(_: Sequence[Change]) -> None:
        if len(list_requests(apiserver)) > len(list_times):
            list_times.append(time.now)

    informer = Informer(
        api, Source.pods(NAMESPACE, "rc"), sleep=time.sleep, clock=time.clock, on_change=on_change
    )
    rounds = 12
    async with running(informer.run()):
        await watching(apiserver)
        for round_ in range(rounds):
            name = f"p{round_}"
            apiserver.create("pods", NAMESPACE, pod(name))  # the one event
            await eventually(lambda: name in informer.store, "event seen")  # noqa: B023
            apiserver.faults.expire_watches("pods")  # ... then 410
            await eventually(lambda: len(list_times) >= round_ + 2, "relist")  # noqa: B023
            await watching(apiserver, round_ + 2)
        await eventually(lambda: view(informer.store) == truth(apiserver), "synced")
    gaps = [later - earlier for earlier, later in itertools.pairwise(list_times)]
    assert len(list_requests(apiserver)) == len(list_times) == rounds + 1
    assert all(gap >= 0.8 for gap in gaps), gaps
    # It grows like client-go's (0.8 s doubling to 30 s): 12 rounds take minutes, not seconds.
    assert list_times[-1] - list_times[0] >= 60, gaps


async def test_a_routine_410_long_after_the_last_list_relists_at_once(
    apiserver: ApiServerStandIn, api: ApiClient
) -> None:
    """The bound is for storms: a 410 minutes after the last list is not delayed."""
    time = VirtualTime()
    informer = Informer(
        api, Source.pods(NAMESPACE, "rc"), silent_timeout=30, sleep=time.sleep, clock=time.clock
    )
    async with running(informer.run()):
        await watching(apiserver)
        apiserver.create("pods", NAMESPACE, pod("a"))
        await eventually(lambda: "a" in informer.store, "event seen")
        time.now += 300  # a healthy watch for five minutes
        apiserver.faults.expire_watches("pods")
        await eventually(lambda: len(list_requests(apiserver)) == 2, "relisted")
        await eventually(lambda: informer.synced and "a" in informer.store, "synced again")
    assert time.slept == []


async def test_after_25_s_of_refused_connections_it_is_synced_within_2_s_of_the_server(
    apiserver: ApiServerStandIn, api: ApiClient
) -> None:
    """Before: the error backoff had grown to 16-30 s, so /readyz stayed 503 ~25 s more.

    The informer's sleeps are virtual, so the whole outage can pass before this coroutine looks
    again: the server comes back from inside the informer's own sleep, and every change of
    `synced` is recorded with its virtual time as it happens (polling `synced` raced it: CI saw
    the outage already 4 s past its end when the test first noticed it had begun).
    """
    apiserver.create("pods", NAMESPACE, pod("a"))
    time = VirtualTime()
    seen: list[tuple[float, bool]] = []  # (virtual time, synced) after every applied change

    def on_change(_: Sequence[Change]) -> None:
        seen.append((time.now, informer.synced))

    informer = Informer(
        api, Source.pods(NAMESPACE, "rc"), sleep=time.sleep, clock=time.clock, on_change=on_change
    )
    async with running(informer.run()):
        await watching(apiserver)
        down_at = time.now
        back_at = down_at + 25.0

        def server_back() -> None:
            if apiserver.faults.refusing and time.now >= back_at:
                apiserver.faults.refuse_connections(False)

        time.on_sleep = server_back
        seen.clear()
        apiserver.faults.refuse_connections(True)
        await eventually(lambda: any(synced for _, synced in seen), "synced again", limit=60)
        await eventually(lambda: view(informer.store) == truth(apiserver), "store matches")
    assert not apiserver.faults.refusing
    assert seen[0][1] is False, seen[:3]  # the cut is noticed first
    synced_again_at = next(at for at, synced in seen if synced)
    assert all(not synced for at, synced in seen if at < back_at), seen
    assert back_at <= synced_again_at <= back_at + 2.0, (synced_again_at - back_at, time.slept)


async def test_after_a_410_storm_a_watch_that_ran_calmly_relists_at_once(
    apiserver: ApiServerStandIn, api: ApiClient
) -> None:
    """After a watch-event storm (a burst of 410s) the relist backoff had grown, and
    the next 410, after a calm watch of 20 s, waited it out: the pod cache stayed unsynced for
    10-30 s. A watch that ran calmly (10 s) ends the storm: the next 410 relists at once."""
    time = VirtualTime()
    seen: list[tuple[float, bool]] = []

    def on_change(_: Sequence[Change]) -> None:
        seen.append((time.now, informer.synced))

    informer = Informer(
        api, Source.pods(NAMESPACE, "rc"), sleep=time.sleep, clock=time.clock, on_change=on_change
    )
    storm = 6
    async with running(informer.run()):
        await watching(apiserver)
        for round_ in range(storm):  # the storm: one event, then 410, again and again
            name = f"p{round_}"
            apiserver.create("pods", NAMESPACE, pod(name))
            await eventually(lambda: name in informer.store, "event seen")  # noqa: B023
            apiserver.faults.expire_watches("pods")
            await eventually(lambda: len(list_requests(apiserver)) >= round_ + 2, "relist")  # noqa: B023
            await watching(apiserver, round_ + 2)
        assert len(time.slept) >= storm - 1  # the storm was paced
        time.now += 20.0  # then a calm watch, 20 s long
        seen.clear()
        cut_at = time.now
        apiserver.faults.expire_watches("pods")
        await eventually(lambda: len(list_requests(apiserver)) >= storm + 2, "relisted")
        await eventually(lambda: view(informer.store) == truth(apiserver), "synced again")
    synced_again_at = next(at for at, synced in seen if synced)
    assert synced_again_at - cut_at < 2.0, (synced_again_at - cut_at, time.slept)
