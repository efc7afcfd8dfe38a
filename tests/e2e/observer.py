"""Watches one RayCluster and its pods as admin, keeps caches and checks invariants on every
version of the RayCluster the API server hands out:

- `replicas` of every group within [minReplicas, maxReplicas];
- `workersToDelete` never names part of a multi-host slice (every live pod of a touched replica
  must be listed);
- no pod named in `workersToDelete` belongs to a Ray node that is busy at that moment (checked
  against the GCS right after the change is seen).

It also records every BOOKMARK / ERROR line the watches receive, so tests can state what the
real server sends.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tests.e2e.kube import Kube
from tests.e2e.ray_bridge import (
    GROUP,
    NODE_TYPE,
    REPLICA_NAME,
    is_terminating,
    labels_of,
    pod_name,
)

INT32_MAX = 2**31 - 1
PodListener = Callable[[str, Mapping[str, Any]], None]
BusyCheck = Callable[[list[str]], Awaitable[list[str]]]


@dataclass
class Timeline:
    """Timestamped lines of what happened, for assertions and failure reports."""

    started: float = field(default_factory=time.monotonic)
    lines: list[str] = field(default_factory=list)

    def add(self, text: str) -> None:
        self.lines.append(f"{time.monotonic() - self.started:7.2f}s {text}")

    def text(self, last: int = 200) -> str:
        return "\n".join(self.lines[-last:])


def groups_of(raycluster: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    spec = (raycluster or {}).get("spec") or {}
    return [g for g in spec.get("workerGroupSpecs") or [] if isinstance(g, dict)]


def group_named(raycluster: Mapping[str, Any] | None, name: str) -> dict[str, Any] | None:
    return next((g for g in groups_of(raycluster) if g.get("groupName") == name), None)


def workers_to_delete(group: Mapping[str, Any] | None) -> list[str]:
    return list(((group or {}).get("scaleStrategy") or {}).get("workersToDelete") or [])


class Observer:
    def __init__(self, admin: Kube, namespace: str, cluster: str, timeline: Timeline) -> None:
        self._admin = admin
        self.namespace = namespace
        self.cluster = cluster
        self.timeline = timeline
        self.pods: dict[str, dict[str, Any]] = {}
        self.raycluster: dict[str, Any] | None = None
        self.versions: list[dict[str, Any]] = []
        self.violations: list[str] = []
        self.special_lines: list[dict[str, Any]] = []  # BOOKMARK / ERROR / HTTP_ERROR lines
        self.pod_listeners: list[PodListener] = []
        self.busy_check: BusyCheck | None = None
        self.ever_deleted: set[str] = set()  # pod names ever named in workersToDelete
        self._tasks: list[asyncio.Task[None]] = []
        self._checks: set[asyncio.Task[None]] = set()

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        pods = f"/api/v1/namespaces/{self.namespace}/pods"
        clusters = f"/apis/ray.io/v1/namespaces/{self.namespace}/rayclusters"
        self._tasks = [
            loop.create_task(self._follow("pods", pods, f"ray.io/cluster={self.cluster}", "")),
            loop.create_task(
                self._follow("rayclusters", clusters, "", f"metadata.name={self.cluster}")
            ),
        ]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in [*self._tasks, *self._checks]:
            with contextlib.suppress(BaseException):
                await task

    # --- list + watch ------------------------------------------------------------------------

    async def _follow(self, kind: str, path: str, labels: str, fields: str) -> None:
        selectors = {k: v for k, v in (("labelSelector", labels), ("fieldSelector", fields)) if v}
        rv: str | None = None
        while True:
            try:
                if rv is None:
                    rv = await self._relist(kind, path, selectors)
                rv = await self._watch_once(kind, path, {**selectors, "resourceVersion": rv})
            except asyncio.CancelledError:
                raise
            except Exception as error:  # the observer must outlive a hiccup; say so
                self.timeline.add(f"observer: {kind} watch failed ({error!r}); relisting")
                rv = None
                await asyncio.sleep(0.5)

    async def _relist(self, kind: str, path: str, selectors: Mapping[str, str]) -> str:
        answer = await self._admin.ok("GET", path, query=selectors)
        items = {pod_name(i): i for i in answer.get("items") or []}
        if kind == "pods":
            for name in set(self.pods) - set(items):
                self._pod_event("DELETED", self.pods[name])
            for item in items.values():
                self._pod_event("ADDED" if pod_name(item) not in self.pods else "MODIFIED", item)
        else:
            for item in items.values():
                self._raycluster_event("MODIFIED", item)
        return str(answer["metadata"]["resourceVersion"])

    async def _watch_once(self, kind: str, path: str, query: Mapping[str, str]) -> str | None:
        """One watch stream; returns the resourceVersion to resume from (None: relist)."""
        rv: str | None = query["resourceVersion"]
        params = {**query, "allowWatchBookmarks": "true", "timeoutSeconds": "240"}
        async for event in self._admin.watch(path, params):
            kind_of_line = event["type"]
            obj = event["object"]
            if kind_of_line in ("BOOKMARK", "ERROR", "HTTP_ERROR"):
                self.special_lines.append({"resource": kind, **event})
            if kind_of_line in ("ERROR", "HTTP_ERROR"):
                self.timeline.add(f"observer: {kind} watch {kind_of_line} {obj.get('code')}")
                return None
            rv = str(obj["metadata"]["resourceVersion"])
            if kind_of_line == "BOOKMARK":
                continue
            if kind == "pods":
                self._pod_event(kind_of_line, obj)
            else:
                self._raycluster_event(kind_of_line, obj)
        return rv

    # --- pods --------------------------------------------------------------------------------

    def _pod_event(self, kind: str, pod: dict[str, Any]) -> None:
        name = pod_name(pod)
        before = self.pods.get(name)
        if kind == "DELETED":
            self.pods.pop(name, None)
        else:
            self.pods[name] = pod
        self._note_pod(kind, before, pod)
        for listener in self.pod_listeners:
            listener(kind, pod)

    def _note_pod(
        self, kind: str, before: Mapping[str, Any] | None, pod: Mapping[str, Any]
    ) -> None:
        labels = labels_of(pod)
        where = labels.get(GROUP, "?")
        if labels.get(REPLICA_NAME):
            where += f" slice {labels[REPLICA_NAME]} host {labels.get('ray.io/replica-host-index')}"
        phase = (pod.get("status") or {}).get("phase")
        old_phase = ((before or {}).get("status") or {}).get("phase")
        if kind == "ADDED" and before is None:
            self.timeline.add(f"pod {pod_name(pod)} created ({where})")
        elif kind == "DELETED":
            self.timeline.add(f"pod {pod_name(pod)} deleted ({where})")
        elif is_terminating(pod) and not is_terminating(before or {}):
            self.timeline.add(f"pod {pod_name(pod)} terminating ({where})")
        elif phase != old_phase:
            self.timeline.add(f"pod {pod_name(pod)} {phase} ({where})")

    def worker_pods(self, group: str | None = None, *, live: bool = True) -> list[dict[str, Any]]:
        """Worker pods of the cluster (of `group`), without terminating ones when `live`."""
        return [
            p
            for p in self.pods.values()
            if labels_of(p).get(NODE_TYPE) == "worker"
            and (group is None or labels_of(p).get(GROUP) == group)
            and not (live and is_terminating(p))
        ]

    def slices(self, group: str) -> dict[str, list[dict[str, Any]]]:
        """Live worker pods of `group` by replica name."""
        by_replica: dict[str, list[dict[str, Any]]] = {}
        for pod in self.worker_pods(group):
            by_replica.setdefault(labels_of(pod).get(REPLICA_NAME, ""), []).append(pod)
        return by_replica

    def head_pod(self) -> dict[str, Any] | None:
        return next((p for p in self.pods.values() if labels_of(p).get(NODE_TYPE) == "head"), None)

    # --- RayCluster --------------------------------------------------------------------------

    def _raycluster_event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            self.raycluster = None
            self.timeline.add("raycluster deleted")
            return
        before = self.raycluster
        if before is not None and _rv(obj) <= _rv(before):
            return  # a relist can replay the version we have
        self.raycluster = obj
        self.versions.append(obj)
        self._check_version(before, obj)

    def _check_version(self, before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> None:
        for group in groups_of(after):
            name = str(group.get("groupName"))
            prev = group_named(before, name)
            self._check_bounds(name, group)
            if prev is not None and prev.get("replicas") != group.get("replicas"):
                self.timeline.add(
                    f"raycluster: {name} replicas {prev.get('replicas')} -> {group.get('replicas')}"
                )
            doomed, was = workers_to_delete(group), workers_to_delete(prev)
            if doomed != was:
                self.timeline.add(f"raycluster: {name} workersToDelete = {doomed}")
            fresh = [n for n in doomed if n not in was]
            if fresh:
                self.ever_deleted.update(fresh)
                self._check_whole_slices(name, group, doomed)
                self._check_not_busy(name, self._in_complete_slices(group, fresh))

    def _check_bounds(self, name: str, group: Mapping[str, Any]) -> None:
        replicas = group.get("replicas")
        low = group.get("minReplicas", 0)
        high = group.get("maxReplicas", INT32_MAX)
        if isinstance(replicas, int) and not low <= replicas <= high:
            self.violations.append(f"{name}: replicas {replicas} outside [{low}, {high}]")

    def _check_whole_slices(self, name: str, group: Mapping[str, Any], doomed: list[str]) -> None:
        if int(group.get("numOfHosts") or 1) <= 1:
            return
        slices = self.slices(name)
        touched = {labels_of(self.pods[n]).get(REPLICA_NAME, "") for n in doomed if n in self.pods}
        for replica in touched:
            left_out = sorted(
                pod_name(p) for p in slices.get(replica, []) if pod_name(p) not in doomed
            )
            if left_out:
                self.violations.append(
                    f"{name}: partial slice {replica} in workersToDelete, left out {left_out}"
                )

    def _in_complete_slices(self, group: Mapping[str, Any], names: list[str]) -> list[str]:
        """The names whose slice is complete (all hosts' pods exist, terminating or not): a
        broken slice (a host pod gone) is replaced whole, busy or not, by the operator too."""
        hosts = int(group.get("numOfHosts") or 1)
        members: dict[str, int] = {}
        for pod in self.pods.values():
            replica = labels_of(pod).get(REPLICA_NAME)
            if replica:
                members[replica] = members.get(replica, 0) + 1
        return [
            n
            for n in names
            if n in self.pods
            and (
                hosts <= 1 or members.get(labels_of(self.pods[n]).get(REPLICA_NAME, ""), 0) == hosts
            )
        ]

    def _check_not_busy(self, name: str, fresh: list[str]) -> None:
        if self.busy_check is None or not fresh:
            return
        check = self.busy_check

        async def run() -> None:
            busy = await check(fresh)
            if busy:
                self.violations.append(f"{name}: busy Ray nodes named in workersToDelete: {busy}")

        task = asyncio.get_running_loop().create_task(run())
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    def replicas_seen(self, group: str) -> list[int]:
        """Every distinct `replicas` value of `group`, in the order the versions came."""
        seen: list[int] = []
        for version in self.versions:
            value = (group_named(version, group) or {}).get("replicas")
            if isinstance(value, int) and (not seen or seen[-1] != value):
                seen.append(value)
        return seen


def _rv(obj: Mapping[str, Any]) -> int:
    return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
