"""Observe alone (loop/observe.py): one snapshot per reconcile, each input read once."""

from __future__ import annotations

from datetime import timedelta

from kuberay_scaler.core.decision import decide
from kuberay_scaler.core.model.plan import Memory
from kuberay_scaler.core.model.ray import RayObservation
from kuberay_scaler.core.model.reasons import Hold, HoldKind
from kuberay_scaler.core.model.signals import CapacityEvent, CapacitySignal
from kuberay_scaler.core.planner.policy import Policy
from kuberay_scaler.loop.observe import Instant, ObserveConfig, Observer
from tests.control.fakes import FakeApiServer, FakePods, FakeView, observation
from tests.factories import NOW, cluster, group, head_node, slice_pods, state, tasks, tpu_group

CONFIG = ObserveConfig(gcs_stale_after_s=15, missing_node_grace_s=180, expectation_timeout_s=60)


def at(seconds: float) -> Instant:
    return Instant(NOW + timedelta(seconds=seconds), 1000.0 + seconds)


def observer(rc: dict[str, object] | None = None) -> tuple[Observer, FakeView, FakePods]:
    view = FakeView(FakeApiServer(rc or cluster(tpu_group(replicas=1), group("cpu"))))
    pods = FakePods(slice_pods("tpu", "tpu-a", 4))
    return Observer(pods, view, CONFIG), view, pods


def test_the_raycluster_is_parsed_once_per_object_and_the_inputs_are_stable() -> None:
    seen, view, _ = observer()
    seen.see_ray(observation(state([head_node()]), observed_at=1000.0))
    first = seen.snapshot(at(0))
    second = seen.snapshot(at(1))
    assert first is not None and second is not None
    assert seen.parses == 1  # the view still holds the same object
    assert first.inputs == second.inputs and first.fresh
    assert first.observation.spec.groups and first.observation.hosts
    view.observe(view.server.obj)  # a new copy of the object: parsed again, same content
    third = seen.snapshot(at(2))
    assert seen.parses == 2 and third is not None and third.inputs == first.inputs


def test_new_gcs_content_changes_the_inputs_but_a_poll_alone_does_not() -> None:
    seen, _, _ = observer()
    seen.see_ray(observation(state([head_node()]), observed_at=1000.0))
    before = seen.snapshot(at(0))
    seen.see_ray(observation(state([head_node()]), observed_at=1001.0))  # same content
    same = seen.snapshot(at(1))
    seen.see_ray(observation(state([head_node()], [tasks({"CPU": 1}, 1)]), observed_at=1002.0))
    seen.ray_changed()  # what the poller's on_change says
    changed = seen.snapshot(at(2))
    assert before is not None and same is not None and changed is not None
    assert before.inputs == same.inputs != changed.inputs


def test_blind_inputs_are_named_and_timed() -> None:
    seen, _, pods = observer()
    seen.see_ray(observation(state([head_node()]), observed_at=1000.0))
    assert seen.snapshot(at(0)) is not None
    seen.see_ray(RayObservation(None, 1005.0, error="unreachable"))
    pods.synced = False
    blind = seen.snapshot(at(30))
    assert blind is not None and not blind.fresh
    assert blind.unknown == {"gcs", "pods"}
    assert blind.blind["gcs"] == 30 and blind.blind["raycluster"] == 0
    assert blind.observation.gcs is None and not blind.observation.synced


def test_no_raycluster_is_no_snapshot() -> None:
    seen, view, _ = observer()
    view.cached = None
    assert seen.snapshot(at(0)) is None


