"""The GCS dies and comes back: the poller says "unknown", then a new epoch, and we re-report."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import pytest

from kuberay_scaler.adapters.ray_gcs.poller import GcsPoller
from kuberay_scaler.adapters.ray_gcs.report import (
    AutoscalingReport,
    LaunchingGroup,
    build_autoscaling_state,
)
from kuberay_scaler.core.model.ray import RayObservation
from kuberay_standins.ray_local import RayHead
from tests.ray.helpers import fast_client, run_ray_status

pytestmark = pytest.mark.ray


class HeadHolder:
    """The module's head; `restart` swaps in the new process so teardown stops the live one."""

    def __init__(self, head: RayHead) -> None:
        self.head = head

    def restart(self) -> RayHead:
        self.head = self.head.restart()
        return self.head


@pytest.fixture(scope="module")
def holder() -> Iterator[HeadHolder]:
    held = HeadHolder(RayHead.start(ip="127.0.0.10"))
    try:
        yield held
    finally:
        held.head.stop()


async def _until(
    poller: GcsPoller, predicate: Callable[[RayObservation], bool], what: str
) -> RayObservation:
    async def wait() -> RayObservation:
        while not predicate(poller.latest):
            poller.poll_soon()
            await asyncio.sleep(0.1)
        return poller.latest

    try:
        return await asyncio.wait_for(wait(), 120)
    except TimeoutError:
        raise AssertionError(f"poller never reached {what}: {poller.latest}") from None


def _launching(group: str) -> AutoscalingReport:
    return AutoscalingReport(launching=(LaunchingGroup(group, hosts=4),))


async def test_gcs_crash_and_restart_is_unknown_then_a_new_epoch(holder: HeadHolder) -> None:
    client = fast_client(holder.head.gcs_address)
    changes: list[RayObservation] = []
    poller = GcsPoller(client, interval_s=0.5, on_change=changes.append)
    polling = asyncio.create_task(poller.run())
    try:
        first = await _until(poller, lambda o: o.known, "a first known state")
        assert first.epoch == 0
        await client.report(build_autoscaling_state(_launching("before-crash")))

        holder.head.kill_gcs()
        lost = await _until(poller, lambda o: not o.known, "unknown after the GCS died")
        assert lost.state is None
        assert lost.error
        assert not lost.fresh(time.monotonic(), max_age=3600)

        new_head = await asyncio.to_thread(holder.restart)
        back = await _until(poller, lambda o: o.known, "known again after restart")
        assert back.epoch == 1
        assert back.cluster_id != first.cluster_id
        assert back.fresh(time.monotonic(), max_age=3600)
        assert client.replacements == 1
    finally:
        polling.cancel()
        await asyncio.gather(polling, return_exceptions=True)

    # The new GCS has no report; sending the full state again makes `ray status` right again.
    await client.report(build_autoscaling_state(_launching("after-restart")))
    out = run_ray_status(new_head)
    assert " after-restart, 4 launching" in out
    assert "before-crash" not in out
    assert [c.known for c in changes][:1] == [True]
    assert any(not c.known for c in changes)
    await client.close()
