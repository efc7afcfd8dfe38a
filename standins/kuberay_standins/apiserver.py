"""A small Kubernetes API server stand-in (loopback HTTP, aiohttp) for contract tests and the demo.

It serves pods, events and KubeRay ``rayclusters`` with the semantics a watch-based client depends
on: one global resourceVersion, list + watch resume, bookmarks, ``timeoutSeconds``, 410 Gone in
both forms, label/field selectors, optimistic concurrency (409), RFC 6902 / merge patches, a
status subresource, schema-ish validation (422), bearer-token auth (401) and RBAC-like rules (403).
``Faults`` injects failures: error replies, delays, dropped / stalled / expired watch streams and a
server that refuses connections.

Fidelity notes (checked against kube-apiserver):
- a JSON patch that does not apply (failed ``test``, ``replace`` of a missing key) answers 422
  ``reason: Invalid`` with message "the server rejected our request due to an error in our
  request" and empty ``details``; a validation 422 instead carries ``details.causes[].field``.
- ``DELETE`` of a pod answers the pod; of a RayCluster or Event a ``Status`` with ``Success``.
- a strategic merge patch is applied as a JSON merge patch (lists are replaced, not merged).
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import copy
import json
import re
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import structlog
import yaml
from aiohttp import web

from kuberay_standins._k8s_errors import (
    AlreadyExists,
    ApiError,
    BadRequest,
    Conflict,
    Gone,
    Invalid,
    NotFound,
    bad_request,
    expired,
    generic_status,
    not_found,
    status_body,
    too_large_resource_version,
)
from kuberay_standins._k8s_rbac import (
    ADMIN_RULES,
    RESTRICTED_RULES,
    SIDECAR_RULES,
    Rule,
    Subject,
    forbidden,
    unauthorized,
)
from kuberay_standins._k8s_resources import (
    BY_STORE,
    EVENTS,
    EVENTS_V1,
    PODS,
    RAYCLUSTERS,
    ResourceType,
)
from kuberay_standins._k8s_store import (
    Listener,
    ObjectStore,
    StoredEvent,
    WriteMode,
    strip_for_list,
)
from kuberay_standins._selectors import Predicate, SelectorError, object_selector

__all__ = [
    "ADMIN_TOKEN",
    "RESTRICTED_TOKEN",
    "SIDECAR_TOKEN",
    "AlreadyExists",
    "ApiError",
    "ApiServerStandIn",
    "BadRequest",
    "Conflict",
    "Faults",
    "Gone",
    "Invalid",
    "NotFound",
    "RecordedRequest",
    "Rule",
    "StoredEvent",
    "Write",
]

log = structlog.get_logger(__name__)

RESTRICTED_TOKEN = "restricted-token"  # KubeRay's autoscaler Role (contract.md §3)
ADMIN_TOKEN = "admin-token"  # everything
SIDECAR_TOKEN = "sidecar-token"  # our minimal sidecar Role

_ROUTES: list[tuple[re.Pattern[str], dict[str, ResourceType]]] = [
    (
        re.compile(
            r"^/api/v1/namespaces/(?P<ns>[^/]+)/(?P<plural>pods|events)"
            r"(?:/(?P<name>[^/]+)(?:/(?P<sub>status|resize))?)?$"
        ),
        {"pods": PODS, "events": EVENTS},
    ),
    (
        re.compile(
            r"^/apis/ray\.io/v1/namespaces/(?P<ns>[^/]+)/(?P<plural>rayclusters)"
            r"(?:/(?P<name>[^/]+)(?:/(?P<sub>status))?)?$"
        ),
        {"rayclusters": RAYCLUSTERS},
    ),
    (
        re.compile(
            r"^/apis/events\.k8s\.io/v1/namespaces/(?P<ns>[^/]+)/(?P<plural>events)"
            r"(?:/(?P<name>[^/]+)(?P<sub>)?)?$"
        ),
        {"events": EVENTS_V1},
    ),
]
_SSAR_PATH = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


@dataclass
class RecordedRequest:
    """One HTTP request as served; ``status`` is 0 while it is still being answered."""

    method: str
    path: str
    query: dict[str, str]
    content_type: str | None
    body: Any
    status: int = 0
    user: str | None = None


@dataclass(frozen=True)
class Write:
    """One committed change and who made it: ``user`` is the authenticated HTTP caller, or
    ``DIRECT_WRITER`` for the store methods (the operator stand-in, tests)."""

    user: str
    event: StoredEvent
    request: str  # "PATCH /apis/... <body>" for HTTP writes, "" for direct ones


DIRECT_WRITER = "<direct>"
WriteListener = Callable[[Write], None]


@dataclass(frozen=True)
class _Route:
    rtype: ResourceType
    namespace: str
    name: str | None
    subresource: str | None

    @property
    def rbac_resource(self) -> str:
        return f"{self.rtype.plural}/{self.subresource}" if self.subresource else self.rtype.plural


def _match_route(path: str) -> _Route | None:
    for pattern, kinds in _ROUTES:
        if match := pattern.match(path):
            return _Route(kinds[match["plural"]], match["ns"], match["name"], match["sub"] or None)
    return None


def _verb(method: str, route: _Route, query: dict[str, str]) -> str:
    if method == "GET" and route.name is None:
        return "watch" if _go_bool(query.get("watch")) else "list"
    verbs = {
        "GET": "get",
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if route.name else "deletecollection",
    }
    return verbs.get(method, method.lower())


def _go_bool(value: str | None) -> bool:
    """Query booleans as Go's strconv.ParseBool reads them (clients send "true" or "True")."""
    return value in ("1", "t", "T", "true", "True", "TRUE")


