"""A v1 Node's GKE maintenance signals, parsed (core/model/signals.py `NodeMaintenance`). Pure.

The label (or an annotation of the same key) holds Unix epoch seconds; a value that is not a
number is ignored (the node says nothing we can use), never guessed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kuberay_scaler.core.model.signals import (
    IMPENDING_NODE_TERMINATION,
    SCHEDULED_MAINTENANCE_TIME,
    NodeMaintenance,
)


def node_maintenance(raw: Mapping[str, Any]) -> NodeMaintenance | None:
    """The node's maintenance facts, or None when it announces none (or has no name)."""
    meta = _map(raw.get("metadata"))
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        return None
    start_ms = _epoch_ms(_map(meta.get("labels")).get(SCHEDULED_MAINTENANCE_TIME))
    if start_ms is None:
        start_ms = _epoch_ms(_map(meta.get("annotations")).get(SCHEDULED_MAINTENANCE_TIME))
    taints = _map(raw.get("spec")).get("taints")
    impending = isinstance(taints, list) and any(
        isinstance(t, Mapping) and t.get("key") == IMPENDING_NODE_TERMINATION for t in taints
    )
    if start_ms is None and not impending:
        return None
    return NodeMaintenance(name, start_ms, impending)


def slim_node(raw: Mapping[str, Any]) -> dict[str, Any]:
    """What a node store keeps: name, version, and the maintenance label/annotation/taint."""
    meta = _map(raw.get("metadata"))
    keep: dict[str, Any] = {
        "name": meta.get("name"),
        "resourceVersion": meta.get("resourceVersion"),
    }
    for part in ("labels", "annotations"):
        value = _map(meta.get(part)).get(SCHEDULED_MAINTENANCE_TIME)
        if value is not None:
            keep[part] = {SCHEDULED_MAINTENANCE_TIME: value}
    taints = _map(raw.get("spec")).get("taints")
    kept_taints = [
        t
        for t in (taints if isinstance(taints, list) else [])
        if isinstance(t, Mapping) and t.get("key") == IMPENDING_NODE_TERMINATION
    ]
    return {"metadata": keep, "spec": {"taints": kept_taints}}


def _epoch_ms(value: object) -> int | None:
    if not isinstance(value, str) or not value.strip().isdigit():
        return None
    return int(value.strip()) * 1000


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
