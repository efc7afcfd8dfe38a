"""Fuzzing the whole decision path on raw input: RayCluster dict + pod list + GCS reply bytes →
parse → plan → patch, as the daemon runs it.

Inputs reach every extreme the CRD accepts (int32 replicas / numOfHosts / min / max, quantities
such as 1e400 or 8Ei, NaN and infinities in rayStartParams resource JSON, unicode group names, up
to 100 groups), pods in odd states (any phase, missing labels, other clusters, duplicate replica
names, garbage items) and GCS replies built as real protobufs and serialized (random nodes,
statuses, idle times, labels, tasks, gangs with every strategy and placement constraint,
label selectors, request_resources constraints).

Per example: no exception; the patch applies to the object it was made from; the write it would
make breaks no invariant of tests/invariants.py; planning twice gives the same patch. Time and
tracemalloc peak per plan are measured and printed at the end (`make fuzz` shows them; the bound
is stated in docs/reliability.md). `FUZZ_EXAMPLES` sets the number of examples (`make fuzz`: 5000).
"""

from __future__ import annotations

import copy
import json
import os
import time
import tracemalloc
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from ray.core.generated import autoscaler_pb2

from tests.fuzz.pipeline import Outcome, run_daemon_path
from tests.invariants import DEAD, DRAINING, NODE_STATUS_NAMES, RUNNING, World, Write, check_write

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "60"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    print_blob=True,
)
FUZZ_TIMEOUT = pytest.mark.timeout(max(300, EXAMPLES))  # about 0.1 s per example at most
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
CLUSTER = "rc"
INT32 = 2**31 - 1

_measured: dict[str, list[float]] = {"seconds": [], "peak_bytes": []}
_worst: dict[str, Any] = {"peak": 0, "case": None}

# --- RayCluster ---------------------------------------------------------------------------------

int32s = st.one_of(
    st.integers(0, 4),
    st.integers(0, 8),
    st.sampled_from([0, 1, -1, 10**6, INT32, -(2**31)]),
    st.integers(-(2**31), INT32),
)
suffixes = st.sampled_from(["", "m", "k", "M", "G", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "E", "n"])
quantities = st.one_of(
    st.integers(0, 64).map(str),
    st.builds(lambda n, s: f"{n}{s}", st.integers(0, 10**20), suffixes),
    st.builds(
        lambda f, s: f"{f}{s}",
        st.floats(0, 1e6, allow_nan=False).map(lambda f: f"{f:.3f}"),
        suffixes,
    ),
    st.sampled_from(
        [
            "1e400",
            "1E+400",
            "-1e400",
            "1e-400",
            ".5",
            "1.",
            "0",
            "500m",
            "8Ei",
            "1e18",
            "-1",
            "1e308",
        ]
    ),
    st.integers(-5, 10**12),  # x-int-or-string: a plain integer is accepted too
)
resource_values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(-(10**20), 10**20)
)
resource_names = st.sampled_from(["TPU", "GPU", "CPU", "memory", "custom", "TPU-v6e-16-head", "ü"])
start_param_values = st.one_of(
    quantities.map(str),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "", "abc"]),
)
resource_json = st.one_of(
    st.dictionaries(resource_names, resource_values, max_size=3).map(json.dumps),
    st.sampled_from(
        ['{"TPU": NaN}', '{"TPU": 1e400}', "not json", "[1]", '{"a": {"b": 1}}', "'{}'"]
    ),
)
names = st.one_of(
    st.sampled_from(["tpu", "cpu", "gpu", "g", "グループ", "x" * 63]),
    st.sampled_from(["tpu", "cpu", "gpu", "g", "h"]),
    st.text(min_size=1, max_size=12),
)
ACCELERATORS = ["tpu-v6e-slice", "tpu-v4-podslice", "tpu-v5-lite-podslice", "tpu-v5p-slice", "x"]
TOPOLOGIES = ["1x1", "2x2", "2x4", "4x4", "2x2x1", "2x2x2", "4x4x4", "8x16", "0x0", "a", ""]


