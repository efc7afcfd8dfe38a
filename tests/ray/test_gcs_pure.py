"""Pure parts of the GCS adapter: report building, versions, drain verdicts, poller epochs.

No Ray processes here; fakes stand in only for our own small interfaces (`DrainClient`,
`StateSource`). One test dials a closed loopback port to see the client's failure path.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from ray.core.generated import autoscaler_pb2

from kuberay_scaler.adapters.ray_gcs.client import GcsClient, _classify
from kuberay_scaler.adapters.ray_gcs.drain import PREEMPTION, DrainReason, deadline_in, drain_slice
from kuberay_scaler.adapters.ray_gcs.errors import (
    GcsAuthError,
    GcsCallError,
    GcsError,
    GcsReplaced,
    GcsUnavailable,
)
from kuberay_scaler.adapters.ray_gcs.poller import GcsPoller
from kuberay_scaler.adapters.ray_gcs.report import (
    AutoscalingReport,
    FailedRequest,
    LaunchingGroup,
    PendingPod,
    StateVersionClock,
    build_autoscaling_state,
)
from kuberay_scaler.core.model.ray import Bundle, RayObservation
from kuberay_scaler.runtime.metrics import GcsCounters
from tests.factories import NOW_MS, one_node_reply

RUNNING = autoscaler_pb2.NodeStatus.Value("RUNNING")


# --- report -------------------------------------------------------------------------------------


def test_launching_hosts_become_one_request_entry_each() -> None:
    report = AutoscalingReport(
        launching=(
            LaunchingGroup("tpu-group", hosts=4, requested_at_s=1_700_000_000),
            LaunchingGroup("cpu-group", hosts=1, instance_type="n2-standard-8"),
        )
    )
    state = build_autoscaling_state(report, version=42)
    entries = [
        (r.ray_node_type_name, r.instance_type_name, r.count, r.request_ts)
        for r in state.pending_instance_requests
    ]
    assert entries == [("tpu-group", "tpu-group", 1, 1_700_000_000)] * 4 + [
        ("cpu-group", "n2-standard-8", 1, 0)
    ]
    assert state.autoscaler_state_version == 42


def test_pending_pods_and_failures_carry_their_details() -> None:
    report = AutoscalingReport(
        pending_pods=(PendingPod("tpu-group-abcde-worker-1", "tpu-group", "ContainerCreating"),),
        failed=(FailedRequest("cpu-group", 2, "quota", started_at_s=10, failed_at_s=20),),
        observed_state_version=7,
    )
    state = build_autoscaling_state(report)
    (pending,) = state.pending_instances
    assert (pending.instance_id, pending.ray_node_type_name, pending.details) == (
        "tpu-group-abcde-worker-1",
        "tpu-group",
        "ContainerCreating",
    )
    (failed,) = state.failed_instance_requests
    assert (failed.ray_node_type_name, failed.count, failed.reason) == ("cpu-group", 2, "quota")
    assert (failed.start_ts, failed.failed_ts) == (10, 20)
    assert state.last_seen_cluster_resource_state_version == 7


def test_infeasible_requests_are_sent_only_when_given() -> None:
    assert not build_autoscaling_state(AutoscalingReport()).infeasible_resource_requests
    told = AutoscalingReport(infeasible=(Bundle(resources={"GPU": 8.0}),))
    (request,) = build_autoscaling_state(told).infeasible_resource_requests
    assert dict(request.resources_bundle) == {"GPU": 8.0}


def test_versions_grow_within_a_millisecond_and_across_clock_steps_back() -> None:
    clock = StateVersionClock()
    first = clock.next(1_000)
    same_ms = clock.next(1_000)
    stepped_back = clock.next(500)
    assert first < same_ms < stepped_back
    clock.observe(10_000)  # the GCS already holds a later version
    assert clock.next(2_000) == 10_001
    assert clock.next(20_000) == 20_000


# --- drain --------------------------------------------------------------------------------------


@dataclass
class FakeDrainClient:
    """Answers per node id: "accept", "reject" or an exception to raise."""

    answers: dict[bytes, Any]
    cluster_id: str | None = "c0ffee"
    calls: list[tuple[bytes, str | None, int]] = field(default_factory=list)
    reasons: list[int] = field(default_factory=list)

    async def drain_node(
        self,
        node_id: bytes,
        *,
        reason_message: str,
        deadline_timestamp_ms: int,
        reason: int = 1,
        cluster_id: str | None = None,
    ) -> object:
        self.calls.append((node_id, cluster_id, deadline_timestamp_ms))
        self.reasons.append(reason)
        answer = self.answers[node_id]
        if isinstance(answer, Exception):
            raise answer
        return autoscaler_pb2.DrainNodeReply(
            is_accepted=answer == "accept",
            rejection_reason_message="" if answer == "accept" else "The node is no longer idle.",
        )


def _drains(counters: GcsCounters, outcome: str) -> float:
    return counters.sample("kuberay_scaler_drains_total", {"outcome": outcome}) or 0.0


async def test_slice_may_be_deleted_only_when_every_host_accepts() -> None:
    hosts = [b"a", b"b", b"c", b"d"]
    client = FakeDrainClient({h: "accept" for h in hosts})
    counters = GcsCounters.new()
    before = _drains(counters, "accepted")
    result = await drain_slice(
        client,
        [h.hex() for h in hosts],
        reason_message="idle",
        deadline_ms=deadline_in(30),
        counters=counters,
    )
    assert result.may_delete
    assert result.drained_node_ids == tuple(h.hex() for h in hosts)
    assert result.reason == "all 4 hosts drained"
    assert _drains(counters, "accepted") - before == 4
    assert {c[1] for c in client.calls} == {"c0ffee"}  # the current id is pinned


async def test_one_rejection_cancels_the_slice_and_lists_drained_hosts() -> None:
    client = FakeDrainClient({b"a": "accept", b"b": "reject", b"c": "accept"})
    result = await drain_slice(client, ["61", "62", "63"], reason_message="idle", deadline_ms=1)
    assert not result.may_delete
    assert result.drained_node_ids == ("61", "63")  # hex of b"a", b"c"
    assert [(h.node_id, h.outcome) for h in result.refused] == [("62", "rejected")]
    assert "no longer idle" in result.reason


async def test_an_error_on_one_host_cancels_the_slice() -> None:
    unreachable = GcsUnavailable("DrainNode", "UNAVAILABLE", "down")
    client = FakeDrainClient({b"a": "accept", b"b": unreachable})
    result = await drain_slice(
        client, ["61", "62"], reason_message="idle", deadline_ms=5, cluster_id="feed"
    )
    assert not result.may_delete
    assert [h.outcome for h in result.hosts] == ["accepted", "error"]
    assert {c[1] for c in client.calls} == {"feed"}


async def test_a_slice_without_ray_nodes_may_go() -> None:
    result = await drain_slice(FakeDrainClient({}), [], reason_message="idle", deadline_ms=5)
    assert result.may_delete
    assert result.hosts == ()


@pytest.mark.parametrize("deadline_ms", [0, -1])
async def test_non_positive_deadline_is_refused(deadline_ms: int) -> None:
    client = FakeDrainClient({b"a": "accept"})
    with pytest.raises(ValueError, match="positive"):
        await drain_slice(client, ["61"], reason_message="idle", deadline_ms=deadline_ms)
    assert client.calls == []


def test_deadline_in_is_epoch_milliseconds() -> None:
    assert deadline_in(30, now_s=1_000.0) == 1_030_000


# --- poller -------------------------------------------------------------------------------------


@dataclass
class FakeSource:
    """Replays scripted answers: a reply or an exception; `cluster_id` is set per answer."""

    script: Iterator[tuple[str | None, Any]]
    cluster_id: str | None = None

    async def get_cluster_resource_state(self) -> Any:
        self.cluster_id, answer = next(self.script)
        if isinstance(answer, Exception):
            raise answer
        return answer


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def _poll_all(poller: GcsPoller, times: int) -> list[RayObservation]:
    return [await poller.poll_once() for _ in range(times)]


async def test_epochs_count_replacements_and_counter_resets() -> None:
    down = GcsUnavailable("GetClusterResourceState", "UNAVAILABLE", "down")
    script = iter(
        [
            ("A", one_node_reply(5)),
            ("A", one_node_reply(6)),
            ("A", down),
            ("B", one_node_reply(1)),  # new cluster id: replaced
            ("B", one_node_reply(3)),
            ("B", one_node_reply(2)),  # same id, counter went back: restarted (GCS FT)
        ]
    )
    poller = GcsPoller(FakeSource(script), interval_s=1.0)
    observations = await _poll_all(poller, 6)
    assert [o.epoch for o in observations] == [0, 0, 0, 1, 1, 2]
    assert [o.known for o in observations] == [True, True, False, True, True, True]
    assert [o.cluster_id for o in observations] == ["A", "A", "A", "B", "B", "B"]
    assert observations[2].error is not None
    assert "UNAVAILABLE" in observations[2].error


async def test_an_unknown_blip_with_a_growing_version_is_not_a_new_gcs() -> None:
    down = GcsUnavailable("GetClusterResourceState", "DEADLINE_EXCEEDED", "slow")
    script = iter(
        [("A", one_node_reply(1)), ("A", one_node_reply(2)), ("A", down), ("A", one_node_reply(9))]
    )
    poller = GcsPoller(FakeSource(script), interval_s=1.0)
    observations = await _poll_all(poller, 4)
    assert [o.known for o in observations] == [True, True, False, True]
    assert observations[-1].epoch == 0  # a blip, not a new GCS


async def test_on_change_ignores_counters_and_idle_clocks() -> None:
    script = iter(
        [
            ("A", one_node_reply(1, idle_ms=100)),
            ("A", one_node_reply(2, idle_ms=600)),  # only volatile fields moved
            ("A", one_node_reply(3, status=RUNNING)),
            ("A", GcsUnavailable("GetClusterResourceState", "UNAVAILABLE", "down")),
            ("A", GcsUnavailable("GetClusterResourceState", "UNAVAILABLE", "down")),
        ]
    )
    seen: list[RayObservation] = []
    poller = GcsPoller(FakeSource(script), interval_s=1.0, on_change=seen.append)
    observations = await _poll_all(poller, 5)
    assert seen == [observations[0], observations[2], observations[3]]
    assert poller.latest is observations[4]


async def test_fresh_means_known_and_young_enough() -> None:
    clock = Clock()
    down = GcsUnavailable("GetClusterResourceState", "UNAVAILABLE", "down")
    poller = GcsPoller(
        FakeSource(iter([("A", one_node_reply(1)), ("A", down)])), interval_s=1.0, monotonic=clock
    )
    assert not poller.latest.fresh(clock.now, max_age=10)  # never polled
    known = await poller.poll_once()
    assert known.fresh(clock.now + 10, max_age=10)
    assert not known.fresh(clock.now + 10.5, max_age=10)
    unknown = await poller.poll_once()
    assert not unknown.fresh(clock.now, max_age=10)


def test_poll_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        GcsPoller(FakeSource(iter([])), interval_s=0)


# --- client -------------------------------------------------------------------------------------


@dataclass
class FakeRpcError:
    status: grpc.StatusCode
    text: str

    def code(self) -> grpc.StatusCode:
        return self.status

    def details(self) -> str:
        return self.text


@pytest.mark.parametrize(
    ("status", "text", "kind"),
    [
        (grpc.StatusCode.UNAVAILABLE, "Connection reset", GcsUnavailable),
        (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", GcsUnavailable),
        (grpc.StatusCode.UNAUTHENTICATED, "WrongClusterID: Perhaps ...", GcsReplaced),
        (grpc.StatusCode.UNAUTHENTICATED, "Invalid token", GcsAuthError),
        (grpc.StatusCode.ABORTED, "deadline is negative", GcsCallError),
    ],
)
def test_grpc_failures_are_sorted_by_what_to_do(
    status: grpc.StatusCode, text: str, kind: type[GcsError]
) -> None:
    error = _classify("DrainNode", FakeRpcError(status, text))
    assert type(error) is kind
    assert error.code == status.name
    assert error.method == "DrainNode"


def _closed_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_unreachable_gcs_fails_fast_then_backs_off_without_dialing() -> None:
    address = f"127.0.0.1:{_closed_loopback_port()}"
    counters = GcsCounters.new()
    unavailable = {"method": "GetClusterId", "code": "UNAVAILABLE"}
    errors_before = counters.sample("kuberay_scaler_gcs_rpc_errors_total", unavailable) or 0.0
    async with GcsClient(
        address, backoff_initial_s=60, backoff_max_s=60, counters=counters
    ) as client:
        with pytest.raises(GcsUnavailable) as first:
            await client.get_cluster_resource_state()
        with pytest.raises(GcsUnavailable) as second:
            await client.get_cluster_resource_state()
    assert first.value.code == "UNAVAILABLE"
    assert second.value.code == "BACKOFF"
    assert not client.connected
    assert client.cluster_id is None
    errors_after = counters.sample("kuberay_scaler_gcs_rpc_errors_total", unavailable)
    assert errors_after == errors_before + 1


async def test_the_poller_publishes_the_reply_parsed_and_leaves_it_as_it_came() -> None:
    reply = one_node_reply(7, idle_ms=4_200)
    poller = GcsPoller(FakeSource(iter([("A", reply)])), interval_s=1.0, wall=lambda: NOW_MS)
    observation = await poller.poll_once()
    assert observation.state is not None and observation.version == 7
    (node,) = observation.state.nodes
    assert node.node_id == b"n1".hex()  # hex, the one form of an id
    assert node.idle_since_ms == NOW_MS - 4_200  # idle since then, by the read time
    assert node.idle_ms(NOW_MS) == 4_200
    assert reply.cluster_resource_state.node_states[0].idle_duration_ms == 4_200
    assert poller.content_version == 1


async def test_an_unusable_reply_is_unknown_and_says_so() -> None:
    poller = GcsPoller(FakeSource(iter([("A", {"not": "a reply"})])), interval_s=1.0)
    observation = await poller.poll_once()
    assert observation.state is None and observation.unusable
    assert observation.error is not None and "unusable" in observation.error


async def test_preemption_drain_sends_reason_preemption() -> None:
    client = FakeDrainClient({b"a": "accept", b"b": "accept"})
    result = await drain_slice(
        client,
        ["61", "62"],
        reason_message="above max",
        deadline_ms=5,
        reason=DrainReason.PREEMPTION,
    )
    assert result.may_delete
    assert client.reasons == [PREEMPTION, PREEMPTION]
