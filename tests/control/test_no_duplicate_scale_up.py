"""No duplicate scale-up while a slice comes up (found live in the e2e tier:
`fake_tpu[sidecar-v6e-4x4-multi-host]` asked for a second slice while 2 of the first slice's 4
hosts had joined Ray, and removed it again as surplus 19 s later).

The GCS reports each raylet's free resources and the demand queued at each raylet separately, so
the moment an actor moves from the raylet it waited on to a host that just joined, one reply can
show the host taken *and* the actor still pending. A slice still coming up is launched for the
demand it will serve: it counts at full size until all of its hosts have joined, so such a reply
never asks for a second one. The same lag at the last host's join (the slice then whole, and a
single-host worker is whole at once): for JOIN_SETTLE_S after a worker's Ray container started
(its pod's own `startedAt`, so an offline plan of a capture decides alike) what it uses may
still serve pending demand, after every other host and before a new slice. Every reconcile
below asserts the target stays within what the demand needs, and that demand beyond it is
still served.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kuberay_scaler.core.defaults import JOIN_SETTLE_S
from kuberay_scaler.core.model.ray import RayNode
from tests.control.fakes import Loop, make_loop
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

TPU_ACTOR = {"CPU": 1, "TPU": 4}  # one per host of a v6e-16 slice
HOSTS = 4
JOIN_ORDER = (3, 1, 0, 2)  # as in the live run: not in host order


def _replicas(loop: Loop, index: int = 0) -> int:
    return int(loop.server.obj["spec"]["workerGroupSpecs"][index]["replicas"])


def _written_replicas(loop: Loop) -> list[int]:
    """Every replicas value the daemon wrote, in order."""
    return [
        int(op["value"])
        for ops in loop.writer.applied
        for op in ops
        if op["op"] == "replace" and str(op["path"]).endswith("/replicas")
    ]


def _joined(nodes: Sequence[RayNode], hosts: Sequence[int]) -> list[RayNode]:
    return [n for n in nodes if int(n.instance_id.rsplit("-", 1)[1]) in hosts]


async def _reconcile(loop: Loop, ray: Any, pods: list[dict[str, Any]] | None = None) -> None:
    loop.clock.advance(1)
    if pods is not None:
        loop.pods.pods = pods
    loop.see_ray(ray)
    await loop.reconciler.reconcile()


def _frames(joined: Sequence[int], newest: int | None, lag: bool = True) -> list[tuple[str, Any]]:
    """What the GCS may say once `joined` hosts are in Ray, the newest one just now.

    `placed`: the actors of the other joined hosts run on them. Then, in any order Ray's
    reports arrive: the newest host free with its actor still pending (consistent), the
    newest host taken while its actor is still reported pending (the lag), and both settled.
    """
    placed = [h for h in joined if h != newest]
    frames = []
    if newest is not None:
        free = _joined(tpu_slice_nodes("tpu-a", HOSTS, busy_hosts=tuple(placed)), joined)
        taken = _joined(tpu_slice_nodes("tpu-a", HOSTS, busy_hosts=tuple(joined)), joined)
        waiting = [tasks(TPU_ACTOR, HOSTS - len(placed))]
        frames.append(("newest host free, its actor pending", state([head_node(), *free], waiting)))
        if lag:
            taken_frame = state([head_node(), *taken], waiting)
            frames.append(("newest host taken, its actor still pending", taken_frame))
    settled = _joined(tpu_slice_nodes("tpu-a", HOSTS, busy_hosts=tuple(joined)), joined)
    left = HOSTS - len(joined)
    frames.append(
        ("settled", state([head_node(), *settled], [tasks(TPU_ACTOR, left)] if left else []))
    )
    return frames


async def test_a_multi_host_slice_joining_host_by_host_is_never_asked_for_twice() -> None:
    """One slice's worth of demand (4 actors, one per host) while its hosts join Ray one by one,
    through every report order Ray may produce: the target is 1 at every reconcile."""
    rc = cluster(tpu_group(max_replicas=HOSTS))
    loop = make_loop(rc, [], state([head_node()], [tasks(TPU_ACTOR, HOSTS)]))
    await loop.reconciler.reconcile()
    assert _replicas(loop) == 1, "one slice for one slice's demand"
    waiting = state([head_node()], [tasks(TPU_ACTOR, HOSTS)])
    steps: list[tuple[str, list[dict[str, Any]], Any]] = [
        ("no pods yet", [], waiting),
        ("pods Pending", slice_pods("tpu", "tpu-a", HOSTS, phase="Pending"), waiting),
        ("pods Running, no Ray node yet", slice_pods("tpu", "tpu-a", HOSTS), waiting),
    ]
    joined: list[int] = []
    for host in JOIN_ORDER:
        joined.append(host)
        for what, ray in _frames(joined, host):
            steps.append((f"{len(joined)} of {HOSTS} joined: {what}", [], ray))
    for what, ray in _frames(joined, None) * 3:  # the slice up and busy, a while
        steps.append((f"all joined: {what}", [], ray))
    pods = slice_pods("tpu", "tpu-a", HOSTS, age_s=5, running_for_s=0)  # Ray started at NOW
    for what, new_pods, ray in steps:
        await _reconcile(loop, ray, new_pods or pods)
        assert _replicas(loop) == 1, f"duplicate scale-up at '{what}'"
    assert _written_replicas(loop) == [1], "exactly one replicas write"


async def test_the_last_host_taken_while_its_actor_is_still_reported_pending() -> None:
    """The lag at the last join: the slice is whole, Ray's view of each host counts, but its
    hosts started 10 s ago: the actor they may be running is not a second slice."""
    rc = cluster(tpu_group(replicas=1, max_replicas=HOSTS))
    pods = slice_pods("tpu", "tpu-a", HOSTS, age_s=15, running_for_s=10)
    three = tpu_slice_nodes("tpu-a", HOSTS, busy_hosts=(0, 1, 2))
    loop = make_loop(rc, pods, state([head_node(), *three[:3]], [tasks(TPU_ACTOR, 1)]))
    await loop.reconciler.reconcile()
    assert _replicas(loop) == 1
    taken = tpu_slice_nodes("tpu-a", HOSTS, busy_hosts=(0, 1, 2, 3))
    await _reconcile(loop, state([head_node(), *taken], [tasks(TPU_ACTOR, 1)]), pods)
    assert _replicas(loop) == 1, "duplicate scale-up at the last join"


async def test_single_host_workers_joining_one_by_one_are_never_asked_for_twice() -> None:
    """The same for a single-host group: three 8-CPU tasks, three workers, each joining Ray in
    turn (and its task showing on it before the task leaves the reported demand)."""
    rc = cluster(group("cpu", max_replicas=10))
    work = {"CPU": 8}
    loop = make_loop(rc, [], state([head_node()], [tasks(work, 3)]))
    await loop.reconciler.reconcile()
    assert _replicas(loop) == 3
    names = ["cpu-0", "cpu-1", "cpu-2"]
    pods = [pod(n, "cpu", age_s=3, running_for_s=0) for n in names]
    await _reconcile(loop, state([head_node()], [tasks(work, 3)]), pods)
    assert _replicas(loop) == 3, "pods without Ray nodes are capacity that is coming"
    for i in range(1, len(names) + 1):
        up = names[:i]
        lagging = state([head_node(), *cpu_nodes(up, free_cpu=0)], [tasks(work, 3 - i + 1)])
        settled = state([head_node(), *cpu_nodes(up, free_cpu=0)], [tasks(work, 3 - i)])
        for what, ray in (("taken, still pending", lagging), ("settled", settled)):
            await _reconcile(loop, ray, pods)
            assert _replicas(loop) == 3, f"duplicate scale-up with {i} joined, {what}"
    assert _written_replicas(loop) == [3]


async def test_demand_beside_workers_just_up_is_served_within_the_settle_time() -> None:
    """No under-provisioning beyond the bound: two workers just up, each running its 8-CPU
    task, and two more tasks arrive. What the new workers use could be their own tasks still
    reported pending, so the daemon waits, but at most JOIN_SETTLE_S from the workers' start:
    the same reply then gets the two workers it needs, and the plan told the loop when."""
    rc = cluster(group("cpu", replicas=2, max_replicas=10))
    work = {"CPU": 8}
    pods = [pod(n, "cpu", age_s=3, running_for_s=0) for n in ("cpu-0", "cpu-1")]
    busy = state([head_node(), *cpu_nodes(["cpu-0", "cpu-1"], free_cpu=0)], [tasks(work, 2)])
    loop = make_loop(rc, pods, busy)
    await _reconcile(loop, busy, pods)
    assert _replicas(loop) == 2, "within the settle time"
    wake = loop.reconciler.seconds_to_wake()
    assert wake is not None and 0 < wake <= JOIN_SETTLE_S
    loop.clock.advance(JOIN_SETTLE_S)
    await _reconcile(loop, busy, pods)
    assert _replicas(loop) == 4, "two more workers for two more tasks"
    assert _written_replicas(loop) == [4]


async def test_more_demand_than_a_slice_just_up_can_hold_gets_its_slice_at_once() -> None:
    """A slice just up and busy with 4 actors, 5 more pending: at most one actor per host can
    be reported twice, so one more slice is asked for at once (then the second the demand
    needs once the settle time is over)."""
    rc = cluster(tpu_group(replicas=1, max_replicas=HOSTS))
    pods = slice_pods("tpu", "tpu-a", HOSTS, age_s=5, running_for_s=0)
    taken = tpu_slice_nodes("tpu-a", HOSTS, busy_hosts=(0, 1, 2, 3))
    ray = state([head_node(), *taken], [tasks(TPU_ACTOR, 5)])
    loop = make_loop(rc, pods, ray)
    await _reconcile(loop, ray, pods)
    assert _replicas(loop) == 2, "demand beyond what the slice just up can hold"


async def test_a_half_joined_slice_and_an_idle_slice_are_enough_for_their_demand() -> None:
    """Slice A up and idle, slice B with 2 hosts in Ray and 2 Running but not yet in Ray; 8
    actors (two slices' worth) of which the 2 on B's joined hosts already run, and a report
    lagging behind: no third slice, and nothing deleted while the demand needs both."""
    rc = cluster(tpu_group(replicas=2, max_replicas=4))
    pods = slice_pods("tpu", "tpu-a", HOSTS) + slice_pods("tpu", "tpu-b", HOSTS, age_s=30)
    idle_a = tpu_slice_nodes("tpu-a", HOSTS, idle_s=10_000)  # far past the idle timeout
    half_b = _joined(tpu_slice_nodes("tpu-b", HOSTS, busy_hosts=(0, 1)), (0, 1))
    frames = [
        state([head_node(), *idle_a, *half_b], [tasks(TPU_ACTOR, 6)]),
        state([head_node(), *idle_a, *half_b], [tasks(TPU_ACTOR, 7)]),  # B's second lags
    ]
    loop = make_loop(rc, pods, frames[0])
    for ray in frames * 2:
        await _reconcile(loop, ray, pods)
        assert _replicas(loop) == 2, "a third slice for two slices' demand"
        assert not loop.gcs.drains, "a slice the demand needs was drained"
    assert _written_replicas(loop) == []
