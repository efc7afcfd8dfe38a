"""Ray before 2.49 has no node labels: slice identity comes from pods (KubeRay's labels, Ray
nodes joined by instance id = pod name), so a slice map built from label-less Ray nodes is the
same map, state for state and reason for reason."""

from __future__ import annotations

import dataclasses

from kuberay_scaler.core.model.ray import RayNode
from kuberay_scaler.core.slicemap import build_slice_map
from tests.factories import NOW, NOW_MS, slice_pods, state, tpu_slice_nodes
from tests.unit.core.test_slicemap import TIMEOUTS, TPU_SPEC, hosts_of


def _without_labels(nodes: list[RayNode]) -> list[RayNode]:
    return [dataclasses.replace(n, labels={}) for n in nodes]


def test_slice_map_is_the_same_without_any_ray_node_label() -> None:
    pods = (
        slice_pods("tpu", "tpu-aaaaa", 4)
        + slice_pods("tpu", "tpu-bbbbb", 4, age_s=300)
        + slice_pods("tpu", "tpu-ccccc", 4, age_s=30)
    )
    # One complete idle slice, one busy, one with a host whose Ray node has not joined.
    nodes = (
        tpu_slice_nodes("tpu-aaaaa", 4, idle_s=90)
        + tpu_slice_nodes("tpu-bbbbb", 4)
        + tpu_slice_nodes("tpu-ccccc", 4)[:3]
    )
    assert any(n.labels for n in nodes), "the labelled run must really carry labels"
    hosts = hosts_of(pods)
    labelled = build_slice_map(TPU_SPEC, hosts, state(nodes), NOW, TIMEOUTS)
    bare = build_slice_map(TPU_SPEC, hosts, state(_without_labels(nodes)), NOW, TIMEOUTS)

    def summary(result: object) -> list[tuple[object, ...]]:
        return [
            (s.key, s.state, s.reason, s.pod_names, tuple(sorted(s.node_ids)), s.idle_ms(NOW_MS))
            for s in result.groups["tpu"].slices  # type: ignore[attr-defined]
        ]

    assert summary(bare) == summary(labelled)
    assert {s.key for s in bare.groups["tpu"].slices} == {"tpu-aaaaa", "tpu-bbbbb", "tpu-ccccc"}