TPU_SHAPES = {1: "2x2", 2: "2x4", 4: "4x4"}  # v6e, 4 chips per host


@st.composite
def worker_groups(draw: st.DrawFn, name: str) -> dict[str, Any]:
    """Mostly a group a user would write; one in four reaches for the CRD's extremes."""
    if draw(st.integers(0, 3)) == 0:
        return draw(wild_groups(name))
    hosts = draw(st.sampled_from([1, 1, 2, 4]))
    tpu = hosts > 1 or draw(st.booleans())
    limits: dict[str, Any] = {
        "cpu": draw(st.sampled_from(["1", "2", "8", "500m"])),
        "memory": "8Gi",
    }
    pod_spec: dict[str, Any] = {
        "containers": [{"name": "ray-worker", "resources": {"limits": limits}}]
    }
    if tpu:
        limits["google.com/tpu"] = "4"
        pod_spec["nodeSelector"] = {
            "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
            "cloud.google.com/gke-tpu-topology": TPU_SHAPES[hosts],
        }
    low = draw(st.integers(0, 2))
    high = draw(st.integers(low, low + 4))
    group: dict[str, Any] = {
        "groupName": name,
        "replicas": draw(st.integers(0, high + 1)),
        "minReplicas": low,
        "maxReplicas": high,
        "numOfHosts": hosts,
        "rayStartParams": {},
        "template": {"spec": pod_spec},
    }
    if draw(st.integers(0, 4)) == 0:
        group["rayStartParams"]["resources"] = draw(resource_json)
    return group


@st.composite
def wild_groups(draw: st.DrawFn, name: str) -> dict[str, Any]:
    limits: dict[str, Any] = {}
    for key in draw(
        st.sets(st.sampled_from(["cpu", "memory", "google.com/tpu", "nvidia.com/gpu"]))
    ):
        limits[key] = draw(quantities)
    container: dict[str, Any] = {"name": draw(st.sampled_from(["ray-worker", "main"]))}
    if draw(st.booleans()):
        container["resources"] = {"limits": limits, "requests": dict(limits)}
    pod_spec: dict[str, Any] = {"containers": [container]}
    if "google.com/tpu" in limits or draw(st.integers(0, 4)) == 0:
        pod_spec["nodeSelector"] = {
            "cloud.google.com/gke-tpu-accelerator": draw(st.sampled_from(ACCELERATORS)),
            "cloud.google.com/gke-tpu-topology": draw(st.sampled_from(TOPOLOGIES)),
        }
    params = draw(
        st.dictionaries(
            st.sampled_from(["num-cpus", "num-gpus", "memory", "resources"]),
            start_param_values,
            max_size=3,
        )
    )
    if draw(st.integers(0, 3)) == 0:
        params["resources"] = draw(resource_json)
    group: dict[str, Any] = {
        "groupName": name,
        "minReplicas": draw(int32s),
        "maxReplicas": draw(int32s),
        "rayStartParams": params,
        "template": {"spec": pod_spec},
    }
    for key in ("replicas", "numOfHosts"):
        if draw(st.integers(0, 5)):
            group[key] = draw(int32s)
    if draw(st.integers(0, 10)) == 0:
        group["suspend"] = draw(st.booleans())
    if draw(st.integers(0, 5)) == 0:
        group["idleTimeoutSeconds"] = draw(int32s)
    return group


@st.composite
def rayclusters(draw: st.DrawFn) -> dict[str, Any]:
    many = draw(st.integers(0, 30)) == 0
    count = 100 if many else draw(st.integers(1, 5))
    group_names = (
        [f"g{i}" for i in range(count)]
        if many
        else draw(st.lists(names, min_size=count, max_size=count))
    )
    spec: dict[str, Any] = {
        "headGroupSpec": {
            "rayStartParams": {},
            "template": {"spec": {"containers": [{"name": "ray-head"}]}},
        },
        "workerGroupSpecs": [draw(worker_groups(n)) for n in group_names],
    }
    if draw(st.booleans()):
        spec["enableInTreeAutoscaling"] = True
        options: dict[str, Any] = {"version": "v2"}
        if draw(st.booleans()):
            options["idleTimeoutSeconds"] = draw(int32s)
        if draw(st.booleans()):
            options["upscalingMode"] = draw(
                st.sampled_from(["Default", "Aggressive", "Conservative"])
            )
        spec["autoscalerOptions"] = options
    if draw(st.integers(0, 30)) == 0:
        spec["suspend"] = True
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {
            "name": CLUSTER,
            "namespace": "default",
            "uid": "uid-1",
            "resourceVersion": "7",
        },
        "spec": spec,
    }


