"""Issue 32's measure, in a scripted world around plan(): a `SlicePlacementGroup(num_slices=4)`
run whose slices take longer to come up than Ray's reservation timeout.

The world (simulated, not real Ray): the operator creates a slice's pods as soon as `replicas`
asks (Pending until `up_s` after), and deletes the slices a plan names. The driver acts as Ray
2.60's `SlicePlacementGroup` does: it reserves slice heads one at a time, each reservation a
pending head placement group until an up slice with a free head takes it or 100 s pass
(`DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S`); on a timeout it removes every head it holds and the
caller tries again after `retry_s`. The planner runs every 5 s with the memory of the last plan
(as if every write applied). Counted: slices launched, slices deleted, launch → delete →
relaunch cycles (a launch within 10 min of deleting a slice that came up), and when the 4th
head is held.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import pytest

from kuberay_scaler.core.model.plan import Memory, Snapshot
from kuberay_scaler.core.model.ray import RayNode, TaskDemand, epoch_ms
from kuberay_scaler.core.parse.pods import parse_pods
from kuberay_scaler.core.parse.raycluster import parse_raycluster
from kuberay_scaler.core.planner.deadlines import Deadlines
from kuberay_scaler.core.planner.pipeline import plan
from kuberay_scaler.core.planner.policy import Policy
from tests.factories import (
    NOW,
    cluster,
    head_node,
    node,
    pod,
    selector_bundle,
    slice_reservation,
    state,
    tpu_group,
)

RESERVATION_TIMEOUT_S = 100.0
TRAIN_WORKER = selector_bundle({"CPU": 1, "TPU": 4}, {"ray.io/tpu-pod-type": "v6e-16"})
STEP_S = 5.0
CYCLE_WINDOW_S = 600.0


@dataclass
class _Slice:
    key: str
    created_s: float
    up_s: float
    held: bool = False
    free_since_s: float = 0.0  # when its head was last released (or it came up)


@dataclass
class _World:
    up_after_s: float
    retry_s: float
    slices: dict[str, _Slice] = field(default_factory=dict)
    replicas: int = 0
    launched: int = 0
    deleted_up: list[float] = field(default_factory=list)  # when an up slice was deleted
    cycles: int = 0
    next_name: int = 0
    pending_since_s: float | None = 0.0  # the reservation being waited for (None: retrying)
    retry_at_s: float = 0.0
    whole_at_s: float | None = None

    def operate(self, t: float) -> None:
        while len(self.slices) < self.replicas:
            key = f"tpu-{self.next_name}"
            self.next_name += 1
            self.slices[key] = _Slice(key, t, t + self.up_after_s)
            self.launched += 1
            if any(t - d < CYCLE_WINDOW_S for d in self.deleted_up):
                self.cycles += 1

    def drive(self, t: float) -> None:
        """SlicePlacementGroup(num_slices=4): one reservation at a time."""
        if self.whole_at_s is not None:
            return
        if self.pending_since_s is None:
            if t >= self.retry_at_s:
                self.pending_since_s = t
            return
        free = [s for s in self.slices.values() if s.up_s <= t and not s.held]
        if free:
            free[0].held = True
            if sum(s.held for s in self.slices.values()) == 4:
                self.whole_at_s, self.pending_since_s = t, None
            else:
                self.pending_since_s = t  # the next slice's reservation
        elif t - self.pending_since_s >= RESERVATION_TIMEOUT_S:
            for s in self.slices.values():  # shutdown(): every head it held is removed
                if s.held:
                    s.held, s.free_since_s = False, t
            self.pending_since_s, self.retry_at_s = None, t + self.retry_s

    def pods(self, t: float) -> list[dict[str, Any]]:
        out = []
        for s in self.slices.values():
            up = s.up_s <= t
            for i in range(4):
                out.append(
                    pod(
                        f"{s.key}-{i}",
                        "tpu",
                        replica=s.key,
                        host_index=i,
                        phase="Running" if up else "Pending",
                        age_s=-s.created_s,  # created at NOW + created_s
                        running_for_s=-s.up_s,
                    )
                )
        return out

    def nodes(self, t: float) -> list[RayNode]:
        out = [head_node()]
        for s in self.slices.values():
            if s.up_s > t:
                continue
            since = max(s.up_s, s.free_since_s)
            for i in range(4):
                res = {"CPU": 24.0, "TPU": 4.0, s.key: 1.0, "accelerator_type:TPU-V6E": 1.0}
                if i == 0:
                    res["TPU-v6e-16-head"] = 1.0
                avail = {**res, "TPU-v6e-16-head": 0.0} if s.held and i == 0 else res
                n = node(
                    f"{s.key}-{i}",
                    group_name="tpu",
                    resources=res,
                    available=avail,
                    labels={
                        "ray.io/tpu-slice-name": s.key,
                        "ray.io/tpu-worker-id": str(i),
                        "ray.io/tpu-pod-type": "v6e-16",
                    },
                    idle_s=None if s.held else 0,
                )
                if not s.held:  # idle since it came up or its head was released
                    n = _idle_since(n, since)
                out.append(n)
        return out


def _idle_since(n: RayNode, since_s: float) -> RayNode:
    return replace(n, idle_since_ms=epoch_ms(NOW + timedelta(seconds=since_s)))


def simulate(
    *,
    grace_s: float,
    up_after_s: float = 300.0,
    retry_s: float = 120.0,
    train_request: bool = False,
) -> _World:
    """`train_request`: Ray Train v2's autoscaling coordinator also asks, through
    request_resources, for the whole gang (16 workers of {CPU: 1, TPU: 4} on v6e-16)."""
    world = _World(up_after_s=up_after_s, retry_s=retry_s)
    memory = Memory()
    policy = Policy(deadlines=Deadlines(reservation_grace_s=grace_s))
    t = 0.0
    while t < 3600.0 and world.whole_at_s is None:
        world.drive(t)
        rc = cluster(tpu_group(replicas=world.replicas, max_replicas=8))
        spec = parse_raycluster(rc)
        hosts, problems = parse_pods(world.pods(t), spec)
        assert problems == []
        gangs = [slice_reservation()] if world.pending_since_s is not None else []
        constraint = [TaskDemand(TRAIN_WORKER, 16)] if train_request else []
        ray = state(world.nodes(t), gangs=gangs, constraint=constraint)
        now = NOW + timedelta(seconds=t)
        result = plan(
            Snapshot(spec, tuple(hosts)), ray, memory, policy, now, mono_s=now.timestamp()
        )
        memory = result.memory
        decision = result.group("tpu")
        assert decision is not None
        for gone in decision.deletions:
            sl = world.slices.pop(gone.slice_key)
            assert not sl.held, "a slice holding a reservation was deleted"
            if sl.up_s <= t:
                world.deleted_up.append(t)
        world.replicas = decision.target
        world.operate(t)
        t += STEP_S
    return world


def test_the_grace_ends_launch_delete_relaunch_cycles() -> None:
    without = simulate(grace_s=0.0)
    with_grace = simulate(grace_s=600.0)
    print(  # the numbers the issue asks for (shown with -s)
        f"\nno grace: launched {without.launched}, cycles {without.cycles},"
        f" 4 heads held at {without.whole_at_s}"
        f"\ngrace 600 s: launched {with_grace.launched}, cycles {with_grace.cycles},"
        f" 4 heads held at {with_grace.whole_at_s}"
    )
    assert without.cycles >= 1  # the churn the issue describes, in this world
    assert with_grace.cycles == 0
    assert with_grace.launched == 4
    assert with_grace.whole_at_s is not None
    assert without.whole_at_s is None or with_grace.whole_at_s <= without.whole_at_s


@pytest.mark.parametrize("retry_s", [10.0, 120.0, 300.0])
def test_with_the_grace_four_slices_are_launched_once_whatever_the_retry_gap(
    retry_s: float,
) -> None:
    world = simulate(grace_s=600.0, retry_s=retry_s)
    assert world.cycles == 0 and world.launched == 4 and world.whole_at_s is not None


def test_a_gang_asked_for_whole_is_up_in_one_provisioning_time() -> None:
    """Time to k = 4 slices: the sequential reservations take about four provisioning times;
    with Ray Train's request_resources for the whole gang the 4 slices are launched in one
    patch and the reservations find them as they come up."""
    sequential = simulate(grace_s=600.0)
    whole = simulate(grace_s=600.0, train_request=True)
    print(
        f"\ntime to 4 heads: sequential {sequential.whole_at_s} s, whole gang {whole.whole_at_s} s"
    )
    assert whole.launched == 4 and whole.cycles == 0
    assert whole.whole_at_s is not None and sequential.whole_at_s is not None
    assert whole.whole_at_s <= 300.0 + 4 * STEP_S < sequential.whole_at_s
