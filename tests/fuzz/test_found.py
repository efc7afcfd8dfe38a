"""Regression tests for what the fuzzer and the soak found (docs/reliability.md lists them)."""

from __future__ import annotations

from ray.core.generated import autoscaler_pb2

from kuberay_scaler.core.model.cluster import frozen_map
from kuberay_scaler.core.model.ray import Bundle
from kuberay_scaler.core.planner.bins import UNBOUNDED, copies_that_fit
from tests.factories import (
    NOW,
    cluster,
    cpu_nodes,
    deleted_pods,
    group,
    head_node,
    plan_of,
    pod,
    state,
)
from tests.fuzz.pipeline import run_daemon_path


def test_a_subnormal_demand_fits_unbounded_instead_of_overflowing() -> None:
    # Found by the fuzzer: 64 / 5e-324 is inf and math.floor(inf) raised OverflowError, which
    # failed the whole plan (every group) on every reconcile.
    tiny = Bundle(resources=frozen_map({"CPU": 5e-324}), selectors=())  # type: ignore[arg-type]
    assert copies_that_fit(tiny, {"CPU": 64.0}, {}) == UNBOUNDED
    assert copies_that_fit(tiny, {"CPU": 0.0}, {}) == UNBOUNDED  # EPSILON / 5e-324 is inf too


def test_a_pod_in_phase_unknown_with_a_busy_ray_node_is_not_deleted() -> None:
    # Found by the fuzzer: kubelet unreachable (phase Unknown) while the GCS still reaches the
    # Ray node, which runs work. The broken slice was replaced without a drain; it is now kept
    # (KeepKind.BROKEN_BUT_BUSY) while any of its Ray nodes is busy.
    rc = cluster(group("cpu", replicas=1, min_replicas=0, max_replicas=2))
    reply = autoscaler_pb2.GetClusterResourceStateReply()
    node = reply.cluster_resource_state.node_states.add(
        node_id=(1).to_bytes(28, "big"),
        instance_id="cpu-w0",
        status=1,  # RUNNING: busy
    )
    node.total_resources["CPU"] = 8
    node.available_resources["CPU"] = 0
    outcome = run_daemon_path(
        rc, [pod("cpu-w0", "cpu", phase="Unknown")], reply.SerializeToString(), NOW
    )
    doomed = (outcome.after["spec"]["workerGroupSpecs"][0].get("scaleStrategy") or {}).get(
        "workersToDelete"
    )
    assert not doomed


def test_single_host_pods_sharing_a_replica_label_are_separate_slices() -> None:
    # Found by the fuzzer: in a numOfHosts 1 group two pods carrying the same
    # worker-group-replica-name were one "slice" with too many hosts, judged broken and planned
    # for replacement whole, the busy pod with it. KubeRay sets that label only for
    # numOfHosts > 1 and reconciles single-host pods one by one; so do we now.
    rc = cluster(group("cpu", replicas=1, min_replicas=0, max_replicas=1))
    idle = pod("cpu-a", "cpu", replica="same")
    busy = pod("cpu-b", "cpu", replica="same")
    nodes = [*cpu_nodes(["cpu-a"], "cpu", idle_s=3600), *cpu_nodes(["cpu-b"], "cpu", free_cpu=0)]
    result = plan_of(rc, [idle, busy], state([head_node(), *nodes]))
    assert "cpu-b" not in deleted_pods(result, "cpu")


def test_an_overdrawn_bin_fits_nothing_instead_of_overflowing() -> None:
    # Found by the fuzzer: free -1e300 over a subnormal need is -inf; math.floor raised.
    tiny = Bundle(resources=frozen_map({"CPU": 5e-324}), selectors=())  # type: ignore[arg-type]
    assert copies_that_fit(tiny, {"CPU": -1e300}, {}) == 0
    one = Bundle(resources=frozen_map({"CPU": 1.0}), selectors=())  # type: ignore[arg-type]
    assert copies_that_fit(one, {"CPU": -3.0}, {}) == 0  # never a negative count
    assert copies_that_fit(one, {"CPU": float("nan")}, {}) == 0


def test_a_slice_with_too_many_hosts_is_not_replaced_over_a_busy_host() -> None:
    # Found by the fuzzer: a broken slice was replaced whole, its busy host with it.
    rc = cluster(group("tpu", replicas=1, min_replicas=0, max_replicas=1, hosts=2))
    pods = [pod(f"tpu-a-{i}", "tpu", replica="tpu-a", host_index=i % 2) for i in range(3)]
    reply = autoscaler_pb2.GetClusterResourceStateReply()
    for i in range(3):
        node = reply.cluster_resource_state.node_states.add(
            node_id=(i + 1).to_bytes(28, "big"),
            instance_id=f"tpu-a-{i}",
            status=1 if i == 1 else 3,  # host 1 busy, the others idle
            idle_duration_ms=0 if i == 1 else 10**6,
        )
        node.total_resources["CPU"] = 8
        node.available_resources["CPU"] = 0 if i == 1 else 8
    outcome = run_daemon_path(rc, pods, reply.SerializeToString(), NOW)
    doomed = (outcome.after["spec"]["workerGroupSpecs"][0].get("scaleStrategy") or {}).get(
        "workersToDelete"
    )
    assert "tpu-a-1" not in (doomed or [])
