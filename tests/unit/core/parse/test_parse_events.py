"""core/parse/events.py: the Events docs/capacity-signals.md names, in the forms their senders
post them (both API shapes), classified; anything else, or anything malformed, is None."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kuberay_scaler.core.model.signals import CapacitySignal
from kuberay_scaler.core.parse.events import (
    MAX_MESSAGE,
    capacity_events,
    group_of_prefix,
    last_seen_ms,
    parse_event,
)

T0 = "2026-12-04T12:03:10Z"
T0_MS = 1796385790000
POD = "tpu-v6e-16-v6e-worker-abcde"
STOCKOUT = (
    "Node scale up in zones us-east5-b associated with this pod failed: GCE out of resources."
    " Pod is at risk of not being scheduled."
)
QUOTA = (
    "Node scale up in zones us-east5-b associated with this pod failed: GCE quota exceeded."
    " Pod is at risk of not being scheduled."
)
IP = (
    "Node scale up in zones us-east5-b associated with this pod failed: IP space exhausted."
    " Pod is at risk of not being scheduled."
)
TRIGGERED = (
    "pod triggered scale-up: [{https://www.googleapis.com/compute/v1/projects/p/zones/us-east5-b/"
    "instanceGroups/gke-c-v6e-pool-1a2b3c4d-grp 0->4 (max: 4)}]"
)
NOT_TRIGGERED = (
    "pod didn't trigger scale-up: 1 max node group size reached, 2 in backoff after failed scale-up"
)
RESOURCE_QUOTA = (
    'Failed to create worker Pod for the cluster ns/tpu-v6e-16, pods "tpu-v6e-16-v6e-worker-" is'
    " forbidden: exceeded quota: tpu-quota, requested: google.com/tpu=4, used: google.com/tpu=16,"
    " limited: google.com/tpu=16"
)


def core_event(
    reason: str,
    message: str,
    *,
    kind: str = "Pod",
    name: str = POD,
    component: str = "cluster-autoscaler",
    **extra: Any,
) -> dict[str, Any]:
    """A core/v1 Event as client-go's legacy recorder posts it."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.17e0", "namespace": "ns"},
        "involvedObject": {"kind": kind, "name": name, "namespace": "ns", "uid": "u1"},
        "reason": reason,
        "message": message,
        "source": {"component": component},
        "firstTimestamp": T0,
        "lastTimestamp": T0,
        "count": 1,
        "type": "Normal",
        **extra,
    }


def new_api_event(
    reason: str, note: str, *, kind: str, name: str, controller: str
) -> dict[str, Any]:
    """An events.k8s.io/v1 Event as KubeRay v1.7.0's recorder writes it."""
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.18a1", "namespace": "ns"},
        "regarding": {"kind": kind, "name": name, "namespace": "ns", "apiVersion": "ray.io/v1"},
        "reason": reason,
        "note": note,
        "action": "Create",
        "reportingController": controller,
        "reportingInstance": "kuberay-operator-7d9",
        "eventTime": "2026-12-04T12:03:10.250000Z",
        "type": "Warning",
    }


@pytest.mark.parametrize(
    "reason,message,signal",
    [
        ("TriggeredScaleUp", TRIGGERED, CapacitySignal.SCALE_UP_TRIGGERED),
        ("NotTriggerScaleUp", NOT_TRIGGERED, CapacitySignal.NO_SCALE_UP),
        (
            "NotTriggerScaleUp",
            "pod didn't trigger scale-up: max total nodes in cluster reached",
            CapacitySignal.NO_SCALE_UP,
        ),
        ("FailedScaleUp", STOCKOUT, CapacitySignal.STOCKOUT),
        ("FailedScaleUp", QUOTA, CapacitySignal.QUOTA),
        ("FailedScaleUp", IP, CapacitySignal.SCALE_UP_FAILED),
        (
            "FailedScaleUp",
            STOCKOUT.replace("GCE out of resources", "Reservation capacity exceeded"),
            CapacitySignal.STOCKOUT,
        ),
        (
            "FailedScaleUp",
            "scale-up failed: ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
            CapacitySignal.STOCKOUT,
        ),
        # two zones, two failures: a stockout anywhere is a stockout
        (
            "FailedScaleUp",
            QUOTA.replace("GCE quota exceeded", "GCE quota exceeded, GCE out of resources"),
            CapacitySignal.STOCKOUT,
        ),
    ],
)
def test_cluster_autoscaler_events_on_pods(
    reason: str, message: str, signal: CapacitySignal
) -> None:
    event = parse_event(core_event(reason, message))
    assert event is not None
    assert (event.signal, event.source, event.reason, event.pod) == (
        signal,
        "cluster-autoscaler",
        reason,
        POD,
    )
    assert event.message == message
    assert event.last_seen_ms == T0_MS
    assert event.group is None  # found by pod, in the planner