def _json_response(
    body: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        text=json.dumps(body), status=status, headers=headers, content_type="application/json"
    )


def _error_response(error: ApiError, headers: dict[str, str] | None = None) -> web.Response:
    return _json_response(error.status, error.code, headers)


# -- faults ---------------------------------------------------------------------------------


@dataclass
class _FailRule:
    method: str
    pattern: re.Pattern[str]
    status: int
    remaining: int
    headers: dict[str, str]
    body: dict[str, Any] | None


def _path_matches(pattern: re.Pattern[str], path: str, path_qs: str) -> bool:
    return bool(pattern.search(path) or pattern.search(path_qs))


_ItemKind = Literal["line", "close", "expire"]


@dataclass(eq=False)
class _Watch:
    """One open watch stream: events are filtered here and queued for the HTTP writer."""

    rtype: ResourceType
    namespace: str
    predicate: Predicate
    queue: asyncio.Queue[tuple[_ItemKind, bytes]] = field(default_factory=asyncio.Queue)
    stalled: bool = False
    after_rv: int = 0  # a watch from a future revision starts after that revision

    def _selects(self, obj: dict[str, Any] | None) -> bool:
        if obj is None or (obj.get("metadata") or {}).get("namespace") != self.namespace:
            return False
        return self.predicate(obj)

    def offer(self, event: StoredEvent) -> None:
        if self.stalled or event.store != self.rtype.store or event.rv <= self.after_rv:
            return
        now, before = self._selects(event.obj), self._selects(event.prev)
        kind: str | None = event.type
        if event.type == "MODIFIED" and now != before:
            # A selector watch sees objects enter and leave its set as ADDED / DELETED.
            kind = "ADDED" if now else "DELETED"
        elif event.type == "DELETED":
            kind = "DELETED" if now or before else None
        elif not now:
            kind = None
        if kind is not None:
            self.send_event(kind, event.obj)

    def send_event(self, kind: str, obj: dict[str, Any]) -> None:
        self.queue.put_nowait(("line", _event_line(kind, obj)))

    def end(self, how: _ItemKind) -> None:
        self.queue.put_nowait((how, b""))


