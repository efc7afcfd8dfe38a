"""Pod dicts → Hosts. Never raises: a pod we cannot use becomes a named Problem."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from kuberay_scaler.core.model.cluster import ClusterSpec, Problem, frozen_map
from kuberay_scaler.core.model.hosts import Host, HostPhase
from kuberay_scaler.core.model.labels import (
    CONDITION_DISRUPTION_TARGET,
    LABEL_CLUSTER,
    LABEL_GROUP,
    LABEL_HOST_INDEX,
    LABEL_LEGACY_REPLICA,
    LABEL_NODE_TYPE,
    LABEL_REPLICA_INDEX,
    LABEL_REPLICA_NAME,
    POD_DO_NOT_DISRUPT,
    POD_SAFE_TO_EVICT,
)

HEAD_GROUP = "headgroup"
_SMALL_INT = re.compile(r"[0-9]{1,9}")
_PROTECTING = (POD_DO_NOT_DISRUPT, POD_SAFE_TO_EVICT)


def pod_items(pod_list: object) -> list[Any]:
    """Accept a PodList (`kubectl get pods -o json`), a bare list, or a name → pod mapping."""
    if isinstance(pod_list, Mapping):
        items = pod_list.get("items")
        if isinstance(items, list):
            return items
        return list(pod_list.values()) if "kind" not in pod_list else []
    return list(pod_list) if isinstance(pod_list, list | tuple) else []


def parse_pods(pods: Iterable[object], spec: ClusterSpec) -> tuple[list[Host], list[Problem]]:
    hosts: list[Host] = []
    problems: list[Problem] = []
    for index, pod in enumerate(pods):
        parsed = parse_pod(pod, spec)
        if isinstance(parsed, Problem):
            problems.append(Problem(f"pod #{index}: {parsed.message}", parsed.group))
        else:
            hosts.append(parsed)
    hosts.sort(key=lambda h: h.pod_name)
    return hosts, problems


def parse_pod(pod: object, spec: ClusterSpec) -> Host | Problem:
    if not isinstance(pod, Mapping):
        return Problem(f"not an object but {type(pod).__name__}")
    meta = _map(pod.get("metadata"))
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        return Problem("has no metadata.name")
    labels = {k: v for k, v in _map(meta.get("labels")).items() if isinstance(v, str)}
    cluster = labels.get(LABEL_CLUSTER)
    if spec.name and cluster is None:
        return Problem(f"{name} has no {LABEL_CLUSTER} label; ignored")
    if spec.name and cluster != spec.name:
        return Problem(f"{name} belongs to cluster {cluster!r}, not {spec.name!r}; ignored")
    group = labels.get(LABEL_GROUP)
    is_head = labels.get(LABEL_NODE_TYPE) == "head"
    if not group and not is_head:
        return Problem(f"{name} has no {LABEL_GROUP} label; ignored")
    group = group or HEAD_GROUP
    phase, detail, started = _classify(pod, _ray_container_name(spec, group, is_head, pod))
    node_name = _map(pod.get("spec")).get("nodeName")
    return Host(
        pod_name=name,
        group=group,
        is_head=is_head,
        phase=phase,
        detail=detail,
        labels=frozen_map(labels),
        node_name=node_name if isinstance(node_name, str) and node_name else None,
        created_at=_time(meta.get("creationTimestamp")),
        slice_key=_slice_key(name, labels, spec, group),
        replica_index=_int_label(labels.get(LABEL_REPLICA_INDEX)),
        host_index=_host_index(pod, labels),
        running_since=started,
        uid=str(meta.get("uid") or ""),
        do_not_disrupt=_do_not_disrupt(_map(meta.get("annotations"))),
        disruption_target=_disruption_target(_map(pod.get("status"))),
        gates=_gates(_map(pod.get("spec"))) if phase is HostPhase.PENDING else (),
    )


def _gates(spec: Mapping[str, Any]) -> tuple[str, ...]:
    """The names of the pod's scheduling gates (`spec.schedulingGates: [{name: ...}]`)."""
    return tuple(
        sys.intern(g["name"])
        for g in _list(spec.get("schedulingGates"))
        if isinstance(g, Mapping) and isinstance(g.get("name"), str) and g["name"]
    )