def test_repeats_count_and_the_newest_time_wins() -> None:
    raw = core_event("FailedScaleUp", STOCKOUT, count=7, lastTimestamp="2026-12-04T12:09:10Z")
    event = parse_event(raw)
    assert event is not None
    assert event.count == 7
    assert event.last_seen_ms == T0_MS + 360_000


def test_aggregated_message_prefix_is_dropped() -> None:
    raw = core_event("FailedScaleUp", "(combined from similar events): " + STOCKOUT)
    event = parse_event(raw)
    assert event is not None and event.message == STOCKOUT
    assert event.signal is CapacitySignal.STOCKOUT


def test_series_time_of_a_new_api_event_through_core_v1() -> None:
    # An events.k8s.io Event read through core/v1: source empty, reportingComponent set,
    # timestamps null, the repeats in series.
    raw = core_event("FailedScaleUp", STOCKOUT, component="")
    raw.update(
        source={},
        reportingComponent="cluster-autoscaler",
        firstTimestamp=None,
        lastTimestamp=None,
        eventTime="2026-12-04T12:03:10.000000Z",
        series={"count": 3, "lastObservedTime": "2026-12-04T12:04:10.500000Z"},
    )
    event = parse_event(raw)
    assert event is not None
    assert (event.source, event.count, event.last_seen_ms) == (
        "cluster-autoscaler",
        3,
        T0_MS + 60_500,
    )


@pytest.mark.parametrize(
    "raw",
    [
        core_event("FailedScaleUp", STOCKOUT, component="karpenter"),  # not the CA
        core_event("FailedScaleUp", STOCKOUT, kind="Node"),  # not about a pod
        core_event("FailedScheduling", "0/14 nodes are available", component="default-scheduler"),
        core_event("Scheduled", "Successfully assigned", component="default-scheduler"),
        core_event("FailedScaleUp", STOCKOUT, lastTimestamp=None, firstTimestamp=None),  # no time
        core_event("FailedScaleUp", STOCKOUT, name=""),
    ],
)
def test_not_capacity_news(raw: dict[str, Any]) -> None:
    assert parse_event(raw) is None


def test_kuberay_quota_refusal_names_its_group_by_generate_name() -> None:
    raw = new_api_event(
        "FailedToCreateWorkerPod",
        RESOURCE_QUOTA,
        kind="RayCluster",
        name="tpu-v6e-16",
        controller="raycluster-controller",
    )
    event = parse_event(raw, cluster="tpu-v6e-16", groups=("v5e", "v6e"))
    assert event is not None
    assert (event.signal, event.group, event.pod, event.source) == (
        CapacitySignal.QUOTA,
        "v6e",
        None,
        "raycluster-controller",
    )
    assert event.last_seen_ms == T0_MS + 250
    # Without the group names it is still quota news, of no group.
    bare = parse_event(raw)
    assert bare is not None and bare.signal is CapacitySignal.QUOTA and bare.group is None
    # Another RayCluster's Event is not ours.
    assert parse_event(raw, cluster="other", groups=("v6e",)) is None


def test_kuberay_legacy_recorder_and_other_refusals() -> None:
    message = (
        'Failed to create worker Pod for the cluster ns/c, admission webhook "x" denied the'
        ' request: pods "c-big-worker-" is forbidden: no'
    )
    legacy = core_event(
        "FailedToCreateWorkerPod",
        message,
        kind="RayCluster",
        name="c",
        component="raycluster-controller",
    )
    event = parse_event(legacy, cluster="c", groups=("big",))
    assert event is not None
    assert (event.signal, event.group) == (CapacitySignal.SCALE_UP_FAILED, "big")
    conflict = copy.deepcopy(legacy)
    conflict["message"] = "Failed to create worker Pod for the cluster ns/c, etcdserver: timeout"
    assert parse_event(conflict, cluster="c") is None


