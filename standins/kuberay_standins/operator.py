"""A KubeRay operator stand-in (v1.7.0 ``reconcilePods`` rules) with a built-in fake kubelet.

The operator reconciles one RayCluster: head pod, worker pods per group (multi-host slices with
KubeRay's replica labels, or the legacy per-pod path plus the GKE TPU webhook's ``replicaIndex``
label), ``workersToDelete`` (never cleared, as upstream), delete expectations (a group waits
until the pods it deleted are gone), garbage collection of pods whose owner is gone, and a
status summary. The kubelet binds new pods to a fake node, marks them Running after
``start_delay`` and removes terminating pods, calling ``PodHooks`` so the demo can start and stop
Ray hosts. The decision rules live in ``_k8s_kuberay`` (pure); this module only applies them.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from kuberay_standins._k8s_errors import ApiError, NotFound
from kuberay_standins._k8s_kuberay import (
    CLUSTER_LABEL,
    GROUP_LABEL,
    HOST_INDEX_LABEL,
    NODE_TYPE_LABEL,
    REPLICA_INDEX_LABEL,
    REPLICA_NAME_LABEL,
    GroupPlan,
    GroupPolicy,
    PodSlot,
    autoscaling_enabled,
    build_head_pod,
    build_worker_pod,
    desired_worker_pods,
    num_of_hosts,
    plan_multi_host,
    plan_single_host,
    pod_labels,
    pod_name,
    resolve_env,
    unhealthy_reason,
)
from kuberay_standins._k8s_store import StoredEvent, rfc3339
from kuberay_standins._k8s_tpu_webhook import LEGACY_REPLICA_INDEX, mutate_tpu_pod
from kuberay_standins.apiserver import ApiServerStandIn

__all__ = ["OperatorStandIn", "PodHooks", "PodSlice", "resolve_env"]

log = structlog.get_logger(__name__)
_HEAD_EXPECTATIONS = ""  # expectation key of the head group, as in KubeRay
_REPLICA_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"


class PodHooks(Protocol):
    """The demo's view of the kubelet: a pod's containers started / the pod is gone."""

    async def on_running(self, pod: dict[str, Any]) -> None: ...

    async def on_deleted(self, pod: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class PodSlice:
    """Where a worker pod sits: its group, its replica (slice) and its host within it."""

    group: str
    replica_name: str | None  # KubeRay label; legacy mode: the webhook's "<group>-<i>"
    replica_index: int | None
    host_index: int | None
    num_of_hosts: int
    group_spec: dict[str, Any]


class OperatorStandIn:
    def __init__(
        self,
        api: ApiServerStandIn,
        namespace: str,
        cluster_name: str,
        *,
        multi_host_indexing: bool = True,
        hooks: PodHooks | None = None,
        interval: float = 0.2,
        start_delay: float = 0.0,
        rng_seed: int | None = None,
        random_pod_delete: bool = False,
        unschedulable: Callable[[dict[str, Any]], str | None] | None = None,
    ) -> None:
        self._api = api
        self._namespace = namespace
        self._cluster_name = cluster_name
        self._indexing = multi_host_indexing
        self._hooks = hooks
        self._interval = interval
        self._start_delay = start_delay
        self._rng = random.Random(rng_seed)
        self._random_pod_delete = random_pod_delete  # operator env ENABLE_RANDOM_POD_DELETE
        # The scheduler's part: a message for a pod no node fits (it stays Pending, unbound).
        self._unschedulable = unschedulable
        self._expected_gone: dict[str, set[str]] = {}
        self._used_replica_names: set[str] = set()
        self._starting: dict[str, asyncio.Task[None]] = {}  # pod uid -> kubelet start task
        self._running: dict[str, dict[str, Any]] = {}  # pod uid -> pod as reported running
        self._wake = asyncio.Event()
        self.paused = False
        self.errors: list[str] = []

    # -- loop --------------------------------------------------------------------------------

    async def run(self) -> None:
        """Reconcile on every change in the API server and every ``interval`` until cancelled.
        The kubelet keeps working while ``paused`` (only the operator is down)."""
        unsubscribe = self._api.subscribe(self._on_change)
        try:
            while True:
                self._wake.clear()
                if not self.paused:
                    self.reconcile_once()
                await self.kubelet_once()
                with suppress(TimeoutError):
                    async with asyncio.timeout(self._interval):
                        await self._wake.wait()
        finally:
            unsubscribe()
            for task in self._starting.values():
                task.cancel()

    def _on_change(self, event: StoredEvent) -> None:
        self._wake.set()

    async def settle(self, max_rounds: int = 100) -> list[str]:
        """Reconcile and run the kubelet until a round changes nothing; returns the actions.
        For tests and scripted demos that want a deterministic end state instead of ``run``."""
        actions: list[str] = []
        for _ in range(max_rounds):
            before = self._api.resource_version
            if not self.paused:
                actions += self.reconcile_once()
            await self.kubelet_once()
            pending = [task for task in self._starting.values() if not task.done()]
            await asyncio.gather(*pending, return_exceptions=True)
            if self._api.resource_version == before:
                return actions
        raise RuntimeError(f"operator stand-in did not settle in {max_rounds} rounds")

    # -- operator ------------------------------------------------------------------------------

    def reconcile_once(self) -> list[str]:
        """One synchronous reconcile pass; returns what it did, in words."""
        actions: list[str] = []
        cluster = self._api.get("rayclusters", self._namespace, self._cluster_name)
        actions += self._collect_garbage(cluster)
        if cluster is None or (cluster.get("spec") or {}).get("suspend") is True:
            actions += self._delete_all(cluster)
            return actions
        actions += self._reconcile_head(cluster)
        for group in (cluster.get("spec") or {}).get("workerGroupSpecs") or []:
            if isinstance(group, dict):
                actions += self._reconcile_group(cluster, group)
        self._update_status(cluster)
        return actions

    def _cluster_pods(self, selector: str = "") -> list[dict[str, Any]]:
        base = f"{CLUSTER_LABEL}={self._cluster_name}"
        return self._api.list("pods", self._namespace, f"{base},{selector}" if selector else base)

    def _collect_garbage(self, cluster: dict[str, Any] | None) -> list[str]:
        """Kubernetes' garbage collector: pods owned by a RayCluster UID that no longer exists."""
        uid = (cluster or {}).get("metadata", {}).get("uid")
        orphans = [p for p in self._cluster_pods() if _owner_uid(p) not in (None, uid)]
        return [
            self._delete(p, "owner RayCluster is gone", None)
            for p in orphans
            if not p["metadata"].get("deletionTimestamp")
        ]

    def _delete_all(self, cluster: dict[str, Any] | None) -> list[str]:
        if cluster is None:
            return []
        return [
            self._delete(p, "cluster suspended", None)
            for p in self._cluster_pods()
            if not p["metadata"].get("deletionTimestamp")
        ]

    def _reconcile_head(self, cluster: dict[str, Any]) -> list[str]:
        if not self._expectations_met(_HEAD_EXPECTATIONS):
            return []
        heads = self._cluster_pods(f"{NODE_TYPE_LABEL}=head")
        if len(heads) > 1:
            return [self._error(f"{len(heads)} head pods found")]
        if len(heads) == 1:
            reason = unhealthy_reason(heads[0])
            return [self._delete(heads[0], reason, _HEAD_EXPECTATIONS)] if reason else []
        created = self._api.create("pods", self._namespace, build_head_pod(cluster))
        return [f"create pod {pod_name(created)} (head)"]

    def _reconcile_group(self, cluster: dict[str, Any], group: dict[str, Any]) -> list[str]:
        name = str(group.get("groupName"))
        if not self._expectations_met(name):
            return []
        pods = self._cluster_pods(f"{GROUP_LABEL}={name},{NODE_TYPE_LABEL}=worker")
        if group.get("suspend") is True:
            return [
                self._delete(p, "group suspended", None)
                for p in pods
                if not p["metadata"].get("deletionTimestamp")
            ]
        policy = GroupPolicy(autoscaling_enabled(cluster), self._random_pod_delete, self._indexing)
        plan = self._plan(group, pods, policy)
        return self._apply(cluster, group, plan)

    def _plan(
        self, group: dict[str, Any], pods: list[dict[str, Any]], policy: GroupPolicy
    ) -> GroupPlan:
        if self._indexing and num_of_hosts(group) > 1:
            return plan_multi_host(
                group, pods, policy, lambda: self._new_replica_name(group), self._rng
            )
        return plan_single_host(group, pods, policy)

    def _new_replica_name(self, group: dict[str, Any]) -> str:
        while True:
            suffix = "".join(self._rng.choice(_REPLICA_NAME_CHARS) for _ in range(5))
            name = f"{group.get('groupName')}-{suffix}"
            if name not in self._used_replica_names:
                self._used_replica_names.add(name)
                return name

    def _apply(self, cluster: dict[str, Any], group: dict[str, Any], plan: GroupPlan) -> list[str]:
        name = str(group.get("groupName"))
        actions = [self._delete_by_name(pod, reason, name) for pod, reason in plan.deletes]
        if plan.error is not None:
            if plan.deletes:
                return [a for a in actions if a]  # a requeue after deletions, not a failure
            return [self._error(plan.error)]
        for slot in plan.creates:
            actions.append(self._create_worker(cluster, group, slot))
        return [a for a in actions if a]

    def _create_worker(self, cluster: dict[str, Any], group: dict[str, Any], slot: PodSlot) -> str:
        pod = build_worker_pod(cluster, group, slot)
        group_pods = self._cluster_pods(f"{GROUP_LABEL}={group.get('groupName')}")
        created = self._api.create("pods", self._namespace, mutate_tpu_pod(pod, group_pods))
        where = f"group {group.get('groupName')}"
        if slot.replica_name is not None:
            where += (
                f" replica {slot.replica_name} index {slot.replica_index} host {slot.host_index}"
            )
        elif slot.replica_index is not None:
            where += f" index {slot.replica_index}"
        return f"create pod {pod_name(created)} ({where})"

    def _delete(self, pod: dict[str, Any], reason: str, expectation: str | None) -> str:
        return self._delete_by_name(pod_name(pod), reason, expectation)

    def _delete_by_name(self, name: str, reason: str, expectation: str | None) -> str:
        try:
            self._api.delete("pods", self._namespace, name)
        except NotFound:
            return ""  # already gone: KubeRay ignores NotFound
        if expectation is not None:
            self._expected_gone.setdefault(expectation, set()).add(name)
        return f"delete pod {name}: {reason}"

    def _expectations_met(self, key: str) -> bool:
        pending = {
            n
            for n in self._expected_gone.get(key, set())
            if self._api.get("pods", self._namespace, n) is not None
        }
        self._expected_gone[key] = pending
        return not pending

    def _error(self, message: str) -> str:
        if message not in self.errors:
            self.errors.append(message)
            log.info("standin_operator_error", cluster=self._cluster_name, error=message)
        return f"error: {message}"

    def _update_status(self, cluster: dict[str, Any]) -> None:
        status = _status_summary(cluster, self._cluster_pods())
        if cluster.get("status") == status:
            return
        with suppress(ApiError):
            self._api.json_patch(
                "rayclusters",
                self._namespace,
                self._cluster_name,
                [{"op": "add", "path": "/status", "value": status}],
            )

    # -- kubelet -----------------------------------------------------------------------------

    async def kubelet_once(self) -> None:
        """Bind new pods, start bound ones (after ``start_delay``), finish terminating ones."""
        pods = self._cluster_pods()
        present = {p["metadata"]["uid"] for p in pods}
        for pod in pods:
            if pod["metadata"].get("deletionTimestamp"):
                await self._finish_termination(pod)
            elif not (pod.get("spec") or {}).get("nodeName"):
                message = self._unschedulable(pod) if self._unschedulable else None
                if message is None:
                    self._bind_and_start(pod)
                else:
                    self._mark_unschedulable(pod, message)
        for uid in [uid for uid in self._running if uid not in present]:
            await self._report_gone(self._running.pop(uid))
        for uid in [u for u, task in self._starting.items() if task.done() and u not in present]:
            del self._starting[uid]

    def _mark_unschedulable(self, pod: dict[str, Any], message: str) -> None:
        """What kube-scheduler writes on a pod no node fits: `PodScheduled=False/Unschedulable`
        with its message, phase Pending; written once."""
        conditions = (pod.get("status") or {}).get("conditions") or []
        if any(c.get("type") == "PodScheduled" for c in conditions):
            return
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastTransitionTime": rfc3339(),
        }
        status = {"phase": "Pending", "conditions": [condition]}
        ops = [{"op": "add", "path": "/status", "value": status}]
        with suppress(ApiError):
            self._api.json_patch("pods", self._namespace, pod_name(pod), ops)

    def _bind_and_start(self, pod: dict[str, Any]) -> None:
        ops = [{"op": "add", "path": "/spec/nodeName", "value": f"standin-node-{pod_name(pod)}"}]
        with suppress(ApiError):
            self._api.json_patch("pods", self._namespace, pod_name(pod), ops)
        uid = pod["metadata"]["uid"]
        if uid not in self._starting:
            self._starting[uid] = asyncio.create_task(self._start(pod_name(pod), uid))

    async def _start(self, name: str, uid: str) -> None:
        await asyncio.sleep(self._start_delay)
        pod = self._api.get("pods", self._namespace, name)
        if pod is None or pod["metadata"]["uid"] != uid or pod["metadata"].get("deletionTimestamp"):
            return
        if (pod.get("status") or {}).get("phase") not in (None, "Pending"):
            return  # someone (a test) already decided this pod's fate
        ops = [{"op": "add", "path": "/status", "value": _running_status(pod)}]
        running = self._api.json_patch("pods", self._namespace, name, ops)
        self._running[uid] = running
        if self._hooks is not None:
            await self._call_hook(self._hooks.on_running, running)

    async def _finish_termination(self, pod: dict[str, Any]) -> None:
        with suppress(NotFound):
            self._api.delete("pods", self._namespace, pod_name(pod), grace_period_seconds=0)
        uid = pod["metadata"]["uid"]
        task = self._starting.pop(uid, None)
        if task is not None:
            task.cancel()
        self._running.pop(uid, None)
        await self._report_gone(pod)

    async def _report_gone(self, pod: dict[str, Any]) -> None:
        if self._hooks is not None:
            await self._call_hook(self._hooks.on_deleted, pod)

    async def _call_hook(self, hook: Any, pod: dict[str, Any]) -> None:
        try:
            await hook(pod)
        except Exception:  # a failing demo hook must not stop the kubelet
            log.exception("standin_kubelet_hook_failed", pod=pod_name(pod))

    # -- for the demo ------------------------------------------------------------------------

    def slice_of(self, pod: dict[str, Any]) -> PodSlice | None:
        """The slice a worker pod belongs to, from KubeRay's labels or the legacy label + env."""
        labels = pod_labels(pod)
        cluster = self._api.get("rayclusters", self._namespace, self._cluster_name)
        groups = (cluster or {}).get("spec", {}).get("workerGroupSpecs") or []
        group = next((g for g in groups if g.get("groupName") == labels.get(GROUP_LABEL)), None)
        if group is None or labels.get(NODE_TYPE_LABEL) != "worker":
            return None
        if REPLICA_NAME_LABEL in labels or not labels.get(LEGACY_REPLICA_INDEX):
            replica = labels.get(REPLICA_NAME_LABEL)
            index, host = (
                _int_or_none(labels.get(REPLICA_INDEX_LABEL)),
                _int_or_none(labels.get(HOST_INDEX_LABEL)),
            )
        else:
            replica = labels[LEGACY_REPLICA_INDEX]
            index = _int_or_none(replica.rsplit("-", 1)[1])
            containers = pod["spec"]["containers"]
            host = _int_or_none(resolve_env(pod, containers[0]).get("TPU_WORKER_ID"))
        return PodSlice(str(group["groupName"]), replica, index, host, num_of_hosts(group), group)


