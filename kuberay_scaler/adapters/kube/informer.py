"""Generic list-then-watch cache of one kind of object in one namespace (client-go's Reflector).

List (paged), then watch from the list's resourceVersion with bookmarks. A clean end of the stream
re-watches from the last seen resourceVersion; 410 Gone (HTTP or an ERROR event) relists and
replaces the store, synthesizing DELETED changes for objects that vanished meanwhile. Relists are
spaced like client-go's: at once when the last one is more than `RELIST_RESET_AFTER_S` old, else
after a jittered backoff of at least 0.8 s that doubles up to 30 s, whatever the watch delivered
in between (a watch that sees one event and then 410 must not be relisted in a tight loop). A
stream silent for `silent_timeout` is treated as dead and re-opened. A server that gives no
answer (connection refused or reset, timeout) is retried at most `CONNECT_RETRY_MAX_S` apart, so
the cache is synced within seconds of the server's return however long it was down; an HTTP
error (5xx, 403, 429) backs off (jittered, exponential, capped at 30 s) and retries.

The store maps `metadata.name` to the raw object. Objects with `deletionTimestamp` stay in it:
deciding what a terminating pod means is the model's job, not the cache's.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

import aiohttp
import structlog
from kubernetes_asyncio.client import ApiClient

from kuberay_scaler.adapters.kube.transport import (
    ApiError,
    NoResponse,
    Target,
    open_stream,
    request_json,
)
from kuberay_scaler.core.backoff import Backoff
from kuberay_scaler.core.defaults import CRD_VERSION, WATCH_SILENCE_TIMEOUT_S, rayclusters_path
from kuberay_scaler.core.model.labels import LABEL_CLUSTER
from kuberay_scaler.runtime.metrics import KubeCounters

log = structlog.get_logger(__name__)

# client-go's reflector: relists back off from 0.8 s up to 30 s, and the backoff is forgotten
# after two minutes without one. Jitter is in [0.5, 1], hence the 1.6 s first step.
RELIST_BACKOFF = (1.6, 30.0)
RELIST_RESET_AFTER_S = 120.0
# A watch open this long before its 410 ends a storm: the relist backoff is forgotten too (a
# burst of 410s must not leave the next, lone one waiting up to 30 s, the cache unsynced).
RELIST_CALM_S = 10.0
# A refused connection costs the server nothing: retry it soon, so a restart is seen at once.
CONNECT_RETRY_MAX_S = 2.0

ChangeType = Literal["ADDED", "MODIFIED", "DELETED"]
RawObject = dict[str, Any]


def notify(on_change: Callable[..., None] | None, logger: Any, failed: str, *args: object) -> None:
    """Call a consumer's callback, if any: its bug is logged (`failed`), never lets it stop the
    watch or view that calls it."""
    if on_change is None:
        return
    try:
        on_change(*args)
    except Exception:
        logger.exception(failed)


@dataclass(frozen=True)
class Source:
    """What to list and watch: a collection path plus optional selectors.

    `resource` is the plural name used in metrics and messages (`pods`, `rayclusters`).
    """

    resource: str
    path: str
    label_selector: str | None = None
    field_selector: str | None = None

    @classmethod
    def pods(cls, namespace: str, cluster_name: str) -> Source:
        """The Ray pods of one cluster (KubeRay labels every one with `ray.io/cluster`)."""
        return cls(
            resource="pods",
            path=f"/api/v1/namespaces/{namespace}/pods",
            label_selector=f"{LABEL_CLUSTER}={cluster_name}",
        )

    @classmethod
    def raycluster(cls, namespace: str, name: str, crd_version: str = CRD_VERSION) -> Source:
        """A single RayCluster, by field selector (needs list+watch on rayclusters)."""
        return cls(
            resource="rayclusters",
            path=rayclusters_path(namespace, crd_version),
            field_selector=f"metadata.name={name}",
        )

    def selectors(self) -> dict[str, str]:
        query: dict[str, str] = {}
        if self.label_selector:
            query["labelSelector"] = self.label_selector
        if self.field_selector:
            query["fieldSelector"] = self.field_selector
        return query


@dataclass(frozen=True)
class Change:
    """One applied change. `synthesized` marks a DELETED inferred from a relist."""

    type: ChangeType
    name: str
    object: RawObject
    synthesized: bool = False


class Gone(Exception):
    """The resourceVersion we resume from is too old (HTTP 410 or an ERROR event with 410)."""


class BrokenStream(Exception):
    """The watch stream said something we cannot continue from (ERROR event, bad JSON)."""


OnChange = Callable[[Sequence[Change]], None]


class Informer:
    """Keeps `store` equal to the server's objects selected by `source`.

    `synced` is False until the first list completes, and again from the moment continuity with
    the server is lost until it is restored: after a 410 Gone until the relist replaces the store,
    and after a failed request (server down, 5xx, 403, timeout) until a watch is re-opened from
    the last resourceVersion or a relist succeeds. A clean end or a silent stream that re-watches
    at once keeps `synced` True: resuming from the last resourceVersion loses nothing.

    `silent_timeout` bounds the wait for any line (event or bookmark); `watch_timeout` asks the
    server to end each watch after 1-2x that many seconds (spreading reconnects, as client-go
    does); `connect_timeout` bounds opening a watch. Lists use the client's request timeout.

    `transform(obj)`, when given, is applied to every listed or watched object before it is
    stored (client-go's TransformFunc): keep only the fields the consumer reads. It must keep
    `metadata.name` and `metadata.resourceVersion` and return a new object.

    `on_change(changes)` runs after every applied batch: one watch event, or one relist (its diff,
    possibly empty), and whenever `synced` flips; it must not block.
    """

    def __init__(
        self,
        api: ApiClient,
        source: Source,
        *,
        silent_timeout: float = WATCH_SILENCE_TIMEOUT_S,
        watch_timeout: float = 300.0,
        page_size: int = 500,
        connect_timeout: float = 10.0,
        backoff: Backoff | None = None,
        relist_backoff: Backoff | None = None,
        on_change: OnChange | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        transform: Callable[[RawObject], RawObject] | None = None,
        counters: KubeCounters | None = None,
    ) -> None:
        self._api = api
        self._counters = counters or KubeCounters.new()
        self.source = source
        self._silent_timeout = silent_timeout
        self._watch_timeout = watch_timeout
        self._page_size = page_size
        self._connect_timeout = connect_timeout
        self._backoff = backoff or Backoff()
        self._relist_backoff = relist_backoff or Backoff(*RELIST_BACKOFF)
        self._last_relist_at: float | None = None
        self._sleep = sleep
        self._clock = clock
        self._on_change = on_change
        self._transform = transform
        self._store: dict[str, RawObject] = {}
        self._resource_version: str | None = None
        self._synced = False
        self._synced_event = asyncio.Event()
        # HTTP status of the last failed request, until a list or watch succeeds again (None:
        # no failure, or no answer at all: a server that is down has no status).
        self.failure_status: int | None = None
        self._log = log.bind(resource=source.resource)

    @property
    def store(self) -> Mapping[str, RawObject]:
        """Read-only view of the cache: name -> raw object (shared, never mutate one)."""
        return MappingProxyType(self._store)

    @property
    def synced(self) -> bool:
        return self._synced

    @property
    def resource_version(self) -> str | None:
        """Last resourceVersion seen (list, event or bookmark); None means "relist next"."""
        return self._resource_version

    async def wait_synced(self) -> None:
        """Return once the store is synced (at once if it already is)."""
        await self._synced_event.wait()

    async def run(self) -> None:
        """List and watch until cancelled. Never raises on API trouble; it backs off instead."""
        while True:
            watch_opened_at: float | None = None
            try:
                if self._resource_version is None:
                    await self._relist()
                watch_opened_at = self._clock()
                await self._watch()
            except Gone:
                self._restart("gone")
                self._resource_version = None
                self._set_synced(False)
                await self._before_relist(calm_since=watch_opened_at)
            except NoResponse as error:
                self.failure_status = None  # no answer at all: down, not "not served"
                self._restart("error")
                self._set_synced(False)
                await self._sleep_backoff(error, cap=CONNECT_RETRY_MAX_S)
            except (ApiError, BrokenStream) as error:
                self.failure_status = error.status if isinstance(error, ApiError) else None
                self._restart("error")
                self._set_synced(False)
                await self._sleep_backoff(error)

    # --- list -------------------------------------------------------------------------------

    async def _before_relist(self, calm_since: float | None) -> None:
        """Relist at once when the last list is old, or the watch that ended ran calmly for
        RELIST_CALM_S (`calm_since`: when it opened); else wait, longer each time."""
        last, now = self._last_relist_at, self._clock()
        calm = calm_since is not None and now - calm_since >= RELIST_CALM_S
        if last is None or now - last >= RELIST_RESET_AFTER_S or calm:
            self._relist_backoff.reset()
            return
        delay = self._relist_backoff.next_delay()
        self._log.warning(
            "relist after backoff: the last list was less than 2 minutes ago",
            delay_s=round(delay, 3),
            relists=self._relist_backoff.failures,
        )
        await self._sleep(delay)

    async def _relist(self) -> None:
        items, resource_version = await self._list_all()
        fresh = {_name(obj): obj for obj in items}
        changes = _diff(self._store, fresh)
        # In place, so a `store` view taken earlier sees the replacement too.
        self._store.clear()
        self._store.update(fresh)
        self._resource_version = resource_version
        self.failure_status = None
        self._last_relist_at = self._clock()
        self._backoff.reset()
        self._log.info("listed", objects=len(fresh), changes=len(changes), rv=resource_version)
        self._synced = True
        self._synced_event.set()
        self._notify(changes)

    async def _list_all(self) -> tuple[list[RawObject], str]:
        target = Target("list", self.source.resource)
        items: list[RawObject] = []
        query = {**self.source.selectors(), "limit": str(self._page_size)}
        while True:
            try:
                page = await request_json(
                    self._api, target, "GET", self.source.path, query=query, counters=self._counters
                )
            except ApiError as error:
                if error.status == 410 and "continue" in query:
                    # The paging snapshot expired: start the list over.
                    return await self._list_all()
                raise
            # Transformed page by page: the full objects of one page at a time, never of all
            # (10k full pods held until the last page arrived were 220 MB of peak RSS).
            metadata = page.get("metadata") or {}
            page_items = page.get("items") or []
            if self._transform is not None:
                page_items = [self._transform(obj) for obj in page_items]
            items.extend(page_items)
            del page, page_items
            token = metadata.get("continue")
            if not token:
                return items, str(metadata.get("resourceVersion") or "")
            query = {**query, "continue": str(token)}

    # --- watch ------------------------------------------------------------------------------

    async def _watch(self) -> None:
        query = {
            **self.source.selectors(),
            "watch": "true",
            "allowWatchBookmarks": "true",
            "resourceVersion": self._resource_version or "",
            "timeoutSeconds": str(int(self._watch_timeout * random.uniform(1.0, 2.0))),
        }
        target = Target("watch", self.source.resource)
        try:
            async with open_stream(
                self._api,
                target,
                self.source.path,
                query,
                counters=self._counters,
                connect_timeout=self._connect_timeout,
            ) as stream:
                self.failure_status = None
                self._set_synced(True)
                received = await self._consume(stream)
        except ApiError as error:
            if error.status == 410:
                raise Gone(str(error)) from error
            raise
        except (aiohttp.ClientError, ValueError, TimeoutError) as error:
            # Mid-stream failures (reset, truncated chunk, oversized line).
            raise NoResponse(f"watch {self.source.resource}: {error!r}") from error
        if received == 0:
            # Opened and closed with nothing in between: don't hammer a server doing that.
            await self._sleep_backoff("watch closed without events")

    async def _consume(self, stream: aiohttp.StreamReader) -> int:
        """Apply events until the stream ends cleanly or falls silent; returns events received."""
        received = 0
        while True:
            try:
                async with asyncio.timeout(self._silent_timeout):
                    line = await stream.readline()
            except TimeoutError:
                self._restart("silent")
                self._log.info("watch silent, reconnecting", silent_timeout=self._silent_timeout)
                return received
            if not line:
                self._restart("closed")
                self._log.debug("watch closed by server", rv=self._resource_version)
                return received
            if line.strip():
                received += 1
                self._backoff.reset()
                self._apply(_parse_event(line))

    def _apply(self, event: RawObject) -> None:
        kind = event.get("type")
        obj = event.get("object")
        if not isinstance(obj, dict):
            raise BrokenStream(f"watch event without object: {kind}")
        if kind == "ERROR":
            _raise_for_status(obj)
        self._resource_version = _resource_version(obj) or self._resource_version
        if kind == "BOOKMARK":
            return
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            self._log.warning("unknown watch event type ignored", type=kind)
            return
        if self._transform is not None:
            obj = self._transform(obj)
        name = _name(obj)
        if kind == "DELETED":
            self._store.pop(name, None)
        else:
            self._store[name] = obj
        self._notify([Change(kind, name, obj)])

    # --- helpers ------------------------------------------------------------------------------

    def _set_synced(self, synced: bool) -> None:
        if synced == self._synced:
            return
        self._synced = synced
        if synced:
            self._synced_event.set()
        else:
            self._synced_event.clear()
        self._log.info("cache synced" if synced else "cache not synced")
        self._notify([])

    def _notify(self, changes: Sequence[Change]) -> None:
        notify(self._on_change, self._log, "on_change callback failed", changes)

    def _restart(self, cause: str) -> None:
        self._counters.watch_restart(self.source.resource, cause)

    async def _sleep_backoff(self, reason: object, cap: float | None = None) -> None:
        delay = self._backoff.next_delay()
        if cap is not None:
            delay = min(delay, cap)
        if isinstance(reason, ApiError) and reason.retry_after is not None:
            delay = max(delay, reason.retry_after)  # honoured; capped by the transport
        self._log.warning(
            "watch retry after backoff",
            reason=str(reason),
            delay_s=round(delay, 3),
            failures=self._backoff.failures,
        )
        await self._sleep(delay)


def _parse_event(line: bytes) -> RawObject:
    try:
        event = json.loads(line)
    except ValueError as error:
        raise BrokenStream(f"undecodable watch line: {line[:120]!r}") from error
    if not isinstance(event, dict):
        raise BrokenStream(f"watch line is not an object: {line[:120]!r}")
    return event


def _raise_for_status(status: RawObject) -> None:
    code = status.get("code")
    message = str(status.get("message") or status.get("reason") or "")
    if code == 410 or status.get("reason") in ("Expired", "Gone"):
        raise Gone(message)
    raise BrokenStream(f"watch ERROR {code}: {message}")


def _diff(old: Mapping[str, RawObject], new: Mapping[str, RawObject]) -> list[Change]:
    changes = [
        Change("DELETED", name, obj, synthesized=True)
        for name, obj in old.items()
        if name not in new
    ]
    for name, obj in new.items():
        if name not in old:
            changes.append(Change("ADDED", name, obj))
        elif _resource_version(old[name]) != _resource_version(obj):
            changes.append(Change("MODIFIED", name, obj))
    return changes


def _name(obj: RawObject) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _resource_version(obj: RawObject) -> str | None:
    value = (obj.get("metadata") or {}).get("resourceVersion")
    return str(value) if value else None
