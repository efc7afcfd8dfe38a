"""Pod informer against the API-server stand-in: catalogue rows 1-3 (server down, watch cut or
hung, 410 Gone). Every test ends with the cache equal to the server's truth."""

from __future__ import annotations

import asyncio

import pytest
from kubernetes_asyncio.client import ApiClient

from kuberay_scaler.adapters.kube.informer import Informer, Source
from kuberay_scaler.adapters.kube.transport import MAX_RETRY_AFTER_S
from kuberay_scaler.core.backoff import Backoff
from kuberay_scaler.runtime.metrics import KubeCounters
from kuberay_standins.apiserver import ApiServerStandIn
from tests.contract.conftest import (
    NAMESPACE,
    ChangeLog,
    eventually,
    metric,
    pod,
    running,
    truth,
    view,
)

pytestmark = pytest.mark.contract

RESTARTS = "kuberay_scaler_watch_restarts_total"


class RecordingBackoff(Backoff):
    """Short real delays; remembers each one so a test can see the backoff grow."""

    def __init__(self) -> None:
        super().__init__(initial=0.02, cap=0.2)
        self.delays: list[float] = []

    def next_delay(self) -> float:
        delay = super().next_delay()
        self.delays.append(delay)
        return delay


def pod_informer(
    api: ApiClient,
    *,
    silent_timeout: float = 5.0,
    on_change: ChangeLog | None = None,
    counters: KubeCounters | None = None,
) -> tuple[Informer, RecordingBackoff]:
    backoff = RecordingBackoff()
    informer = Informer(
        api,
        Source.pods(NAMESPACE, "rc"),
        silent_timeout=silent_timeout,
        page_size=2,  # the paging path is exercised with a handful of pods
        backoff=backoff,
        on_change=on_change,
        counters=counters,
    )
    return informer, backoff


def watch_requests(server: ApiServerStandIn) -> list[dict[str, str]]:
    return [r.query for r in server.requests if r.path.endswith("/pods") and "watch" in r.query]


def list_requests(server: ApiServerStandIn) -> list[dict[str, str]]:
    return [r.query for r in server.requests if r.path.endswith("/pods") and "watch" not in r.query]


async def watching(server: ApiServerStandIn, count: int = 1) -> None:
    """Wait until `count` pod watches have been answered 200 (the latest is then open)."""

    def opened() -> int:
        return sum(
            1
            for r in server.requests
            if r.path.endswith("/pods") and "watch" in r.query and r.status == 200
        )

    await eventually(lambda: opened() >= count, f"{count} pod watch(es) opened")


def mirrors(informer: Informer, server: ApiServerStandIn) -> bool:
    return informer.synced and view(informer.store) == truth(server)


async def test_lists_pages_then_watches_only_its_cluster(
    apiserver: ApiServerStandIn, api: ApiClient
) -> None:
    for name in ("a", "b", "c"):
        apiserver.create("pods", NAMESPACE, pod(name, node="n1"))
    apiserver.create("pods", NAMESPACE, pod("other", cluster="someone-else"))
    listed_at = str(apiserver.resource_version)
    changes = ChangeLog()
    informer, _ = pod_informer(api, on_change=changes)
    assert not informer.synced
    async with running(informer.run()):
        await informer.wait_synced()
        assert view(informer.store) == truth(apiserver)
        apiserver.create("pods", NAMESPACE, pod("d"))
        apiserver.delete("pods", NAMESPACE, "a")  # scheduled: only gets a deletionTimestamp
        apiserver.delete("pods", NAMESPACE, "d")  # unscheduled: gone at once
        await eventually(lambda: mirrors(informer, apiserver), "cache follows the watch")
    assert "a" in informer.store
    assert informer.store["a"]["metadata"].get("deletionTimestamp")
    assert "other" not in informer.store
    assert any(c.type == "DELETED" and c.name == "d" for c in changes.changes)
    assert len(list_requests(apiserver)) >= 2  # three pods in pages of two
    first_watch = watch_requests(apiserver)[0]
    assert first_watch["allowWatchBookmarks"] == "true"
    assert first_watch["labelSelector"] == "ray.io/cluster=rc"
    assert first_watch["resourceVersion"] == listed_at  # from the list's snapshot, no gap


