"""Node shapes: what one host of a group offers, compared with Ray's own derivation."""

from __future__ import annotations

from typing import Any

import pytest
from ray.autoscaler._private.kuberay.autoscaling_config import (
    _get_labels_from_group_spec,
    _get_ray_resources_from_group_spec,
)

from kuberay_scaler.core.parse.raycluster import parse_group
from kuberay_scaler.core.planner.shapes import ShapeError, slice_shape, tpu_pod_type
from tests.factories import group, sample, tpu_group

GiB = 2**30


def _container(limits: dict[str, str] | None = None, requests: dict[str, str] | None = None) -> Any:
    resources: dict[str, Any] = {}
    if limits:
        resources["limits"] = limits
    if requests:
        resources["requests"] = requests
    return {"spec": {"containers": [{"name": "ray-worker", "resources": resources}]}}


def _raw(template: Any, **fields: Any) -> dict[str, Any]:
    return {"groupName": "g", "minReplicas": 0, "maxReplicas": 5, "template": template, **fields}


RAY_COMPARABLE = {
    "cpu from limits": _raw(_container({"cpu": "2", "memory": "4Gi"})),
    "cpu from requests only": _raw(_container(requests={"cpu": "3", "memory": "1G"})),
    "fractional cpu rounds up": _raw(_container({"cpu": "1500m"})),
    "num-cpus beats the container": _raw(
        _container({"cpu": "8"}), rayStartParams={"num-cpus": "3"}
    ),
    "group resources beat num-cpus": _raw(
        _container({"cpu": "8"}),
        rayStartParams={"num-cpus": "3"},
        resources={"CPU": "500m", "memory": "8Gi", "custom": "2"},
    ),
    "gpu from nvidia limit": _raw(_container({"cpu": "4", "nvidia.com/gpu": "2"})),
    "num-gpus param": _raw(_container({"cpu": "4"}), rayStartParams={"num-gpus": "1"}),
    "custom resources from rayStartParams": _raw(
        _container({"cpu": "4"}),
        rayStartParams={"resources": '"{\\"Custom1\\": 1, \\"Custom2\\": 5}"'},
    ),
    "group resources replace rayStartParams resources": _raw(
        _container({"cpu": "4"}),
        rayStartParams={"resources": '"{\\"Custom1\\": 1}"'},
        resources={"Other": "3"},
    ),
    "memory from rayStartParams": _raw(
        _container({"cpu": "4", "memory": "8Gi"}), rayStartParams={"memory": "1000000000"}
    ),
}


def _ray_host_resources(raw: dict[str, Any]) -> dict[str, float]:
    ray = _get_ray_resources_from_group_spec(raw, is_head=False)
    return {k: float(v) for k, v in ray.items() if v}


def _our_host_resources(raw: dict[str, Any], host: int = 0) -> dict[str, float]:
    shape = slice_shape(parse_group(raw, 0))
    resources = shape.hosts[host].resources
    # Real TPU hosts carry accelerator_type:TPU-<GEN>; Ray's autoscaling config leaves it out.
    return {k: v for k, v in resources.items() if v and not k.startswith("accelerator_type:")}


@pytest.mark.parametrize("raw", RAY_COMPARABLE.values(), ids=RAY_COMPARABLE.keys())
def test_host_resources_match_rays_own_derivation(raw: dict[str, Any]) -> None:
    assert _our_host_resources(raw) == _ray_host_resources(raw)


TPU_CASES = [
    # (accelerator, topology, chips per host, hosts, pod type)
    ("tpu-v6e-slice", "4x4", "4", 4, "v6e-16"),
    ("tpu-v4-podslice", "2x2x2", "4", 2, "v4-16"),
    ("tpu-v5p-slice", "2x2x4", "4", 4, "v5p-32"),
    ("tpu-v5-lite-podslice", "2x4", "4", 2, "v5litepod-8"),
    ("tpu7x", "2x2x2", "4", 2, "v7x-16"),
]


@pytest.mark.parametrize(("accelerator", "topology", "chips", "hosts", "pod_type"), TPU_CASES)
def test_tpu_head_resource_matches_ray(
    accelerator: str, topology: str, chips: str, hosts: int, pod_type: str
) -> None:
    raw = tpu_group(accelerator=accelerator, topology=topology, tpu=chips, hosts=hosts)
    assert _our_host_resources(raw, host=0) == _ray_host_resources(raw)
    assert f"TPU-{pod_type}-head" in _ray_host_resources(raw)


