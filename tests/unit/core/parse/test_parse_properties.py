"""Property tests: malformed RayClusters, pods and Ray-state JSON never crash the parsers.

Inputs are real documents (the KubeRay samples, factory pods, a captured GCS reply) with random
parts replaced by junk or removed, plus junk built from the field names the parsers look at.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kuberay_scaler.adapters.ray_gcs.state import RayStateError, parse_ray_state
from kuberay_scaler.core.model.cluster import INT32_MAX, ClusterSpec
from kuberay_scaler.core.model.ray import RayState
from kuberay_scaler.core.parse.pods import parse_pods
from kuberay_scaler.core.parse.raycluster import parse_raycluster
from kuberay_scaler.core.slicemap import build_slice_map
from tests.factories import NOW, NOW_MS, SAMPLES, cluster, group, pod, slice_pods

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "ray_state"
PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

FIELD_NAMES = [
    # RayCluster
    *("metadata", "name", "spec", "workerGroupSpecs", "groupName", "replicas", "minReplicas"),
    *("maxReplicas", "numOfHosts", "suspend", "scaleStrategy", "workersToDelete", "template"),
    *("containers", "resources", "limits", "requests", "cpu", "memory", "google.com/tpu"),
    *("rayStartParams", "labels", "idleTimeoutSeconds", "priority", "autoscalerOptions"),
    *("upscalingMode", "headGroupSpec", "nodeSelector"),
    # Pod
    *("status", "phase", "reason", "containerStatuses", "state", "running", "waiting"),
    *("terminated", "startedAt", "conditions", "type", "deletionTimestamp", "creationTimestamp"),
    *("nodeName", "env", "value", "restartPolicy", "ray.io/group", "ray.io/cluster"),
    *("ray.io/node-type", "ray.io/worker-group-replica-name", "ray.io/replica-host-index"),
    # Ray state (proto3 JSON)
    *("clusterResourceState", "nodeStates", "nodeId", "instanceId", "status", "totalResources"),
    *("availableResources", "idleDurationMs", "pendingResourceRequests", "request", "count"),
    *("resourcesBundle", "pendingGangResourceRequests", "bundleSelectors", "resourceRequests"),
    *("labelSelectors", "labelConstraints", "labelKey", "labelValues", "operator", "details"),
    *("clusterResourceConstraints", "placementConstraints", "antiAffinity"),
]
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64),
    st.floats(),
    st.text(max_size=8),
    st.sampled_from(["Running", "Failed", "Unknown", "IDLE", "DEAD", "4x4", "1Gi", "²", "-1", ""]),
)
KEYS = st.one_of(st.sampled_from(FIELD_NAMES), st.text(max_size=6))
JUNK = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=12,
)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    children = (
        doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    )
    for key, value in children:
        yield from _paths(value, (*prefix, key))


def _parent(doc: Any, path: tuple[Any, ...]) -> Any:
    for key in path[:-1]:
        doc = doc[key]
    return doc


@st.composite
def mutated(draw: st.DrawFn, base: Any) -> Any:
    """`base` with 1-4 of its parts replaced by junk or deleted."""
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(list(_paths(doc))[1:] or [()]))
        if not path:
            return draw(JUNK)
        parent = _parent(doc, path)
        if draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(JUNK)
    return doc


def _sample_clusters() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(SAMPLES.glob("ray-cluster.*.yaml")):
        docs += [
            d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") == "RayCluster"
        ]
    return docs


BASE_CLUSTERS = [
    *_sample_clusters(),
    cluster(
        group("cpu", replicas=2),
        group(
            "tpu", hosts=4, tpu="4", idleTimeoutSeconds=30, scaleStrategy={"workersToDelete": ["x"]}
        ),
        name="rc",
        autoscalerOptions={"idleTimeoutSeconds": 60, "upscalingMode": "Aggressive"},
    ),
]
SPEC: ClusterSpec = parse_raycluster(BASE_CLUSTERS[-1])
BASE_PODS = [
    *slice_pods("tpu", "tpu-a", 2),
    pod("cpu-1", "cpu"),
    pod("head", "", head=True, container="ray-head"),
    pod("old", "tpu", legacy_replica="tpu-0", phase="Pending"),
]
BASE_REPLY = json.loads((FIXTURES / "pinned_slice_bundles.json").read_text())


def _check_spec(spec: ClusterSpec, raw: Any) -> None:
    for g in spec.groups:
        assert g.name and g.num_of_hosts >= 1
        assert 0 <= g.min_replicas <= g.max_replicas <= INT32_MAX
        assert g.replicas >= 0
        assert g.min_replicas <= g.effective_replicas <= g.max_replicas or g.suspend
    spec_raw = raw.get("spec") if isinstance(raw, dict) else None
    entries = spec_raw.get("workerGroupSpecs") if isinstance(spec_raw, dict) else None
    if isinstance(entries, list):
        # Every entry either parsed or was skipped with a problem naming it.
        assert len(spec.groups) + len(spec.skipped_groups) == len(entries)
        assert len({p.group for p in spec.problems if p.group}) >= len(set(spec.skipped_groups))


@PROPERTY
@given(st.sampled_from(BASE_CLUSTERS).flatmap(mutated))
def test_mutated_rayclusters_never_raise(raw: Any) -> None:
    spec = parse_raycluster(raw)
    _check_spec(spec, raw)


@PROPERTY
@given(
    st.one_of(
        JUNK,
        st.fixed_dictionaries(
            {"spec": st.fixed_dictionaries({"workerGroupSpecs": st.lists(JUNK, max_size=4)})}
        ),
    )
)
def test_junk_rayclusters_never_raise(raw: Any) -> None:
    spec = parse_raycluster(raw)
    _check_spec(spec, raw)


@PROPERTY
@given(st.lists(st.sampled_from(BASE_PODS).flatmap(mutated) | JUNK, max_size=6))
def test_mutated_pods_never_raise_and_each_is_a_host_or_a_problem(pods: list[Any]) -> None:
    hosts, problems = parse_pods(pods, SPEC)

    assert len(hosts) + len(problems) == len(pods)
    # ...and whatever came through can be mapped into slices.
    result = build_slice_map(SPEC, hosts, None, NOW)
    assert len(result.head) + len(result.orphans) <= len(hosts)


@PROPERTY
@given(
    st.sampled_from(BASE_CLUSTERS).flatmap(mutated),
    st.lists(st.sampled_from(BASE_PODS).flatmap(mutated), max_size=4),
)
def test_mutated_cluster_and_pods_map_into_slices(raw: Any, pods: list[Any]) -> None:
    spec = parse_raycluster(raw)
    hosts, _ = parse_pods(pods, spec)
    ray = parse_ray_state(BASE_REPLY, read_at_ms=NOW_MS)

    result = build_slice_map(spec, hosts, ray, NOW)

    assert set(result.groups) == {g.name for g in spec.groups}


def _parsed_or_rejected(doc: Any) -> RayState | None:
    try:
        return parse_ray_state(doc, read_at_ms=NOW_MS)
    except RayStateError:
        return None


@PROPERTY
@given(mutated(BASE_REPLY))
def test_mutated_ray_state_parses_or_raises_ray_state_error_only(doc: Any) -> None:
    ray = _parsed_or_rejected(doc)
    if ray is not None:
        assert all(isinstance(n.node_id, str) for n in ray.nodes)
        assert all(t.count > 0 for t in ray.tasks)


@PROPERTY
@given(JUNK | st.binary(max_size=20) | JUNK.map(json.dumps))
def test_junk_ray_state_parses_or_raises_ray_state_error_only(doc: Any) -> None:
    ray = _parsed_or_rejected(doc)
    assert ray is None or isinstance(ray, RayState)