async def test_server_down_at_start_backs_off_then_syncs(
    apiserver: ApiServerStandIn, api: ApiClient
) -> None:
    apiserver.create("pods", NAMESPACE, pod("a"))
    apiserver.faults.refuse_connections(True)
    informer, backoff = pod_informer(api)
    async with running(informer.run()):
        await eventually(lambda: len(backoff.delays) >= 4, "several failed attempts")
        assert not informer.synced
        assert informer.store == {}
        apiserver.create("pods", NAMESPACE, pod("b"))
        apiserver.faults.refuse_connections(False)
        await eventually(lambda: mirrors(informer, apiserver), "syncs once the server is back")
    steps = [min(0.2, 0.02 * 2**i) for i in range(4)]
    assert all(
        step / 2 <= delay <= step for step, delay in zip(steps, backoff.delays, strict=False)
    )
    assert set(informer.store) == {"a", "b"}


async def test_server_down_mid_run_unsyncs_and_recovers_without_loss(
    apiserver: ApiServerStandIn, api: ApiClient
) -> None:
    apiserver.create("pods", NAMESPACE, pod("a"))
    apiserver.create("pods", NAMESPACE, pod("b"))
    counters = KubeCounters.new()
    informer, backoff = pod_informer(api, counters=counters)
    async with running(informer.run()):
        await watching(apiserver)
        errors_before = metric(counters, RESTARTS, resource="pods", cause="error")
        apiserver.faults.refuse_connections(True)
        await eventually(lambda: not informer.synced, "cache reports it is not synced")
        apiserver.delete("pods", NAMESPACE, "a")
        apiserver.create("pods", NAMESPACE, pod("c"))
        await eventually(lambda: len(backoff.delays) >= 2, "retries with backoff")
        apiserver.faults.refuse_connections(False)
        await eventually(lambda: mirrors(informer, apiserver), "recovers to the server's truth")
    assert set(informer.store) == {"b", "c"}
    assert metric(counters, RESTARTS, resource="pods", cause="error") > errors_before


async def test_clean_watch_end_resumes_from_last_rv_without_relist(
    apiserver: ApiServerStandIn, api: ApiClient
) -> None:
    apiserver.create("pods", NAMESPACE, pod("a"))
    informer, _ = pod_informer(api)
    async with running(informer.run()):
        await watching(apiserver)
        apiserver.create("pods", NAMESPACE, pod("b"))
        await eventually(lambda: "b" in informer.store, "event before the cut")
        lists_before = len(list_requests(apiserver))
        last_seen = informer.resource_version
        assert apiserver.faults.drop_watches("pods") == 1
        apiserver.create("pods", NAMESPACE, pod("c"))  # happens while no watch is open
        await eventually(lambda: mirrors(informer, apiserver), "event during the gap arrives")
        assert informer.synced
    assert len(list_requests(apiserver)) == lists_before
    resumed = [q["resourceVersion"] for q in watch_requests(apiserver)[1:]]
    assert resumed and int(resumed[0]) >= int(last_seen or 0)


async def test_silent_watch_is_abandoned_and_reopened(
    apiserver: ApiServerStandIn, api: ApiClient
) -> None:
    counters = KubeCounters.new()
    # bookmarks come every 0.1 s
    informer, _ = pod_informer(api, silent_timeout=0.5, counters=counters)
    async with running(informer.run()):
        await watching(apiserver)
        silent_before = metric(counters, RESTARTS, resource="pods", cause="silent")
        assert apiserver.faults.stall_watches("pods") == 1
        apiserver.create("pods", NAMESPACE, pod("a"))  # never sent on the stalled stream
        await eventually(lambda: mirrors(informer, apiserver), "reconnect delivers the pod")
    assert metric(counters, RESTARTS, resource="pods", cause="silent") > silent_before
    assert len(list_requests(apiserver)) == 1  # resumed by resourceVersion, no relist


async def test_410_in_stream_relists_and_synthesizes_deletions(
    apiserver: ApiServerStandIn, api: ApiClient
) -> None:
    for name in ("a", "b"):
        apiserver.create("pods", NAMESPACE, pod(name))
    changes = ChangeLog()
    informer, _ = pod_informer(api, silent_timeout=30, on_change=changes)
    async with running(informer.run()):
        await watching(apiserver)
        assert apiserver.faults.stall_watches("pods") == 1  # the informer misses what follows
        apiserver.delete("pods", NAMESPACE, "a")
        apiserver.create("pods", NAMESPACE, pod("c"))
        apiserver.compact()
        assert apiserver.faults.expire_watches("pods") == 1
        await eventually(lambda: mirrors(informer, apiserver), "relist replaces the store")
    deleted = [c for c in changes.changes if c.type == "DELETED"]
    assert [(c.name, c.synthesized) for c in deleted] == [("a", True)]
    assert set(informer.store) == {"b", "c"}
    assert len(list_requests(apiserver)) == 2


