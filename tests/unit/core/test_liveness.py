"""The liveness tracker: Ray nodes missing only over consecutive fresh replies, on the daemon's
monotonic clock; a settle period after a GCS (re)connect; pod ages from the daemon's first sight."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from kuberay_scaler.core.liveness import HostClock, LivenessTracker
from kuberay_scaler.core.model.hosts import Host
from kuberay_scaler.core.model.ray import RayNode
from kuberay_scaler.core.model.slices import SliceState
from kuberay_scaler.core.parse.pods import parse_pods
from kuberay_scaler.core.parse.raycluster import parse_raycluster
from kuberay_scaler.core.slicemap import SliceTimeouts, build_slice_map
from tests.factories import NOW, cluster, group, slice_pods, state, tpu_slice_nodes

GRACE = 180.0
TIMEOUTS = SliceTimeouts(max_provision_s=900, missing_node_grace_s=GRACE)
SPEC = parse_raycluster(cluster(group("tpu", hosts=4, tpu="4", replicas=1, max_replicas=4)))
# Pods whose API-server timestamps say they have run for an hour.
PODS = slice_pods("tpu", "tpu-a", 4, age_s=3700, running_for_s=3600)
NODES = tpu_slice_nodes("tpu-a", 4)


def hosts_of(pods: list[dict[str, Any]]) -> list[Host]:
    hosts, problems = parse_pods(pods, SPEC)
    assert problems == []
    return hosts


def alive(nodes: list[RayNode]) -> list[str]:
    return [n.instance_id for n in nodes if n.alive]


def tracker() -> LivenessTracker:
    return LivenessTracker(grace_s=GRACE, stale_after_s=15)


def judge(t: LivenessTracker, nodes: list[RayNode], at: float) -> tuple[SliceState, str]:
    """The slice map as the daemon builds it at monotonic time `at` from `nodes`."""
    result = build_slice_map(SPEC, hosts_of(PODS), state(nodes), NOW, TIMEOUTS, clock=t.clock(at))
    [sl] = result.groups["tpu"].slices
    return sl.state, sl.reason


def steady(t: LivenessTracker, until: float, nodes: list[RayNode], start: float = 0.0) -> float:
    """Fresh replies every second from `start` to `until` (inclusive), showing `nodes`."""
    at = start
    while at <= until:
        t.observe_pods(at, hosts_of(PODS))
        t.observe_ray(at, "epoch-1", alive(nodes))
        at += 1
    return until


def test_one_reply_without_the_slices_nodes_does_not_break_it() -> None:
    t = tracker()
    now = steady(t, 400, NODES)  # nodes seen for 400 s: past the settle period
    t.observe_ray(now + 1, "epoch-1", [])  # one partial reply
    got = judge(t, [], now + 1)
    assert got[0] is not SliceState.BROKEN, got
    assert got == (SliceState.PENDING, "0 of 4 hosts joined Ray")


def test_a_node_missing_over_a_full_grace_of_fresh_replies_breaks_its_slice() -> None:
    t = tracker()
    now = steady(t, 400, NODES)
    lost = NODES[:3]  # host 3's node is gone
    now = steady(t, now + GRACE, lost, start=now + 1)
    assert judge(t, lost, now)[0] is SliceState.PENDING  # exactly one grace: not yet
    now = steady(t, now + 2, lost, start=now + 1)
    assert judge(t, lost, now) == (SliceState.BROKEN, "Ray node of tpu-a-3 missing for 3 min")


def test_a_gcs_reconnect_starts_the_grace_again() -> None:
    t = tracker()
    now = steady(t, 400, NODES)
    t.observe_ray(now + 1, "epoch-1", None)  # GCS unreachable
    # The GCS comes back 100 s later without the slice's nodes (restart window) for a while.
    now = steady(t, now + 101 + GRACE - 1, [], start=now + 101)
    state_, reason = judge(t, [], now)
    assert state_ is SliceState.PENDING, reason
    clock = t.clock(now)
    assert clock.settling is not None and "grace" in clock.settling
    now = steady(t, now + 2, [], start=now + 1)
    assert judge(t, [], now)[0] is SliceState.BROKEN


def test_a_new_cluster_id_settles_before_any_judgement() -> None:
    t = tracker()
    now = steady(t, 400, NODES)
    t.observe_ray(now + 1, "epoch-2", [])  # a replaced GCS that does not know the nodes yet
    assert t.clock(now + 1).settling is not None
    assert judge(t, [], now + 1)[0] is SliceState.PENDING


def test_a_gap_longer_than_stale_after_is_not_a_fresh_streak() -> None:
    t = tracker()
    now = steady(t, 400, NODES)
    t.observe_ray(now + 1, "epoch-1", [])
    t.observe_ray(now + 1 + 300, "epoch-1", [])  # no reply for 300 s: not consecutive
    assert t.clock(now + 301).missing_s["tpu-a-0"] == 0.0
    assert judge(t, [], now + 301)[0] is SliceState.PENDING


def test_a_node_never_seen_is_timed_from_when_the_daemon_saw_its_pod_running() -> None:
    t = tracker()
    # The daemon starts now; the pods' own timestamps claim an hour of running.
    now = steady(t, 400, NODES[:3])
    assert t.clock(now).missing_s == {"tpu-a-3": 400.0}
    assert judge(t, NODES[:3], now)[0] is SliceState.BROKEN


def test_daemon_restart_never_shortens_a_timer() -> None:
    t = tracker()
    t.observe_pods(0, hosts_of(PODS))
    t.observe_ray(0, "epoch-1", [])
    clock = t.clock(0)
    assert clock.missing_s == dict.fromkeys((p["metadata"]["name"] for p in PODS), 0.0)
    assert clock.age_s["tpu-a-0"] == 0.0  # not the hour the API server claims


def test_pod_age_ignores_api_server_clock_skew() -> None:
    # The API server's clock runs an hour ahead: its pods look created in the future.
    skewed = slice_pods("tpu", "tpu-a", 4, age_s=-3600, running_for_s=-3600)
    t = tracker()
    t.observe_pods(10, hosts_of(skewed))
    t.observe_pods(1000, hosts_of(skewed))
    assert t.clock(1000).age_s["tpu-a-0"] == 990.0


def test_unknown_gcs_reports_nothing_missing_and_says_why() -> None:
    t = tracker()
    t.observe_pods(0, hosts_of(PODS))
    t.observe_ray(0, "epoch-1", None)
    clock = t.clock(500)
    assert clock.missing_s == {}
    assert clock.settling == "no GCS reply yet: Ray's view judges no slice"


def test_a_recreated_pod_of_the_same_name_starts_fresh() -> None:
    t = tracker()
    t.observe_pods(0, hosts_of(PODS))
    again = [dict(p, metadata={**p["metadata"], "uid": "new"}) for p in PODS]
    t.observe_pods(500, hosts_of(again))
    assert t.clock(500).age_s["tpu-a-0"] == 0.0


def test_gone_pods_are_forgotten() -> None:
    t = tracker()
    steady(t, 3, NODES)
    t.observe_pods(4, [])
    t.observe_ray(4, "epoch-1", [])
    clock = t.clock(4)
    assert clock.age_s == {} and clock.missing_s == {}


def test_from_timestamps_is_the_one_shot_fallback() -> None:
    hosts = hosts_of(PODS)
    clock = HostClock.from_timestamps(hosts, ["tpu-a-0"], NOW)
    assert clock.missing_s["tpu-a-1"] == 3600.0 and "tpu-a-0" not in clock.missing_s
    assert clock.age_s["tpu-a-0"] == 3700.0
    assert NOW - timedelta(seconds=3700) == hosts[0].created_at


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError):
        LivenessTracker(grace_s=0, stale_after_s=1)
