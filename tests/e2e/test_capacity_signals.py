"""Capacity signals on the real control plane (observation side).

The shared plane has TPU Nodes of one type only (v6e, 4x4). A group asking for another type
(v5e, `tpu-v5-lite-podslice` 4x4) is really Unschedulable: the real kube-scheduler says so on its
pods, with its own message. A cluster-autoscaler stand-in (`kuberay_standins.ca_standin`: the
reasons, reporter and message forms of the real one, docs/capacity-signals.md) posts on those
pods what the real one posts in a stockout. The daemon, as KubeRay's autoscaler user:

- under KubeRay's Role alone: runs, says capacity Events are not read, asks for none;
- with deploy/capacity-events' Role bound too: reads them, and /debug/plan lists them as
  CapacityEvents (stockout, scale-up triggered, no scale-up in backoff) for exactly those pods;
  and when a namespace ResourceQuota makes the real API server refuse a group's pods, the real
  operator's `FailedToCreateWorkerPod` Event on the RayCluster is read as `quota` of that group
  (named by the refused pod's name).

`test_fallback_*` (v5e stuck → demand served by v6e) need the planner side of issue 29 (the
capacity-plan branch): they skip without it. Both deploy modes: with the events Role (the fast
path: the stand-in's stockout; then v5e Nodes appear → the probe moves new demand back) and
drop-in under KubeRay's Role alone (the deadline path: v5e-16's own provisioning deadline).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import re
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest
import yaml
from pydantic import AliasChoices

from kuberay_scaler.core import defaults
from kuberay_scaler.core.model import reasons
from kuberay_scaler.core.model.labels import ANNOTATION_MAX_PROVISION
from kuberay_scaler.runtime.settings import Settings
from kuberay_standins.ca_standin import ACCELERATOR, ClusterAutoscalerStandIn, Mode
from kuberay_standins.ray_local import RayDriver
from tests.e2e.controlplane import REPO, RESTRICTED_USER, ControlPlane, tpu_node
from tests.e2e.procs import Daemon
from tests.e2e.ray_bridge import GROUP, labels_of, pod_name
from tests.e2e.world import CLUSTER, HOSTS, SLICE_UP_S, World, tpu_raycluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

EVENTS_ROLE = REPO / "deploy" / "capacity-events" / "role.yaml"
V5E = {ACCELERATOR: "tpu-v5-lite-podslice", "cloud.google.com/gke-tpu-topology": "4x4"}
STUCK = "v5e-16"
FALLBACK = "v6e-16"
DEADLINE_S = 20  # v5e-16's own provisioning deadline in the drop-in test
QUOTA_GROUP = "v6e-quota"
V6E_16 = {ACCELERATOR: "tpu-v6e-slice", "cloud.google.com/gke-tpu-topology": "4x4"}
# The real scheduler's words for a pod no Node's labels fit (pkg/scheduler/framework/plugins/
# nodeaffinity: ErrReasonPod), inside its "0/N nodes are available: ..." summary.
UNSCHEDULABLE = re.compile(
    r"^0/\d+ nodes are available: .*didn't match Pod's node affinity/selector"
)


def with_group(
    cluster: dict[str, Any], name: str, selector: Mapping[str, str], **sizes: int
) -> None:
    """Turn the fixture's TPU group into `name` on Nodes of `selector`."""
    group = cluster["spec"]["workerGroupSpecs"][0]
    group["groupName"] = name
    group.update(sizes)
    group["template"]["spec"]["nodeSelector"] = dict(selector)


def group_pods(world: World, group: str) -> list[dict[str, Any]]:
    return [p for p in world.observer.pods.values() if labels_of(p).get(GROUP) == group]


def scheduled_condition(pod: Mapping[str, Any]) -> dict[str, Any]:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "PodScheduled"), {})


def all_unschedulable(pods: list[dict[str, Any]]) -> bool:
    return len(pods) == HOSTS and all(
        scheduled_condition(p).get("reason") == "Unschedulable" for p in pods
    )


@contextlib.asynccontextmanager
async def autoscaler(
    world: World, modes: Mapping[str, Mode]
) -> AsyncIterator[ClusterAutoscalerStandIn]:
    standin = ClusterAutoscalerStandIn(world.admin, world.namespace, modes)
    task = asyncio.create_task(standin.run())
    try:
        yield standin
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def bind_events_role(world: World, user: str) -> None:
    """deploy/capacity-events' Role as shipped, bound to the test user (a User, not the
    ServiceAccount the shipped RoleBinding names)."""
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{world.namespace}"
    role = yaml.safe_load(EVENTS_ROLE.read_text())
    await world.admin.ok("POST", f"{rbac}/roles", role)
    name = role["metadata"]["name"]
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": f"{user}-{name}"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
    await world.admin.ok("POST", f"{rbac}/rolebindings", binding)