def _event_line(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


class Faults:
    """Failure injection for the stand-in. Path regexes are searched in the request path and in
    the path with its query string (so ``watch=true`` can single out watch requests)."""

    def __init__(self, server: ApiServerStandIn) -> None:
        self._server = server
        self._failures: list[_FailRule] = []
        self._delays: list[tuple[re.Pattern[str], float]] = []
        self.refusing = False

    def fail_next(
        self,
        method: str,
        path_regex: str,
        status: int,
        count: int = 1,
        headers: dict[str, str] | None = None,
        body: dict[str, Any] | None = None,
    ) -> None:
        """Answer the next ``count`` matching requests (method "*" = any) with ``status``."""
        self._failures.append(
            _FailRule(
                method.upper(), re.compile(path_regex), status, count, dict(headers or {}), body
            )
        )

    def delay(self, path_regex: str, seconds: float) -> None:
        self._delays.append((re.compile(path_regex), seconds))

    def clear(self) -> None:
        """Forget pending failures and delays (watch states and refusal are left as they are)."""
        self._failures.clear()
        self._delays.clear()

    def drop_watches(self, resource: str | None = None) -> int:
        """End matching open watch streams cleanly; returns how many."""
        return self._server._end_watches(resource, "close")

    def stall_watches(self, resource: str | None = None) -> int:
        """Keep matching streams open but send nothing more on them, not even bookmarks."""
        watches = self._server._open_watches(resource)
        for watch in watches:
            watch.stalled = True
        return len(watches)

    def expire_watches(self, resource: str | None = None) -> int:
        """Send an ERROR event (410 Expired) on matching streams, then close them."""
        return self._server._end_watches(resource, "expire")

    def refuse_connections(self, on: bool) -> None:
        """While on, every connection is closed at once (server down); open ones are cut."""
        self.refusing = on
        if on:
            self._server._cut_connections()

    def take_failure(self, method: str, path: str, path_qs: str) -> _FailRule | None:
        for rule in self._failures:
            if rule.method in ("*", method) and _path_matches(rule.pattern, path, path_qs):
                rule.remaining -= 1
                if rule.remaining <= 0:
                    self._failures.remove(rule)
                return rule
        return None

    def delay_for(self, path: str, path_qs: str) -> float:
        return sum(s for pattern, s in self._delays if _path_matches(pattern, path, path_qs))


class _RefusingProtocol(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.abort() if isinstance(transport, asyncio.Transport) else transport.close()


# -- the server -----------------------------------------------------------------------------


class ApiServerStandIn:
    """API server stand-in. Use the HTTP surface from the code under test and the direct store
    methods (create/get/list/replace/json_patch/delete) from tests and the operator stand-in;
    both produce the same resourceVersions and watch events."""

    def __init__(self, *, history_limit: int = 1000, bookmark_interval: float = 1.0) -> None:
        self._store = ObjectStore(history_limit)
        self._bookmark_interval = bookmark_interval
        self._subjects: dict[str, Subject] = {}
        self._watches: set[_Watch] = set()
        self._runner: web.AppRunner | None = None
        self._server: asyncio.Server | None = None
        self.url = ""
        self.requests: list[RecordedRequest] = []
        self.faults = Faults(self)
        self._write_listeners: list[WriteListener] = []
        self._acting: tuple[str, str] | None = None  # (user, request) of the HTTP write in hand
        self.add_token(ADMIN_TOKEN, ADMIN_RULES, user="kubernetes-admin")
        self.add_token(
            RESTRICTED_TOKEN,
            RESTRICTED_RULES,
            user="system:serviceaccount:default:raycluster-autoscaler",
        )
        self.add_token(
            SIDECAR_TOKEN, SIDECAR_RULES, user="system:serviceaccount:default:kuberay-scaler"
        )
        self._store.subscribe(self._fan_out)
        self._store.subscribe(self._log_write)

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(
            app,
            handle_signals=False,
            access_log=None,
            handler_cancellation=True,
            shutdown_timeout=1.0,
        )
        await self._runner.setup()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._make_protocol, host, port)
        bound_port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://{host}:{bound_port}"
        log.debug("standin_apiserver_started", url=self.url)
        return self.url

    def _make_protocol(self) -> asyncio.BaseProtocol:
        if self.faults.refusing or self._runner is None or self._runner.server is None:
            return _RefusingProtocol()
        return self._runner.server()

    async def stop(self) -> None:
        """Close open watches cleanly, then every connection and the listening socket."""
        self._end_watches(None, "close")
        await asyncio.sleep(0)  # let watch writers send their last chunk
        if self._server is not None:
            self._server.close()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._server is not None:
            with suppress(TimeoutError):
                async with asyncio.timeout(2.0):
                    await self._server.wait_closed()
        self._server = None
        self._runner = None
        log.debug("standin_apiserver_stopped", url=self.url)

    def _cut_connections(self) -> None:
        self._end_watches(None, "close")
        server = self._runner.server if self._runner is not None else None
        for handler in server.connections if server is not None else []:
            handler.force_close()

    # -- identities ------------------------------------------------------------------------

    def add_token(self, token: str, rules: builtins.list[Rule], user: str | None = None) -> None:
        """Accept ``token`` with these rules; replaces an earlier entry for the same token."""
        name = user or f"user-{len(self._subjects)}"
        self._subjects[token] = Subject(name, tuple(rules))

    def user_of(self, token: str) -> str | None:
        """The user name a token authenticates as (what the write log records)."""
        subject = self._subjects.get(token)
        return subject.user if subject is not None else None

    def remove_token(self, token: str) -> None:
        """Stop accepting ``token`` (401 from now on), e.g. to test token rotation."""
        self._subjects.pop(token, None)

    def write_kubeconfig(
        self, path: str | Path, token: str = ADMIN_TOKEN, namespace: str = "default"
    ) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "standin", "cluster": {"server": self.url}}],
            "users": [{"name": "standin-user", "user": {"token": token}}],
            "contexts": [
                {
                    "name": "standin",
                    "context": {
                        "cluster": "standin",
                        "user": "standin-user",
                        "namespace": namespace,
                    },
                }
            ],
            "current-context": "standin",
        }
        target = Path(path)
        target.write_text(yaml.safe_dump(config))
        target.chmod(0o600)

    # -- direct store access (no HTTP, no auth, no faults) -------------------------------

    @property
    def resource_version(self) -> int:
        return self._store.resource_version

    def create(
        self, resource: str, namespace: str, obj: dict[str, Any], *, validate: bool = True
    ) -> dict[str, Any]:
        """Create as an admin would; status is kept as given. ``validate=False`` stores an
        object the real server would reject (to test tolerant parsing)."""
        return copy.deepcopy(
            self._store.create(BY_STORE[resource], namespace, obj, mode="full", check=validate)
        )

    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        obj = self._store.get(BY_STORE[resource].store, namespace, name)
        return copy.deepcopy(obj) if obj is not None else None

    def list(
        self, resource: str, namespace: str, label_selector: str | None = None
    ) -> builtins.list[dict[str, Any]]:
        selects = object_selector(label_selector, None)
        items = self._store.items(BY_STORE[resource].store, namespace)
        return [copy.deepcopy(obj) for obj in items if selects(obj)]

    def replace(
        self, resource: str, namespace: str, obj: dict[str, Any], *, validate: bool = True
    ) -> dict[str, Any]:
        """Full replace (spec, metadata and status). Raises Conflict when ``obj`` carries a
        stale metadata.resourceVersion; without one the write is unconditional."""
        name = str((obj.get("metadata") or {}).get("name", ""))
        rtype = BY_STORE[resource]
        stored = self._store.update(
            rtype, namespace, name, lambda _: copy.deepcopy(obj), mode="full", check=validate
        )
        return copy.deepcopy(stored)

    def json_patch(
        self, resource: str, namespace: str, name: str, ops: builtins.list[dict[str, Any]]
    ) -> dict[str, Any]:
        """RFC 6902 patch of the whole object (status included); Invalid when it does not apply."""
        stored = self._store.json_patch(BY_STORE[resource], namespace, name, ops, mode="full")
        return copy.deepcopy(stored)

    def delete(
        self, resource: str, namespace: str, name: str, *, grace_period_seconds: int | None = None
    ) -> None:
        """Delete; a pod with spec.nodeName and a non-zero grace period only gets a
        deletionTimestamp (the kubelet stand-in finishes it). Raises NotFound."""
        self._store.delete(
            BY_STORE[resource], namespace, name, grace_period_seconds=grace_period_seconds
        )

    def compact(self) -> None:
        """Forget the change history: resuming from any older resourceVersion gets 410."""
        self._store.compact()

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener`` synchronously on every committed change; returns an unsubscribe."""
        return self._store.subscribe(listener)

    def subscribe_writes(self, listener: WriteListener) -> Callable[[], None]:
        """The write log: ``listener`` gets every committed change with its writer, synchronously
        (so it sees the world exactly as the write left it). Returns an unsubscribe."""
        self._write_listeners.append(listener)
        return lambda: self._write_listeners.remove(listener)

    def _log_write(self, event: StoredEvent) -> None:
        user, request = self._acting or (DIRECT_WRITER, "")
        write = Write(user, event, request)
        for listener in list(self._write_listeners):
            listener(write)

    # -- watches ---------------------------------------------------------------------------

    def _fan_out(self, event: StoredEvent) -> None:
        for watch in list(self._watches):
            watch.offer(event)

    def _open_watches(self, resource: str | None) -> builtins.list[_Watch]:
        return [w for w in self._watches if resource in (None, w.rtype.store, w.rtype.plural)]

    def _end_watches(self, resource: str | None, how: _ItemKind) -> int:
        watches = self._open_watches(resource)
        for watch in watches:
            self._watches.discard(watch)
            watch.end(how)
        return len(watches)

    # -- HTTP ------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        record = RecordedRequest(
            request.method,
            request.path,
            dict(request.query),
            request.content_type if raw else None,
            _decode_body(raw),
        )
        self.requests.append(record)
        response = await self._answer(request, record)
        if record.status == 0:
            record.status = response.status
        return response

    async def _answer(self, request: web.Request, record: RecordedRequest) -> web.StreamResponse:
        delay = self.faults.delay_for(request.path, request.path_qs)
        if delay > 0:
            await asyncio.sleep(delay)
        failure = self.faults.take_failure(request.method, request.path, request.path_qs)
        if failure is not None:
            body = failure.body or generic_status(failure.status)
            return _json_response(body, failure.status, failure.headers)
        try:
            subject = self._authenticate(request)
            record.user = subject.user
            return await self._dispatch(request, subject, record)
        except ApiError as error:
            return _error_response(error)

    def _authenticate(self, request: web.Request) -> Subject:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        subject = self._subjects.get(token.strip()) if scheme.lower() == "bearer" else None
        if subject is None:
            raise unauthorized()
        return subject

    async def _dispatch(
        self, request: web.Request, subject: Subject, record: RecordedRequest
    ) -> web.StreamResponse:
        if request.path == _SSAR_PATH and request.method == "POST":
            return _json_response(self._access_review(subject, record.body), 201)
        if request.path in ("/version", "/readyz", "/livez", "/healthz"):
            return _json_response(
                {"gitVersion": "v1.36.0-standin"} if request.path == "/version" else "ok"
            )
        route = _match_route(request.path)
        if route is None:
            raise ApiError(
                status_body(404, "NotFound", "the server could not find the requested resource")
            )
        query = dict(request.query)
        verb = _verb(request.method, route, query)
        if not subject.allows(verb, route.rbac_resource):
            raise forbidden(
                subject,
                verb,
                group=route.rtype.group,
                resource=route.rbac_resource,
                namespace=route.namespace,
                name=route.name,
            )
        if verb == "watch":
            return await self._serve_watch(request, route, query, record)
        self._acting = (subject.user, f"{request.method} {request.path_qs} {record.body!r:.2000}")
        try:
            return self._serve_plain(request, route, query, verb, record.body)
        finally:
            self._acting = None

    def _serve_plain(
        self, request: web.Request, route: _Route, query: dict[str, str], verb: str, body: Any
    ) -> web.Response:
        if verb == "list":
            return _json_response(self._list(route, query))
        if verb == "create" and route.name is None:
            return _json_response(self._create_http(route, _require_object(body)), 201)
        if route.name is None:
            raise ApiError(
                status_body(
                    405,
                    "MethodNotAllowed",
                    "the server does not allow this method on the requested resource",
                )
            )
        if verb == "get":
            return _json_response(self._get_http(route))
        if verb == "update":
            return _json_response(self._update_http(route, _require_object(body)))
        if verb == "patch":
            return _json_response(self._patch_http(route, request.content_type, body))
        if verb == "delete":
            return _json_response(self._delete_http(route, query, body))
        raise ApiError(status_body(405, "MethodNotAllowed", f"{verb} is not supported"))

    # -- plain verbs -------------------------------------------------------------------------

    def _write_mode(self, route: _Route) -> WriteMode:
        return "status" if route.subresource == "status" else "main"

    def _create_http(self, route: _Route, body: dict[str, Any]) -> dict[str, Any]:
        return self._store.create(route.rtype, route.namespace, body, mode="main")

    def _get_http(self, route: _Route) -> dict[str, Any]:
        assert route.name is not None
        obj = self._store.get(route.rtype.store, route.namespace, route.name)
        if obj is None:
            raise not_found(route.rtype.group, route.rtype.plural, route.name)
        return obj

    def _update_http(self, route: _Route, body: dict[str, Any]) -> dict[str, Any]:
        assert route.name is not None
        return self._store.update(
            route.rtype,
            route.namespace,
            route.name,
            lambda _: body,
            mode=self._write_mode(route),
            require_rv=True,
        )

    def _patch_http(self, route: _Route, content_type: str, body: Any) -> dict[str, Any]:
        assert route.name is not None
        mode = self._write_mode(route)
        if content_type == "application/json-patch+json":
            return self._store.json_patch(route.rtype, route.namespace, route.name, body, mode=mode)
        if content_type in (
            "application/merge-patch+json",
            "application/strategic-merge-patch+json",
        ):
            return self._store.merge_patch(
                route.rtype, route.namespace, route.name, body, mode=mode
            )
        raise ApiError(
            status_body(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - "
                f"accepted media types include: application/json-patch+json, "
                f"application/merge-patch+json, "
                f'application/strategic-merge-patch+json; got "{content_type}"',
            )
        )

    def _delete_http(self, route: _Route, query: dict[str, str], body: Any) -> dict[str, Any]:
        assert route.name is not None
        options = body if isinstance(body, dict) else {}
        grace = options.get("gracePeriodSeconds", query.get("gracePeriodSeconds"))
        deleted = self._store.delete(
            route.rtype,
            route.namespace,
            route.name,
            grace_period_seconds=int(grace) if grace is not None else None,
            preconditions=options.get("preconditions"),
        )
        if route.rtype is PODS:
            return deleted
        details = {
            "name": route.name,
            "kind": route.rtype.plural,
            "uid": (deleted.get("metadata") or {}).get("uid"),
        }
        if route.rtype.group:
            details["group"] = route.rtype.group
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": details,
        }

    def _access_review(self, subject: Subject, body: Any) -> dict[str, Any]:
        review = copy.deepcopy(body) if isinstance(body, dict) else {}
        spec = review.get("spec") or {}
        attributes = spec.get("resourceAttributes") or {}
        resource = str(attributes.get("resource", ""))
        if attributes.get("subresource"):
            resource = f"{resource}/{attributes['subresource']}"
        allowed = bool(resource) and subject.allows(str(attributes.get("verb", "")), resource)
        review.setdefault("apiVersion", "authorization.k8s.io/v1")
        review.setdefault("kind", "SelfSubjectAccessReview")
        review.setdefault("metadata", {})
        review["status"] = {"allowed": allowed}
        if allowed:
            review["status"]["reason"] = f'RBAC: allowed for User "{subject.user}"'
        return review

    # -- list ------------------------------------------------------------------------------

    def _list(self, route: _Route, query: dict[str, str]) -> dict[str, Any]:
        predicate = _selector_from(query)
        snapshot_rv, start_after = self._list_revision(query)
        store = route.rtype.store
        if snapshot_rv == self._store.resource_version:
            objects = self._store.items(store, route.namespace)
        else:
            state = self._store.snapshot_at(store, snapshot_rv)
            objects = [state[key] for key in sorted(state) if key[0] == route.namespace]
        selected = [obj for obj in objects if predicate(obj) and _name_of(obj) > start_after]
        limit: int = _int_param(query, "limit") or 0
        page = selected[:limit] if limit > 0 else selected
        metadata: dict[str, Any] = {"resourceVersion": str(snapshot_rv)}
        if len(page) < len(selected):
            metadata["continue"] = _continue_token(snapshot_rv, _name_of(page[-1]))
            metadata["remainingItemCount"] = len(selected) - len(page)
        return {
            "kind": route.rtype.list_kind,
            "apiVersion": route.rtype.api_version,
            "metadata": metadata,
            "items": strip_for_list(route.rtype, page),
        }

    def _list_revision(self, query: dict[str, str]) -> tuple[int, str]:
        """Which revision a list reads (and where a continued list resumes)."""
        current = self._store.resource_version
        token = query.get("continue")
        if token:
            rv, start_after = _parse_continue(token)
            try:
                self._store.ensure_resumable(rv)
            except Gone:
                raise expired(
                    "The provided continue parameter is too old to display a "
                    "consistent list result. You can start a new list without the "
                    "continue parameter."
                ) from None
            return rv, start_after
        rv_text = query.get("resourceVersion", "")
        match = query.get("resourceVersionMatch", "")
        if match and not rv_text:
            raise bad_request(
                "resourceVersionMatch is forbidden unless resourceVersion is provided"
            )
        if rv_text in ("", "0"):
            return current, ""
        requested = _int_param(query, "resourceVersion") or 0
        if requested > current:
            raise too_large_resource_version(requested, current)
        if match == "Exact":
            try:
                self._store.ensure_resumable(requested)
            except Gone:
                raise expired("The resourceVersion for the provided list is too old.") from None
            return requested, ""
        return current, ""

    # -- watch -----------------------------------------------------------------------------

    async def _serve_watch(
        self, request: web.Request, route: _Route, query: dict[str, str], record: RecordedRequest
    ) -> web.StreamResponse:
        watch = _Watch(route.rtype, route.namespace, _selector_from(query))
        gone = self._prime_watch(watch, query)
        if gone is None:
            self._watches.add(watch)
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        try:
            await response.prepare(request)
            record.status = 200
            if gone is not None:
                await response.write(_event_line("ERROR", gone.status))
            else:
                await self._pump(response, watch, route.rtype, query)
            await response.write_eof()
        except ConnectionError:
            pass  # the client went away; nothing left to tell it
        finally:
            self._watches.discard(watch)
        return response

    def _prime_watch(self, watch: _Watch, query: dict[str, str]) -> ApiError | None:
        """Queue what precedes live events: synthetic ADDED for rv unset/"0", else the retained
        history after rv; returns the 410 to send instead when that history is gone."""
        rv_text = query.get("resourceVersion", "")
        if rv_text in ("", "0"):
            for obj in self._store.items(watch.rtype.store, watch.namespace):
                if watch.predicate(obj):
                    watch.send_event("ADDED", obj)
            return None
        rv = _int_param(query, "resourceVersion") or 0
        watch.after_rv = rv
        try:
            backlog = self._store.events_after(watch.rtype.store, rv)
        except Gone as gone:
            return gone
        for event in backlog:
            watch.offer(event)
        return None

    async def _pump(
        self,
        response: web.StreamResponse,
        watch: _Watch,
        rtype: ResourceType,
        query: dict[str, str],
    ) -> None:
        loop = asyncio.get_running_loop()
        timeout = _int_param(query, "timeoutSeconds")
        deadline = loop.time() + timeout if timeout else None
        bookmarks = _go_bool(query.get("allowWatchBookmarks"))
        next_bookmark = loop.time() + self._bookmark_interval
        while True:
            wait = (
                None
                if watch.stalled
                else _seconds_until(loop.time(), deadline, next_bookmark if bookmarks else None)
            )
            try:
                async with asyncio.timeout(wait):
                    kind, line = await watch.queue.get()
            except TimeoutError:
                if deadline is not None and loop.time() >= deadline:
                    return
                if bookmarks and not watch.stalled and loop.time() >= next_bookmark:
                    await response.write(self._bookmark_line(rtype))
                    next_bookmark = loop.time() + self._bookmark_interval
                continue
            if kind == "close":
                return
            if kind == "expire":
                await response.write(
                    _event_line(
                        "ERROR",
                        expired(f"too old resource version: {self._store.history_floor}").status,
                    )
                )
                return
            if not watch.stalled:
                await response.write(line)

    def _bookmark_line(self, rtype: ResourceType) -> bytes:
        # Every event up to the current revision has been offered to this watch already (fan-out
        # is synchronous and the queue is empty when we get here), so this revision is safe.
        bookmark = {
            "kind": rtype.kind,
            "apiVersion": rtype.api_version,
            "metadata": {"resourceVersion": str(self._store.resource_version)},
        }
        return _event_line("BOOKMARK", bookmark)


# -- small helpers --------------------------------------------------------------------------


def _seconds_until(now: float, *moments: float | None) -> float | None:
    """Time to the earliest of ``moments`` (None entries ignored; all None = wait forever)."""
    pending = [m for m in moments if m is not None]
    return max(0.0, min(pending) - now) if pending else None


def _decode_body(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


def _require_object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


def _selector_from(query: dict[str, str]) -> Predicate:
    try:
        return object_selector(query.get("labelSelector"), query.get("fieldSelector"))
    except SelectorError as exc:
        raise bad_request(str(exc)) from None


def _int_param(query: dict[str, str], name: str) -> int | None:
    text = query.get(name)
    if text in (None, ""):
        return None
    try:
        return int(text)
    except ValueError:
        raise bad_request(f"invalid value for {name}: {text!r}") from None


def _name_of(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _continue_token(rv: int, last_name: str) -> str:
    raw = json.dumps({"rv": rv, "start": last_name}).encode()
    return base64.urlsafe_b64encode(raw).decode()


def _parse_continue(token: str) -> tuple[int, str]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        return int(data["rv"]), str(data["start"])
    except (ValueError, KeyError, TypeError):
        raise bad_request("continue key is not valid") from None
