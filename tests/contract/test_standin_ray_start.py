"""The operator stand-in writes KubeRay's `ray start` line into the Ray container, and the
harness sizes its fake hosts from that line (never from the daemon's own `host_resources`).
Expected lines follow KubeRay v1.6 pod.go (generateRayStartCommand and friends)."""

from __future__ import annotations

import copy

import pytest

from kuberay_standins._k8s_kuberay import PodSlot, build_worker_pod
from kuberay_standins.demo import Scenario, demo_raycluster
from kuberay_standins.harness import _host_setup
from kuberay_standins.ray_start import flags_of_pod, parse_command, quantity, render, start_params


def test_quantities_round_up_like_resource_quantity_value() -> None:
    assert (
        quantity("500m") is not None
        and start_params("worker", {}, {"limits": {"cpu": "500m"}})["num-cpus"] == "1"
    )
    assert start_params("worker", {}, {"limits": {"memory": "1Gi"}})["memory"] == str(2**30)
    assert start_params("worker", {}, {"limits": {"memory": "1e3"}})["memory"] == "1000"
    assert quantity("garbage") is None


def test_limits_then_requests_and_params_win() -> None:
    requests_only = {"requests": {"cpu": "3"}}
    assert start_params("worker", {}, requests_only)["num-cpus"] == "3"
    both = {"limits": {"cpu": "8"}, "requests": {"cpu": "2"}}
    assert start_params("worker", {}, both)["num-cpus"] == "8"
    assert start_params("worker", {"num-cpus": "0"}, both)["num-cpus"] == "0"


def test_first_accelerator_goes_into_resources_unless_one_is_there() -> None:
    tpu = {"limits": {"cpu": "24", "google.com/tpu": "4", "nvidia.com/gpu": "1"}}
    params = start_params("worker", {}, tpu)
    assert params["resources"] == """'{"TPU":4.0}'""" and params["num-gpus"] == "1"
    kept = start_params("worker", {"resources": '{"TPU": 8, "x": 1}'}, tpu)
    assert kept["resources"] == '{"TPU": 8, "x": 1}'
    added = start_params("worker", {"resources": '{"x": 1}'}, tpu)
    assert parse_command(render("worker", added)).resources == {"x": 1.0, "TPU": 4.0}


def test_flags_sorted_booleans_bare_and_block_on() -> None:
    line = render(
        "worker",
        start_params(
            "worker", {"disable-usage-stats": "true", "x": "false", "log-color": "false"}, {}
        ),
    )
    assert line == "ray start --block --disable-usage-stats --log-color=false"


def test_worker_pod_carries_the_line_and_the_harness_reads_it() -> None:
    cluster = demo_raycluster(Scenario(slices=1, hosts=2))
    cluster["metadata"].update(uid="u1", namespace="default")
    tpu = copy.deepcopy(cluster["spec"]["workerGroupSpecs"][0])
    tpu["rayStartParams"] = {"num-cpus": "2", "resources": '{"custom": 3}'}
    pod = build_worker_pod(
        cluster, tpu, PodSlot(replica_name="tpu-group-abc", replica_index=0, host_index=1)
    )
    pod["metadata"]["name"] = "demo-tpu-tpu-group-worker-x"
    [args] = pod["spec"]["containers"][0]["args"]
    assert args.startswith("ulimit -n 65536; ray start --address=demo-tpu-head-svc.default.svc")
    flags = flags_of_pod(pod)
    assert (flags.num_cpus, flags.memory) == (2, 10**9)
    assert flags.resources == {"custom": 3.0, "TPU": 4.0}
    num_cpus, resources, memory, env = _host_setup(pod)
    assert (num_cpus, memory) == (2, 10**9)
    assert resources == {"custom": 3.0, "TPU": 4.0}
    assert env["TPU_NAME"] == "tpu-group-abc" and env["TPU_WORKER_ID"] == "1"
    assert (env["TPU_ACCELERATOR_TYPE"], env["TPU_TOPOLOGY"]) == ("v6e-8", "2x4")


def test_a_users_own_ray_start_is_left_alone() -> None:
    cluster = demo_raycluster(Scenario())
    cluster["metadata"].update(uid="u1", namespace="default")
    cpu = copy.deepcopy(cluster["spec"]["workerGroupSpecs"][1])
    cpu["template"]["spec"]["containers"][0]["args"] = ["ray start --num-cpus=7 --block"]
    pod = build_worker_pod(cluster, cpu, PodSlot())
    assert pod["spec"]["containers"][0]["args"] == ["ray start --num-cpus=7 --block"]
    assert flags_of_pod(pod).num_cpus == 7


def test_no_ray_start_is_an_error() -> None:
    with pytest.raises(ValueError, match="no `ray start`"):
        parse_command("sleep infinity")
