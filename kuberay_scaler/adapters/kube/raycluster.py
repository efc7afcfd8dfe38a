"""The current RayCluster, kept fresh by a watch or, under KubeRay's Role, by GETs.

Mode is chosen once at start from `detect_access`: "watch" when the token may list+watch
rayclusters (an informer with `fieldSelector=metadata.name=<name>`, which a Role limited by
`resourceNames` allows), else "poll": a GET every `refresh_interval` seconds (2.5 s: a user's spec
edit is acted on within seconds) and sooner after pod events (`nudge()` from the pod informer),
never two GETs closer than `min_get_gap`. `PollCadence` is that schedule, a pure function of time.

Whatever the mode, a GET (`refresh()`) or a patch result (`observe()`) can bring a fresher copy;
the view keeps the newest by resourceVersion. resourceVersions are officially opaque, but every
API server stores etcd revisions (decimal integers); if one is not, the latest arrival wins.

Deletion makes `current()` None (writes must stop). A RayCluster seen again with a different UID
sets `uid_changed`: the loop drops its memory of the old one, then clears the event.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import structlog
from kubernetes_asyncio.client import ApiClient

from kuberay_scaler.adapters.kube.informer import (
    CONNECT_RETRY_MAX_S,
    Change,
    Informer,
    Source,
    notify,
)
from kuberay_scaler.adapters.kube.transport import ApiError, NoResponse, Target, request_json
from kuberay_scaler.core import defaults as D
from kuberay_scaler.core.backoff import Backoff
from kuberay_scaler.runtime.metrics import KubeCounters

log = structlog.get_logger(__name__)

Mode = Literal["watch", "poll"]
RawObject = dict[str, Any]
_GET = Target("get", "rayclusters")


@dataclass(frozen=True)
class PollCadence:
    """When poll mode GETs the RayCluster next (times in monotonic seconds, passed in).

    Every `interval_s` after the last GET; a nudge (pod events) brings it to `debounce_s` after
    the first nudge since that GET (a burst folds into one GET), but never closer than
    `min_gap_s` to the last GET: pod churn cannot raise the rate above 1 / `min_gap_s`.
    """

    interval_s: float = D.RAYCLUSTER_POLL_INTERVAL_S
    min_gap_s: float = D.RAYCLUSTER_MIN_GET_GAP_S
    debounce_s: float = D.DEBOUNCE_S

    def next_get(self, last_get: float, nudged_at: float | None) -> float:
        due = last_get + self.interval_s
        if nudged_at is None:
            return due
        return min(due, max(nudged_at + self.debounce_s, last_get + self.min_gap_s))


class RayClusterView:
    """One RayCluster (`namespace`/`name`) as last seen; run `run()` as a task.

    `synced` is False until the first answer (object or 404) and, in poll mode, after a failed
    GET until the next successful one; in watch mode it is the informer's `synced`.
    `on_change()` runs whenever `current()`, the UID or `synced` changes; it must not block.
    """

    def __init__(
        self,
        api: ApiClient,
        *,
        namespace: str,
        name: str,
        mode: Mode,
        refresh_interval: float = D.RAYCLUSTER_POLL_INTERVAL_S,
        debounce: float = D.DEBOUNCE_S,
        min_get_gap: float = D.RAYCLUSTER_MIN_GET_GAP_S,
        silent_timeout: float = D.WATCH_SILENCE_TIMEOUT_S,
        backoff: Backoff | None = None,
        on_change: Callable[[], None] | None = None,
        crd_version: str = D.CRD_VERSION,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        counters: KubeCounters | None = None,
    ) -> None:
        self._api = api
        self._counters = counters or KubeCounters.new()
        self._sleep = sleep
        self.mode: Mode = mode
        self.namespace = namespace
        self.name = name
        self._path = f"{D.rayclusters_path(namespace, crd_version)}/{name}"
        self._cadence = PollCadence(
            interval_s=refresh_interval,
            min_gap_s=min(min_get_gap, refresh_interval),
            debounce_s=debounce,
        )
        self._clock = time.monotonic
        self._nudged_at: float | None = None
        self._backoff = backoff or Backoff()
        self._on_change = on_change
        self._current: RawObject | None = None
        self._last_uid: str | None = None
        self._polled_ok = False
        self._poll_failure: int | None = None
        self._nudged = asyncio.Event()
        self.uid_changed = asyncio.Event()
        self._log = log.bind(raycluster=f"{namespace}/{name}", mode=mode)
        self._informer: Informer | None = None
        if mode == "watch":
            self._informer = Informer(
                api,
                Source.raycluster(namespace, name, crd_version),
                silent_timeout=silent_timeout,
                backoff=self._backoff,
                on_change=self._on_watch_change,
                counters=self._counters,
            )

    def current(self) -> RawObject | None:
        """The RayCluster as last seen, or None (not seen yet, or deleted)."""
        return self._current

    @property
    def uid(self) -> str | None:
        """UID of the RayCluster last seen (kept after deletion, to notice a recreation)."""
        return self._last_uid

    @property
    def synced(self) -> bool:
        if self._informer is not None:
            return self._informer.synced
        return self._polled_ok

    @property
    def failure_status(self) -> int | None:
        """HTTP status of the last failed read, until one succeeds (None: none, or no answer)."""
        if self._informer is not None:
            return self._informer.failure_status
        return self._poll_failure

    def nudge(self) -> None:
        """Something changed (a pod event): GET soon, folding bursts. No-op in watch mode."""
        if self._nudged_at is None:
            self._nudged_at = self._clock()
        self._nudged.set()

    def observe(self, obj: RawObject) -> None:
        """Take a copy fresher than the cache (e.g. the object a successful patch returned)."""
        self._accept(obj)

    async def refresh(self) -> RawObject | None:
        """GET the RayCluster now (both modes; e.g. after a `stale` patch) and return it.

        Raises `ApiError` / `NoResponse` when the GET fails; the view is then unchanged.
        """
        try:
            obj = await request_json(self._api, _GET, "GET", self._path, counters=self._counters)
        except ApiError as error:
            if error.status != 404:
                raise
            self._set_deleted()
            return None
        self._accept(obj)
        return self._current

    async def run(self) -> None:
        """Keep the view fresh until cancelled."""
        if self._informer is not None:
            await self._informer.run()
        else:
            await self._poll()

    # --- poll mode --------------------------------------------------------------------------

    async def _poll(self) -> None:
        while True:
            self._nudged_at = None  # nudges from now on may not be reflected by this GET
            started = self._clock()
            try:
                await self.refresh()
            except (ApiError, NoResponse) as error:
                self._poll_failure = error.status if isinstance(error, ApiError) else None
                self._set_polled_ok(False)
                delay = self._backoff.next_delay()
                if isinstance(error, NoResponse):
                    # Nothing answered (refused, reset, timed out): retry soon, as the informer
                    # does, so a server back from an outage is seen at once.
                    delay = min(delay, CONNECT_RETRY_MAX_S)
                self._log.warning(
                    "raycluster GET failed", error=str(error), delay_s=round(delay, 3)
                )
                await self._sleep(delay)
                continue
            self._backoff.reset()
            self._poll_failure = None
            self._set_polled_ok(True)
            await self._until_next_get(started)

    async def _until_next_get(self, last_get: float) -> None:
        """Sleep until the cadence says GET, re-planning the wake-up on every nudge."""
        while True:
            wait_s = self._cadence.next_get(last_get, self._nudged_at) - self._clock()
            if wait_s <= 0:
                return
            self._nudged.clear()
            try:
                async with asyncio.timeout(wait_s):
                    await self._nudged.wait()
            except TimeoutError:
                return

    def _set_polled_ok(self, ok: bool) -> None:
        if ok != self._polled_ok:
            self._polled_ok = ok
            self._notify()

    # --- watch mode -------------------------------------------------------------------------

    def _on_watch_change(self, changes: Sequence[Change]) -> None:
        for change in changes:
            if change.name != self.name:
                continue
            if change.type == "DELETED":
                self._set_deleted()
            else:
                self._accept(change.object)
        if not changes:
            self._notify()  # the informer's synced flag flipped

    # --- shared -----------------------------------------------------------------------------

    def _accept(self, obj: RawObject) -> None:
        uid = _uid(obj)
        same_cluster = self._current is not None and _uid(self._current) == uid
        if same_cluster and not _newer_or_unknown(obj, self._current):
            return
        if self._last_uid is not None and uid != self._last_uid:
            self._log.warning("raycluster recreated", old_uid=self._last_uid, new_uid=uid)
            self.uid_changed.set()
        elif self._current is None:
            self._log.info("raycluster seen", uid=uid)
        self._last_uid = uid
        self._current = obj
        self._notify()

    def _set_deleted(self) -> None:
        if self._current is None:
            return
        self._log.warning("raycluster deleted: writes stop", uid=self._last_uid)
        self._current = None
        self._notify()

    def _notify(self) -> None:
        notify(self._on_change, self._log, "on_change callback failed")


def _uid(obj: RawObject) -> str | None:
    uid = (obj.get("metadata") or {}).get("uid")
    return str(uid) if uid else None


def _newer_or_unknown(candidate: RawObject, current: RawObject | None) -> bool:
    new = (candidate.get("metadata") or {}).get("resourceVersion")
    old = ((current or {}).get("metadata") or {}).get("resourceVersion")
    if isinstance(new, str) and isinstance(old, str) and new.isdigit() and old.isdigit():
        return int(new) > int(old)
    return True