def _do_not_disrupt(annotations: Mapping[str, Any]) -> str | None:
    """The annotation (as "key=value") that asks node autoscalers not to disrupt the pod."""
    for key, value in _PROTECTING:
        if str(annotations.get(key, "")).strip().lower() == value:
            return f"{key}={value}"
    return None


def _disruption_target(status: Mapping[str, Any]) -> str | None:
    """The reason of a DisruptionTarget=True condition (eviction, preemption, taint manager)."""
    for cond in _list(status.get("conditions")):
        if _is_disruption_target(cond) and cond.get("status") == "True":
            return str(cond.get("reason") or CONDITION_DISRUPTION_TARGET)
    return None


def _is_disruption_target(cond: object) -> bool:
    return isinstance(cond, Mapping) and cond.get("type") == CONDITION_DISRUPTION_TARGET


def _ray_container_name(
    spec: ClusterSpec, group: str, is_head: bool, pod: Mapping[str, Any]
) -> str | None:
    if is_head:
        return spec.head_container_name
    found = spec.group(group)
    if found:
        return found.container.name
    # Not in the spec (an orphan): KubeRay's rule, the pod's first container is the Ray one.
    first = next(iter(_list(_map(pod.get("spec")).get("containers"))), None)
    name = _map(first).get("name")
    return name if isinstance(name, str) else None


def _classify(
    pod: Mapping[str, Any], container: str | None
) -> tuple[HostPhase, str, datetime | None]:
    meta, status = _map(pod.get("metadata")), _map(pod.get("status"))
    if meta.get("deletionTimestamp"):
        return HostPhase.TERMINATING, "deletionTimestamp set", None
    phase = status.get("phase")
    if phase in ("Failed", "Succeeded", "Unknown"):
        reason = status.get("reason")
        return HostPhase.FAILED, f"pod {phase}" + (f" ({reason})" if reason else ""), None
    state = _container_state(status, container)
    if "terminated" in state:
        why = f"Ray container terminated ({_map(state['terminated']).get('reason', 'unknown')})"
        # As KubeRay judges it: only under restartPolicy Never is a terminated container final.
        if _map(pod.get("spec")).get("restartPolicy") == "Never":
            return HostPhase.FAILED, why, None
        return HostPhase.PENDING, f"{why}, restarting", None
    if phase == "Running" and "running" in state:
        return HostPhase.RUNNING, "running", _time(_map(state["running"]).get("startedAt"))
    return HostPhase.PENDING, _pending_detail(status, state), None


def _container_state(status: Mapping[str, Any], container: str | None) -> Mapping[str, Any]:
    # Look the Ray container up by name: containerStatuses order is not guaranteed.
    for entry in _list(status.get("containerStatuses")):
        if isinstance(entry, Mapping) and entry.get("name") == container:
            return _map(entry.get("state"))
    return {}


def _pending_detail(status: Mapping[str, Any], state: Mapping[str, Any]) -> str:
    waiting = _map(state.get("waiting"))
    if waiting.get("reason"):
        return str(waiting["reason"])
    for cond in _list(status.get("conditions")):
        unscheduled = isinstance(cond, Mapping) and cond.get("type") == "PodScheduled"
        if unscheduled and cond.get("status") == "False":
            return str(cond.get("reason") or "not scheduled")
    phase = status.get("phase")
    return f"pod {phase}" if isinstance(phase, str) else "no status yet"


def _slice_key(name: str, labels: Mapping[str, str], spec: ClusterSpec, group: str) -> str:
    # KubeRay reconciles a single-host group pod by pod (replica labels are for numOfHosts > 1):
    # a stray replica label must not tie two single-host pods into one "slice".
    found = spec.group(group)
    if found is not None and found.num_of_hosts <= 1:
        return name
    return labels.get(LABEL_REPLICA_NAME) or labels.get(LABEL_LEGACY_REPLICA) or name


def _host_index(pod: Mapping[str, Any], labels: Mapping[str, str]) -> int | None:
    index = _int_label(labels.get(LABEL_HOST_INDEX))
    if index is not None:
        return index
    # Legacy clusters: the GKE webhook injects TPU_WORKER_ID into the Ray container's env.
    for container in _list(_map(pod.get("spec")).get("containers")):
        for env in _list(_map(container).get("env")):
            if isinstance(env, Mapping) and env.get("name") == "TPU_WORKER_ID":
                return _int_label(env.get("value"))
    return None