def _int_or_none(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


def _owner_uid(pod: dict[str, Any]) -> str | None:
    for ref in pod["metadata"].get("ownerReferences") or []:
        if ref.get("kind") == "RayCluster" and ref.get("controller"):
            return str(ref.get("uid"))
    return None


def _running_status(pod: dict[str, Any]) -> dict[str, Any]:
    now = rfc3339()
    containers = (pod.get("spec") or {}).get("containers") or []
    return {
        "phase": "Running",
        "startTime": now,
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
        # The kubelet does not promise the spec's order: list the Ray container last.
        "containerStatuses": [
            {
                "name": c.get("name"),
                "image": c.get("image", ""),
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": now}},
            }
            for c in reversed(containers)
        ],
    }


def _status_summary(cluster: dict[str, Any], pods: list[dict[str, Any]]) -> dict[str, Any]:
    groups = [
        g for g in (cluster.get("spec") or {}).get("workerGroupSpecs") or [] if isinstance(g, dict)
    ]
    workers = [p for p in pods if pod_labels(p).get(NODE_TYPE_LABEL) == "worker"]
    running = [
        p
        for p in workers
        if (p.get("status") or {}).get("phase") == "Running"
        and not p["metadata"].get("deletionTimestamp")
    ]
    head_ready = any(
        pod_labels(p).get(NODE_TYPE_LABEL) == "head"
        and (p.get("status") or {}).get("phase") == "Running"
        for p in pods
    )
    return {
        "desiredWorkerReplicas": sum(max(desired_worker_pods(g), 0) for g in groups),
        "availableWorkerReplicas": len(running),
        "readyWorkerReplicas": len(running),
        "state": "ready" if head_ready else "",
        "observedGeneration": cluster["metadata"].get("generation", 1),
    }
