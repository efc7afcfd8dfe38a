"""Reconciler fault paths of issue 11 against the fakes behind the Protocols. Every test asserts an
invariant (no busy, undrained or partial deletion; targets within [min, max]; nothing lost), not
only that a path ran."""

from __future__ import annotations

from typing import Any

from tests.control.fakes import Loop, make_loop
from tests.control.test_reconciler import spec_group, workers_to_delete
from tests.factories import cluster, head_node, slice_pods, state, tpu_group, tpu_slice_nodes

GRACE_S = 180.0  # the default KUBERAY_SCALER_MISSING_NODE_GRACE_S


def busy_slice_loop() -> Loop:
    """One 4-host slice whose pods (by their own timestamps) have run for an hour, busy in Ray."""
    pods = slice_pods("tpu", "tpu-a", 4, age_s=3700, running_for_s=3600)
    nodes = [head_node(), *tpu_slice_nodes("tpu-a", 4, idle_s=None)]
    return make_loop(cluster(tpu_group(replicas=1, max_replicas=4)), pods, state(nodes))


def assert_nothing_deleted(loop: Loop) -> None:
    """Invariant: the busy slice is neither named for deletion nor scaled away."""
    assert workers_to_delete(loop) == [], "busy slice deleted without a drain"
    assert spec_group(loop)["replicas"] == 1
    assert loop.gcs.drains == [], "busy slice drained"


async def run_for(loop: Loop, seconds: float, ray: Any, *, epoch: int = 1) -> None:
    """Fresh GCS replies showing `ray` (None: unknown) and a reconcile, every 5 s."""
    elapsed = 0.0
    while elapsed < seconds:
        loop.clock.advance(5)
        elapsed += 5
        loop.see_ray(ray, epoch=epoch)
        await loop.reconciler.reconcile()


async def test_one_gcs_reply_without_a_running_slices_nodes_replaces_nothing() -> None:
    """Item 1 / catalogue row 19: a partial reply (GCS restart window) is not a broken slice."""
    loop = busy_slice_loop()
    await run_for(loop, 30, state([head_node(), *tpu_slice_nodes("tpu-a", 4, idle_s=None)]))
    loop.clock.advance(1)
    loop.see_ray(state([head_node()]))  # one reply lacks the slice's nodes
    await loop.reconciler.reconcile()
    assert_nothing_deleted(loop)


async def test_gcs_restart_window_replaces_nothing_until_a_full_grace_of_fresh_replies() -> None:
    loop = busy_slice_loop()
    await run_for(loop, 30, state([head_node(), *tpu_slice_nodes("tpu-a", 4, idle_s=None)]))
    await run_for(loop, 60, None)  # GCS down for a minute
    # A new GCS without the slice's nodes for almost a full grace: still nothing is judged.
    await run_for(loop, GRACE_S - 10, state([head_node()]), epoch=2)
    assert_nothing_deleted(loop)


async def test_a_node_truly_gone_for_a_full_grace_is_replaced() -> None:
    """The other side of the rule: a slice whose node stays missing is still replaced."""
    loop = busy_slice_loop()
    await run_for(loop, 30, state([head_node(), *tpu_slice_nodes("tpu-a", 4, idle_s=None)]))
    three = state([head_node(), *tpu_slice_nodes("tpu-a", 4, idle_s=None)[:3]])
    await run_for(loop, GRACE_S + 10, three)
    assert sorted(workers_to_delete(loop)) == [f"tpu-a-{i}" for i in range(4)]  # whole slice
