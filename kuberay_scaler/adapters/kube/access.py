"""What our token may do, asked once at start with SelfSubjectAccessReviews.

KubeRay's own autoscaler Role has no list/watch on rayclusters and no Events (contract.md §3),
so those two decide the daemon's modes; the permissions it cannot work without are only
reported (the requests themselves will fail loudly later, with verb and resource named).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import structlog
from kubernetes_asyncio.client import ApiClient

from kuberay_scaler.adapters.kube.transport import ApiError, NoResponse, Target, request_json
from kuberay_scaler.core.backoff import Backoff
from kuberay_scaler.runtime.metrics import KubeCounters

log = structlog.get_logger(__name__)

_SSAR_PATH = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
_SSAR = Target("create", "selfsubjectaccessreviews")


@dataclass(frozen=True)
class Permission:
    """One RBAC check: `verb` on `group`/`resource` (group "" is the core API)."""

    verb: str
    group: str
    resource: str

    def __str__(self) -> str:
        return f"{self.verb} {self.resource}" + (f".{self.group}" if self.group else "")


WATCH_RAYCLUSTERS = (
    Permission("list", "ray.io", "rayclusters"),
    Permission("watch", "ray.io", "rayclusters"),
)
CREATE_EVENTS = (Permission("create", "", "events"),)
# Reading the cluster-autoscaler's and KubeRay's Events (capacity signals): deploy/capacity-events.
READ_EVENTS = (
    Permission("get", "", "events"),
    Permission("list", "", "events"),
    Permission("watch", "", "events"),
)
# Reading GKE's maintenance signals on nodes (cluster-scoped): deploy/node-maintenance.
READ_NODES = (
    Permission("get", "", "nodes"),
    Permission("list", "", "nodes"),
    Permission("watch", "", "nodes"),
)
REQUIRED = (
    Permission("list", "", "pods"),
    Permission("watch", "", "pods"),
    Permission("get", "ray.io", "rayclusters"),
    Permission("patch", "ray.io", "rayclusters"),
)


@dataclass(frozen=True)
class Access:
    """The modes our token allows. `missing` lists required permissions the token lacks."""

    watch_rayclusters: bool
    create_events: bool
    missing: tuple[str, ...] = ()
    read_events: bool = False  # list+watch events: capacity signals from Events
    read_nodes: bool = False  # get/list/watch nodes: GKE maintenance signals

    @property
    def description(self) -> str:
        """One line saying which modes the daemon runs in, and why."""
        raycluster = (
            "RayCluster by watch"
            if self.watch_rayclusters
            else "RayCluster by GET on pod events + periodic refresh (no list/watch rayclusters)"
        )
        events = "Events on" if self.create_events else "Events off (no create events)"
        reading = (
            "capacity Events read"
            if self.read_events
            else "capacity Events not read (no get/list/watch events)"
        )
        nodes = (
            "node maintenance read"
            if self.read_nodes
            else "node maintenance not read (no get/list/watch nodes)"
        )
        missing = f"; MISSING: {', '.join(self.missing)}" if self.missing else ""
        return f"{raycluster}; {events}; {reading}; {nodes}{missing}"


async def detect_access(
    api: ApiClient,
    namespace: str,
    *,
    name: str = "",
    backoff: Backoff | None = None,
    counters: KubeCounters | None = None,
) -> Access:
    """Ask the API server what our token may do in `namespace`; logs the result once.

    Retries (with backoff) while the server is unreachable or answers 5xx, since a guess made
    during an outage would stick for the process's life. If reviews themselves are refused,
    assumes the most restricted mode (poll, no Events), which works under KubeRay's Role.
    RayCluster checks name our RayCluster (`name`): a Role limited by resourceNames allows
    exactly that one, and our list/watch carry fieldSelector metadata.name, authorized so.
    """
    retry = backoff or Backoff()
    counted = counters or KubeCounters.new()
    while True:
        try:
            access = await _review_all(api, namespace, name, counted)
            break
        except ApiError as error:
            if error.status < 500 and error.status != 429:
                access = Access(watch_rayclusters=False, create_events=False)
                log.warning("access reviews refused, assuming restricted mode", error=str(error))
                break
            await _wait(retry, error)
        except NoResponse as error:
            await _wait(retry, error)
    log.info("kubernetes access", mode=access.description)
    return access


async def _review_all(api: ApiClient, namespace: str, name: str, counters: KubeCounters) -> Access:
    checks = (*WATCH_RAYCLUSTERS, *CREATE_EVENTS, *READ_EVENTS, *READ_NODES, *REQUIRED)
    answers = await asyncio.gather(
        *(_allowed(api, namespace, check, name, counters) for check in checks)
    )
    allowed = dict(zip(checks, answers, strict=True))
    return Access(
        watch_rayclusters=all(allowed[p] for p in WATCH_RAYCLUSTERS),
        create_events=all(allowed[p] for p in CREATE_EVENTS),
        read_events=all(allowed[p] for p in READ_EVENTS),
        read_nodes=all(allowed[p] for p in READ_NODES),
        missing=tuple(str(p) for p in REQUIRED if not allowed[p]),
    )


async def _allowed(
    api: ApiClient, namespace: str, permission: Permission, name: str, counters: KubeCounters
) -> bool:
    # Nodes are cluster-scoped: asked without a namespace, as the list itself is authorized (a
    # RoleBinding to a ClusterRole naming nodes would pass a namespaced review, not the list).
    attributes = {
        "namespace": "" if permission.resource == "nodes" else namespace,
        "verb": permission.verb,
        "group": permission.group,
        "resource": permission.resource,
    }
    if name and permission.resource == "rayclusters":
        attributes["name"] = name
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attributes},
    }
    answer = await request_json(api, _SSAR, "POST", _SSAR_PATH, body=review, counters=counters)
    return bool((answer.get("status") or {}).get("allowed"))


async def _wait(backoff: Backoff, error: Exception) -> None:
    delay = backoff.next_delay()
    log.warning("access review failed, retrying", error=str(error), delay_s=round(delay, 3))
    await asyncio.sleep(delay)
