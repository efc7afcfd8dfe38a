"""A cluster-autoscaler STAND-IN: it posts the Events the real one posts on pending pods, and
nothing else (it adds no node, runs no simulation). For tests and the e2e world only.

The real cluster-autoscaler (kubernetes/autoscaler) and GKE's build of it post, on a pod the
scheduler marked `PodScheduled=False/Unschedulable`, core/v1 Events from the legacy client-go
recorder with `source.component: cluster-autoscaler` (`utils/kubernetes/factory.go`):

- `TriggeredScaleUp` (Normal), `pod triggered scale-up: [{<group> <cur>-><new> (max: <max>)}]`
  (`processors/status/eventing_scale_up_processor.go`, `nodegroupset.ScaleUpInfo.String`);
- `NotTriggerScaleUp` (Normal), `pod didn't trigger scale-up: <n> <reason>, ...` (same file;
  reasons from `core/scaleup/orchestrator/skippedreasons.go`);
- on GKE, `FailedScaleUp` (Warning), `Node scale up in zones <zones> associated with this pod
  failed: <failure>. Pod is at risk of not being scheduled.` with `<failure>` e.g. `GCE out of
  resources`, `GCE quota exceeded` (GoogleCloudPlatform/cluster-autoscaler
  `pkg/visibility/events/failed_scale_up_event_logger.go`).

docs/capacity-signals.md lists every form with its source. What the stand-in says for a pod is
chosen per TPU type (the pod's `cloud.google.com/gke-tpu-accelerator` nodeSelector), and can be
changed while it runs (`say()`): `stockout` and `quota` post `TriggeredScaleUp` and, a moment
later, the `FailedScaleUp` (as the real one does once the node group's instances fail), then
`NotTriggerScaleUp ... in backoff after failed scale-up`; `no-scale-up` posts `NotTriggerScaleUp`;
`triggered` posts `TriggeredScaleUp` only. Each (pod, reason) is posted once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

import structlog

log = structlog.get_logger(__name__)

COMPONENT = "cluster-autoscaler"
ACCELERATOR = "cloud.google.com/gke-tpu-accelerator"
Mode = Literal["stockout", "quota", "no-scale-up", "triggered"]
FAILURES: dict[str, str] = {"stockout": "GCE out of resources", "quota": "GCE quota exceeded"}


class Reply(Protocol):
    @property
    def status(self) -> int: ...

    @property
    def body(self) -> Any: ...


class Client(Protocol):
    """What the stand-in needs of an API client (tests/e2e/kube.py `Kube` has it)."""

    async def request(
        self, method: str, path: str, body: Any = None, *, query: Mapping[str, str] | None = None
    ) -> Any: ...


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_event(
    pod: Mapping[str, Any], reason: str, message: str, *, type: str = "Normal", at: str = ""
) -> dict[str, Any]:
    """A core/v1 Event about `pod` (a Pod or an involvedObject reference) as the legacy
    recorder writes it: name `<pod>.<hex ns>`, source and reportingComponent the autoscaler."""
    meta = pod.get("metadata") or pod
    when = at or now_rfc3339()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{meta.get('name')}.{time.time_ns():x}",
            "namespace": meta.get("namespace"),
        },
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
        },
        "reason": reason,
        "message": message,
        "type": type,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": "",
        "firstTimestamp": when,
        "lastTimestamp": when,
        "count": 1,
    }


def triggered(
    pod: Mapping[str, Any], group_id: str, current: int, new: int, max_size: int, *, at: str = ""
) -> dict[str, Any]:
    message = f"pod triggered scale-up: [{{{group_id} {current}->{new} (max: {max_size})}}]"
    return pod_event(pod, "TriggeredScaleUp", message, at=at)


def not_triggered(
    pod: Mapping[str, Any], reasons: str = "1 max node group size reached", *, at: str = ""
) -> dict[str, Any]:
    return pod_event(pod, "NotTriggerScaleUp", f"pod didn't trigger scale-up: {reasons}", at=at)


def failed_scale_up(
    pod: Mapping[str, Any], zone: str, failure: str = FAILURES["stockout"], *, at: str = ""
) -> dict[str, Any]:
    message = (
        f"Node scale up in zones {zone} associated with this pod failed: {failure}."
        " Pod is at risk of not being scheduled."
    )
    return pod_event(pod, "FailedScaleUp", message, type="Warning", at=at)


def unschedulable(pod: Mapping[str, Any]) -> bool:
    """Pending, not bound, and the scheduler's `PodScheduled=False/Unschedulable` on it."""
    status = pod.get("status") or {}
    if (pod.get("spec") or {}).get("nodeName") or (pod.get("metadata") or {}).get(
        "deletionTimestamp"
    ):
        return False
    return any(
        c.get("type") == "PodScheduled"
        and c.get("status") == "False"
        and c.get("reason") == "Unschedulable"
        for c in status.get("conditions") or []
    )


