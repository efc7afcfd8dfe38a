"""Best-effort core/v1 Events on the RayCluster (`kubectl describe raycluster` shows them).

Only when the token may create events (KubeRay's own Role may not): otherwise, and after a 403,
the recorder only logs, and says so once. Recording never raises: an Event is a courtesy to the
user, never a reason to stop scaling. Identical events within `dedupe_window` seconds are sent
once, so a condition re-detected every loop does not flood the namespace.
"""

from __future__ import annotations

import datetime
import os
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any, Literal

import structlog
from kubernetes_asyncio.client import ApiClient

from kuberay_scaler.adapters.kube.transport import ApiError, NoResponse, Target, request_json
from kuberay_scaler.core.defaults import raycluster_api
from kuberay_scaler.runtime.metrics import KubeCounters

log = structlog.get_logger(__name__)

COMPONENT = "kuberay-scaler"
EventType = Literal["Normal", "Warning"]
_CREATE = Target("create", "events")
_MAX_MESSAGE = 1024  # the API server rejects longer messages


class EventRecorder:
    """Creates Events whose involvedObject is the RayCluster returned by `involved()`.

    `involved` is usually `RayClusterView.current`: no RayCluster (deleted, not seen yet) means
    no Event, since one must name the object's UID.
    """

    def __init__(
        self,
        api: ApiClient,
        *,
        namespace: str,
        enabled: bool,
        involved: Callable[[], dict[str, Any] | None],
        instance: str | None = None,
        dedupe_window: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        counters: KubeCounters | None = None,
    ) -> None:
        self._api = api
        self._counters = counters or KubeCounters.new()
        self._namespace = namespace
        self._path = f"/api/v1/namespaces/{namespace}/events"
        self._enabled = enabled
        self._involved = involved
        self._instance = instance or os.environ.get("HOSTNAME") or socket.gethostname()
        self._dedupe_window = dedupe_window
        self._clock = clock
        self._last_sent: dict[tuple[str, str, str], float] = {}
        if not enabled:
            log.info("kubernetes events disabled (no 'create events' permission): logging only")

    @property
    def enabled(self) -> bool:
        return self._enabled

    async def record(self, reason: str, message: str, *, type: EventType = "Normal") -> None:
        """Log the event and, when allowed, create it on the RayCluster. Never raises."""
        log.info("event", reason=reason, message=message, type=type)
        if not self._enabled or self._is_duplicate(reason, message, type):
            return
        cluster = self._involved()
        if cluster is None:
            return
        try:
            await request_json(
                self._api,
                _CREATE,
                "POST",
                self._path,
                body=self._event(cluster, reason, message, type),
                counters=self._counters,
            )
        except ApiError as error:
            self._on_api_error(error)
        except NoResponse as error:
            log.warning("event not recorded", reason=reason, error=str(error))
        except Exception:  # recording must never break the caller
            log.exception("event not recorded", reason=reason)

    def _is_duplicate(self, reason: str, message: str, type: str) -> bool:
        now = self._clock()
        key = (reason, message, type)
        last = self._last_sent.get(key)
        if last is not None and now - last < self._dedupe_window:
            return True
        self._last_sent = {
            k: t for k, t in self._last_sent.items() if now - t < self._dedupe_window
        }
        self._last_sent[key] = now
        return False

    def _on_api_error(self, error: ApiError) -> None:
        if error.status == 403:
            self._enabled = False
            log.warning("kubernetes events disabled after 403: logging only", error=str(error))
        else:
            log.warning("event not recorded", error=str(error))

    def _event(
        self, cluster: dict[str, Any], reason: str, message: str, type: str
    ) -> dict[str, Any]:
        metadata = cluster.get("metadata") or {}
        name = str(metadata.get("name") or "raycluster")
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{name}.{uuid.uuid4().hex[:16]}", "namespace": self._namespace},
            "involvedObject": {
                "apiVersion": cluster.get("apiVersion") or raycluster_api(),
                "kind": cluster.get("kind") or "RayCluster",
                "name": name,
                "namespace": self._namespace,
                "uid": metadata.get("uid"),
                "resourceVersion": metadata.get("resourceVersion"),
            },
            "reason": reason,
            "message": message[:_MAX_MESSAGE],
            "type": type,
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self._instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