# --- pods --------------------------------------------------------------------------------------

PHASES = ["Running"] * 8 + ["Pending", "Pending", "Succeeded", "Failed", "Unknown", "", None]


@st.composite
def pods_for(draw: st.DrawFn, rc: dict[str, Any]) -> list[Any]:
    pods: list[Any] = []
    groups = rc["spec"]["workerGroupSpecs"][:6]
    for index, group in enumerate(groups):
        hosts = group.get("numOfHosts", 1)
        hosts = hosts if isinstance(hosts, int) and 1 <= hosts <= 4 else draw(st.integers(1, 3))
        for s in range(draw(st.integers(0, 3))):
            replica = draw(st.sampled_from([f"{index}-r{s}"] * 8 + [f"{index}-r0", "dup"]))
            for h in range(draw(st.sampled_from([hosts, hosts, max(1, hosts - 1)]))):
                pods.append(draw(a_pod(f"p{index}-{s}-{h}", str(group["groupName"]), replica, h)))
    if draw(st.integers(0, 6)) == 0:
        pods.append(
            draw(st.sampled_from([None, 5, "pod", [], {"metadata": None}, {"metadata": {}}]))
        )
    if groups and draw(st.integers(0, 3)) == 0:  # name some existing pods in workersToDelete
        named = [p["metadata"]["name"] for p in pods if isinstance(p, dict) and p.get("spec")]
        if named:
            doomed = draw(st.lists(st.sampled_from(named), max_size=4))
            groups[0]["scaleStrategy"] = {"workersToDelete": doomed}
    return pods


@st.composite
def a_pod(draw: st.DrawFn, name: str, group: str, replica: str, host: int) -> dict[str, Any]:
    labels = {
        "ray.io/cluster": draw(st.sampled_from([CLUSTER] * 12 + ["other"])),
        "ray.io/node-type": draw(st.sampled_from(["worker"] * 12 + ["head", "x"])),
        "ray.io/group": group,
        "ray.io/worker-group-replica-name": replica,
        "ray.io/replica-host-index": draw(st.sampled_from([str(host)] * 12 + ["0", "-1", "x"])),
    }
    if draw(st.integers(0, 10)) == 0:
        for key in draw(st.sets(st.sampled_from(sorted(labels)), max_size=2)):
            del labels[key]
    phase = draw(st.sampled_from(PHASES))
    meta: dict[str, Any] = {
        "name": name,
        "uid": f"u-{name}",
        "labels": labels,
        "creationTimestamp": draw(
            st.sampled_from(
                ["2026-12-01T11:00:00Z"] * 6 + ["2026-12-01T11:59:59Z", "garbage", None]
            )
        ),
    }
    if draw(st.integers(0, 8)) == 0:
        meta["deletionTimestamp"] = "2026-12-01T11:59:00Z"
    state: dict[str, Any] = (
        {"running": {"startedAt": "2026-12-01T11:00:05Z"}}
        if phase == "Running"
        else {
            "waiting": {"reason": draw(st.sampled_from(["ContainerCreating", "CrashLoopBackOff"]))}
        }
    )
    status: dict[str, Any] = {
        "phase": phase,
        "containerStatuses": [{"name": "ray-worker", "state": state}],
    }
    if draw(st.integers(0, 8)) == 0:
        status["conditions"] = [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
        ]
    spec: dict[str, Any] = {"nodeName": "n1", "containers": [{"name": "ray-worker"}]}
    if draw(st.integers(0, 6)) == 0:  # held by a scheduling gate, as Kueue holds pods
        spec["schedulingGates"] = draw(
            st.sampled_from(
                [
                    [{"name": "kueue.x-k8s.io/elastic-job"}],
                    [{"name": "kueue.x-k8s.io/admission"}, {"name": "example.com/gate"}],
                    [{"name": ""}, "junk", {"nom": 1}],
                    "not a list",
                ]
            )
        )
    return {"metadata": meta, "spec": spec, "status": status}


