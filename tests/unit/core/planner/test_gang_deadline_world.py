"""Issue 32's measure for the gang deadline, in a scripted world around plan(): idle
accelerator-minutes held by incomplete gangs past their deadline (goal 0).

The world (simulated, not real Ray): two v6e-16 groups, `tpu-a` (preferred: priority 10) and
`tpu-b`. The operator creates a slice's pods as soon as `replicas` asks and deletes the
slices a plan names (drains accepted at once). A slice of `tpu-b` comes up `UP_S` after its
pods; of `tpu-a` only the first 3 ever do (then the zone is out of capacity: the rest stay
Pending). The job is one STRICT_SPREAD placement group of 16 × {CPU: 1, TPU: 4} on v6e-16
(4 slices): Ray places it, all or nothing, once 4 slices are up and idle. The planner runs
every 5 s with the memory of the last plan. Counted, while the placement group is pending:
16 chips per up slice whose launch is older than the provisioning deadline (900 s).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from kuberay_scaler.core.model.plan import Memory, Snapshot
from kuberay_scaler.core.model.ray import GangStrategy, RayNode, epoch_ms
from kuberay_scaler.core.parse.pods import parse_pods
from kuberay_scaler.core.parse.raycluster import parse_raycluster
from kuberay_scaler.core.planner import groups as planner_groups
from kuberay_scaler.core.planner.gang_deadline import GangDeadlines
from kuberay_scaler.core.planner.pipeline import plan
from kuberay_scaler.core.planner.policy import Policy
from tests.factories import (
    NOW,
    cluster,
    gang,
    head_node,
    node,
    pod,
    selector_bundle,
    state,
    tpu_group,
)

WORKER = selector_bundle({"CPU": 1, "TPU": 4}, {"ray.io/tpu-pod-type": "v6e-16"})
GANG = gang(GangStrategy.STRICT_SPREAD, *([WORKER] * 16))
STEP_S = 5.0
UP_S = 300.0
DEADLINE_S = 900.0  # KUBERAY_SCALER_MAX_PROVISION_TIME_S's default
CHIPS = 16  # per v6e-16 slice
A_COMES = 3  # slices of tpu-a that ever come up


@dataclass
class _Slice:
    key: str
    group: str
    created_s: float
    up_s: float | None  # None: never comes up
    busy: bool = False


@dataclass
class _World:
    slices: dict[str, _Slice] = field(default_factory=dict)
    replicas: dict[str, int] = field(default_factory=lambda: {"tpu-a": 0, "tpu-b": 0})
    made: dict[str, int] = field(default_factory=lambda: {"tpu-a": 0, "tpu-b": 0})
    placed_at_s: float | None = None
    placed_on: tuple[str, ...] = ()
    idle_chip_s_past_deadline: float = 0.0

    def operate(self, t: float) -> None:
        for group, want in self.replicas.items():
            mine = [s for s in self.slices.values() if s.group == group]
            for _ in range(want - len(mine)):
                i = self.made[group]
                self.made[group] += 1
                comes = group == "tpu-b" or i < A_COMES
                key = f"{group[-1]}-{i}"
                self.slices[key] = _Slice(key, group, t, t + UP_S if comes else None)

    def up(self, t: float) -> list[_Slice]:
        return [s for s in self.slices.values() if s.up_s is not None and s.up_s <= t]

    def ray_places(self, t: float) -> None:
        """The placement group, all or nothing, on 4 up slices (any groups)."""
        up = self.up(t)
        if self.placed_at_s is None and len(up) >= 4:
            for s in up[:4]:
                s.busy = True
            self.placed_at_s, self.placed_on = t, tuple(s.key for s in up[:4])

    def count_idle(self, t: float) -> None:
        if self.placed_at_s is not None:
            return
        late = [s for s in self.up(t) if t - s.created_s > DEADLINE_S]
        self.idle_chip_s_past_deadline += len(late) * CHIPS * STEP_S

    def pods(self, t: float) -> list[dict[str, Any]]:
        out = []
        for s in self.slices.values():
            up = s.up_s is not None and s.up_s <= t
            for i in range(4):
                out.append(
                    pod(
                        f"{s.key}-{i}",
                        s.group,
                        replica=s.key,
                        host_index=i,
                        phase="Running" if up else "Pending",
                        age_s=-s.created_s,  # created at NOW + created_s
                        running_for_s=-(s.up_s or 0.0),
                    )
                )
        return out

    def nodes(self, t: float) -> list[RayNode]:
        out = [head_node()]
        for s in self.up(t):
            for i in range(4):
                res = {"CPU": 24.0, "TPU": 4.0, s.key: 1.0, "accelerator_type:TPU-V6E": 1.0}
                if i == 0:
                    res["TPU-v6e-16-head"] = 1.0
                labels = {
                    "ray.io/tpu-slice-name": s.key,
                    "ray.io/tpu-worker-id": str(i),
                    "ray.io/tpu-pod-type": "v6e-16",
                    "ray.io/node-group": s.group,
                }
                avail = {**res, "TPU": 0.0, "CPU": 23.0} if s.busy else res
                n = node(
                    f"{s.key}-{i}",
                    group_name=s.group,
                    resources=res,
                    available=avail,
                    labels=labels,
                    idle_s=None if s.busy else 0,
                )
                if not s.busy:
                    since = epoch_ms(NOW + timedelta(seconds=s.up_s or 0.0))
                    n = RayNode(**{**n.__dict__, "idle_since_ms": since})
                out.append(n)
        return out


def simulate(*, until_s: float = 3600.0, b_max: int = 8) -> _World:
    """`b_max`: tpu-b's maxReplicas (0: no other group can host the gang)."""
    world = _World(replicas={"tpu-a": 4, "tpu-b": 0})  # the gang launched whole in tpu-a
    world.operate(0.0)
    memory = Memory()
    t = 0.0
    while t < until_s and world.placed_at_s is None:
        world.ray_places(t)
        rc = cluster(
            tpu_group("tpu-a", replicas=world.replicas["tpu-a"], max_replicas=8, priority=10),
            tpu_group("tpu-b", replicas=world.replicas["tpu-b"], max_replicas=b_max),
        )
        spec = parse_raycluster(rc)
        hosts, problems = parse_pods(world.pods(t), spec)
        assert problems == []
        gangs = [GANG] if world.placed_at_s is None else []
        ray = state(world.nodes(t), gangs=gangs)
        now = NOW + timedelta(seconds=t)
        result = plan(
            Snapshot(spec, tuple(hosts)), ray, memory, Policy(), now, mono_s=now.timestamp()
        )
        memory = result.memory
        for decision in result.groups:
            for gone in decision.deletions:
                sl = world.slices.pop(gone.slice_key)
                assert not sl.busy, f"busy slice {sl.key} deleted"
                ran = sl.up_s is not None and sl.up_s <= t
                assert not ran or len(gone.node_ids) == 4, f"{sl.key} ran: deleted undrained"
            world.replicas[decision.group] = decision.target
        world.operate(t)
        world.count_idle(t)
        t += STEP_S
    return world