def accelerator_of(pod: Mapping[str, Any]) -> str:
    return str(((pod.get("spec") or {}).get("nodeSelector") or {}).get(ACCELERATOR) or "")


class ClusterAutoscalerStandIn:
    """Every `interval_s`, lists the namespace's pods and posts what `modes` say for the
    unschedulable ones (keyed by TPU accelerator; "" for pods without one)."""

    def __init__(
        self,
        client: Client,
        namespace: str,
        modes: Mapping[str, Mode],
        *,
        zone: str = "us-east5-b",
        interval_s: float = 0.5,
        failure_after_s: float = 1.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._namespace = namespace
        self._modes = dict(modes)
        self._zone = zone
        self._interval_s = interval_s
        self._failure_after_s = failure_after_s
        self._clock = clock
        self._posted: set[tuple[str, str]] = set()  # (pod, reason)
        self._triggered_at: dict[str, float] = {}
        self.posted: list[dict[str, Any]] = []  # every Event posted, in order

    def say(self, accelerator: str, mode: Mode | None) -> None:
        """From now on, say `mode` for pods of `accelerator` (None: say nothing)."""
        if mode is None:
            self._modes.pop(accelerator, None)
        else:
            self._modes[accelerator] = mode

    async def run(self) -> None:
        while True:
            try:
                await self.step()
            except (TimeoutError, OSError) as err:  # the server restarting: next loop
                log.warning("ca stand-in: step failed", error=str(err))
            await asyncio.sleep(self._interval_s)

    async def step(self) -> None:
        path = f"/api/v1/namespaces/{self._namespace}/pods"
        reply = await self._client.request(
            "GET", path, query={"fieldSelector": "status.phase=Pending"}
        )
        if reply.status != 200:
            log.warning("ca stand-in: cannot list pods", status=reply.status)
            return
        for pod in reply.body.get("items") or []:
            if unschedulable(pod):
                mode = self._modes.get(accelerator_of(pod))
                if mode is not None:
                    await self._tell(pod, mode)

    async def _tell(self, pod: Mapping[str, Any], mode: Mode) -> None:
        name = str(pod["metadata"]["name"])
        if mode == "no-scale-up":
            await self._post_once(name, not_triggered(pod))
            return
        if (name, "TriggeredScaleUp") not in self._posted:
            self._triggered_at[name] = self._clock()
            await self._post_once(
                name, triggered(pod, f"gke-{accelerator_of(pod)}-pool-grp", 0, 1, 4)
            )
            return
        if mode == "triggered" or self._clock() - self._triggered_at[name] < self._failure_after_s:
            return
        if (name, "FailedScaleUp") not in self._posted:
            await self._post_once(name, failed_scale_up(pod, self._zone, FAILURES[mode]))
            return
        await self._post_once(name, not_triggered(pod, "1 in backoff after failed scale-up"))

    async def _post_once(self, pod_name: str, event: dict[str, Any]) -> None:
        key = (pod_name, event["reason"])
        if key in self._posted:
            return
        path = f"/api/v1/namespaces/{self._namespace}/events"
        reply = await self._client.request("POST", path, event)
        if reply.status not in (200, 201):
            log.warning("ca stand-in: event refused", status=reply.status, reason=event["reason"])
            return
        self._posted.add(key)
        self.posted.append(event)
        log.info(
            "ca stand-in: posted", pod=pod_name, reason=event["reason"], message=event["message"]
        )
