"""Intent that must survive a restart, kept as an annotation on the RayCluster (pure).

Before draining slices we record them; the patch that deletes them removes the record. A daemon
that restarts in between finds the record and finishes the deletion instead of forgetting it.
The record is read by the parser (ClusterSpec.draining); the ops here are built from the spec.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace

from kuberay_scaler.core.model.cluster import ClusterSpec, frozen_map
from kuberay_scaler.core.model.labels import DRAINING_ANNOTATION
from kuberay_scaler.core.patch.ops import Add, Op, Remove, Test

__all__ = ["DRAINING_ANNOTATION", "clear_ops", "record_ops", "with_record"]

_POINTER = "/metadata/annotations/" + DRAINING_ANNOTATION.replace("~", "~0").replace("/", "~1")


def _record(draining: Mapping[str, list[str]]) -> str:
    return json.dumps(dict(draining), sort_keys=True)


def record_ops(spec: ClusterSpec, draining: Mapping[str, list[str]]) -> list[Op]:
    """Ops that write the record (creating the annotations map when it is absent)."""
    value = _record(draining)
    if not spec.has_annotations:
        return [Add("/metadata/annotations", {DRAINING_ANNOTATION: value})]
    return [Add(_POINTER, value)]


def with_record(spec: ClusterSpec, draining: Mapping[str, list[str]]) -> ClusterSpec:
    """The spec as it is once `record_ops` applied (only the record differs)."""
    return replace(
        spec,
        draining=frozen_map({g: tuple(keys) for g, keys in draining.items()}),
        draining_record=_record(draining),
        has_annotations=True,
    )


def clear_ops(spec: ClusterSpec) -> list[Op]:
    """Ops that remove the record if the object carries one (guarded by its current value)."""
    if spec.draining_record is None:
        return []
    return [Test(_POINTER, spec.draining_record), Remove(_POINTER)]
