"""Issue 30, sidecar mode (`enableInTreeAutoscaling: false`): when maxReplicas is lowered,
KubeRay itself deletes a surplus pod at random at once. What is left runs within the new max,
but `replicas` stays above it unless the daemon writes it down, as the drop-in path does.
Invariant: the pod left running (busy) is neither drained nor named for deletion."""

from __future__ import annotations

import pytest

from kuberay_scaler.core.model.reasons import RunsMaxReplicas
from tests.control.fakes import make_loop, run_for
from tests.control.worlds import spec_group, workers_to_delete
from tests.factories import cluster, cpu_nodes, group, head_node, pod, state


@pytest.mark.parametrize("in_tree", [False, True])
async def test_replicas_above_a_lowered_max_are_written_down_when_kuberay_deleted_the_pod(
    in_tree: bool,
) -> None:
    rc = cluster(group("cpu", replicas=2, max_replicas=1), enableInTreeAutoscaling=in_tree)
    busy = state([head_node(), *cpu_nodes(["cpu-0"], free_cpu=0)])
    loop = make_loop(rc, [pod("cpu-0", "cpu")], busy)  # KubeRay deleted cpu-1 already
    await run_for(loop, 15, busy)
    assert spec_group(loop)["replicas"] == 1, spec_group(loop)
    assert workers_to_delete(loop) == [] and loop.gcs.drains == []  # the busy one stays
    plan = loop.reconciler.status.last_plan
    assert plan is not None
    [written] = [d for d in loop.writer.applied]
    assert {"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 1} in written


async def test_the_write_down_says_why() -> None:
    rc = cluster(group("cpu", replicas=3, max_replicas=1), enableInTreeAutoscaling=False)
    busy = state([head_node(), *cpu_nodes(["cpu-0"], free_cpu=0)])
    loop = make_loop(rc, [pod("cpu-0", "cpu")], busy)
    await loop.reconciler.reconcile()
    plan = loop.reconciler.status.last_plan
    assert plan is not None
    [decision] = plan.groups
    assert RunsMaxReplicas(replicas=3, max_replicas=1) in decision.reasons
    assert decision.reason_code == "replicas_above_max"