async def capacity_signals(daemon: Daemon) -> dict[str, Any]:
    plan = await daemon.plan()
    found = (plan or {}).get("capacity_signals")
    return found if isinstance(found, dict) else {}


async def test_stockout_events_reach_the_daemon_only_with_the_events_role(world: World) -> None:
    cluster = tpu_raycluster()
    with_group(cluster, STUCK, V5E, replicas=1, minReplicas=1, maxReplicas=1)
    quota_group = copy.deepcopy(cluster["spec"]["workerGroupSpecs"][0])
    quota_group.update(groupName=QUOTA_GROUP, replicas=0, minReplicas=0, maxReplicas=1)
    quota_group["template"]["spec"]["nodeSelector"] = dict(V6E_16)
    cluster["spec"]["workerGroupSpecs"].append(quota_group)
    await world.create_raycluster(cluster)

    # --- the real scheduler: no v5e Node, so the slice's pods are Unschedulable ---------------
    await world.wait_for(lambda: all_unschedulable(group_pods(world, STUCK)), 90, "Unschedulable")
    stuck = sorted(pod_name(p) for p in group_pods(world, STUCK))
    for pod in group_pods(world, STUCK):
        condition = scheduled_condition(pod)
        assert condition["status"] == "False"
        assert UNSCHEDULABLE.match(condition["message"]), condition["message"]

    async with autoscaler(world, {V5E[ACCELERATOR]: "stockout"}) as ca:

        def failed() -> set[str]:
            return {
                e["involvedObject"]["name"] for e in ca.posted if e["reason"] == "FailedScaleUp"
            }

        await world.wait_for(lambda: failed() == set(stuck), 60, "the stand-in's FailedScaleUp")
        await world.ray_up()

        # --- KubeRay's Role alone: no Events read, said once, the daemon runs ---------------
        plain = await world.start_daemon(RESTRICTED_USER)
        await world.wait_for(lambda: capacity_signals(plain), 60, "/debug/plan", async_ok=True)
        signals = await capacity_signals(plain)
        assert signals["events"].startswith("not read")
        assert signals["capacity_events"] == []
        assert "provisioning deadline" in signals["signals"]
        said = plain.events("capacity signals")
        assert len(said) == 1 and said[0]["events"].startswith("not read")
        assert await plain.metric("kuberay_scaler_api_requests_total", resource="events") == 0
        await asyncio.to_thread(plain.stop)

        # --- with the events Role: the stand-in's Events, judged, in /debug/plan -------------
        await bind_events_role(world, RESTRICTED_USER)
        reader = await world.start_daemon(RESTRICTED_USER)

        async def judged() -> set[tuple[str, str, str]]:
            found = (await capacity_signals(reader)).get("capacity_events") or []
            return {(e["pod"], e["reason"], e["signal"]) for e in found}

        expected = {
            *((p, "TriggeredScaleUp", "scale-up-triggered") for p in stuck),
            *((p, "FailedScaleUp", "stockout") for p in stuck),
            *((p, "NotTriggerScaleUp", "no-scale-up") for p in stuck),  # in backoff
        }

        async def all_judged() -> bool:
            return await judged() == expected

        await world.wait_for(all_judged, 60, "the CapacityEvents in /debug/plan", async_ok=True)

    # --- KubeRay refused by a namespace ResourceQuota: its Event names the group -------------
    # No kube-controller-manager here to fill the quota's status (admission judges by it: an
    # empty status.hard refuses nothing), so the test writes the status that controller would.
    quotas = f"/api/v1/namespaces/{world.namespace}/resourcequotas"
    tpu = {"requests.google.com/tpu": "0"}
    quota = {"metadata": {"name": "tpu"}, "spec": {"hard": tpu}}
    created = await world.admin.ok("POST", quotas, quota)
    created["status"] = {"hard": tpu, "used": tpu}
    await world.admin.ok("PUT", f"{quotas}/tpu/status", created)
    await world.admin.ok(
        "PATCH",
        world.raycluster_path,
        [{"op": "replace", "path": "/spec/workerGroupSpecs/1/replicas", "value": 1}],
        content_type="application/json-patch+json",
    )

    async def quota_judged() -> list[dict[str, Any]]:
        found = (await capacity_signals(reader)).get("capacity_events") or []
        return [e for e in found if e["reason"] == "FailedToCreateWorkerPod"]

    await world.wait_for(quota_judged, 60, "KubeRay's refusal in /debug/plan", async_ok=True)
    [refused] = await quota_judged()
    assert (refused["signal"], refused["group"], refused["pod"]) == ("quota", QUOTA_GROUP, None)
    # kube-apiserver 1.36 names the pod before admission: the generated name, not generateName.
    named = re.search(r'pods "([a-z0-9-]+)" is forbidden: exceeded quota: tpu', refused["message"])
    assert named and named.group(1).startswith(f"{CLUSTER}-{QUOTA_GROUP}-worker-"), refused
    assert refused["source"] == "raycluster-controller"
    signals = await capacity_signals(reader)
    assert signals["events"] == "read"
    assert "cluster-autoscaler Events on pods" in signals["signals"]
    for event in signals["capacity_events"]:
        if event["pod"] is not None:
            assert event["source"] == "cluster-autoscaler" and event["group"] is None
    [access] = [line["mode"] for line in reader.events("kubernetes access")]
    assert "; capacity Events read;" in access
    assert await reader.metric("kuberay_scaler_api_requests_total", code="403") == 0
    world.assert_invariants()