# --- the GCS reply -----------------------------------------------------------------------------

res_maps = st.dictionaries(
    st.sampled_from(
        [
            "CPU",
            "TPU",
            "GPU",
            "memory",
            "custom",
            "TPU-v6e-16-head",
            "node:__internal_head__",
            "CPU_group_ab",
        ]
    ),
    st.one_of(st.floats(0, 64), st.sampled_from([float("nan"), float("inf"), -1.0, 1e300])),
    max_size=4,
)
label_maps = st.dictionaries(
    st.sampled_from(
        [
            "ray.io/tpu-slice-name",
            "ray.io/tpu-worker-id",
            "ray.io/tpu-pod-type",
            "ray.io/node-group",
            "k",
        ]
    ),
    st.sampled_from(["0", "1", "v6e-16", "v4-8", "0-r0", "dup", "tpu", ""]),
    max_size=3,
)


def _fill_request(request: Any, draw: st.DrawFn) -> None:
    for key, value in draw(res_maps).items():
        request.resources_bundle[key] = value
    if draw(st.integers(0, 3)) == 0:
        selector = request.label_selectors.add()
        for key, values in draw(label_maps).items():
            constraint = selector.label_constraints.add()
            constraint.label_key = key
            constraint.operator = draw(st.sampled_from([0, 1, 2]))
            constraint.label_values.extend([values])
    if draw(st.integers(0, 4)) == 0:
        constraint = request.placement_constraints.add()
        which = constraint.anti_affinity if draw(st.booleans()) else constraint.affinity
        which.label_name = "_PG_x"
        which.label_value = ""


@st.composite
def gcs_replies(draw: st.DrawFn, pods: list[Any]) -> bytes:
    reply = autoscaler_pb2.GetClusterResourceStateReply()
    state = reply.cluster_resource_state
    state.cluster_session_name = "session_x"
    # A Ray node runs only in a container that runs: Running pods, or Unknown (kubelet lost).
    pod_names = [
        p["metadata"]["name"]
        for p in pods
        if isinstance(p, dict)
        and isinstance(p.get("metadata"), dict)
        and p["metadata"].get("name")
        and (p.get("status") or {}).get("phase") in ("Running", "Unknown")
    ]
    head = state.node_states.add(node_id=b"\x00" * 28, instance_id="rc-head", status=3)
    head.total_resources["node:__internal_head__"] = 1
    instances = [n for n in dict.fromkeys(pod_names) if draw(st.integers(0, 4))]
    instances += ["ghost"] * draw(st.integers(0, 1))
    for i, instance in enumerate(instances):
        status = draw(st.sampled_from([3, 3, 3, 1, 1, 2, 4, 0]))
        node = state.node_states.add(
            node_id=(i + 1).to_bytes(28, "big"),
            instance_id=instance if draw(st.integers(0, 6)) else "ghost",
            ray_node_type_name=draw(st.sampled_from(["", "tpu", "cpu"])),
            status=status,
            idle_duration_ms=draw(st.sampled_from([0, 1000, 10**6, 10**6, 10**12]))
            if status == 3
            else 0,
        )
        total = draw(res_maps)
        for key, value in total.items():
            node.total_resources[key] = value
            node.available_resources[key] = value if status != 1 else 0.0
        for key, value in draw(label_maps).items():
            node.labels[key] = value
    for _ in range(draw(st.integers(0, 3))):
        by_count = state.pending_resource_requests.add(
            count=draw(st.sampled_from([0, 1, 3, 10**6, 2**62]))
        )
        _fill_request(by_count.request, draw)
    for _ in range(draw(st.integers(0, 3))):
        gang = state.pending_gang_resource_requests.add()
        strategy = draw(st.sampled_from(["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD", "X"]))
        gang.details = f"pg{draw(st.integers(0, 9))}:{strategy}|PENDING"
        target = (
            gang.bundle_selectors.add().resource_requests if draw(st.booleans()) else gang.requests
        )
        for _ in range(draw(st.integers(0, 5))):
            _fill_request(target.add(), draw)
    if draw(st.integers(0, 4)) == 0:
        constraint = state.cluster_resource_constraints.add()
        for _ in range(draw(st.integers(1, 3))):
            by_count = constraint.resource_requests.add(count=draw(st.sampled_from([1, 4, 10**6])))
            _fill_request(by_count.request, draw)
    return bytes(reply.SerializeToString())


