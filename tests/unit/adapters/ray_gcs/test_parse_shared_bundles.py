"""parse_ray_state parses equal task entries once (one shared Bundle): the values are exactly
those of parsing every entry on its own."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kuberay_scaler.adapters.ray_gcs import state as ray_state
from kuberay_scaler.adapters.ray_gcs.state import parse_ray_state
from kuberay_scaler.core.model.ray import TaskDemand
from tests.factories import NOW_MS, gcs_reply, gcs_request

_resources = st.dictionaries(
    st.sampled_from(["CPU", "GPU", "TPU", "memory", "CPU_group_x", "custom"]),
    st.sampled_from([0.5, 1.0, 4.0, float("nan"), float("inf")]),
    max_size=3,
)
_selector = st.dictionaries(
    st.sampled_from(["zone", "ray.io/accelerator-type"]), st.sampled_from(["a", "b"]), max_size=2
)
_entry = st.tuples(_resources, _selector, st.integers(0, 5), st.booleans())


def _request(
    resources: dict[str, float], selector: dict[str, str], count: int, negated: bool
) -> Any:
    """`count` tasks of `resources`, with `selector` as one label selector (`negated`: not in)."""
    entry = gcs_request(resources, count)
    if selector:
        constraints = entry.request.label_selectors.add()
        for key, value in selector.items():
            c = constraints.label_constraints.add(label_key=key, label_values=[value])
            c.operator = 2 if negated else 1
    return entry


@given(st.lists(st.sampled_from([0, 1, 2]), max_size=30), st.lists(_entry, min_size=3, max_size=3))
@settings(max_examples=80, deadline=None)
def test_shared_bundles_equal_bundles_parsed_one_by_one(
    picks: list[int], shapes: list[tuple[dict[str, float], dict[str, str], int, bool]]
) -> None:
    reply = gcs_reply(
        0, demand=[_request(*shapes[i]) for i in picks]
    )  # shapes repeat, as per raylet
    state = reply.cluster_resource_state
    one_by_one = tuple(
        TaskDemand(ray_state._bundle(r.request), int(r.count))
        for r in state.pending_resource_requests
        if r.count > 0
    )
    parsed = parse_ray_state(reply, read_at_ms=NOW_MS)
    assert parsed.tasks == one_by_one
    # Entries of one shape (equal requests) share one Bundle object.
    kept = [i for i in picks if shapes[i][2] > 0]
    by_shape: dict[int, object] = {}
    for i, task in zip(kept, parsed.tasks, strict=True):
        assert by_shape.setdefault(i, task.bundle) is task.bundle
