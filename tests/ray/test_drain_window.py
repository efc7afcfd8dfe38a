"""The partial-drain race window, against real raylets: the time from the fresh GCS read the
daemon makes right before draining (loop/execute.py) to the last DrainNode answer of the
slice. A host that turns busy inside it refuses and the slice is partly drained
(docs/reliability.md, "Partial drains"). The window is measured and printed, never asserted
(timing is not a test's business); what is asserted is what the rule relies on: every host of
an idle slice accepts and its raylet exits.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from ray.core.generated import autoscaler_pb2

from kuberay_scaler.adapters.ray_gcs.client import GcsClient
from kuberay_scaler.adapters.ray_gcs.drain import deadline_in, drain_slice
from kuberay_scaler.adapters.ray_gcs.state import parse_ray_state
from kuberay_scaler.core.decision import Decision, Drain, drains_to_send
from kuberay_scaler.core.model.plan import Memory, Plan
from kuberay_scaler.core.parse.raycluster import parse_raycluster
from kuberay_standins.ray_local import (
    HostSpec,
    RayHead,
    RayHost,
    loopback_ip,
    start_hosts,
    stop_all,
)
from tests.factories import NOW_MS
from tests.ray.helpers import DEAD, node_by_id, wait_for_state

pytestmark = pytest.mark.ray

SLICES = {"win-a": (41, 42, 43, 44)}
WINDOWS_MS: list[float] = []
IDLE = autoscaler_pb2.NodeStatus.Value("IDLE")


@pytest.fixture(scope="module")
def hosts(head: RayHead) -> Iterator[dict[str, RayHost]]:
    specs = [
        HostSpec(
            ip=loopback_ip(n),
            num_cpus=1,
            env={"RAY_CLOUD_INSTANCE_ID": f"{key}-{i}", "RAY_NODE_TYPE_NAME": "win"},
        )
        for key, ips in SLICES.items()
        for i, n in enumerate(ips)
    ]
    started = start_hosts(head.gcs_address, specs)
    try:
        yield {h.instance_id: h for h in started}
    finally:
        stop_all(started)


def _idle(state: object, node_id: bytes) -> bool:
    node = node_by_id(state, node_id)
    return node is not None and int(node.status) == IDLE


def _decision(key: str, node_ids: tuple[str, ...]) -> Decision:
    plan = Plan("rc", "uid", "1", (), (), (), None, Memory())
    pods = tuple(f"{key}-{i}" for i in range(4))
    drain = Drain("win", key, node_ids, None, deadline_in(60), "idle", pods=pods)
    return Decision(plan, (drain,), parse_raycluster({}))


@pytest.mark.parametrize("key", sorted(SLICES))
async def test_the_window_from_the_fresh_read_to_the_last_drain_answer(
    key: str, hosts: dict[str, RayHost], client: GcsClient
) -> None:
    mine = [hosts[f"{key}-{i}"] for i in range(4)]
    ids = tuple(h.node_id.hex() for h in mine)
    await wait_for_state(
        client,
        lambda s: all(_idle(s, h.node_id) for h in mine),
        what="the slice's raylets registered and idle",
    )
    for _ in range(50):  # the read the daemon makes right before draining, as it makes it
        reply = await client.get_cluster_resource_state()
        read_at = time.perf_counter()
        send, kept = drains_to_send(
            _decision(key, ids), parse_ray_state(reply, read_at_ms=NOW_MS), None
        )
        if not kept:
            break  # a raylet still settling reads as not idle: the daemon would not drain
    assert not kept and len(send) == 1, kept
    result = await drain_slice(
        client,
        [h.node_id.hex() for h in mine],
        reason_message="idle slice",
        deadline_ms=send[0].deadline_ms,
    )
    answered_at = time.perf_counter()
    assert result.may_delete, result.reason
    WINDOWS_MS.append((answered_at - read_at) * 1000)
    print(f"partial-drain race window ({key}, 4 hosts): {WINDOWS_MS[-1]:.1f} ms")
    await wait_for_state(
        client,
        lambda s: all(
            (n := node_by_id(s, h.node_id)) is None or int(n.status) == DEAD for h in mine
        ),
        what="every drained raylet exited",
    )