@st.composite
def inputs(draw: st.DrawFn) -> tuple[dict[str, Any], list[Any], bytes]:
    rc = draw(rayclusters())
    pods = draw(pods_for(rc))
    return rc, pods, draw(gcs_replies(pods))


# --- the checks --------------------------------------------------------------------------------


def ray_world(pods: list[Any], reply: bytes, drained: frozenset[str]) -> World:
    """The world the final write lands in: Ray's node states after the drains were answered."""
    parsed = autoscaler_pb2.GetClusterResourceStateReply.FromString(reply)
    ray: dict[str, str] = {}
    for node in parsed.cluster_resource_state.node_states:
        status = NODE_STATUS_NAMES.get(int(node.status), RUNNING)
        if bytes(node.node_id).hex() in drained:
            status = DRAINING
        status = {"UNSPECIFIED": RUNNING}.get(status, status)
        if ray.get(node.instance_id, DEAD) == DEAD:
            ray[node.instance_id] = status
    by_name = {
        p["metadata"]["name"]: p
        for p in pods
        if isinstance(p, dict)
        and isinstance(p.get("metadata"), dict)
        and p["metadata"].get("name")
        and (p["metadata"].get("labels") or {}).get("ray.io/cluster") == CLUSTER
    }
    return World(by_name, ray)


def report() -> str:
    """What `make fuzz` prints at the end (tests/fuzz/conftest.py): the measured bounds."""
    seconds, peaks = sorted(_measured["seconds"]), sorted(_measured["peak_bytes"])
    if not seconds:
        return ""
    p99 = seconds[min(len(seconds) - 1, int(len(seconds) * 0.99))]
    return (
        f"fuzz: {len(seconds)} plans (parse + plan + patch on raw input); seconds per plan "
        f"p50 {seconds[len(seconds) // 2]:.4f}, p99 {p99:.4f}, max {seconds[-1]:.4f}; "
        f"tracemalloc peak per plan p50 {peaks[len(peaks) // 2] / 2**20:.2f} MiB, "
        f"max {peaks[-1] / 2**20:.2f} MiB"
    )


def _measured_decide(rc: dict[str, Any], pods: list[Any], reply: bytes) -> Outcome:
    """One pass, timed without tracing, then its allocation peak measured on a second pass."""
    started = time.perf_counter()
    outcome = run_daemon_path(rc, pods, reply, NOW)
    _measured["seconds"].append(time.perf_counter() - started)
    tracemalloc.start()
    try:
        run_daemon_path(rc, pods, reply, NOW)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    _measured["peak_bytes"].append(peak)
    return outcome


@FUZZ_TIMEOUT
@FUZZ
@given(inputs())
def test_raw_input_plans_without_exception_and_keeps_every_invariant(
    case: tuple[dict[str, Any], list[Any], bytes],
) -> None:
    rc, pods, reply = case
    pristine = copy.deepcopy(rc)
    outcome = _measured_decide(rc, pods, reply)  # the patch's guards hold (jsonpatch raises)
    assert rc == pristine, "planning mutated its input"
    assert outcome.decision.error is None, outcome.decision.error
    _events(outcome)
    world = ray_world(pods, reply, outcome.drained)
    request = json.dumps(outcome.decision.document()["writes"], default=str)[:2000]
    violations = check_write(Write(rc, outcome.after, by="daemon", request=request), world)
    assert not violations, "\n\n".join(map(str, violations))
    again = run_daemon_path(copy.deepcopy(rc), list(pods), reply, NOW)
    assert again.decision.document() == outcome.decision.document(), "same input, other writes"
    assert again.after == outcome.after


