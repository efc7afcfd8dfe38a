"""The cluster-autoscaler stand-in says what the real one says, in the order it says it, and the
daemon's parser reads every form it posts as the signal it stands for."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kuberay_scaler.core.model.signals import CapacitySignal
from kuberay_scaler.core.parse.events import parse_event
from kuberay_standins.ca_standin import ClusterAutoscalerStandIn, unschedulable

V5E = "tpu-v5-lite-podslice"


def pending(name: str, accelerator: str = V5E, *, reason: str = "Unschedulable") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
        "spec": {"nodeSelector": {"cloud.google.com/gke-tpu-accelerator": accelerator}},
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": reason,
                    "message": "0/14 nodes are available: 14 node(s) didn't match Pod's node"
                    " affinity/selector.",
                }
            ],
        },
    }


@dataclass
class Reply:
    status: int
    body: Any


class FakeApi:
    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.events: list[dict[str, Any]] = []

    async def request(
        self, method: str, path: str, body: Any = None, *, query: Mapping[str, str] | None = None
    ) -> Reply:
        if method == "GET":
            assert query == {"fieldSelector": "status.phase=Pending"}
            return Reply(200, {"items": self.pods})
        self.events.append(body)
        return Reply(201, body)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_stockout_sequence_and_every_form_parses_as_its_signal() -> None:
    api = FakeApi([pending("p0"), pending("p1", "tpu-v6e-slice"), pending("p2", reason="x")])
    clock = Clock()
    ca = ClusterAutoscalerStandIn(api, "ns", {V5E: "stockout"}, clock=clock, failure_after_s=2)

    async def steps() -> None:
        await ca.step()  # triggered
        await ca.step()  # too soon to fail
        clock.now = 2.5
        await ca.step()  # the failure
        await ca.step()  # then in backoff
        await ca.step()  # each (pod, reason) once

    asyncio.run(steps())
    assert [(e["involvedObject"]["name"], e["reason"]) for e in api.events] == [
        ("p0", "TriggeredScaleUp"),
        ("p0", "FailedScaleUp"),
        ("p0", "NotTriggerScaleUp"),
    ]  # p1: no mode for v6e; p2: not Unschedulable
    signals = [parse_event(e) for e in api.events]
    assert [s.signal if s else None for s in signals] == [
        CapacitySignal.SCALE_UP_TRIGGERED,
        CapacitySignal.STOCKOUT,
        CapacitySignal.NO_SCALE_UP,
    ]
    assert api.events[1]["type"] == "Warning"
    assert "GCE out of resources" in api.events[1]["message"]


def test_modes_can_change_while_it_runs() -> None:
    api = FakeApi([pending("p0"), pending("p1")])
    ca = ClusterAutoscalerStandIn(api, "ns", {V5E: "quota"}, clock=Clock())
    ca.say(V5E, "no-scale-up")
    asyncio.run(ca.step())
    ca.say(V5E, None)
    asyncio.run(ca.step())
    assert [(e["involvedObject"]["name"], e["reason"]) for e in api.events] == [
        ("p0", "NotTriggerScaleUp"),
        ("p1", "NotTriggerScaleUp"),
    ]


def test_a_bound_or_terminating_pod_is_not_unschedulable() -> None:
    bound = pending("p0")
    bound["spec"]["nodeName"] = "n1"
    going = pending("p1")
    going["metadata"]["deletionTimestamp"] = "2026-12-04T12:00:00Z"
    assert not unschedulable(bound) and not unschedulable(going)
    assert unschedulable(pending("p2"))
