"""Intent that must survive a restart, kept as an annotation on the RayCluster (pure).

Before draining slices we record them; the patch that deletes them removes the record. A daemon
that restarts in between finds the record and finishes the deletion instead of forgetting it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

DRAINING_ANNOTATION = "kuberay-scaler.ray.io/draining"
_POINTER = "/metadata/annotations/" + DRAINING_ANNOTATION.replace("~", "~0").replace("/", "~1")

Op = dict[str, Any]


def read_draining(raycluster: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """Group → slice keys recorded as being drained; malformed records count as none."""
    raw = (raycluster.get("metadata", {}).get("annotations") or {}).get(DRAINING_ANNOTATION)
    if not isinstance(raw, str):
        return {}
    try:
        parsed = json.loads(raw)
    except ValueError:
        return {}
    if not isinstance(parsed, dict):
        return {}
    return {
        str(group): tuple(str(k) for k in keys)
        for group, keys in parsed.items()
        if isinstance(keys, list)
    }


def record_ops(raycluster: Mapping[str, Any], draining: Mapping[str, list[str]]) -> list[Op]:
    """Ops that write the record (creating the annotations map when it is absent)."""
    value = json.dumps(dict(draining), sort_keys=True)
    annotations = raycluster.get("metadata", {}).get("annotations")
    if not isinstance(annotations, Mapping):
        return [
            {"op": "add", "path": "/metadata/annotations", "value": {DRAINING_ANNOTATION: value}}
        ]
    return [{"op": "add", "path": _POINTER, "value": value}]


def with_record(raycluster: Mapping[str, Any], draining: Mapping[str, list[str]]) -> dict[str, Any]:
    """The object as it is once `record_ops` applied (only its annotations differ)."""
    metadata = dict(raycluster.get("metadata") or {})
    annotations = dict(metadata.get("annotations") or {})
    annotations[DRAINING_ANNOTATION] = json.dumps(dict(draining), sort_keys=True)
    metadata["annotations"] = annotations
    return {**raycluster, "metadata": metadata}


def clear_ops(raycluster: Mapping[str, Any]) -> list[Op]:
    """Ops that remove the record if the object carries one (guarded by its current value)."""
    annotations = raycluster.get("metadata", {}).get("annotations") or {}
    if DRAINING_ANNOTATION not in annotations:
        return []
    return [
        {"op": "test", "path": _POINTER, "value": annotations[DRAINING_ANNOTATION]},
        {"op": "remove", "path": _POINTER},
    ]
