"""Against a real Ray head: an idle cluster's replies differ on every call (versions, idle
clocks), yet the poller parses only the first; new demand is parsed at once."""

from __future__ import annotations

import asyncio

import pytest
from ray.core.generated import autoscaler_pb2

from kuberay_scaler.adapters.ray_gcs.client import GcsClient
from kuberay_scaler.adapters.ray_gcs.poller import GcsPoller
from kuberay_scaler.adapters.ray_gcs.state import parse_ray_state
from kuberay_scaler.adapters.ray_gcs.unchanged import zeroed
from kuberay_standins.ray_local import RayDriver, RayHead
from tests.factories import NOW_MS
from tests.ray.helpers import head_explains, wait_for_state

pytestmark = pytest.mark.ray

IDLE = autoscaler_pb2.NodeStatus.Value("IDLE")

DEMAND = """
@ray.remote(num_cpus=64)
def needs_a_big_host():
    return 1

ref = needs_a_big_host.remote()
"""


async def test_idle_replies_keep_their_body_and_are_parsed_once(
    client: GcsClient, head: RayHead
) -> None:
    # A head just started turns from RUNNING to IDLE in its first second: a real change.
    await wait_for_state(
        client, lambda s: all(n.status == IDLE for n in s.node_states), what="an idle head"
    )
    first = await client.get_cluster_resource_state()
    await asyncio.sleep(1.2)
    second = await client.get_cluster_resource_state()
    assert first.SerializeToString() != second.SerializeToString()  # the GCS moved something
    zeroed1, zeroed2 = zeroed(first), zeroed(second)
    assert zeroed1 is not None and zeroed2 is not None
    assert zeroed1.reply == zeroed2.reply

    poller = GcsPoller(client, interval_s=1.0)
    seen = []
    for _ in range(4):
        seen.append(await poller.poll_once())
        await asyncio.sleep(0.3)
    assert (poller.parses, poller.reparses) == (1, 0)
    # Each reused parse equals a full parse of the same reply, idle clock included.
    reply = await client.get_cluster_resource_state()
    latest = await poller.poll_once()
    assert latest.state is not None
    assert [n.node_id for n in latest.state.nodes] == [
        n.node_id for n in parse_ray_state(reply, read_at_ms=NOW_MS).nodes
    ]

    with head_explains(head):
        driver = RayDriver.start(head.gcs_address, DEMAND, node_ip=head.ip, env=head.client_env())
    try:
        for _ in range(150):
            observed = await poller.poll_once()
            if observed.state is not None and observed.state.tasks:
                break
            await asyncio.sleep(0.2)
        else:
            raise AssertionError("the driver's demand was never parsed")
        assert poller.parses + poller.reparses >= 2  # the demand re-read (alone or in full)
        assert {k: v for k, v in observed.state.tasks[0].bundle.resources.items()} == {"CPU": 64.0}
    finally:
        driver.stop()
