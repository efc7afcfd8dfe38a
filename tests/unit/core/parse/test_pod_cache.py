"""Pods are parsed once per change (PodCache), and the informer keeps only what parsing reads."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kuberay_scaler.core.parse.pod_cache import PodCache
from kuberay_scaler.core.parse.pods import parse_pod, parse_pods, slim_pod
from kuberay_scaler.core.parse.raycluster import parse_raycluster
from tests.factories import cluster, group, pod, slice_pods, tpu_group

RC = cluster(group("cpu", replicas=2), tpu_group("tpu", replicas=1))
SPEC = parse_raycluster(RC)


def _store() -> dict[str, Any]:
    pods = [
        pod("rc-head", "headgroup", head=True, container="ray-head"),
        pod("cpu-a", "cpu"),
        pod("cpu-b", "cpu", phase="Pending"),
        *slice_pods("tpu", "tpu-r0", 4),
    ]
    return {p["metadata"]["name"]: p for p in pods}


def test_a_changed_pod_is_parsed_once_and_the_others_not_again() -> None:
    store = _store()
    cache = PodCache()
    cache.hosts(store, SPEC)
    assert cache.parsed == len(store)

    changed = copy.deepcopy(store["cpu-b"])
    changed["status"]["phase"] = "Running"
    changed["status"]["containerStatuses"][1]["state"] = {
        "running": {"startedAt": "2026-11-30T11:59:00Z"}
    }
    store["cpu-b"] = changed  # what a watch event does: a new object under the same name
    hosts, _ = cache.hosts(store, SPEC)
    cache.hosts(store, SPEC)  # and a reconcile with no event in between parses nothing

    assert cache.parsed == len(store) + 1
    assert {h.pod_name: h.phase.value for h in hosts}["cpu-b"] == "running"


def test_the_cache_gives_what_parsing_every_pod_gives() -> None:
    store = _store()
    cache = PodCache()
    cache.hosts(store, SPEC)
    del store["cpu-a"]
    store["cpu-c"] = pod("cpu-c", "cpu", deleting=True)
    store["stray"] = pod("stray", "cpu", cluster_name="other")

    hosts, problems = cache.hosts(store, SPEC)
    expected_hosts, expected_problems = parse_pods(list(store.values()), SPEC)

    assert hosts == tuple(expected_hosts)
    assert len(problems) == len(expected_problems) == 1
    assert "stray" in problems[0].message


def test_version_moves_only_when_what_the_planner_reads_moves() -> None:
    store = _store()
    cache = PodCache()
    cache.hosts(store, SPEC)
    first = cache.version

    touched = copy.deepcopy(store["cpu-a"])
    touched["metadata"]["resourceVersion"] = "999"  # e.g. a condition's timestamp changed
    store["cpu-a"] = touched
    cache.hosts(store, SPEC)
    assert cache.version == first  # re-parsed, but the same host

    del store["cpu-a"]
    cache.hosts(store, SPEC)
    assert cache.version == first + 1


def test_a_spec_change_the_parser_reads_reparses_every_pod() -> None:
    store = _store()
    cache = PodCache()
    cache.hosts(store, SPEC)
    renamed = copy.deepcopy(RC)
    renamed["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["name"] = "main"
    cache.hosts(store, parse_raycluster(renamed))
    assert cache.parsed == 2 * len(store)


def _variety() -> list[Any]:
    terminated = pod("t", "cpu")
    terminated["spec"]["restartPolicy"] = "Never"
    terminated["status"]["containerStatuses"][1]["state"] = {"terminated": {"reason": "OOMKilled"}}
    unscheduled = pod("u", "cpu", phase="Pending")
    unscheduled["status"]["containerStatuses"] = []
    unscheduled["status"]["conditions"] = [
        {"type": "Initialized", "status": "True"},
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"},
    ]
    legacy = pod("legacy-0", "tpu", legacy_replica="tpu-legacy")
    legacy["spec"]["containers"][0]["env"] = [
        {"name": "A", "value": "1"},
        {"name": "TPU_WORKER_ID", "value": "2"},
    ]
    failed = pod("f", "cpu")
    failed["status"] |= {"phase": "Failed", "reason": "Evicted"}
    orphan = pod("o", "gone-group")
    orphan["spec"]["containers"].insert(0, {"name": "first", "image": "x", "env": []})
    weird_spec = pod("w", "cpu")
    weird_spec["spec"] = ["not", "a", "map"]
    return [
        *_store().values(),
        pod("d", "cpu", deleting=True),
        terminated,
        unscheduled,
        legacy,
        failed,
        orphan,
        weird_spec,
        {"metadata": {"labels": {}}},
        "not a pod",
    ]


@pytest.mark.parametrize("raw", _variety(), ids=lambda p: str(p)[:40])
def test_a_slim_pod_parses_exactly_as_the_full_pod(raw: Any) -> None:
    original = copy.deepcopy(raw)
    slim = slim_pod(raw)
    assert parse_pod(slim, SPEC) == parse_pod(raw, SPEC)
    assert raw == original  # the informer's input is not modified


def test_a_slim_pod_keeps_what_the_informer_needs_and_drops_the_rest() -> None:
    full = pod("cpu-a", "cpu")
    full["metadata"] |= {"resourceVersion": "42", "managedFields": [{"manager": "kubelet"}]}
    full["spec"]["containers"][0] |= {"image": "ray:2.60", "args": ["x" * 500]}
    slim = slim_pod(full)
    assert slim["metadata"]["name"] == "cpu-a"
    assert slim["metadata"]["resourceVersion"] == "42"
    assert "managedFields" not in slim["metadata"]
    assert slim["spec"]["containers"] == [{"name": "ray-worker"}]