def test_group_of_prefix_follows_kuberays_cut_and_case() -> None:
    cluster = "a-very-long-raycluster-name-for-tpu-training-jobs"  # 48 characters
    groups = ("v6e-group-one", "v6e-group-two", "V5E")
    # <cluster>-<group> is cut to 50 characters: both v6e groups share the prefix → ambiguous.
    prefix = f"{cluster}-v"[:50] + "-worker-"
    assert group_of_prefix(prefix, cluster, groups) is None
    assert group_of_prefix("c-v5e-worker-", "c", groups) == "V5E"
    assert group_of_prefix("c-v5e-worker-85s99", "c", groups) == "V5E"  # named before admission
    assert group_of_prefix("c-v5e-", "c", groups) is None
    assert group_of_prefix(None, "c", groups) is None


def test_newest_per_pod_and_reason_oldest_first() -> None:
    raws = [
        core_event("NotTriggerScaleUp", NOT_TRIGGERED, lastTimestamp="2026-12-04T12:03:30Z"),
        core_event("NotTriggerScaleUp", NOT_TRIGGERED, lastTimestamp="2026-12-04T12:03:20Z"),
        core_event("FailedScaleUp", STOCKOUT, lastTimestamp="2026-12-04T12:03:25Z"),
        core_event("TriggeredScaleUp", TRIGGERED, name="other-pod"),
        {"not": "an event"},
        "junk",
    ]
    events = capacity_events(raws)
    assert [(e.pod, e.reason, e.last_seen_ms - T0_MS) for e in events] == [
        ("other-pod", "TriggeredScaleUp", 0),
        (POD, "FailedScaleUp", 15_000),
        (POD, "NotTriggerScaleUp", 20_000),
    ]


def test_time_forms() -> None:
    assert last_seen_ms({"eventTime": "2026-12-04T12:03:10.123456Z"}) == T0_MS + 123
    assert last_seen_ms({"lastTimestamp": "2026-12-04T12:03:10+00:00"}) == T0_MS
    assert last_seen_ms({"lastTimestamp": "yesterday"}) is None
    assert last_seen_ms({"lastTimestamp": 1796385790}) is None
    assert last_seen_ms({"series": "x", "eventTime": ["x"]}) is None


def test_long_messages_are_read_only_so_far() -> None:
    raw = core_event("FailedScaleUp", "x" * 10**6 + " GCE out of resources")
    event = parse_event(raw)
    assert event is not None
    assert len(event.message) == MAX_MESSAGE
    assert event.signal is CapacitySignal.SCALE_UP_FAILED  # what was never read says nothing


FIELDS = [
    "reason",
    "message",
    "note",
    "involvedObject",
    "regarding",
    "kind",
    "name",
    "source",
    "component",
    "reportingComponent",
    "reportingController",
    "deprecatedSource",
    "series",
    "lastObservedTime",
    "lastTimestamp",
    "eventTime",
    "firstTimestamp",
    "count",
    "metadata",
]
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.floats(),
    st.text(max_size=12),
    st.sampled_from(
        [
            "Pod",
            "RayCluster",
            "FailedScaleUp",
            "NotTriggerScaleUp",
            "TriggeredScaleUp",
            "FailedToCreateWorkerPod",
            "cluster-autoscaler",
            T0,
            "2026-13-99T99:99:99Z",
            STOCKOUT,
            RESOURCE_QUOTA,
            'pods "' + "a" * 300 + '" is forbidden: ',
        ],
    ),
)
JUNK = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.one_of(st.sampled_from(FIELDS), st.text(max_size=4)), inner, max_size=5
        )
    ),
    max_leaves=20,
)


@settings(max_examples=300)
@given(JUNK)
def test_hostile_input_never_raises(raw: object) -> None:
    event = parse_event(raw, cluster="c", groups=("g", ""))
    assert event is None or (event.pod or event.group is None or event.group == "g")


@settings(max_examples=200)
@given(st.sampled_from(FIELDS), JUNK, st.sampled_from(["FailedScaleUp", "RayCluster"]))
def test_a_real_event_with_one_field_replaced_never_raises(
    field: str, junk: object, which: str
) -> None:
    raw: dict[str, Any] = (
        core_event("FailedScaleUp", STOCKOUT)
        if which == "FailedScaleUp"
        else new_api_event(
            "FailedToCreateWorkerPod",
            RESOURCE_QUOTA,
            kind="RayCluster",
            name="c",
            controller="raycluster-controller",
        )
    )
    raw[field] = junk
    event = parse_event(raw, cluster="c", groups=("v6e",))
    if event is not None:
        assert event.reason == raw["reason"]
        assert event.count >= 1
