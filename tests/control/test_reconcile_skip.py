"""A reconcile woken by a change that changes nothing the plan reads does not plan.

The GCS side is a real `GcsPoller` over a scripted source (replies whose state version and idle
clocks move on every call, as a real GCS's do), wired to the reconciler as app.py wires it; the
Kubernetes side is the informer's store and the RayCluster view, faked as the loop's Protocols.
Plans are counted at `plan()` itself. Dry-run mode keeps the writer and drains out of it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from kuberay_scaler.adapters.ray_gcs.poller import GcsPoller, monotonic_ms
from kuberay_scaler.core.decision import deciding as decision_module
from kuberay_scaler.core.model.labels import DRAINING_ANNOTATION
from kuberay_scaler.core.planner.policy import Policy
from kuberay_scaler.loop.config import LoopConfig
from kuberay_scaler.loop.reconciler import Reconciler
from tests.control.fakes import FakeEvents, FakeFeed, FakeGcs
from tests.factories import cluster, gcs_node, gcs_reply, gcs_request, group, pod


def _head_reply(version: int, *, idle_ms: int, demand: bool = False) -> Any:
    """A reply of the head alone (its node state version moves with the reply's), with one
    pending 1-CPU task if `demand`."""
    head = gcs_node(
        b"h" * 28,
        "rc-head",
        idle_ms=idle_ms,
        ray_node_type_name="headgroup",
        node_state_version=version,
        total_resources={"node:__internal_head__": 1.0},
    )
    return gcs_reply(version, nodes=[head], demand=[gcs_request({"CPU": 1.0})] if demand else [])


@dataclass
class Source:
    script: Iterator[Any]
    cluster_id: str | None = "c1"

    async def get_cluster_resource_state(self) -> Any:
        return next(self.script)


@dataclass
class Pods:
    store: dict[str, Any] = field(default_factory=dict)
    synced: bool = True


@dataclass
class View:
    raw: dict[str, Any]
    synced: bool = True

    def current(self) -> dict[str, Any]:
        return self.raw


@pytest.fixture
def plans(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = decision_module.plan

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(decision_module, "plan", counting)
    return calls


def _wired(replies: Iterator[Any], pods: Pods, view: View) -> tuple[GcsPoller, Reconciler]:
    rec = Reconciler(
        config=LoopConfig(dry_run=True),
        policy=Policy(),
        pods=pods,
        cluster=view,  # type: ignore[arg-type]
        feed=FakeFeed(),
        gcs=FakeGcs(),
        writer=None,  # type: ignore[arg-type]
        events=FakeEvents(),
    )
    poller = GcsPoller(
        Source(replies),
        interval_s=1.0,
        on_change=rec.gcs_changed,
        on_observation=rec.observe_gcs,
        wall=monotonic_ms,  # stamped on the reconciler's clock, as app.py wires it
    )
    return poller, rec


async def test_an_unchanged_gcs_reply_triggers_no_plan(plans: list[int]) -> None:
    replies = iter(
        [
            _head_reply(1, idle_ms=1_000),
            _head_reply(2, idle_ms=2_000),  # only the version and the idle clock moved
            _head_reply(3, idle_ms=3_000, demand=True),
        ]
    )
    pods = Pods({"rc-head": pod("rc-head", "headgroup", head=True, container="ray-head")})
    poller, rec = _wired(replies, pods, View(cluster(group("cpu", max_replicas=5))))

    await poller.poll_once()
    await rec.reconcile({"gcs"})
    assert len(plans) == 1

    await poller.poll_once()
    await rec.reconcile({"gcs"})
    assert len(plans) == 1  # same content: skipped
    assert rec.skipped == 1

    await rec.reconcile({"timer"})
    assert len(plans) == 2  # the timer always plans: idle clocks and deadlines move

    await poller.poll_once()
    result = await rec.reconcile({"gcs"})
    assert len(plans) == 3  # new demand
    assert result is not None and {d.group: d.target for d in result.groups}["cpu"] == 1


async def test_a_pod_event_that_changes_no_host_triggers_no_plan(plans: list[int]) -> None:
    pods = Pods(
        {
            "rc-head": pod("rc-head", "headgroup", head=True, container="ray-head"),
            "cpu-a": pod("cpu-a", "cpu"),
        }
    )
    view = View(cluster(group("cpu", replicas=1, min_replicas=1, max_replicas=5)))
    poller, rec = _wired(iter([_head_reply(1, idle_ms=0)]), pods, view)
    await poller.poll_once()
    await rec.reconcile({"pods"})
    assert len(plans) == 1

    touched = copy.deepcopy(pods.store["cpu-a"])
    touched["metadata"]["resourceVersion"] = "12"
    pods.store["cpu-a"] = touched
    await rec.reconcile({"pods"})
    assert len(plans) == 1

    pods.store["cpu-a"] = pod("cpu-a", "cpu", deleting=True)
    await rec.reconcile({"pods"})
    assert len(plans) == 2

    changed = copy.deepcopy(view.raw)
    changed["metadata"]["resourceVersion"] = "8"  # e.g. a status write by the operator
    view.raw = changed
    await rec.reconcile({"raycluster"})
    assert len(plans) == 2
    changed = copy.deepcopy(changed)
    changed["spec"]["workerGroupSpecs"][0]["maxReplicas"] = 6
    view.raw = changed
    await rec.reconcile({"raycluster"})
    assert len(plans) == 3


async def test_who_wrote_the_spec_and_unread_annotations_trigger_no_plan_our_record_does(
    plans: list[int],
) -> None:
    """The fingerprint holds the parsed spec: the spec's writers (managedFields) and annotations
    the plan does not read change nothing it plans from; our draining record is read."""
    pods = Pods({"rc-head": pod("rc-head", "headgroup", head=True, container="ray-head")})
    view = View(cluster(group("cpu", max_replicas=5)))
    view.raw["metadata"]["annotations"] = {}  # a map already: adding one is not a new map
    poller, rec = _wired(iter([_head_reply(1, idle_ms=0)]), pods, view)
    await poller.poll_once()
    await rec.reconcile({"raycluster"})
    assert len(plans) == 1

    def edited(key: str, value: Any) -> dict[str, Any]:
        changed = copy.deepcopy(view.raw)
        changed["metadata"][key] = value
        changed["metadata"]["resourceVersion"] = str(
            int(changed["metadata"]["resourceVersion"]) + 1
        )
        return changed

    writer = {"manager": "argocd", "time": "2026-01-01T10:00:00Z", "fieldsV1": {"f:spec": {}}}
    view.raw = edited("managedFields", [writer])
    await rec.reconcile({"raycluster"})
    assert len(plans) == 1
    view.raw = edited("annotations", {"argocd.argoproj.io/tracking-id": "app:ray/RayCluster:rc"})
    await rec.reconcile({"raycluster"})
    assert len(plans) == 1 and rec.skipped == 2

    notes = {**view.raw["metadata"]["annotations"], DRAINING_ANNOTATION: '{"cpu": []}'}
    view.raw = edited("annotations", notes)
    await rec.reconcile({"raycluster"})
    assert len(plans) == 2  # our draining record is an input