def _int_label(value: object) -> int | None:
    # ASCII digits only: str.isdigit() also takes "²", which int() rejects.
    if isinstance(value, str) and _SMALL_INT.fullmatch(value):
        return int(value)
    return None


def _time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    # The API server writes UTC; a naive time would break comparisons with an aware `now`.
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


# ---- informer transform: keep only what parse_pod reads ------------------------------------

_META_KEPT = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "labels",
    "creationTimestamp",
    "deletionTimestamp",
)
_WORKER_ID_ENV = "TPU_WORKER_ID"


def slim_pod(pod: Any) -> Any:
    """The pod with only the fields `parse_pod` (and the informer: name, resourceVersion) read.

    Applied by the pod informer to every object before it is stored, as client-go's
    TransformFunc is: a full pod is 5-20 kB of which the daemon reads a few hundred bytes.
    `parse_pod(slim_pod(p), spec) == parse_pod(p, spec)` for every pod (tests pin this); an
    object of an unexpected shape is kept whole, so its problem reads the same.
    """
    if not isinstance(pod, dict):
        return pod
    parts = {k: pod[k] for k in ("metadata", "spec", "status") if k in pod}
    if not all(isinstance(v, Mapping) for v in parts.values()):
        return pod
    slim: dict[str, Any] = {}
    if "metadata" in parts:
        meta = {k: parts["metadata"][k] for k in _META_KEPT if k in parts["metadata"]}
        if isinstance(meta.get("labels"), Mapping):
            meta["labels"] = _shared_strings(meta["labels"])
        notes = parts["metadata"].get("annotations")
        if isinstance(notes, Mapping):
            # Only the do-not-disrupt ones: others (last-applied-configuration) can be kBs.
            kept = {k: notes[k] for k, _ in _PROTECTING if k in notes}
            if kept:
                meta["annotations"] = kept
        elif "annotations" in parts["metadata"]:
            meta["annotations"] = notes
        slim["metadata"] = meta
    if "spec" in parts:
        slim["spec"] = _slim_spec(parts["spec"])
    if "status" in parts:
        slim["status"] = _slim_status(parts["status"])
    return slim


def _shared_strings(mapping: Mapping[Any, Any]) -> dict[Any, Any]:
    """`mapping` with its string keys and values interned (equal, one object each): every pod
    of a group repeats the same label keys and most values, and each JSON decode makes its own
    copies."""
    return {
        (sys.intern(k) if type(k) is str else k): (sys.intern(v) if type(v) is str else v)
        for k, v in mapping.items()
    }


def _slim_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    slim = {k: spec[k] for k in ("nodeName", "restartPolicy", "schedulingGates") if k in spec}
    containers = spec.get("containers")
    if "containers" in spec:
        slim["containers"] = (
            [_slim_container(c) for c in containers] if isinstance(containers, list) else containers
        )
    return slim


def _slim_status(status: Mapping[str, Any]) -> dict[str, Any]:
    slim = {k: status[k] for k in ("phase", "reason") if k in status}
    entries = status.get("containerStatuses")
    if isinstance(entries, list):
        slim["containerStatuses"] = [
            {k: c[k] for k in ("name", "state") if k in c} if isinstance(c, Mapping) else c
            for c in entries
        ]
    conditions = status.get("conditions")
    if isinstance(conditions, list):
        slim["conditions"] = [
            c
            for c in conditions
            if not isinstance(c, Mapping)
            or c.get("type") == "PodScheduled"
            or _is_disruption_target(c)
        ]
    return slim


def _slim_container(container: object) -> object:
    if not isinstance(container, Mapping):
        return container
    slim: dict[str, Any] = {}
    if "name" in container:
        slim["name"] = container["name"]
    env = container.get("env")
    if isinstance(env, list):
        slim["env"] = [
            e for e in env if not isinstance(e, Mapping) or e.get("name") == _WORKER_ID_ENV
        ]
    elif "env" in container:
        slim["env"] = env
    return slim
