"""Named worlds for the control tests: a RayCluster, its pods and what Ray says, wired into a
`Loop` (fakes.py); and what the world's RayCluster shows after the loop acted.

A builder that returns `(loop, ray)` hands back the very Ray state the loop was started on, for
the test to keep showing it.
"""

from __future__ import annotations

from typing import Any

from kuberay_scaler.core.model.ray import NodeStatus, RayNode, RayState
from kuberay_scaler.core.planner.policy import Policy
from tests.control.fakes import Loop, make_loop, reply_of
from tests.factories import (
    cluster,
    cpu_nodes,
    group,
    head_node,
    pod,
    slice_pods,
    state,
    tasks,
    tpu_group,
    tpu_slice_nodes,
)


def spec_group(loop: Loop, index: int = 0) -> dict[str, Any]:
    """The server's RayCluster: its worker group `index`."""
    group_spec: dict[str, Any] = loop.server.obj["spec"]["workerGroupSpecs"][index]
    return group_spec


def workers_to_delete(loop: Loop) -> list[str]:
    return list(spec_group(loop).get("scaleStrategy", {}).get("workersToDelete", []))


def named_pods(loop: Loop) -> set[str]:
    """Every pod any applied write named in workersToDelete."""
    out: set[str] = set()
    for ops in loop.writer.applied:
        for op in ops:
            value = op.get("value")
            if op.get("path", "").endswith("workersToDelete") and isinstance(value, list):
                out.update(value)
            elif op.get("path", "").endswith("scaleStrategy") and isinstance(value, dict):
                out.update(value.get("workersToDelete") or [])
    return out


def scale_up_world(**kw: Any) -> tuple[Loop, RayState]:
    """A CPU group (at most 5) with no pod, and two tasks of 8 CPUs pending: a scale-up to do."""
    demand = state([head_node()], [tasks({"CPU": 8}, 2)])
    return make_loop(cluster(group("cpu", max_replicas=5)), [], demand, **kw), demand


def scale_up_loop(**kw: Any) -> Loop:
    return scale_up_world(**kw)[0]


def idle_slices_world(*keys: str, **kw: Any) -> tuple[Loop, RayState]:
    """One 4-host slice per key in group `tpu`, every host idle for 900 s: past the idle timeout."""
    pods = [p for k in keys for p in slice_pods("tpu", k, 4)]
    ray = state([head_node(), *(n for k in keys for n in tpu_slice_nodes(k, 4, idle_s=900))])
    return make_loop(cluster(tpu_group(replicas=len(keys))), pods, ray, **kw), ray


def idle_slices_loop(*keys: str, **kw: Any) -> Loop:
    return idle_slices_world(*keys, **kw)[0]


def busy_cpu_worker_world() -> tuple[Loop, list[RayNode]]:
    """A CPU group (1 of at most 4) whose one worker, cpu-a, has no CPU free; the Ray nodes."""
    nodes = [head_node(), *cpu_nodes(["cpu-a"], free_cpu=0)]
    rc = cluster(group("cpu", replicas=1, max_replicas=4))
    return make_loop(rc, [pod("cpu-a", "cpu")], state(nodes)), nodes


def surplus_busy_slice_world() -> tuple[Loop, list[RayNode]]:
    """tpu-a above its group's max (0), host 1 running work; its Ray nodes."""
    busy = tpu_slice_nodes("tpu-a", 4, busy_hosts=(1,))
    rc = cluster(tpu_group(replicas=1, max_replicas=0))
    return make_loop(rc, slice_pods("tpu", "tpu-a", 4), state([head_node(), *busy])), busy


def broken_busy_slice_world(policy: Policy) -> tuple[Loop, RayState]:
    """tpu-a: host 2 Failed (its node DEAD), the three others running work (busy in the GCS)."""
    pods = slice_pods("tpu", "tpu-a", 4)
    pods[2]["status"]["phase"] = "Failed"
    nodes = tpu_slice_nodes("tpu-a", 4, idle_s=None)
    nodes[2] = RayNode(**{**nodes[2].__dict__, "status": NodeStatus.DEAD})
    ray = state([head_node(), *nodes])
    loop = make_loop(cluster(tpu_group(replicas=1)), pods, ray, policy=policy)
    loop.gcs.busy = {n.node_id for n in nodes}
    return loop, ray


def drain_busy_and_scale_up() -> tuple[dict[str, Any], list[dict[str, Any]], Any]:
    """One idle slice to drain and delete, one busy slice, and CPU demand to scale up for: the
    RayCluster, its pods and the GCS reply."""
    rc = cluster(tpu_group(replicas=2), group("cpu", cpu="32", max_replicas=5))
    pods = slice_pods("tpu", "tpu-a", 4) + slice_pods("tpu", "tpu-b", 4)
    nodes = [
        head_node(),
        *tpu_slice_nodes("tpu-a", 4, idle_s=900),
        *tpu_slice_nodes("tpu-b", 4, busy_hosts=(0,)),
    ]
    return rc, pods, reply_of(state(nodes, [tasks({"CPU": 30}, 2)]))  # no TPU host fits it
