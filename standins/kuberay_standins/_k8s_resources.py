"""The kinds the stand-in serves, their CRD-style defaults and the validation it enforces."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kuberay_standins._k8s_errors import FieldCause, Invalid, invalid

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class ResourceType:
    plural: str
    store: str  # key of the object map: both event APIs share one store
    group: str
    version: str
    kind: str
    has_status: bool
    unconditional_update: bool  # PUT without metadata.resourceVersion allowed (core types)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def group_kind(self) -> str:
        return f"{self.kind}.{self.group}" if self.group else self.kind


PODS = ResourceType("pods", "pods", "", "v1", "Pod", True, True)
RAYCLUSTERS = ResourceType("rayclusters", "rayclusters", "ray.io", "v1", "RayCluster", True, False)
EVENTS = ResourceType("events", "events", "", "v1", "Event", False, True)
EVENTS_V1 = ResourceType("events", "events", "events.k8s.io", "v1", "Event", False, True)

BY_STORE: dict[str, ResourceType] = {"pods": PODS, "rayclusters": RAYCLUSTERS, "events": EVENTS}

_GROUP_DEFAULTS: dict[str, int] = {
    "replicas": 0,
    "minReplicas": 0,
    "maxReplicas": INT32_MAX,
    "numOfHosts": 1,
    "priority": 0,
}
_INT32_GROUP_FIELDS = (*_GROUP_DEFAULTS, "idleTimeoutSeconds")


def apply_defaults(rtype: ResourceType, obj: dict[str, Any]) -> None:
    """CRD structural defaults: absent or null worker-group ints get their schema default."""
    if rtype is not RAYCLUSTERS:
        return
    spec = obj.get("spec")
    groups = spec.get("workerGroupSpecs") if isinstance(spec, dict) else None
    if not isinstance(groups, list):
        return
    for group in groups:
        if isinstance(group, dict):
            for key, default in _GROUP_DEFAULTS.items():
                if group.get(key) is None:
                    group[key] = default


def _is_int32(value: Any) -> bool:
    return (
        isinstance(value, int) and not isinstance(value, bool) and (INT32_MIN <= value <= INT32_MAX)
    )


def _type_cause(field: str, value: Any, expected: str) -> FieldCause:
    return FieldCause(
        field,
        "FieldValueTypeInvalid",
        f"Invalid value: {value!r}: {field} in body must be of type {expected}",
    )


def _group_int_causes(path: str, group: dict[str, Any]) -> list[FieldCause]:
    causes: list[FieldCause] = []
    for key in _INT32_GROUP_FIELDS:
        if key not in group:
            continue
        value = group[key]
        if not _is_int32(value):
            causes.append(_type_cause(f"{path}.{key}", value, "integer (int32)"))
        # No minimum: the v1.7.0 CRD has none, so a real server stores negative replicas (e2e).
    return causes


def _scale_strategy_causes(path: str, group: dict[str, Any]) -> list[FieldCause]:
    strategy = group.get("scaleStrategy")
    if strategy is None:
        return []
    if not isinstance(strategy, dict):
        return [_type_cause(f"{path}.scaleStrategy", strategy, "object")]
    victims = strategy.get("workersToDelete")
    field = f"{path}.scaleStrategy.workersToDelete"
    if victims is None:
        return []
    if not isinstance(victims, list):
        return [_type_cause(field, victims, "array")]
    return [
        _type_cause(f"{field}[{i}]", item, "string")
        for i, item in enumerate(victims)
        if not isinstance(item, str)
    ]


def _worker_group_causes(index: int, group: Any) -> list[FieldCause]:
    path = f"spec.workerGroupSpecs[{index}]"
    if not isinstance(group, dict):
        return [_type_cause(path, group, "object")]
    causes: list[FieldCause] = []
    if not isinstance(group.get("groupName"), str):
        causes.append(FieldCause(f"{path}.groupName", "FieldValueRequired", "Required value"))
    if not isinstance(group.get("template"), dict):
        causes.append(FieldCause(f"{path}.template", "FieldValueRequired", "Required value"))
    if "suspend" in group and not isinstance(group["suspend"], bool):
        causes.append(_type_cause(f"{path}.suspend", group["suspend"], "boolean"))
    return causes + _group_int_causes(path, group) + _scale_strategy_causes(path, group)


def _raycluster_causes(obj: dict[str, Any]) -> list[FieldCause]:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [FieldCause("spec", "FieldValueRequired", "Required value")]
    causes: list[FieldCause] = []
    if not isinstance(spec.get("headGroupSpec"), dict):
        causes.append(FieldCause("spec.headGroupSpec", "FieldValueRequired", "Required value"))
    for key in ("enableInTreeAutoscaling", "suspend"):
        if key in spec and not isinstance(spec[key], bool):
            causes.append(_type_cause(f"spec.{key}", spec[key], "boolean"))
    groups = spec.get("workerGroupSpecs", [])
    if not isinstance(groups, list):
        return [*causes, _type_cause("spec.workerGroupSpecs", groups, "array")]
    for index, group in enumerate(groups):
        causes.extend(_worker_group_causes(index, group))
    return causes


def validate(rtype: ResourceType, obj: dict[str, Any]) -> Invalid | None:
    """Return the 422 to send for ``obj``, or None when it is acceptable."""
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    causes: list[FieldCause] = []
    if not isinstance(name, str) or not name:
        causes.append(
            FieldCause(
                "metadata.name",
                "FieldValueRequired",
                "Required value: name or generateName is required",
            )
        )
    if rtype is RAYCLUSTERS:
        causes.extend(_raycluster_causes(obj))
    if not causes:
        return None
    return invalid(rtype.group_kind, str(name or ""), causes, kind=rtype.kind, group=rtype.group)
