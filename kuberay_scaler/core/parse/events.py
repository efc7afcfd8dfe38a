"""Raw Kubernetes Events → `CapacityEvent`s. Pure and tolerant: never raises, bounded cost.

Reads both shapes the API returns: `core/v1` (what the daemon lists and watches, including
Events written through `events.k8s.io/v1`, converted) and `events.k8s.io/v1` itself (what
`kubectl get events.v1.events.k8s.io -o json` prints). The reasons, reporters and message forms
are the ones docs/capacity-signals.md names with their sources: the cluster-autoscaler's
`TriggeredScaleUp` / `NotTriggerScaleUp` / GKE `FailedScaleUp` on pods, and KubeRay's
`FailedToCreateWorkerPod` on the RayCluster. Anything else, or anything malformed, is None.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from kuberay_scaler.core.model.signals import CapacityEvent, CapacitySignal

CLUSTER_AUTOSCALER = "cluster-autoscaler"
RAYCLUSTER_CONTROLLER = "raycluster-controller"

TRIGGERED_SCALE_UP = "TriggeredScaleUp"
NOT_TRIGGER_SCALE_UP = "NotTriggerScaleUp"
FAILED_SCALE_UP = "FailedScaleUp"
FAILED_TO_CREATE_WORKER_POD = "FailedToCreateWorkerPod"
CA_REASONS = (TRIGGERED_SCALE_UP, NOT_TRIGGER_SCALE_UP, FAILED_SCALE_UP)

MAX_MESSAGE = 2048  # GKE cuts its messages at 250; the rest is never read
_MAX_NAME = 253  # a Kubernetes object name
_COMBINED = "(combined from similar events): "  # client-go's aggregator prefix
# KubeRay cuts `<cluster>-<group>` to 50 characters before `-worker-` (utils.PodName).
POD_PREFIX_LIMIT = 50

# GKE FailedScaleUp failure texts (GoogleCloudPlatform/cluster-autoscaler
# pkg/visibility/events/failed_scale_up_event_logger.go) and raw GCE error codes.
_STOCKOUT = re.compile(
    r"GCE out of resources|Reservation capacity exceeded|RESOURCE_POOL_EXHAUSTED", re.IGNORECASE
)
_QUOTA = re.compile(r"GCE quota exceeded|QUOTA_EXCEEDED", re.IGNORECASE)
# The API server's ResourceQuota refusals (plugin/pkg/admission/resourcequota).
_RESOURCE_QUOTA = re.compile(r"exceeded quota: |status unknown for quota: ")
# `pods "<generateName>" is forbidden: ...`: the name a refused pod had at admission.
_FORBIDDEN_POD = re.compile(r'pods "([a-z0-9.-]{1,253})" is forbidden')


def parse_event(
    raw: object, *, cluster: str = "", groups: Collection[str] = ()
) -> CapacityEvent | None:
    """The capacity news in one Event, or None (not capacity news, or not usable).

    `cluster` and `groups` (the RayCluster's name and worker group names) let a KubeRay
    pod-creation failure name its group; without them its `group` is None.
    """
    if not isinstance(raw, Mapping):
        return None
    reason = _text(raw.get("reason"), 128)
    if reason not in CA_REASONS and reason != FAILED_TO_CREATE_WORKER_POD:
        return None
    involved = _map(raw.get("involvedObject")) or _map(raw.get("regarding"))
    kind = _text(involved.get("kind"), 64)
    name = _text(involved.get("name"), _MAX_NAME)
    when = last_seen_ms(raw)
    if not name or when is None:
        return None
    message = _message(raw)
    source = reporter(raw)
    if reason in CA_REASONS:
        if kind != "Pod" or source != CLUSTER_AUTOSCALER:
            return None
        signal = _autoscaler_signal(reason, message)
        return CapacityEvent(signal, source, reason, message, when, pod=name, count=_count(raw))
    if kind != "RayCluster" or (cluster and name != cluster):
        return None
    refused = _pod_refusal(message)
    if refused is None:
        return None
    group = group_of_prefix(_refused_prefix(message), cluster or name, groups)
    source = source or RAYCLUSTER_CONTROLLER
    return CapacityEvent(refused, source, reason, message, when, group=group, count=_count(raw))


def capacity_events(
    raws: Iterable[object], *, cluster: str = "", groups: Collection[str] = ()
) -> tuple[CapacityEvent, ...]:
    """Every Event's capacity news, the newest per (pod or group, reason), oldest first."""
    parsed = (parse_event(raw, cluster=cluster, groups=groups) for raw in raws)
    return newest_per_key(e for e in parsed if e is not None)


def newest_per_key(events: Iterable[CapacityEvent]) -> tuple[CapacityEvent, ...]:
    """The newest event per (pod, group, reason), ordered oldest first (ties by pod, reason)."""
    newest: dict[tuple[str, str, str], CapacityEvent] = {}
    for event in events:
        key = (event.pod or "", event.group or "", event.reason)
        kept = newest.get(key)
        if kept is None or event.last_seen_ms >= kept.last_seen_ms:
            newest[key] = event
    return tuple(sorted(newest.values(), key=_order))


def reporter(raw: Mapping[str, Any]) -> str:
    """Who posted it: `source.component`, else the new API's reporting controller."""
    for value in (
        _map(raw.get("source")).get("component"),
        raw.get("reportingComponent"),
        raw.get("reportingController"),
        _map(raw.get("deprecatedSource")).get("component"),
    ):
        text = _text(value, 128)
        if text:
            return text
    return ""


def last_seen_ms(raw: Mapping[str, Any]) -> int | None:
    """Epoch ms of the newest time the Event carries (None: no readable time at all)."""
    series = _map(raw.get("series"))
    times = (
        series.get("lastObservedTime"),
        raw.get("lastTimestamp"),
        raw.get("deprecatedLastTimestamp"),
        raw.get("eventTime"),
        raw.get("firstTimestamp"),
        raw.get("deprecatedFirstTimestamp"),
    )
    seen = [ms for ms in (_epoch_ms(t) for t in times) if ms is not None]
    return max(seen) if seen else None


def worker_group_names(raycluster: object) -> tuple[str, ...]:
    """The `groupName`s of a raw RayCluster's worker groups (whatever else it holds)."""
    spec = _map(_map(raycluster).get("spec"))
    groups = spec.get("workerGroupSpecs")
    if not isinstance(groups, list):
        return ()
    names = (_text(_map(g).get("groupName"), _MAX_NAME) for g in groups[:1000])
    return tuple(n for n in names if n)


def pod_name_prefix(cluster: str) -> str:
    """What every KubeRay pod name of `cluster` starts with (lowercased, cut as KubeRay does)."""
    return cluster.lower()[:POD_PREFIX_LIMIT]


def group_of_prefix(name: str | None, cluster: str, groups: Collection[str]) -> str | None:
    """The worker group a refused KubeRay pod belongs to, from the name the API server gave it:
    its `generateName` `<cluster>-<group>-worker-` (older servers refuse before generating a
    name) or a generated `<cluster>-<group>-worker-<suffix>` (kube-apiserver 1.36 names it
    first). `<cluster>-<group>` is lowercased and cut to 50 characters, as KubeRay does; None
    when no group, or several, fit."""
    if not name or "-worker-" not in name:
        return None
    stem = name.rpartition("-worker-")[0]
    matches = [g for g in groups if g and f"{cluster}-{g}".lower()[:POD_PREFIX_LIMIT] == stem]
    return matches[0] if len(matches) == 1 else None


# --- the parts --------------------------------------------------------------------------------


def _autoscaler_signal(reason: str, message: str) -> CapacitySignal:
    if reason == TRIGGERED_SCALE_UP:
        return CapacitySignal.SCALE_UP_TRIGGERED
    if reason == NOT_TRIGGER_SCALE_UP:
        return CapacitySignal.NO_SCALE_UP
    if _STOCKOUT.search(message):
        return CapacitySignal.STOCKOUT
    if _QUOTA.search(message):
        return CapacitySignal.QUOTA
    return CapacitySignal.SCALE_UP_FAILED


def _pod_refusal(message: str) -> CapacitySignal | None:
    """What a KubeRay pod-creation failure says of capacity: quota, another admission refusal,
    or nothing (a conflict or a timeout is not capacity news)."""
    if _RESOURCE_QUOTA.search(message):
        return CapacitySignal.QUOTA
    if " is forbidden: " in message:
        return CapacitySignal.SCALE_UP_FAILED
    return None


def _refused_prefix(message: str) -> str | None:
    match = _FORBIDDEN_POD.search(message)
    return match.group(1) if match else None


def _message(raw: Mapping[str, Any]) -> str:
    text = _text(raw.get("message"), MAX_MESSAGE) or _text(raw.get("note"), MAX_MESSAGE)
    return text.removeprefix(_COMBINED)


def _count(raw: Mapping[str, Any]) -> int:
    for value in (
        _map(raw.get("series")).get("count"),
        raw.get("count"),
        raw.get("deprecatedCount"),
    ):
        if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 1 << 31:
            return value
    return 1


def _epoch_ms(value: object) -> int | None:
    """RFC 3339 (`2026-12-04T12:03:10Z`, or with fractional seconds as in `eventTime`)."""
    if not isinstance(value, str) or not 20 <= len(value) <= 40:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return int(parsed.timestamp() * 1000)


def _order(event: CapacityEvent) -> tuple[int, str, str, str]:
    return (event.last_seen_ms, event.pod or "", event.group or "", event.reason)


def _text(value: object, limit: int) -> str:
    return value[:limit] if isinstance(value, str) else ""


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
