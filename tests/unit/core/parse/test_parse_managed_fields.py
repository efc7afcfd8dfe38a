"""The spec's writers from metadata.managedFields (ClusterSpec.spec_writers).

They name another writer that overrode our replicas (loop/handsoff.py). The parser reads each
entry's manager, time and the top-level keys of its FieldsV1 and nothing below them; a malformed
entry is a named problem that costs neither the other entries nor the rest of the spec.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kuberay_scaler.core.model.cluster import ClusterSpec, SpecWriter
from kuberay_scaler.core.parse.raycluster import MAX_MANAGED_FIELDS, parse_raycluster
from tests.factories import cluster, group


def entry(manager: object, time: object, fields: object, **extra: object) -> dict[str, object]:
    return {"manager": manager, "operation": "Update", "time": time, "fieldsV1": fields, **extra}


def parsed(managed: object) -> ClusterSpec:
    rc = cluster(group("cpu", replicas=2), group("tpu", hosts=4, tpu="4"))
    rc["metadata"]["managedFields"] = managed
    return parse_raycluster(rc)


def names(spec: ClusterSpec) -> list[str]:
    return [w.manager for w in spec.spec_writers]


def test_the_spec_writers_newest_first_without_status_writers_or_nameless_entries() -> None:
    spec = parsed(
        [
            entry("kubectl-edit", "2026-01-01T10:00:00Z", {"f:spec": {}}),
            entry(
                "kuberay-operator", "2026-01-01T12:00:00Z", {"f:status": {}}, subresource="status"
            ),
            entry("argocd-controller", "2026-01-01T11:00:00Z", {"f:spec": {"f:suspend": {}}}),
            entry("", "2026-01-01T13:00:00Z", {"f:spec": {}}),  # names nobody
            entry(None, "2026-01-01T13:00:00Z", {"f:spec": {}}),
            entry("labeller", "2026-01-01T14:00:00Z", {"f:metadata": {"f:labels": {}}}),
            entry("no-fields", "2026-01-01T15:00:00Z", None),
        ]
    )
    assert spec.spec_writers == (
        SpecWriter("argocd-controller", "2026-01-01T11:00:00Z"),
        SpecWriter("kubectl-edit", "2026-01-01T10:00:00Z"),
    )
    assert spec.problems == ()
    assert [g.name for g in spec.groups] == ["cpu", "tpu"]


def test_equal_times_keep_their_order_and_a_missing_time_is_the_oldest() -> None:
    spec = parsed(
        [
            entry("undated", None, {"f:spec": {}}),
            entry("first", "2026-01-01T10:00:00Z", {"f:spec": {}}),
            entry("second", "2026-01-01T10:00:00Z", {"f:spec": {}}),
            {"manager": "no-time-key", "fieldsV1": {"f:spec": {}}},
            entry("newest", "2026-01-02T00:00:00Z", {"f:spec": {}}),
        ]
    )
    assert names(spec) == ["newest", "first", "second", "undated", "no-time-key"]
    assert spec.spec_writers[-1].time == "" and spec.problems == ()


@pytest.mark.parametrize("managed", [None, []])
def test_no_managed_fields_is_no_writers_and_no_problem(managed: object) -> None:
    spec = parsed(managed)
    assert spec.spec_writers == () and spec.problems == ()


def test_without_the_key_there_are_no_writers() -> None:
    spec = parse_raycluster(cluster(group("cpu")))
    assert spec.spec_writers == () and spec.problems == ()


@pytest.mark.parametrize("managed", [{"f:spec": {}}, "argocd", 7, True])
def test_managed_fields_that_are_not_a_list_are_a_problem_and_cost_nothing_else(
    managed: object,
) -> None:
    spec = parsed(managed)
    assert spec.spec_writers == ()
    (problem,) = spec.problems
    assert str(problem).startswith("metadata.managedFields is not a list but ")
    assert type(managed).__name__ in str(problem)
    assert spec == replace(parsed(None), problems=spec.problems)  # nothing else lost


def test_malformed_entries_are_named_once_and_the_good_ones_are_kept() -> None:
    spec = parsed(
        [
            "argocd",  # not an object
            entry("gitops", "2026-01-01T10:00:00Z", ["f:spec"]),  # fieldsV1 not an object
            entry(42, "2026-01-01T10:00:00Z", {"f:spec": {}}),  # manager not a string
            entry("kubectl-scale", "2026-01-01T12:00:00Z", {"f:spec": {}}),
            entry("timeless", 1767261600, {"f:spec": {}}),  # time not a string: kept, oldest
            entry("kubectl-edit", "2026-01-01T11:00:00Z", {"f:spec": {}}),
        ]
    )
    assert names(spec) == ["kubectl-scale", "kubectl-edit", "timeless"]
    (problem,) = spec.problems
    assert str(problem) == (
        "metadata.managedFields: entry 0 is not an object but str; ignored (and 3 more)"
    )
    assert problem.group is None
    assert [g.name for g in spec.groups] == ["cpu", "tpu"]


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (None, "entry 0 is not an object but NoneType; ignored"),
        (entry("x", "t", "f:spec"), "entry 0 fieldsV1 is not an object but str; ignored"),
        (entry("x", "t", 7), "entry 0 fieldsV1 is not an object but int; ignored"),
        (entry(["x"], "t", {"f:spec": {}}), "entry 0 manager is not a string but list; ignored"),
        (
            entry("x", {"at": 1}, {"f:spec": {}}),
            "entry 0 (x) time is not a string but dict; taken as oldest",
        ),
    ],
)
def test_each_malformed_entry_says_what_is_wrong(bad: object, why: str) -> None:
    spec = parsed([bad])
    assert [str(p) for p in spec.problems] == [f"metadata.managedFields: {why}"]


class Untouchable(Mapping[str, Any]):
    """A FieldsV1 subtree (or an entry past the bound): reading any of it fails the test."""

    def __getitem__(self, key: str) -> Any:
        raise AssertionError(f"the parser read {key!r} below what it needs")

    def __iter__(self) -> Iterator[str]:
        raise AssertionError("the parser walked a subtree it does not need")

    def __len__(self) -> int:
        raise AssertionError("the parser sized a subtree it does not need")


def test_the_field_sets_below_the_top_level_are_never_read() -> None:
    spec = parsed(
        [
            entry("argocd", "2026-01-01T10:00:00Z", {"f:spec": Untouchable()}),
            entry("kubelet", "2026-01-01T11:00:00Z", {"f:status": Untouchable()}),
        ]
    )
    assert names(spec) == ["argocd"] and spec.problems == ()


def test_entries_past_the_bound_are_named_and_not_read() -> None:
    kept = [
        entry(f"m{i}", f"2026-01-01T00:00:{i % 60:02}Z", {"f:spec": {}})
        for i in range(MAX_MANAGED_FIELDS)
    ]
    spec = parsed([*kept, Untouchable(), Untouchable()])
    assert len(spec.spec_writers) == MAX_MANAGED_FIELDS
    (problem,) = spec.problems
    assert str(problem) == (
        f"metadata.managedFields has {MAX_MANAGED_FIELDS + 2} entries; the first"
        f" {MAX_MANAGED_FIELDS} were read for the spec's writers"
    )


def test_writers_do_not_change_what_the_groups_parse_to() -> None:
    plain = parsed(None)
    written = parsed([entry("argocd", "2026-01-01T10:00:00Z", {"f:spec": {}})])
    assert written.groups == plain.groups and written.problems == plain.problems


WELL_FORMED = [
    entry("kubectl-edit", "2026-01-01T10:00:00Z", {"f:spec": {"f:workerGroupSpecs": {}}}),
    entry("kuberay-operator", "2026-01-01T12:00:00Z", {"f:status": {}}, subresource="status"),
    entry("argocd", "2026-01-01T11:00:00Z", {"f:spec": {}, "f:metadata": {}}),
]
JUNK = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=6), st.just("f:spec")
    ),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["manager", "time", "fieldsV1", "f:spec", "operation", "x"]),
            inner,
            max_size=4,
        )
    ),
    max_leaves=10,
)


@st.composite
def mangled(draw: st.DrawFn) -> object:
    """The well-formed managedFields with a few parts replaced by junk (or all of it)."""
    if draw(st.integers(0, 9)) == 0:
        return draw(JUNK)
    managed: list[Any] = copy.deepcopy(WELL_FORMED)
    for _ in range(draw(st.integers(1, 3))):
        index = draw(st.integers(0, len(managed) - 1))
        key = draw(st.sampled_from([None, "manager", "time", "fieldsV1"]))
        if key is None:
            managed[index] = draw(JUNK)
        elif isinstance(managed[index], dict):
            managed[index][key] = draw(JUNK)
    return managed


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mangled())
def test_any_managed_fields_parse_without_raising_and_keep_the_groups(managed: object) -> None:
    spec = parsed(managed)
    assert [g.name for g in spec.groups] == ["cpu", "tpu"]
    assert all(isinstance(w.manager, str) and w.manager for w in spec.spec_writers)
    times = [w.time for w in spec.spec_writers]
    assert times == sorted(times, reverse=True)
    assert all(p.group is None for p in spec.problems) and len(spec.problems) <= 1
