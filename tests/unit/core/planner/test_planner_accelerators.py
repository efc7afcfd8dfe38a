"""Accelerators beyond nvidia.com/gpu: host resources as Ray derives them (issue 12 item 4).

Ray's own KubeRay config derivation (`_get_ray_resources_from_group_spec`, installed wheel) is
the reference for every resource it derives. For accelerators it does not know (AWS Neuron,
Intel Gaudi, NVIDIA MIG) the reference is what the Ray node ends up with: KubeRay writes
`--num-gpus` for MIG and `neuron_cores` into `ray start --resources`; Ray reports Gaudi as HPU.
"""

from __future__ import annotations

from typing import Any

import pytest
from ray.autoscaler._private.kuberay.autoscaling_config import (
    _get_ray_resources_from_group_spec,
)

from kuberay_scaler.core.parse.raycluster import parse_group
from kuberay_scaler.core.planner.shapes import slice_shape
from tests.factories import (
    cluster,
    group,
    node,
    plan_of,
    pod,
    state,
    targets,
    tasks,
    tpu_group,
    tpu_slice_nodes,
)

BEYOND_RAYS_DERIVATION = ("neuron_cores", "HPU")


def _group(limits: dict[str, str], requests: dict[str, str] | None = None, **fields: Any) -> Any:
    resources: dict[str, Any] = {"limits": limits}
    if requests:
        resources["requests"] = requests
    container = {"name": "ray-worker", "resources": resources}
    return {
        "groupName": "acc",
        "minReplicas": 0,
        "maxReplicas": 4,
        "template": {"spec": {"containers": [container]}},
        **fields,
    }


ACCELERATOR_GROUPS = {
    "amd gpu": _group({"cpu": "8", "amd.com/gpu": "2"}),
    "nvidia gpu": _group({"cpu": "8", "nvidia.com/gpu": "4", "memory": "64Gi"}),
    "gpu only in requests": _group({"cpu": "8"}, requests={"amd.com/gpu": "1"}),
    "zero nvidia, one amd": _group({"cpu": "4", "nvidia.com/gpu": "0", "amd.com/gpu": "1"}),
    "fractional gpu rounds up": _group({"cpu": "4", "example.com/gpu": "1500m"}),
    "num-gpus beats the container": _group(
        {"cpu": "4", "amd.com/gpu": "8"}, rayStartParams={"num-gpus": "2"}
    ),
    "group resources GPU beats all": _group(
        {"cpu": "4", "amd.com/gpu": "8"}, resources={"GPU": "3", "CPU": "4"}
    ),
    "tpu": _group({"cpu": "8", "google.com/tpu": "4"}),
    "tpu in requests": _group({"cpu": "8"}, requests={"google.com/tpu": "4"}),
    "aws neuron": _group({"cpu": "32", "aws.amazon.com/neuroncore": "2", "memory": "128Gi"}),
    "intel gaudi": _group({"cpu": "16", "habana.ai/gaudi": "8"}),
}


def _ours(raw: dict[str, Any]) -> dict[str, float]:
    return dict(slice_shape(parse_group(raw, 0)).hosts[0].resources)


def _rays(raw: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in _get_ray_resources_from_group_spec(raw, False).items() if v}


@pytest.mark.parametrize("raw", ACCELERATOR_GROUPS.values(), ids=ACCELERATOR_GROUPS.keys())
def test_accelerator_hosts_match_rays_derivation_where_ray_derives(raw: dict[str, Any]) -> None:
    ours = _ours(raw)
    known_to_ray = {k: v for k, v in ours.items() if k not in BEYOND_RAYS_DERIVATION}
    assert known_to_ray == _rays(raw)


def test_amd_gpu_counts_as_gpu() -> None:
    assert _ours(ACCELERATOR_GROUPS["amd gpu"])["GPU"] == 2


def test_neuron_cores_as_kuberay_passes_them_to_ray_start() -> None:
    ours = _ours(ACCELERATOR_GROUPS["aws neuron"])
    assert ours["neuron_cores"] == 2
    assert "GPU" not in ours
    # Ray's derivation does not see them; its autoscaler cannot scale for neuron demand.
    assert "neuron_cores" not in _rays(ACCELERATOR_GROUPS["aws neuron"])