def test_the_gang_deadline_hands_back_idle_chips_and_the_gang_arrives_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with_deadline = simulate()
    with monkeypatch.context() as m:  # the planner before the gang deadline
        m.setattr(planner_groups, "gang_deadlines", lambda *a, **k: GangDeadlines())
        without = simulate()
    print(  # the numbers the issue asks for (shown with -s)
        f"\nwithout the gang deadline: idle chip-minutes past the deadline"
        f" {without.idle_chip_s_past_deadline / 60:.0f}, placed at {without.placed_at_s} s"
        f" on {without.placed_on}"
        f"\nwith it: idle chip-minutes past the deadline"
        f" {with_deadline.idle_chip_s_past_deadline / 60:.0f}, placed at"
        f" {with_deadline.placed_at_s} s on {with_deadline.placed_on}"
    )
    assert without.idle_chip_s_past_deadline > 0  # the waste the issue describes
    assert with_deadline.idle_chip_s_past_deadline == 0
    assert with_deadline.placed_at_s is not None
    assert {k[0] for k in with_deadline.placed_on} == {"b"}  # all 4 in the group that has them


def test_with_no_other_group_the_gang_is_handed_back_and_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with_deadline = simulate(b_max=0)
    with monkeypatch.context() as m:
        m.setattr(planner_groups, "gang_deadlines", lambda *a, **k: GangDeadlines())
        without = simulate(b_max=0)
    print(
        f"\nno other group, an hour: idle chip-minutes past the deadline without"
        f" {without.idle_chip_s_past_deadline / 60:.0f}, with"
        f" {with_deadline.idle_chip_s_past_deadline / 60:.0f}"
    )
    assert without.idle_chip_s_past_deadline > with_deadline.idle_chip_s_past_deadline == 0
    assert with_deadline.placed_at_s is None  # it waits: no partial gang is placed
