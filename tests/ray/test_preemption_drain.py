"""A busy surplus slice drained with reason preemption, against a real GCS (issue 12 item 1).

One CPU host runs an actor: an idle-termination drain would be refused, a preemption drain
with a deadline is accepted and the node shows DRAINING while its work runs; our planner keeps
it (not deleted) until the work is gone, then deletes it without a second drain.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest

from kuberay_scaler.adapters.ray_gcs.client import GcsClient
from kuberay_scaler.adapters.ray_gcs.drain import DrainReason, deadline_in, drain_slice
from kuberay_scaler.adapters.ray_gcs.state import parse_ray_state
from kuberay_scaler.core.defaults import PREEMPT_DEADLINE_S
from kuberay_scaler.core.model.plan import Memory
from kuberay_scaler.core.model.ray import epoch_ms
from kuberay_scaler.core.model.reasons import ScaleDownKind
from kuberay_standins.ray_local import (
    HostSpec,
    RayDriver,
    RayHead,
    RayHost,
    loopback_ip,
    start_hosts,
    stop_all,
)
from tests.factories import NOW, NOW_MS, cluster, group, plan_of, pod
from tests.ray.helpers import node_by_id, wait_for_state

pytestmark = pytest.mark.ray

DRAINING = 3  # NodeStatus.DRAINING
POD = "cpu-busy-0"


@pytest.fixture(scope="module")
def host(head: RayHead) -> Iterator[RayHost]:
    spec = HostSpec(
        ip=loopback_ip(41),
        num_cpus=1,
        env={"RAY_CLOUD_INSTANCE_ID": POD, "RAY_NODE_TYPE_NAME": "cpu"},
    )
    (started,) = start_hosts(head.gcs_address, [spec])
    try:
        yield started
    finally:
        stop_all([started])


def _busy(node_hex: str) -> str:
    return "\n".join(
        [
            "from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy",
            "@ray.remote(num_cpus=1)",
            "class Hold:",
            "    def ready(self): return True",
            f"pin = NodeAffinitySchedulingStrategy(node_id={node_hex!r}, soft=False)",
            "h = Hold.options(scheduling_strategy=pin).remote()",
            "ray.get(h.ready.remote())",
        ]
    )


async def test_busy_node_is_drained_for_preemption_and_deleted_only_once_free(
    host: RayHost, client: GcsClient, start_driver: Callable[..., RayDriver]
) -> None:
    from ray.core.generated import autoscaler_pb2

    running = autoscaler_pb2.NodeStatus.Value("RUNNING")
    draining = autoscaler_pb2.NodeStatus.Value("DRAINING")
    driver = start_driver(_busy(host.node_id.hex()))
    await wait_for_state(
        client,
        lambda s: (n := node_by_id(s, host.node_id)) is not None and n.status == running,
        what="the host busy",
    )
    rc = cluster(group("cpu", replicas=1, max_replicas=0, cpu="1"))
    pods = [pod(POD, "cpu")]
    state = (await client.get_cluster_resource_state()).cluster_resource_state
    first = plan_of(rc, pods, parse_ray_state(state, read_at_ms=NOW_MS))
    (preempt,) = first.group("cpu").preempt  # type: ignore[union-attr]
    assert not first.group("cpu").deletions  # type: ignore[union-attr]

    result = await drain_slice(
        client,
        preempt.node_ids,
        reason_message=str(preempt.reason),
        deadline_ms=deadline_in(600),
        reason=DrainReason.PREEMPTION,
    )
    assert result.may_delete, result.reason  # accepted although busy
    state = await wait_for_state(
        client,
        lambda s: (n := node_by_id(s, host.node_id)) is not None and n.status == draining,
        what="the host DRAINING",
    )
    memory = Memory(preempting=first.memory.preempting)
    later = NOW + timedelta(seconds=PREEMPT_DEADLINE_S / 2)  # before the notice ends
    parsed = parse_ray_state(state, read_at_ms=epoch_ms(later))
    kept = plan_of(rc, pods, parsed, memory=memory, now=later)
    assert not kept.group("cpu").deletions, "deleted while its work still runs"  # type: ignore[union-attr]
    assert not kept.group("cpu").preempt  # type: ignore[union-attr]  # not drained twice

    driver.stop()  # the work ends
    state = await wait_for_state(
        client,
        lambda s: (
            (n := node_by_id(s, host.node_id)) is None
            or n.status != draining
            or dict(n.available_resources).get("CPU", 0) >= 1
        ),
        what="the host free (or gone)",
    )
    parsed = parse_ray_state(state, read_at_ms=epoch_ms(later))
    done = plan_of(rc, pods, parsed, memory=memory, now=later)
    (gone,) = done.group("cpu").deletions  # type: ignore[union-attr]
    assert gone.pods == (POD,)
    assert gone.reason.kind in (ScaleDownKind.PREEMPTED, ScaleDownKind.ABOVE_MAX)
