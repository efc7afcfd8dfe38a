"""Every duration that licenses a deletion runs on the monotonic clock.

The fake clock's wall and monotonic readings diverge here as an NTP step makes them: the wall
jumps an hour, the monotonic clock does not. Broken-but-busy age, preemption deadlines and idle
age are judged on the monotonic clock, so a step neither deletes early nor leaves hosts
draining an extra hour; what Ray reads (the drain deadline) stays on the wall clock.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

from kuberay_scaler.core.model.drains import DrainReason
from kuberay_scaler.core.planner.deadlines import Deadlines
from kuberay_scaler.core.planner.policy import Policy
from tests.control.fakes import Loop, make_loop, run_for
from tests.control.worlds import broken_busy_slice_world, named_pods, surplus_busy_slice_world
from tests.factories import (
    cluster,
    going,
    head_node,
    node_id_of,
    slice_pods,
    state,
    tpu_group,
    tpu_slice_nodes,
)

HOUR = timedelta(hours=1)


async def test_a_wall_step_forward_does_not_end_the_broken_busy_bound_early() -> None:
    """Before: +1 h made the slice "busy for 3610 s" and its three running hosts were drained
    for preemption at once (deleted 30 s later), 30 minutes early."""
    loop, ray = broken_busy_slice_world(
        Policy(deadlines=Deadlines(broken_busy_max_s=1800, preempt_deadline_s=30))
    )
    await run_for(loop, 10, ray)
    loop.clock.wall_now += HOUR  # NTP steps the wall clock; the monotonic clock moves on
    await run_for(loop, 60, ray)
    assert loop.gcs.drains == [], "drained for preemption on a wall-clock step"
    assert named_pods(loop) == set()
    # The bound still ends on time, by the monotonic clock: 1800 s after it began.
    await run_for(loop, 1800 - 70 + 10, ray)
    assert {d.reason for d in loop.gcs.drains} == {DrainReason.PREEMPTION}
    # What Ray reads is on the wall clock (stepped): the deadline is 30 s after the wall now.
    deadline_s = loop.gcs.drains[0].deadline_ms / 1000
    assert abs(deadline_s - (loop.clock.wall().timestamp() + 30)) <= 5


async def test_a_wall_step_back_after_preemption_drains_leaves_no_host_draining_longer() -> None:
    """Before: -1 h after the preemption drains kept the surplus slice draining until its wall
    deadline came round again, an hour later."""
    rc = cluster(tpu_group(replicas=1, max_replicas=0))
    pods = slice_pods("tpu", "tpu-a", 4)
    busy = state([head_node(), *tpu_slice_nodes("tpu-a", 4, busy_hosts=(1,))])
    loop = make_loop(rc, pods, busy, policy=Policy(deadlines=Deadlines(preempt_deadline_s=30)))
    await loop.reconciler.reconcile()
    assert {d.reason for d in loop.gcs.drains} == {DrainReason.PREEMPTION}
    loop.clock.wall_now -= HOUR
    await run_for(loop, 35, busy)  # past the 30 s notice on the monotonic clock
    assert named_pods(loop) == {f"tpu-a-{i}" for i in range(4)}, "still draining after its notice"


async def test_a_wall_step_forward_does_not_make_an_idle_slice_expire_early() -> None:
    """Idle age is Ray's idle duration plus the monotonic time since the reply: a reply whose
    idle clocks were read before a +1 h step is not an hour older after it."""
    rc = cluster(tpu_group(replicas=2))
    pods = slice_pods("tpu", "tpu-a", 4) + slice_pods("tpu", "tpu-b", 4)
    ray = state(
        [
            head_node(),
            *tpu_slice_nodes("tpu-a", 4, idle_s=10),  # idle 10 s of the 60 s timeout
            *tpu_slice_nodes("tpu-b", 4, idle_s=None),
        ]
    )
    loop = make_loop(rc, pods, ray)
    await loop.reconciler.reconcile()
    loop.clock.wall_now += HOUR
    loop.clock.advance(5)
    loop.see_ray(ray)  # the same reply (its idle clocks unchanged since it was read)
    await loop.reconciler.reconcile()
    assert loop.gcs.drains == [] and named_pods(loop) == set(), "idle-expired by a wall step"


ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")


def _shown_instants(loop: Loop) -> list[datetime]:
    """Every instant the loop shows people: /debug/plan and the Events it recorded."""
    said = json.dumps(loop.reconciler.document(), default=str)
    said += " ".join(message for _, message in loop.events.recorded)
    return [datetime.fromisoformat(m).replace(tzinfo=UTC) for m in ISO.findall(said)]


async def test_every_instant_the_loop_shows_is_on_the_wall_clock() -> None:
    """The monotonic clock reads 5000 s (fakes.MONO_AT_NOW), the wall 2026: a timer kept on the
    monotonic clock and shown unconverted reads 1970. Before: the disruption stage's reasons
    said "drain slice tpu-a for preemption until 1970-01-01T01:23:50"."""
    busy = (0, 1, 2, 3)
    pods_a = slice_pods("tpu", "tpu-a", 4)
    going(pods_a[1])
    worlds = {
        "going slice": make_loop(
            cluster(tpu_group(replicas=2, max_replicas=2)),
            pods_a + slice_pods("tpu", "tpu-b", 4),
            state(
                [
                    head_node(),
                    *tpu_slice_nodes("tpu-a", 4, busy_hosts=busy),
                    *tpu_slice_nodes("tpu-b", 4, busy_hosts=busy),
                ]
            ),
        ),
        "surplus busy slice": surplus_busy_slice_world()[0],
        "broken busy slice": broken_busy_slice_world(
            Policy(deadlines=Deadlines(broken_busy_max_s=5, preempt_deadline_s=30))
        )[0],
        "refused idle drain": make_loop(
            cluster(tpu_group(replicas=1)),
            slice_pods("tpu", "tpu-a", 4),
            state([head_node(), *tpu_slice_nodes("tpu-a", 4, idle_s=900)]),
        ),
    }
    worlds["refused idle drain"].gcs.refuse = {node_id_of(f"tpu-a-{i}") for i in range(4)}
    for name, loop in worlds.items():
        shown: list[datetime] = []
        far: list[datetime] = []
        for _ in range(4):
            await loop.reconciler.reconcile()
            now = _shown_instants(loop)
            shown += now
            far += [t for t in now if abs(t - loop.clock.wall()) > timedelta(days=1)]
            loop.clock.advance(3)
        assert shown, f"{name}: no instant shown (the scenario reached no timer)"
        assert not far, f"{name}: instants shown off the wall clock: {far}"
