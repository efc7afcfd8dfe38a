"""RayCluster dict → ClusterSpec: KubeRay's defaults and clamping, and tolerance of bad groups."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kuberay_scaler.core.model.cluster import INT32_MAX, UpscalingMode
from kuberay_scaler.core.parse.raycluster import parse_raycluster
from tests.factories import SAMPLES, cluster, deep, group


def rayclusters_in(path: Path) -> list[dict[str, Any]]:
    """The RayCluster documents of a sample file (some also carry a ConfigMap)."""
    return [
        doc
        for doc in yaml.safe_load_all(path.read_text())
        if isinstance(doc, dict) and doc.get("kind") == "RayCluster"
    ]


SAMPLE_FILES = sorted(SAMPLES.glob("ray-cluster.*.yaml"))


def test_the_samples_are_there() -> None:
    assert len(SAMPLE_FILES) >= 5


@pytest.mark.parametrize("path", SAMPLE_FILES, ids=lambda p: p.name)
def test_every_sample_parses_without_problems(path: Path) -> None:
    [raw] = rayclusters_in(path)

    spec = parse_raycluster(raw)

    assert spec.problems == ()
    assert spec.skipped_groups == ()
    names = [g["groupName"] for g in raw["spec"]["workerGroupSpecs"]]
    assert [g.name for g in spec.groups] == names
    assert spec.head_container_name == "ray-head"


def test_tpu_v6e_16_sample() -> None:
    [raw] = rayclusters_in(SAMPLES / "ray-cluster.tpu-v6e-16-multihost.yaml")

    spec = parse_raycluster(raw)

    [tpu] = spec.groups
    assert (tpu.name, tpu.index, tpu.num_of_hosts, tpu.is_multi_host) == ("tpu-group", 0, 4, True)
    assert (tpu.replicas, tpu.min_replicas, tpu.max_replicas) == (1, 0, 1)
    assert tpu.container.name == "ray-worker"
    assert tpu.container.tpu == 4.0
    assert tpu.container.cpu == 24.0
    assert tpu.container.memory_bytes == 200e9
    assert tpu.node_selector["cloud.google.com/gke-tpu-topology"] == "4x4"
    assert tpu.node_selector["cloud.google.com/gke-tpu-accelerator"] == "tpu-v6e-slice"
    assert spec.in_tree_autoscaling is False


def test_autoscaler_sample_reads_autoscaler_options() -> None:
    [raw] = rayclusters_in(SAMPLES / "ray-cluster.autoscaler.yaml")

    spec = parse_raycluster(raw)

    assert spec.name == "raycluster-autoscaler"
    assert spec.in_tree_autoscaling is True
    assert spec.autoscaler.idle_timeout_s == 60.0
    assert spec.autoscaler.upscaling_mode is UpscalingMode.DEFAULT
    [small] = spec.groups
    assert (small.num_of_hosts, small.container.cpu) == (1, 1.0)
    assert small.container.memory_bytes == 2**30


def test_kuberay_defaults_when_fields_are_absent() -> None:
    raw = group("g")
    for key in ("replicas", "minReplicas", "maxReplicas", "numOfHosts"):
        del raw[key]

    [g] = parse_raycluster(cluster(raw)).groups

    assert (g.replicas, g.min_replicas, g.max_replicas, g.num_of_hosts) == (0, 0, INT32_MAX, 1)
    assert g.replicas_present is False
    assert g.idle_timeout_s is None
    assert g.priority == 0
    assert g.suspend is False
    assert g.workers_to_delete == ()


@pytest.mark.parametrize(
    ("replicas", "lo", "hi", "suspend", "effective"),
    [
        (3, 1, 5, False, 3),
        (0, 2, 5, False, 2),  # below min: KubeRay runs min
        (9, 0, 4, False, 4),  # above max: KubeRay runs max
        (3, 1, 5, True, 0),  # suspended group: no pods
        (5, 5, 5, False, 5),
    ],
)
def test_effective_replicas_clamp_as_kuberay_does(
    replicas: int, lo: int, hi: int, suspend: bool, effective: int
) -> None:
    raw = group("g", replicas=replicas, min_replicas=lo, max_replicas=hi, suspend=suspend)

    [g] = parse_raycluster(cluster(raw)).groups

    assert g.replicas == replicas  # as stored: patches compare against this
    assert g.effective_replicas == effective


def test_group_fields_are_read() -> None:
    raw = group(
        "g",
        idleTimeoutSeconds=300,
        priority=5,
        resources={"TPU": "4", "custom": 2},
        labels={"zone": "a"},
        rayStartParams={"num-cpus": 4, "block": True},
        scaleStrategy={"workersToDelete": ["p1", "p2"]},
    )

    [g] = parse_raycluster(cluster(raw)).groups

    assert g.idle_timeout_s == 300.0
    assert g.priority == 5
    assert dict(g.resources) == {"TPU": "4", "custom": "2"}
    assert dict(g.labels) == {"zone": "a"}
    assert dict(g.ray_start_params) == {"num-cpus": "4", "block": "true"}
    assert g.workers_to_delete == ("p1", "p2")


def test_cluster_level_fields() -> None:
    raw = cluster(
        group("g"),
        name="rc",
        suspend=True,
        enableInTreeAutoscaling=True,
        autoscalerOptions={"idleTimeoutSeconds": 30, "upscalingMode": "Conservative"},
    )

    spec = parse_raycluster(raw)

    assert (spec.name, spec.namespace, spec.uid) == ("rc", "default", "uid-1")
    assert spec.resource_version == "7"
    assert spec.suspended is True
    assert spec.in_tree_autoscaling is True
    assert spec.autoscaler.idle_timeout_s == 30.0
    assert spec.autoscaler.upscaling_mode is UpscalingMode.CONSERVATIVE


def test_limits_win_over_requests_for_the_container_shape() -> None:
    raw = group("g")
    raw["template"]["spec"]["containers"][0]["resources"] = {
        "limits": {"cpu": "2"},
        "requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": 1},
    }

    [g] = parse_raycluster(cluster(raw)).groups

    assert (g.container.cpu, g.container.memory_bytes, g.container.gpu) == (2.0, 2**30, 1.0)


def with_field(key: str, value: object) -> dict[str, Any]:
    raw = group("bad")
    raw[key] = value
    return raw


MALFORMED_GROUPS = [
    pytest.param(with_field("numOfHosts", 0), "numOfHosts must be at least 1", id="hosts-0"),
    pytest.param(with_field("numOfHosts", -2), "numOfHosts must be at least 1", id="hosts-neg"),
    pytest.param(
        group("bad", min_replicas=5, max_replicas=2), "minReplicas 5 > maxReplicas 2", id="min>max"
    ),
    pytest.param(with_field("replicas", None), "replicas is null", id="replicas-null"),
    pytest.param(with_field("replicas", -1), "replicas must not be negative", id="replicas-neg"),
    pytest.param(with_field("replicas", "3"), "replicas must be an integer", id="replicas-str"),
    pytest.param(with_field("replicas", True), "replicas must be an integer", id="replicas-bool"),
    pytest.param(with_field("replicas", 2.5), "replicas must be an integer", id="replicas-float"),
    pytest.param(with_field("maxReplicas", 2**40), "exceeds int32", id="max-huge"),
    pytest.param(with_field("minReplicas", [1]), "minReplicas must be an integer", id="min-list"),
    pytest.param(with_field("suspend", "yes"), "suspend must be a boolean", id="suspend-str"),
    pytest.param(with_field("priority", "high"), "priority must be an integer", id="priority"),
    pytest.param(with_field("idleTimeoutSeconds", -5), "idleTimeoutSeconds", id="idle-neg"),
    pytest.param(with_field("rayStartParams", ["a"]), "rayStartParams must be a map", id="params"),
    pytest.param(with_field("resources", {"TPU": {"x": 1}}), "resources entry", id="resources"),
    pytest.param(with_field("scaleStrategy", "all"), "scaleStrategy must be an object", id="ss"),
    pytest.param(
        with_field("scaleStrategy", {"workersToDelete": "p1"}), "workersToDelete", id="wtd-str"
    ),
    pytest.param(with_field("template", None), "containers is empty", id="no-template"),
    pytest.param(
        with_field("template", {"spec": {"containers": [{"image": "ray"}]}}),
        "has no name",
        id="container-unnamed",
    ),
    pytest.param(
        with_field(
            "template",
            {"spec": {"containers": [{"name": "w", "resources": {"limits": {"cpu": "lots"}}}]}},
        ),
        "container resource cpu",
        id="bad-quantity",
    ),
]


@pytest.mark.parametrize(("bad", "why"), MALFORMED_GROUPS)
def test_a_malformed_group_is_skipped_with_a_named_problem(bad: dict[str, Any], why: str) -> None:
    raw = cluster(group("before", replicas=1), bad, group("after", hosts=4))

    spec = parse_raycluster(raw)

    assert [g.name for g in spec.groups] == ["before", "after"]
    assert [g.index for g in spec.groups] == [0, 2]  # patch paths still point at the right entry
    assert spec.skipped_groups == ("bad",)
    [problem] = spec.problems
    assert problem.group == "bad"
    assert why in problem.message
    assert "skipped" in problem.message


def test_duplicate_group_names_skip_every_copy() -> None:
    raw = cluster(group("dup"), group("ok"), group("dup", hosts=2))

    spec = parse_raycluster(raw)

    assert [g.name for g in spec.groups] == ["ok"]
    assert spec.skipped_groups == ("dup", "dup")
    assert all(p.group == "dup" and "more than once" in p.message for p in spec.problems)


@pytest.mark.parametrize("entry", [None, 7, "tpu", [group("x")]])
def test_a_group_entry_that_is_not_an_object(entry: object) -> None:
    spec = parse_raycluster(cluster(entry, group("ok")))  # type: ignore[arg-type]

    assert [g.name for g in spec.groups] == ["ok"]
    assert spec.skipped_groups == ("workerGroupSpecs[0]",)
    assert "not an object" in spec.problems[0].message


@pytest.mark.parametrize("name", [None, "", 5, ["a"], {"a": 1}])
def test_a_group_without_a_usable_name(name: object) -> None:
    raw = group("x")
    raw["groupName"] = name

    spec = parse_raycluster(cluster(raw, deep(raw), group("ok")))

    assert [g.name for g in spec.groups] == ["ok"]
    assert spec.skipped_groups == ("workerGroupSpecs[0]", "workerGroupSpecs[1]")


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (None, "not an object but NoneType"),
        ([], "not an object but list"),
        ({"kind": "RayCluster"}, "spec is missing"),
        ({"spec": {"workerGroupSpecs": {"a": 1}}}, "workerGroupSpecs is not a list"),
        ({"spec": {"autoscalerOptions": ["x"]}}, "autoscalerOptions is not an object"),
        ({"spec": {"autoscalerOptions": {"upscalingMode": "Turbo"}}}, "'Turbo' unknown"),
        ({"spec": {"autoscalerOptions": {"idleTimeoutSeconds": "60"}}}, "'60' ignored"),
    ],
)
def test_a_malformed_cluster_yields_a_problem_not_an_exception(raw: object, problem: str) -> None:
    spec = parse_raycluster(raw)

    assert spec.groups == ()
    assert any(problem in p.message for p in spec.problems)
    assert spec.autoscaler.upscaling_mode is UpscalingMode.DEFAULT


def test_head_container_name_comes_from_the_head_template() -> None:
    raw = cluster(group("g"))
    raw["spec"]["headGroupSpec"]["template"]["spec"]["containers"] = [{"name": "head-main"}]

    assert parse_raycluster(raw).head_container_name == "head-main"


def test_the_model_is_frozen() -> None:
    [g] = parse_raycluster(cluster(group("g", labels={"a": "b"}))).groups

    with pytest.raises(TypeError):
        g.labels["a"] = "c"  # type: ignore[index]
    with pytest.raises(AttributeError):
        g.replicas = 4  # type: ignore[misc]