# --- one group's spec never changes another group's decision -------------------------------------


@st.composite
def isolated_cases(draw: st.DrawFn) -> tuple[dict[str, Any], list[Any], bytes, int, dict[str, Any]]:
    """Groups that serve disjoint demand (each its own custom resource `R<i>`), then any other
    spec for one of them: what the others decide must not move."""
    count = draw(st.integers(2, 4))
    groups = []
    for i in range(count):
        group = draw(worker_groups(f"g{i}"))
        group["rayStartParams"] = {"resources": json.dumps({f"R{i}": draw(st.integers(1, 4))})}
        group["template"]["spec"].pop("nodeSelector", None)
        group["template"]["spec"]["containers"] = [
            {"name": "ray-worker", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}
        ]
        group["numOfHosts"] = 1
        group["minReplicas"], group["maxReplicas"] = 0, draw(st.integers(0, 5))
        group["replicas"] = draw(st.integers(0, group["maxReplicas"]))
        groups.append(group)
    rc = draw(rayclusters())
    rc["spec"]["workerGroupSpecs"] = groups
    rc["spec"].pop("suspend", None)
    pods: list[Any] = []
    reply = autoscaler_pb2.GetClusterResourceStateReply()
    state = reply.cluster_resource_state
    for i in range(count):
        for k in range(draw(st.integers(0, 3))):
            name = f"g{i}-w{k}"
            pods.append(draw(a_pod(name, f"g{i}", name, 0)))
            status = draw(st.sampled_from([1, 3, 3, 2]))
            node = state.node_states.add(
                node_id=(i * 10 + k + 1).to_bytes(28, "big"),
                instance_id=name,
                status=status,
                idle_duration_ms=draw(st.sampled_from([0, 10**7])) if status == 3 else 0,
            )
            node.total_resources[f"R{i}"] = 4.0
            node.available_resources[f"R{i}"] = 0.0 if status == 1 else 4.0
        for _ in range(draw(st.integers(0, 2))):
            ask = state.pending_resource_requests.add(count=draw(st.integers(1, 6)))
            ask.request.resources_bundle[f"R{i}"] = draw(st.sampled_from([1.0, 2.0, 4.0]))
    changed = draw(st.integers(0, count - 1))
    other = draw(worker_groups(f"g{changed}"))
    return rc, pods, bytes(reply.SerializeToString()), changed, other


def _events(outcome: Outcome) -> None:
    """What the examples reached (shown by --hypothesis-show-statistics): a fuzzer whose plans
    never change anything would prove little."""
    result = outcome.decision.plan
    event("patch" if outcome.decision.patch else "no patch")
    if outcome.refused:
        event("a drain refused (busy host kept)")
    if any(g.target > g.current for g in result.groups):
        event("scale-up")
    if any(g.deletions for g in result.groups):
        event("deletions")
    if any(g.clear_workers_to_delete for g in result.groups):
        event("clear workersToDelete")
    if result.problems:
        event("problems reported")


def _decisions(result: Any, skip: str) -> dict[str, Any]:
    return {
        g.group: (g.target, g.deletions, g.clear_workers_to_delete, g.held)
        for g in result.groups
        if g.group != skip
    }


@FUZZ_TIMEOUT
@FUZZ
@given(isolated_cases())
def test_changing_one_group_never_changes_another_groups_decision(
    case: tuple[dict[str, Any], list[Any], bytes, int, dict[str, Any]],
) -> None:
    rc, pods, reply, changed, other = case
    name = f"g{changed}"
    before = _measured_decide(rc, pods, reply)
    edited = copy.deepcopy(rc)
    edited["spec"]["workerGroupSpecs"][changed] = other
    after = _measured_decide(edited, pods, reply)
    _events(before)
    assert _decisions(after.decision.plan, name) == _decisions(before.decision.plan, name)
