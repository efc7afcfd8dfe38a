"""Issue 11 at the daemon level: the whole daemon as a subprocess against the stand-ins and a
real Ray head. One absurd group next to good ones: the good group scales, /healthz keeps
answering, and the absurd group is named on /debug/plan (failure catalogue row 21)."""

from __future__ import annotations

import asyncio
import copy
import json
import threading
import urllib.request
from typing import Any

import pytest

from kuberay_standins.demo import Scenario, demo_raycluster
from kuberay_standins.harness import DaemonProcess, LocalCluster
from tests.integration.test_daemon import RESERVE_SLICE, _driver, _get, _replicas

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def _with_absurd_groups(rc: dict[str, Any]) -> dict[str, Any]:
    cpu = rc["spec"]["workerGroupSpecs"][1]
    infinite = copy.deepcopy(cpu)
    infinite.update(groupName="absurd-resources", replicas=0, maxReplicas=3)
    infinite["rayStartParams"] = {"resources": '"{\\"CPU\\": 1e400, \\"custom\\": NaN}"'}
    huge = copy.deepcopy(cpu)
    huge.update(groupName="absurd-hosts", replicas=0, maxReplicas=3, numOfHosts=1_000_000)
    rc["spec"]["workerGroupSpecs"] += [infinite, huge]
    return rc


@pytest.fixture
def local_raycluster() -> dict[str, Any]:
    return _with_absurd_groups(demo_raycluster(Scenario()))


# A kubelet restarts a container after this many failed probes in a row (its default).
KUBELET_FAILURE_THRESHOLD = 3


class HealthProbe:
    """Probes /healthz like a kubelet with a 1 s timeout, all along, in a thread of its own.

    A probe left unanswered for 1 s is a failure to a kubelet only as part of a run of
    `KUBELET_FAILURE_THRESHOLD`: one stall of a loaded 2-core machine is not the daemon stopping.
    Any answer but 200 is a failure at once.
    """

    def __init__(self, daemon: DaemonProcess) -> None:
        self._url = f"http://{daemon.http}/healthz"
        self.answers: list[int | str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            try:
                with urllib.request.urlopen(self._url, timeout=1) as reply:
                    self.answers.append(reply.status)
            except urllib.error.HTTPError as err:
                self.answers.append(err.code)
            except OSError as err:
                self.answers.append(repr(err))

    def longest_silence(self) -> int:
        """The longest run of probes in a row that got no answer within the timeout."""
        longest = run = 0
        for answer in self.answers:
            run = run + 1 if not isinstance(answer, int) else 0
            longest = max(longest, run)
        return longest

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)


def _plan(daemon: DaemonProcess) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{daemon.http}/debug/plan", timeout=5) as reply:
        document: dict[str, Any] = json.loads(reply.read())
    return document


async def test_absurd_groups_are_skipped_and_the_good_group_scales_while_healthz_answers(
    cluster: LocalCluster,
) -> None:
    daemon = cluster.start_daemon()
    await cluster.wait_for(lambda: _get(daemon, "/healthz")[0] == 200, 60, "/healthz up")
    with HealthProbe(daemon) as probe:
        driver = await asyncio.to_thread(_driver, cluster, RESERVE_SLICE)
        try:
            await cluster.wait_for(lambda: "SLICE_READY" in driver.output(), 240, "the slice")
        finally:
            await asyncio.to_thread(driver.stop)
    assert _replicas(cluster, "tpu-group") == 1  # the good group scaled
    assert _replicas(cluster, "absurd-resources") == 0 and _replicas(cluster, "absurd-hosts") == 0
    problems = " ".join(str(p) for p in _plan(daemon)["problems"])
    assert "absurd-resources" in problems and "absurd-hosts" in problems
    assert probe.answers, "the probe never ran"
    answered = [a for a in probe.answers if isinstance(a, int)]
    assert set(answered) == {200}, f"/healthz said unhealthy: {answered}"
    assert probe.longest_silence() < KUBELET_FAILURE_THRESHOLD, probe.answers
    code, _ = await asyncio.to_thread(daemon.stop)
    assert code == 0
    assert not cluster.violations