# --- fallback: needs the planner side of issue 29 (capacity-plan branch) ---------------------

FALLBACK_READY = hasattr(reasons.ScaleDownKind, "CANCEL_UNAVAILABLE")
# The planner side's backoff setting, when it has one (its name is that branch's to choose).
BACKOFF_ENV = next(
    (
        str(choice)
        for info in Settings.model_fields.values()
        if isinstance(info.validation_alias, AliasChoices)
        for choice in info.validation_alias.choices
        if "UNAVAILABLE_BACKOFF" in str(choice) and "MAX" not in str(choice)
    ),
    None,
)
# Four bundles of one TPU host each: one 4-host slice of either type serves it.
DEMAND = """
import ray
pg = ray.util.placement_group([{"TPU": 4}] * 4, strategy="STRICT_SPREAD")
ray.get(pg.ready(), timeout=900)
print("PLACED", flush=True)
"""


async def add_nodes(plane: ControlPlane, prefix: str, selector: Mapping[str, str]) -> list[str]:
    names = [f"{prefix}-{i}" for i in range(HOSTS)]
    for name in names:
        topology = selector["cloud.google.com/gke-tpu-topology"]
        body = tpu_node(name, selector[ACCELERATOR], topology)
        await asyncio.to_thread(plane.request, "POST", "/api/v1/nodes", body)
    return names


def delete_nodes(plane: ControlPlane, names: list[str]) -> None:
    for name in names:
        plane.request("DELETE", f"/api/v1/nodes/{name}", ok_statuses=(404,))


def running_pods(world: World, group: str) -> int:
    return sum((p.get("status") or {}).get("phase") == "Running" for p in group_pods(world, group))


def stuck_then_fallback(*, stuck_deadline_s: str | None = None) -> dict[str, Any]:
    """Two groups of the same 4-host shape, the stuck one first in spec order (the e2e
    operator's CRD, v1.6.1, has no `priority`): v5e-16 (no Nodes in the plane; its own
    provisioning deadline when `stuck_deadline_s`) and v6e-16."""
    cluster = tpu_raycluster()
    with_group(cluster, STUCK, V5E, replicas=0, minReplicas=0, maxReplicas=1)
    groups = cluster["spec"]["workerGroupSpecs"]
    fallback = copy.deepcopy(groups[0])
    fallback["groupName"] = FALLBACK
    fallback["template"]["spec"]["nodeSelector"] = dict(V6E_16)
    groups.append(fallback)
    if stuck_deadline_s is not None:
        meta = groups[0]["template"].setdefault("metadata", {})
        meta.setdefault("annotations", {})[ANNOTATION_MAX_PROVISION] = stuck_deadline_s
    return cluster


async def served_by_the_fallback(world: World, driver: RayDriver) -> None:
    """The daemon opens v5e-16 for the demand, its pods are really Unschedulable; then the
    demand is served by v6e-16 (a whole slice Running, its 4 Ray hosts joined, the placement
    group placed) and v5e-16's never-ran slice is cancelled: exactly its pods named in
    workersToDelete, nothing else."""
    await world.wait_for(lambda: world.replicas(STUCK) == 1, 90, "v5e-16 opened first")
    await world.wait_for(
        lambda: all_unschedulable(group_pods(world, STUCK)), 90, "its pods Unschedulable"
    )
    stuck = {pod_name(p) for p in group_pods(world, STUCK)}
    await world.wait_for(lambda: world.replicas(FALLBACK) == 1, 120, "fallback to v6e")
    await world.wait_for(lambda: "PLACED" in driver.output(), SLICE_UP_S, "demand served")
    await world.wait_for(lambda: not group_pods(world, STUCK), 120, "v5e slice cancelled")
    assert world.replicas(STUCK) == 0
    # Ray may place the group before the bridge has seen every `ray start` return.
    await world.wait_for(lambda: world.running_slices(FALLBACK), 60, "v6e-16's hosts joined")
    assert len(world.running_slices(FALLBACK)) == 1
    # Cancelled whole, and only what never ran: no v5e pod was ever scheduled (no Node fits).
    assert world.observer.ever_deleted == stuck