def test_our_write_is_held_until_seen_and_an_override_is_held_typed() -> None:
    seen, view, _ = observer(cluster(group("cpu", max_replicas=5)))
    seen.see_ray(observation(state([head_node()], [tasks({"CPU": 8}, 2)]), observed_at=1000.0))
    snap = seen.snapshot(at(0))
    assert snap is not None
    seen.wrote(decide(snap.observation, Memory(), Policy(), NOW).plan, 1000.0)  # 0 -> 2 applied
    held = seen.snapshot(at(1))  # the view has not caught up
    assert held is not None
    assert _kind(held.observation.awaiting_write["cpu"]) is HoldKind.AWAITING_WRITE
    view.server.edit(["spec", "workerGroupSpecs", 0, "replicas"], 2)  # our write is seen...
    view.observe(view.server.obj)
    caught_up = seen.snapshot(at(2))
    assert caught_up is not None and not caught_up.overridden
    assert "cpu" not in caught_up.observation.awaiting_write
    view.server.edit(["spec", "workerGroupSpecs", 0, "replicas"], 0)  # ...then GitOps resets it
    view.observe(view.server.obj)
    overridden = seen.snapshot(at(3))
    assert overridden is not None
    (notice,) = overridden.overridden
    assert (notice.group, notice.ours, notice.theirs, notice.count) == ("cpu", 2, 0, 1)
    assert _kind(overridden.observation.awaiting_write["cpu"]) is HoldKind.OVERRIDDEN


def _managed(manager: str, time: str, fields: dict[str, object]) -> dict[str, object]:
    return {"manager": manager, "operation": "Update", "time": time, "fieldsV1": fields}


def test_an_override_names_the_spec_writers_newest_first_from_managed_fields() -> None:
    seen, view, _ = observer(cluster(group("cpu", max_replicas=5)))
    seen.see_ray(observation(state([head_node()], [tasks({"CPU": 8}, 2)]), observed_at=1000.0))
    snap = seen.snapshot(at(0))
    assert snap is not None
    seen.wrote(decide(snap.observation, Memory(), Policy(), NOW).plan, 1000.0)  # 0 -> 2 applied
    view.server.edit(["spec", "workerGroupSpecs", 0, "replicas"], 2)
    view.observe(view.server.obj)
    assert seen.snapshot(at(1)) is not None  # our write is seen
    view.server.edit(
        ["metadata", "managedFields"],
        [
            _managed("kubectl-edit", "2026-01-01T10:00:00Z", {"f:spec": {}}),
            _managed("kuberay-operator", "2026-01-01T12:00:00Z", {"f:status": {}}),
            _managed("argocd-controller", "2026-01-01T11:00:00Z", {"f:spec": {"f:x": {}}}),
            _managed("", "2026-01-01T13:00:00Z", {"f:spec": {}}),  # names nobody
        ],
    )
    view.server.edit(["spec", "workerGroupSpecs", 0, "replicas"], 0)
    view.observe(view.server.obj)
    overridden = seen.snapshot(at(2))
    assert overridden is not None
    (notice,) = overridden.overridden
    assert notice.managers == ("argocd-controller", "kubectl-edit")


def _kind(hold: str | Hold) -> HoldKind:
    assert isinstance(hold, Hold)
    return hold.kind


class Feed:
    """The capacity Events port (loop/ports.py CapacityFeed): what the reader holds now."""

    def __init__(self) -> None:
        self.held: tuple[CapacityEvent, ...] = ()

    def events(self) -> tuple[CapacityEvent, ...]:
        return self.held


def test_capacity_events_reach_the_observation_and_change_the_inputs() -> None:
    view = FakeView(FakeApiServer(cluster(tpu_group(replicas=1))))
    feed = Feed()
    seen = Observer(FakePods(slice_pods("tpu", "tpu-a", 4)), view, CONFIG, feed)
    seen.see_ray(observation(state([head_node()]), observed_at=1000.0))
    before = seen.snapshot(at(0))
    stockout = CapacityEvent(
        CapacitySignal.STOCKOUT,
        "cluster-autoscaler",
        "FailedScaleUp",
        "GCE out of resources",
        1_000,
        pod="tpu-a-0",
    )
    feed.held = (stockout,)
    after = seen.snapshot(at(1))
    assert before is not None and after is not None
    assert before.observation.capacity_events == ()
    assert after.observation.capacity_events == (stockout,)
    assert before.inputs != after.inputs  # news alone is worth a plan
    assert Observer(FakePods([]), view, CONFIG).snapshot(at(2)) is not None  # no feed: none