def test_v6e_4x4_slice_is_four_hosts_with_the_head_on_host_zero() -> None:
    shape = slice_shape(parse_group(tpu_group(), 0))
    assert shape.tpu_pod_type == "v6e-16"
    assert len(shape.hosts) == 4
    assert [h.resources.get("TPU-v6e-16-head", 0) for h in shape.hosts] == [1, 0, 0, 0]
    assert all(h.resources["TPU"] == 4 and h.resources["CPU"] == 24 for h in shape.hosts)
    assert all(h.resources["accelerator_type:TPU-V6E"] == 1 for h in shape.hosts)
    assert [h.labels["ray.io/tpu-worker-id"] for h in shape.hosts] == ["0", "1", "2", "3"]
    assert {h.labels["ray.io/tpu-pod-type"] for h in shape.hosts} == {"v6e-16"}
    assert {h.labels["ray.io/tpu-topology"] for h in shape.hosts} == {"4x4"}
    assert shape.accelerators == frozenset({"TPU"})


def test_v4_2x2x2_is_v4_16_with_two_hosts() -> None:
    raw = sample("ray-cluster.tpu-v4-multihost.yaml")["spec"]["workerGroupSpecs"][0]
    shape = slice_shape(parse_group(raw, 0))
    assert shape.tpu_pod_type == "v4-16"
    assert len(shape.hosts) == 2
    assert shape.hosts[0].resources["TPU-v4-16-head"] == 1
    assert "TPU-v4-16-head" not in shape.hosts[1].resources
    assert shape.hosts[0].resources["TPU"] == 4
    assert shape.hosts[0].resources["memory"] == 40e9
    assert shape.hosts[1].labels["ray.io/tpu-worker-id"] == "1"


def test_tpu_count_from_ray_start_params_resources() -> None:
    raw = tpu_group()
    raw["template"]["spec"]["containers"][0]["resources"]["limits"].pop("google.com/tpu")
    raw["rayStartParams"] = {"resources": '"{\\"TPU\\": 4}"'}
    shape = slice_shape(parse_group(raw, 0))
    assert shape.hosts[0].resources["TPU"] == 4
    assert shape.hosts[0].resources["TPU-v6e-16-head"] == 1


def test_group_labels_and_node_group_label_on_every_host() -> None:
    raw = group("cpu", hosts=2, labels={"zone": "a", "team": "ml"})
    shape = slice_shape(parse_group(raw, 0))
    ray_labels = _get_labels_from_group_spec(raw, "cpu")
    for host in shape.hosts:
        assert ray_labels.items() <= host.labels.items()
        # KubeRay injects RAY_NODE_TYPE_NAME, which Ray exposes as this label.
        assert host.labels["ray.io/node-group"] == "cpu"
    assert shape.accelerators == frozenset()


def test_group_without_any_cpu_count_is_a_shape_error() -> None:
    raw = _raw(_container({"memory": "1Gi"}))
    with pytest.raises(ShapeError, match="no CPU count"):
        slice_shape(parse_group(raw, 0))


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ({}, None),
        ({"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice"}, None),
        (
            {
                "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
                "cloud.google.com/gke-tpu-topology": "16x16",
            },
            "v6e-256",
        ),
        (
            {
                "cloud.google.com/gke-tpu-accelerator": "unknown",
                "cloud.google.com/gke-tpu-topology": "2x2",
            },
            None,
        ),
        (
            {
                "cloud.google.com/gke-tpu-accelerator": "tpu-v4-podslice",
                "cloud.google.com/gke-tpu-topology": "2xbad",
            },
            None,
        ),
    ],
)
def test_tpu_pod_type_from_node_selectors(selector: dict[str, str], expected: str | None) -> None:
    assert tpu_pod_type(selector) == expected


def test_all_sample_worker_groups_have_a_shape() -> None:
    names = [
        "ray-cluster.autoscaler.yaml",
        "ray-cluster.autoscaler-v2.yaml",
        "ray-cluster.tpu-v4-multihost.yaml",
        "ray-cluster.tpu-v6e-16-multihost.yaml",
        "ray-cluster.tpu-v6e-256-multihost.yaml",
    ]
    hosts = {}
    for name in names:
        raw = sample(name)["spec"]["workerGroupSpecs"][0]
        shape = slice_shape(parse_group(raw, 0))
        assert _our_host_resources(raw) == _ray_host_resources(raw)
        hosts[name] = len(shape.hosts)
    assert hosts["ray-cluster.tpu-v6e-256-multihost.yaml"] == 64
    assert hosts["ray-cluster.autoscaler.yaml"] == 1