@pytest.mark.skipif(
    not FALLBACK_READY, reason="needs capacity-plan's fallback (issue 29 planner side)"
)
async def test_fallback_from_a_stuck_group_and_back_when_its_nodes_appear(world: World) -> None:
    """v5e-16 (no Nodes) and v6e-16 (stuck_then_fallback). Demand for 4 x {TPU: 4}: the
    daemon opens v5e-16, its pods are really Unschedulable, the stand-in posts the stockout,
    the daemon cancels that slice and serves the demand with v6e-16. Then v5e Nodes appear and
    the stand-in falls silent: once the group's backoff ends, the probe opens v5e-16 again for
    new demand, and its slice comes up."""
    await world.create_raycluster(stuck_then_fallback())
    await world.ray_up()
    await bind_events_role(world, RESTRICTED_USER)
    settings = {BACKOFF_ENV: "20"} if BACKOFF_ENV else {}
    nodes: list[str] = []
    try:
        async with autoscaler(world, {V5E[ACCELERATOR]: "stockout"}) as ca:
            daemon = await world.start_daemon(RESTRICTED_USER, **settings)
            first = await world.start_driver(DEMAND)
            await served_by_the_fallback(world, first)
            if BACKOFF_ENV is None:
                pytest.skip("no backoff setting: the probe half would wait the 180 s default")
            # v5e Nodes appear; the real autoscaler would now succeed: it says nothing more.
            ca.say(V5E[ACCELERATOR], None)
            nodes = await add_nodes(world.plane, f"kwok-v5e-{world.namespace}", V5E)
            second = await world.start_driver(DEMAND)
            await world.wait_for(
                lambda: running_pods(world, STUCK) == HOSTS and "PLACED" in second.output(),
                SLICE_UP_S + 120,
                "the probe moved new demand back to v5e-16",
            )
            assert daemon.alive()
        world.assert_invariants()
    finally:
        await asyncio.to_thread(delete_nodes, world.plane, nodes)


@pytest.mark.skipif(
    not FALLBACK_READY, reason="needs capacity-plan's fallback (issue 29 planner side)"
)
async def test_fallback_by_the_provisioning_deadline_under_kuberays_role_alone(
    world: World,
) -> None:
    """The drop-in deploy mode's path: KubeRay's autoscaler Role alone, so no Events are read
    and the group's own provisioning deadline (20 s, its template annotation) is all that
    judges v5e-16's Unschedulable slice: past it, the group is unavailable
    (provisioning-deadline), its never-ran slice cancelled, the demand served by v6e-16."""
    await world.create_raycluster(stuck_then_fallback(stuck_deadline_s=str(DEADLINE_S)))
    await world.ray_up()
    daemon = await world.start_daemon(RESTRICTED_USER)
    await world.wait_for(lambda: capacity_signals(daemon), 60, "/debug/plan", async_ok=True)
    signals = await capacity_signals(daemon)
    assert signals["events"].startswith("not read"), signals
    assert "provisioning deadline" in signals["signals"], signals

    driver = await world.start_driver(DEMAND)
    await served_by_the_fallback(world, driver)

    async def judged() -> dict[str, Any]:
        plan = await daemon.plan() or {}
        groups: list[dict[str, Any]] = plan.get("groups") or []
        found: dict[str, Any] = next((g["availability"] for g in groups if g["name"] == STUCK), {})
        return found if found.get("state") == "unavailable" else {}

    await world.wait_for(judged, 30, "v5e-16 unavailable in /debug/plan", async_ok=True)
    availability = await judged()
    assert availability["cause"] == "provisioning-deadline", availability
    # Judged by the group's own deadline (long before the cluster default), not before it.
    late = re.search(r"not up after (\d+) s\b", availability["text"])
    assert late, availability
    assert DEADLINE_S <= int(late.group(1)) < defaults.MAX_PROVISION_TIME_S, availability
    # The morning log: one line says it all, the cancelled slice and where the demand went.
    [marked] = [
        line
        for line in daemon.events("capacity")
        if line["group"] == STUCK and line["change"] == "marked_unavailable"
    ]
    assert "unavailable (provisioning-deadline)" in marked["text"], marked
    assert "1 pending slice(s) cancelled" in marked["text"], marked
    assert f"demand → {FALLBACK}" in marked["text"], marked
    assert await daemon.metric("kuberay_scaler_api_requests_total", resource="events") == 0
    world.assert_invariants()
