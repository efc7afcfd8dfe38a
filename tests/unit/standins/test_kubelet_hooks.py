"""The stand-in kubelet's Ray hooks (hosts left behind, a start lost under load).

A host that fails to start is started again, as a kubelet restarts a crashed container; a host
still starting when its pod goes, or when the cluster stops, is stopped once it is up. Ray itself
is replaced by a fake `RayHost` here (the hooks' own logic is under test; the integration tier
runs them with real Ray).
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from kuberay_standins import harness
from kuberay_standins.harness import RayPodHooks, Timeline
from kuberay_standins.ray_local import RayStartError


class FakeHost:
    def __init__(self, ip: str, fail: bool, gate: threading.Event) -> None:
        self.ip, self.fail, self.gate, self.stopped = ip, fail, gate, False

    def wait_ready(self) -> FakeHost:
        assert self.gate.wait(30)
        if self.fail:
            raise RayStartError("ray start exited: Failed to connect to GCS within 60 seconds")
        return self

    def stop(self) -> None:
        self.stopped = True


class FakeHead:
    gcs_address = "127.0.0.10:6379"
    auth_token = None


def _pod(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"ray.io/node-type": "worker"}}}


@dataclass
class Spawner:
    """Hands out fake hosts; the first `failures` fail, all wait for `gate`."""

    hosts: list[FakeHost] = field(default_factory=list)
    failures: int = 0
    gate: threading.Event = field(default_factory=threading.Event)
    spawned: threading.Event = field(default_factory=threading.Event)  # set at the first spawn

    def spawn(self, _: str, *, ip: str, **__: Any) -> FakeHost:
        host = FakeHost(ip, len(self.hosts) < self.failures, self.gate)
        self.hosts.append(host)
        self.spawned.set()
        return host

    async def first_spawn(self) -> None:
        """Wait until a host is being started (in the hooks' worker thread), however late."""
        assert await asyncio.to_thread(self.spawned.wait, 30), "no host was ever spawned"


@pytest.fixture
def spawner(monkeypatch: pytest.MonkeyPatch) -> Spawner:
    fake = Spawner()
    fake.gate.set()
    monkeypatch.setattr(harness.RayHost, "spawn", staticmethod(fake.spawn))
    monkeypatch.setattr(harness, "_host_setup", lambda pod: (1, {}, None, {}))
    return fake


def _hooks() -> RayPodHooks:
    return RayPodHooks(FakeHead(), Timeline())  # type: ignore[arg-type]


async def test_a_host_that_fails_to_start_is_started_again(spawner: Spawner) -> None:
    spawner.failures = 2
    hooks = _hooks()
    await hooks.on_running(_pod("w1"))
    assert len(spawner.hosts) == 3 and hooks.hosts["w1"] is spawner.hosts[-1]
    await hooks.stop_all()
    assert spawner.hosts[-1].stopped


async def test_a_host_that_never_starts_gives_up_and_frees_its_ip(spawner: Spawner) -> None:
    spawner.failures = RayPodHooks.START_ATTEMPTS
    hooks = _hooks()
    with pytest.raises(RayStartError):
        await hooks.on_running(_pod("w1"))
    assert "w1" not in hooks.hosts
    assert spawner.hosts[0].ip in hooks._free_ips


async def test_a_host_whose_pod_went_while_it_started_is_stopped(spawner: Spawner) -> None:
    spawner.gate.clear()
    hooks = _hooks()
    running = asyncio.create_task(hooks.on_running(_pod("w1")))
    await spawner.first_spawn()  # a fixed sleep here lost to a loaded machine's thread start
    await hooks.on_deleted(_pod("w1"))
    spawner.gate.set()
    await running
    assert "w1" not in hooks.hosts and spawner.hosts[0].stopped


async def test_a_cancelled_start_stops_its_host_once_up(spawner: Spawner) -> None:
    spawner.gate.clear()
    hooks = _hooks()
    running = asyncio.create_task(hooks.on_running(_pod("w1")))
    await spawner.first_spawn()  # a fixed sleep here lost to a loaded machine's thread start
    running.cancel()  # the kubelet cancels the start of a pod that is terminating
    with pytest.raises(asyncio.CancelledError):
        await running
    assert not spawner.hosts[0].stopped
    spawner.gate.set()
    await hooks.stop_all()  # waits for the late stop
    assert spawner.hosts[0].stopped and not hooks.hosts
