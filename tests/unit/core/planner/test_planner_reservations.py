"""Reservation grace: a slice launched for a slice reservation (ray.util.tpu's head
placement group, `{"TPU-v6e-16-head": 1}` selecting worker 0 of a v6e-16) is kept after that
reservation times out, for the grace, so the next attempt finds it: never launch, time out,
idle out, relaunch within it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kuberay_scaler.adapters.ray_gcs.state import parse_ray_state
from kuberay_scaler.core.model.plan import DeleteKind, Memory, Plan, ReservationMark, Snapshot
from kuberay_scaler.core.model.ray import RayNode, RayState
from kuberay_scaler.core.model.reasons import Keep, KeepKind
from kuberay_scaler.core.parse.pods import parse_pods
from kuberay_scaler.core.parse.raycluster import parse_raycluster
from kuberay_scaler.core.planner.deadlines import Deadlines
from kuberay_scaler.core.planner.pipeline import plan
from kuberay_scaler.core.planner.policy import Policy
from kuberay_scaler.core.planner.reservations import reservation_head, reservation_marks
from kuberay_scaler.core.planner.shapes import slice_shape
from kuberay_scaler.core.slicemap import build_slice_map
from tests.factories import (
    KUEUE_ELASTIC_GATE,
    NOW,
    NOW_MS,
    cluster,
    gang,
    head_node,
    pinned_slice_bundles,
    pod,
    slice_pods,
    slice_reservation,
    state,
    tasks,
    tpu_group,
    tpu_slice_nodes,
)

GRACE = 600.0
# The monotonic readings below count from BASE: the Ray nodes' idle clocks are stamped on the
# wall clock (NOW) and idle age is measured on the planner's monotonic tick.
BASE = NOW.timestamp()
IDLE_PAST_TIMEOUT = 120.0  # the default idle timeout is 60 s


def _plan(
    replicas: int,
    pods: list[dict[str, Any]],
    ray: RayState,
    *,
    memory: Memory | None = None,
    mono_s: float,
    grace_s: float = GRACE,
) -> Plan:
    spec = parse_raycluster(cluster(tpu_group(replicas=replicas)))
    hosts, problems = parse_pods(pods, spec)
    assert problems == []
    policy = Policy(deadlines=Deadlines(reservation_grace_s=grace_s))
    return plan(
        Snapshot(spec, tuple(hosts)), ray, memory or Memory(), policy, NOW, mono_s=BASE + mono_s
    )


def _idle_slice(key: str, idle_s: float = IDLE_PAST_TIMEOUT) -> tuple[list[Any], list[RayNode]]:
    return slice_pods("tpu", key, 4), tpu_slice_nodes(key, 4, idle_s=idle_s)


def _held_slice(key: str) -> tuple[list[Any], list[RayNode]]:
    """A slice whose head a placed reservation holds (`TPU-v6e-16-head` not available)."""
    nodes = tpu_slice_nodes(key, 4, idle_s=None)
    first = nodes[0]
    taken = {**first.available, "TPU-v6e-16-head": 0.0}
    nodes[0] = replace(first, available=taken)
    return slice_pods("tpu", key, 4), nodes


def test_ray_260s_reservation_is_recognised_and_nothing_else_is() -> None:
    assert reservation_head(slice_reservation()) is not None
    assert reservation_head(pinned_slice_bundles("tpu-a")) is None
    assert reservation_head(gang(slice_reservation().strategy)) is None


def test_a_pending_reservation_marks_its_group_and_launches_one_slice() -> None:
    result = _plan(0, [], state([head_node()], gangs=[slice_reservation()]), mono_s=100.0)
    assert result.group("tpu").target == 1  # type: ignore[union-attr]
    assert dict(result.memory.reservations) == {
        "tpu": ReservationMark(seen_s=BASE + 100.0, slices=1)
    }


def test_the_slice_outlives_its_timed_out_reservation_for_the_grace() -> None:
    """Launched at 100 s for a reservation Ray removed at 200 s (its 100 s timeout); up and
    idle past the idle timeout at 500 s: kept until 600 s after the last sighting."""
    marked = _plan(0, [], state([head_node()], gangs=[slice_reservation()]), mono_s=200.0)
    pods, nodes = _idle_slice("tpu-a")
    ray = state([head_node(), *nodes])
    kept = _plan(1, pods, ray, memory=marked.memory, mono_s=500.0)
    decision = kept.group("tpu")
    assert decision is not None and decision.deletions == ()
    [keep] = [r for r in decision.reasons if isinstance(r, Keep)]
    assert keep.kind is KeepKind.RESERVATION_GRACE and keep.slice == "tpu-a"
    assert kept.next_idle_expiry_s is not None and kept.next_idle_expiry_s <= 300.0
    # The next attempt finds it: placed on it, nothing launched.
    again = state([head_node(), *nodes], gangs=[slice_reservation()])
    found = _plan(1, pods, again, memory=kept.memory, mono_s=700.0)
    assert found.group("tpu").target == 1  # type: ignore[union-attr]
    assert found.group("tpu").deletions == ()  # type: ignore[union-attr]
    # No further attempt: it leaves once the grace has passed.
    gone = _plan(1, pods, ray, memory=found.memory, mono_s=700.0 + GRACE)
    [deletion] = gone.group("tpu").deletions  # type: ignore[union-attr]
    assert deletion.kind is DeleteKind.IDLE


def test_without_the_grace_the_slice_idles_out_and_the_next_attempt_relaunches() -> None:
    """The cycle the grace removes: launch, time out, idle out, relaunch."""
    marked = _plan(0, [], state([head_node()], gangs=[slice_reservation()]), mono_s=200.0)
    pods, nodes = _idle_slice("tpu-a")
    idle = _plan(
        1, pods, state([head_node(), *nodes]), memory=marked.memory, mono_s=500.0, grace_s=0.0
    )
    assert [x.kind for x in idle.group("tpu").deletions] == [DeleteKind.IDLE]  # type: ignore[union-attr]


def test_a_queued_slice_is_not_cancelled_within_the_grace() -> None:
    marked = _plan(0, [], state([head_node()], gangs=[slice_reservation()]), mono_s=200.0)
    pods = slice_pods("tpu", "tpu-a", 4, gates=(KUEUE_ELASTIC_GATE,))
    memory = Memory(reservations=marked.memory.reservations, queued_unneeded_since={"tpu-a": 0.0})
    kept = _plan(1, pods, state([head_node()]), memory=memory, mono_s=500.0)
    assert kept.group("tpu").deletions == ()  # type: ignore[union-attr]
    after = _plan(1, pods, state([head_node()]), memory=memory, mono_s=200.0 + GRACE)
    assert [x.kind for x in after.group("tpu").deletions] == [DeleteKind.CANCEL]  # type: ignore[union-attr]


def test_held_heads_count_toward_the_slices_the_grace_keeps() -> None:
    """Slice 3 of a SlicePlacementGroup(num_slices=3) is pending while two heads are held: when
    it times out, Ray removes all three heads; all three slices are kept."""
    held = [_held_slice("tpu-a"), _held_slice("tpu-b")]
    pods = [p for ps, _ in held for p in ps]
    nodes = [n for _, ns in held for n in ns]
    ray = state([head_node(), *nodes], gangs=[slice_reservation()])
    marked = _plan(2, pods, ray, mono_s=100.0)
    assert marked.memory.reservations["tpu"] == ReservationMark(seen_s=BASE + 100.0, slices=3)
    assert marked.group("tpu").target == 3  # type: ignore[union-attr]


def test_the_grace_keeps_no_more_slices_than_the_reservations_held() -> None:
    memory = Memory(reservations={"tpu": ReservationMark(seen_s=BASE + 100.0, slices=1)})
    a, b = _idle_slice("tpu-a", 300.0), _idle_slice("tpu-b", 200.0)
    pods, nodes = [*a[0], *b[0]], [*a[1], *b[1]]
    result = _plan(2, pods, state([head_node(), *nodes]), memory=memory, mono_s=300.0)
    decision = result.group("tpu")
    assert decision is not None
    assert [x.slice_key for x in decision.deletions] == ["tpu-a"]  # the longest idle goes
    assert [r.slice for r in decision.reasons if isinstance(r, Keep)] == ["tpu-b"]


def test_marks_expire_after_the_grace() -> None:
    memory = Memory(reservations={"tpu": ReservationMark(seen_s=BASE, slices=1)})
    result = _plan(0, [], state([head_node()]), memory=memory, mono_s=GRACE)
    assert dict(result.memory.reservations) == {}


@settings(max_examples=60)
@given(
    idle=st.lists(st.floats(min_value=0, max_value=3600), min_size=1, max_size=4),
    reserved=st.integers(min_value=1, max_value=5),
    since=st.floats(min_value=0, max_value=2 * GRACE),
    busy_demand=st.integers(min_value=0, max_value=8),
)
def test_within_the_grace_at_most_the_unreserved_surplus_leaves(
    idle: list[float], reserved: int, since: float, busy_demand: int
) -> None:
    """Invariant: while a group's mark is within the grace, slices left ≥ min(reserved,
    slices); past it, the plan is the plan without a mark (the grace changes nothing)."""
    keys = [f"tpu-{i}" for i in range(len(idle))]
    pods = [p for k in keys for p in slice_pods("tpu", k, 4)]
    nodes = [n for k, s in zip(keys, idle, strict=True) for n in tpu_slice_nodes(k, 4, idle_s=s)]
    ray = state(
        [head_node(), *nodes], tasks=[tasks({"TPU": 4}, busy_demand)] if busy_demand else []
    )
    mono = 0.0  # relative to BASE: the idle clocks above are the nodes' own
    memory = Memory(
        reservations={"tpu": ReservationMark(seen_s=BASE + mono - since, slices=reserved)}
    )
    result = _plan(len(keys), pods, ray, memory=memory, mono_s=mono)
    left = len(keys) - len(result.group("tpu").deletions)  # type: ignore[union-attr]
    if since < GRACE:
        assert left >= min(reserved, len(keys))
    else:
        bare = _plan(len(keys), pods, ray, mono_s=mono)
        assert result.group("tpu") == bare.group("tpu")


FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "ray_state"


def _captured(name: str) -> RayState:
    return parse_ray_state((FIXTURES / name).read_text(), read_at_ms=NOW_MS)


def test_ray_260s_captured_reservation_reply_is_recognised() -> None:
    """A real Ray 2.60 reply of `SlicePlacementGroup`'s step 1 (tests/fixtures/ray_state)."""
    [gang] = _captured("pending_slice_reservation.json").gangs
    head = reservation_head(gang)
    assert head is not None and dict(head.resources) == {"TPU-v6e-16-head": 1.0}


def test_a_head_a_real_reply_shows_placed_counts_as_held() -> None:
    """pinned_slice_bundles.json: the head bundle placed on worker 0 of a real v6e-16 slice (its
    `TPU-v6e-16-head_group_*` resources); one more reservation pending: 2 slices reserved."""
    ray = _captured("pinned_slice_bundles.json")
    tpu = [n for n in ray.nodes if "ray.io/tpu-worker-id" in n.labels]
    pods = [
        pod(
            n.instance_id,
            "tpu-group",
            replica="tpu-group-q8m4z",
            host_index=int(n.labels["ray.io/tpu-worker-id"]),
        )
        for n in tpu
    ]
    spec = parse_raycluster(cluster(tpu_group("tpu-group", replicas=1)))
    hosts, problems = parse_pods(pods, spec)
    assert problems == []
    slice_map = build_slice_map(spec, hosts, ray, NOW)
    pending = replace(ray, gangs=(slice_reservation(),))
    shapes = {"tpu-group": slice_shape(spec.groups[0])}
    marks = reservation_marks(slice_map, pending, shapes, {}, 50.0, GRACE)
    assert marks == {"tpu-group": ReservationMark(seen_s=50.0, slices=2)}