async def test_410_on_watch_request_relists_and_synthesizes_deletions(
    apiserver: ApiServerStandIn, api: ApiClient
) -> None:
    for name in ("a", "b"):
        apiserver.create("pods", NAMESPACE, pod(name))
    changes = ChangeLog()
    counters = KubeCounters.new()
    informer, _ = pod_informer(api, silent_timeout=30, on_change=changes, counters=counters)
    async with running(informer.run()):
        await watching(apiserver)
        gone_before = metric(counters, RESTARTS, resource="pods", cause="gone")
        assert apiserver.faults.stall_watches("pods") == 1
        apiserver.delete("pods", NAMESPACE, "b")
        apiserver.compact()
        apiserver.faults.drop_watches("pods")  # re-watch from an RV older than the history
        await eventually(lambda: mirrors(informer, apiserver), "relist after HTTP 410")
    assert [c.name for c in changes.changes if c.type == "DELETED" and c.synthesized] == ["b"]
    assert metric(counters, RESTARTS, resource="pods", cause="gone") > gone_before
    assert set(informer.store) == {"a"}


async def test_server_errors_on_watch_back_off_and_recover(
    apiserver: ApiServerStandIn, api: ApiClient
) -> None:
    informer, backoff = pod_informer(api)
    async with running(informer.run()):
        await watching(apiserver)
        apiserver.faults.fail_next("GET", r"watch=", 500, count=3)
        assert apiserver.faults.drop_watches("pods") == 1
        apiserver.create("pods", NAMESPACE, pod("a"))
        await eventually(lambda: len(backoff.delays) >= 3, "each 500 backs off")
        await eventually(lambda: mirrors(informer, apiserver), "recovers after the errors")
    assert "a" in informer.store


class VirtualSleep:
    """Records every backoff the informer asks for and returns at once: a minute of backoff
    passes in well under a second, so the bound below is exact, not a timing."""

    def __init__(self, stop_after: float = float("inf")) -> None:
        self.slept: list[float] = []
        self._stop_after = stop_after

    async def __call__(self, delay: float) -> None:
        self.slept.append(delay)
        if self.total >= self._stop_after:
            await asyncio.Event().wait()  # the virtual minute is over: nothing more happens
        await asyncio.sleep(0)

    @property
    def total(self) -> float:
        return sum(self.slept)


async def test_410_storm_relists_with_growing_jittered_backoff(
    apiserver: ApiServerStandIn, api: ApiClient
) -> None:
    """Catalogue row 3 under a storm: every watch answers 410. Before: 215-805 LISTs in 6 s."""
    for name in ("a", "b"):
        apiserver.create("pods", NAMESPACE, pod(name))
    sleep = VirtualSleep(stop_after=60)
    informer = Informer(api, Source.pods(NAMESPACE, "rc"), sleep=sleep)
    apiserver.faults.fail_next("GET", r"watch=", 410, count=1_000_000)
    async with running(informer.run()):
        await eventually(
            lambda: sleep.total >= 60 or len(list_requests(apiserver)) > 50, "a minute"
        )
    lists = len(list_requests(apiserver))
    # Backoff 0.8 s doubling to 30 s, jitter in [0.5, 1]: at most ~10 LISTs in a minute.
    assert lists <= 12, (lists, sleep.slept)
    assert sleep.slept == sorted(sleep.slept) or max(sleep.slept) >= 15  # grows, then capped
    assert view(informer.store) == truth(apiserver)  # nothing lost meanwhile


# A routine 410 relists at once when the last list is old, and a watch's events no longer reset
# the relist backoff: tests/contract/test_kube_informer_bounds.py.


async def test_429_on_list_waits_for_retry_after_capped(
    apiserver: ApiServerStandIn, api: ApiClient
) -> None:
    sleep = VirtualSleep()
    informer = Informer(api, Source.pods(NAMESPACE, "rc"), sleep=sleep)
    apiserver.faults.fail_next("GET", r"/pods", 429, headers={"Retry-After": "86400"})
    async with running(informer.run()):
        await eventually(lambda: mirrors(informer, apiserver), "synced after the 429")
    assert len(sleep.slept) == 1 and 1 <= sleep.slept[0] <= MAX_RETRY_AFTER_S
