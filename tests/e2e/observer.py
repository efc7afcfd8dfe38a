"""Watches one RayCluster and its pods as admin, keeps caches and judges every version of the
RayCluster the API server hands out with the one invariant checker (tests/invariants.py): whole
slices only, no busy or undrained slice deleted (Ray's node states read from the GCS right after
the change is seen), replicas written within [minReplicas, maxReplicas]. A watch cannot tell
writers apart, so every version is judged and the scale-up rule (which needs the writer) is off.

It also records every BOOKMARK / ERROR line the watches receive, so tests can state what the
real server sends.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
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
from tests.invariants import InvariantChecker, RayView, Write, WriteFeed

PodListener = Callable[[str, Mapping[str, Any]], None]


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
        self.checker = InvariantChecker(daemon=None, track_scale_ups=False)
        self.ray_view: RayView | None = None  # set by the world when Ray runs
        self._feed = WriteFeed(self.checker, self._ray_states)
        self.special_lines: list[dict[str, Any]] = []  # BOOKMARK / ERROR / HTTP_ERROR lines
        self.pod_listeners: list[PodListener] = []
        self.ever_deleted: set[str] = set()  # pod names ever named in workersToDelete
        self._tasks: list[asyncio.Task[None]] = []

    # --- lifecycle ---------------------------------------------------------------------------

    @property
    def violations(self) -> list[str]:
        return [str(v) for v in self.checker.violations]

    async def _ray_states(self) -> Any:
        return await self.ray_view() if self.ray_view is not None else None

    def start(self) -> None:
        self._feed.start()
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
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        with contextlib.suppress(TimeoutError):
            await self._feed.drain(30.0)
        await self._feed.close()

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
            if prev is not None and prev.get("replicas") != group.get("replicas"):
                self.timeline.add(
                    f"raycluster: {name} replicas {prev.get('replicas')} -> {group.get('replicas')}"
                )
            doomed, was = workers_to_delete(group), workers_to_delete(prev)
            if doomed != was:
                self.timeline.add(f"raycluster: {name} workersToDelete = {doomed}")
            self.ever_deleted.update(n for n in doomed if n not in was)
        if before is not None:
            self._feed.offer(Write(before, after, by="(watch)"), dict(self.pods))

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