def test_neuron_cores_named_in_ray_start_resources_are_not_overridden() -> None:
    raw = _group(
        {"cpu": "32", "aws.amazon.com/neuroncore": "2"},
        rayStartParams={"resources": '"{\\"neuron_cores\\": 1}"'},
    )
    assert _ours(raw)["neuron_cores"] == 1


def test_gaudi_is_hpu() -> None:
    assert _ours(ACCELERATOR_GROUPS["intel gaudi"])["HPU"] == 8


def test_nvidia_mig_counts_as_gpu_like_kuberays_ray_start() -> None:
    raw = _group({"cpu": "8", "nvidia.com/mig-1g.10gb": "2"})
    assert _ours(raw)["GPU"] == 2


@pytest.mark.parametrize(
    ("limit", "resource"),
    [
        ("amd.com/gpu", "GPU"),
        ("aws.amazon.com/neuroncore", "neuron_cores"),
        ("habana.ai/gaudi", "HPU"),
    ],
)
def test_demand_for_the_accelerator_scales_its_group_and_plain_demand_stays_off_it(
    limit: str, resource: str
) -> None:
    acc = group("acc", max_replicas=4)
    acc["template"]["spec"]["containers"][0]["resources"]["limits"][limit] = "2"
    rc = cluster(group("cpu", max_replicas=4), acc)
    ray = state(tasks=[tasks({resource: 2, "CPU": 1}, 3), tasks({"CPU": 4}, 1)])
    result = plan_of(rc, ray=ray)
    assert targets(result) == {"cpu": 1, "acc": 3}
    assert not result.infeasible


def test_accelerator_demand_fits_a_running_accelerator_host_without_a_launch() -> None:
    acc = group("acc", replicas=1, max_replicas=4)
    acc["template"]["spec"]["containers"][0]["resources"]["limits"]["amd.com/gpu"] = "2"
    rc = cluster(acc)
    gpu_node = node("acc-0", group_name="acc", resources={"CPU": 8, "GPU": 2})
    result = plan_of(rc, [pod("acc-0", "acc")], state([gpu_node], [tasks({"GPU": 1}, 2)]))
    assert targets(result) == {"acc": 1}


def test_multi_host_pods_without_replica_labels_do_not_count_as_fresh_slices() -> None:
    """Four unlabelled pods of a 4-host group are one slice's worth of hosts at most.

    Before: each became a "partial" slice of its own, and each partial slice counted as a whole
    fresh slice on its way: 16 hosts of capacity that did not exist, so demand never scaled up.
    """
    rc = cluster(tpu_group(replicas=1, max_replicas=3))
    pods = [pod(f"tpu-x-{i}", "tpu") for i in range(4)]  # no replica label, no host index
    nodes = tpu_slice_nodes("tpu-x", 4, busy_hosts=(0, 1, 2, 3))
    # Busy hosts: a second slice's worth of TPU demand needs a new slice.
    ray = state(nodes, [tasks({"TPU": 4}, 4)])
    result = plan_of(rc, pods, ray)
    assert targets(result) == {"tpu": 2}


def test_unlabelled_multi_host_pods_still_serve_what_their_ray_nodes_offer() -> None:
    rc = cluster(tpu_group(replicas=1, max_replicas=3))
    pods = [pod(f"tpu-x-{i}", "tpu") for i in range(4)]
    ray = state(tpu_slice_nodes("tpu-x", 4), [tasks({"TPU": 4}, 4)])
    result = plan_of(rc, pods, ray)
    assert targets(result) == {"tpu": 1}
    assert not result.infeasible


@pytest.mark.parametrize("limit", ["amd.com/gpu", "nvidia.com/gpu", "google.com/tpu"])
def test_scale_up_for_accelerator_demand_agrees_with_rays_scheduler(limit: str) -> None:
    from tests.ray_reference import add_tasks, answers, new_state

    acc = group("acc", max_replicas=6)
    acc["template"]["spec"]["containers"][0]["resources"]["limits"][limit] = "2"
    resource = "TPU" if "tpu" in limit else "GPU"
    rc = cluster(group("cpu", max_replicas=6), acc)
    reply = new_state()
    add_tasks(reply, {resource: 1, "CPU": 1}, 5)
    add_tasks(reply, {"CPU": 8}, 1)
    got = answers(rc, reply)
    assert got.ray == {"cpu": 1, "acc": 3}
    assert got.ours == got.ray
