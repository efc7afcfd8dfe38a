"""In-memory object store with etcd-like semantics: one global resourceVersion counter for all
kinds, a bounded history of change events (for watch resume and consistent paged lists), and the
write rules of kube-apiserver (metadata ownership, status subresource, generation, preconditions,
graceful pod deletion). No I/O: the HTTP layer and the direct Python API both call into this.
"""

from __future__ import annotations

import copy
import secrets
import uuid
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import jsonpatch
import jsonpointer

from kuberay_standins._k8s_errors import (
    ApiError,
    FieldCause,
    already_exists,
    bad_request,
    conflict,
    expired,
    invalid,
    not_found,
    patch_not_applied,
)
from kuberay_standins._k8s_resources import PODS, ResourceType, apply_defaults, validate

EventType = Literal["ADDED", "MODIFIED", "DELETED"]
# "main": the object endpoint (status changes ignored where a status subresource exists);
# "status": the /status endpoint (only status changes kept); "full": direct stand-in access.
WriteMode = Literal["main", "status", "full"]
Key = tuple[str, str]  # (namespace, name)

# k8s.io/apimachinery/pkg/util/rand: no vowels, no confusable characters.
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_SYSTEM_METADATA = (
    "name",
    "namespace",
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
)
DEFAULT_POD_GRACE_SECONDS = 30


def random_suffix(length: int = 5) -> str:
    return "".join(secrets.choice(_NAME_ALPHABET) for _ in range(length))


def rfc3339(moment: datetime | None = None) -> str:
    return (moment or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class StoredEvent:
    """One committed change. ``obj`` is the state after it (for DELETED: the last state, with
    the deletion's resourceVersion); ``prev`` the state before (None for ADDED)."""

    rv: int
    store: str
    type: EventType
    obj: dict[str, Any]
    prev: dict[str, Any] | None


Listener = Callable[[StoredEvent], None]


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        meta = {}
        obj["metadata"] = meta
    return meta


def _key(obj: dict[str, Any]) -> Key:
    meta = _meta(obj)
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (also used for strategic merge patches: lists are replaced)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _apply_json_patch(obj: dict[str, Any], ops: Any) -> dict[str, Any]:
    if not isinstance(ops, list) or not all(isinstance(op, dict) for op in ops):
        raise bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    try:
        patched = jsonpatch.apply_patch(obj, ops)
    except (
        jsonpatch.JsonPatchException,
        jsonpointer.JsonPointerException,
        KeyError,
        IndexError,
        TypeError,
    ) as exc:
        raise patch_not_applied() from exc
    if not isinstance(patched, dict):
        raise patch_not_applied()
    return patched


class ObjectStore:
    """All objects of all kinds plus the change history. Objects handed out are never mutated
    afterwards (every write replaces the stored dict), so readers may keep references."""

    def __init__(self, history_limit: int) -> None:
        self.resource_version = 100
        self.history_floor = self.resource_version  # resuming needs rv >= floor
        self._history_limit = max(1, history_limit)
        self._history: deque[StoredEvent] = deque()
        self._objects: dict[str, dict[Key, dict[str, Any]]] = defaultdict(dict)
        self._listeners: list[Listener] = []

    # -- reading -------------------------------------------------------------------------

    def get(self, store: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self._objects[store].get((namespace, name))

    def items(self, store: str, namespace: str | None) -> list[dict[str, Any]]:
        objects = self._objects[store]
        return [obj for (ns, _), obj in sorted(objects.items()) if namespace in (None, ns)]

    def ensure_resumable(self, rv: int) -> None:
        """Raise 410 when the events after ``rv`` are no longer all retained."""
        if rv < self.history_floor:
            raise expired(f"too old resource version: {rv} ({self.history_floor})")

    def events_after(self, store: str, rv: int) -> list[StoredEvent]:
        self.ensure_resumable(rv)
        return [ev for ev in self._history if ev.rv > rv and ev.store == store]

    def snapshot_at(self, store: str, rv: int) -> dict[Key, dict[str, Any]]:
        """The objects of ``store`` as they were right after revision ``rv``."""
        self.ensure_resumable(rv)
        state = dict(self._objects[store])
        for event in reversed(self._history):
            if event.rv <= rv:
                break
            if event.store != store:
                continue
            key = _key(event.obj)
            if event.prev is None:
                state.pop(key, None)
            else:
                state[key] = event.prev
        return state

    # -- bookkeeping ---------------------------------------------------------------------

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def compact(self) -> None:
        self._history.clear()
        self.history_floor = self.resource_version

    def _commit(
        self, store: str, kind: EventType, obj: dict[str, Any], prev: dict[str, Any] | None
    ) -> dict[str, Any]:
        self.resource_version += 1
        _meta(obj)["resourceVersion"] = str(self.resource_version)
        key = _key(obj)
        if kind == "DELETED":
            self._objects[store].pop(key, None)
        else:
            self._objects[store][key] = obj
        event = StoredEvent(self.resource_version, store, kind, obj, prev)
        self._history.append(event)
        while len(self._history) > self._history_limit:
            self.history_floor = self._history.popleft().rv
        for listener in list(self._listeners):
            listener(event)
        return obj

    # -- writing -------------------------------------------------------------------------

    def create(
        self,
        rtype: ResourceType,
        namespace: str,
        body: dict[str, Any],
        *,
        mode: WriteMode,
        check: bool = True,
    ) -> dict[str, Any]:
        obj = copy.deepcopy(body)
        meta = _meta(obj)
        if meta.get("namespace") not in (None, "", namespace):
            raise bad_request(
                "the namespace of the provided object does not match the "
                "namespace sent on the request"
            )
        meta["namespace"] = namespace
        self._assign_name(rtype, namespace, meta)
        if mode == "main":
            self._reset_status_on_create(rtype, obj)
        obj["kind"], obj["apiVersion"] = rtype.kind, rtype.api_version
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=rfc3339(), generation=1)
        meta.pop("resourceVersion", None)
        meta.pop("deletionTimestamp", None)
        self._check(rtype, obj, check)
        if self.get(rtype.store, namespace, meta["name"]) is not None:
            raise already_exists(rtype.group, rtype.plural, meta["name"])
        return self._commit(rtype.store, "ADDED", obj, None)

    def _assign_name(self, rtype: ResourceType, namespace: str, meta: dict[str, Any]) -> None:
        if meta.get("name") or not meta.get("generateName"):
            return
        for _ in range(20):
            candidate = f"{meta['generateName']}{random_suffix()}"
            if self.get(rtype.store, namespace, candidate) is None:
                meta["name"] = candidate
                return
        raise already_exists(rtype.group, rtype.plural, meta["generateName"])

    @staticmethod
    def _reset_status_on_create(rtype: ResourceType, obj: dict[str, Any]) -> None:
        if rtype is PODS:
            obj["status"] = {"phase": "Pending"}
        elif rtype.has_status:
            obj.pop("status", None)

    @staticmethod
    def _check(rtype: ResourceType, obj: dict[str, Any], check: bool) -> None:
        if not check:
            return
        apply_defaults(rtype, obj)
        error = validate(rtype, obj)
        if error is not None:
            raise error

    def update(
        self,
        rtype: ResourceType,
        namespace: str,
        name: str,
        mutate: Callable[[dict[str, Any]], dict[str, Any]],
        *,
        mode: WriteMode,
        require_rv: bool = False,
        check: bool = True,
    ) -> dict[str, Any]:
        """Read-modify-write with kube-apiserver's rules; a no-op write commits nothing."""
        current = self.get(rtype.store, namespace, name)
        if current is None:
            raise not_found(rtype.group, rtype.plural, name)
        proposed = mutate(copy.deepcopy(current))
        if not isinstance(proposed, dict):
            raise bad_request("the request body must be an object")
        self._check_preconditions(rtype, current, proposed, name, require_rv)
        merged = self._merge_for_mode(rtype, current, proposed, mode)
        self._check(rtype, merged, check)
        if merged.get("spec") != current.get("spec"):
            _meta(merged)["generation"] = int(_meta(current).get("generation", 1)) + 1
        _meta(merged)["resourceVersion"] = _meta(current).get("resourceVersion")
        if merged == current:
            return current
        return self._commit(rtype.store, "MODIFIED", merged, current)

    @staticmethod
    def _check_preconditions(
        rtype: ResourceType,
        current: dict[str, Any],
        proposed: dict[str, Any],
        name: str,
        require_rv: bool,
    ) -> None:
        proposed_meta = _meta(proposed)
        if proposed_meta.get("name") not in (None, name):
            raise bad_request(
                f"the name of the object ({proposed_meta.get('name')}) does not "
                f"match the name on the URL ({name})"
            )
        wanted_rv = proposed_meta.get("resourceVersion")
        if wanted_rv in (None, ""):
            if require_rv and not rtype.unconditional_update:
                raise _rv_required(rtype, name)
            return
        if str(wanted_rv) != _meta(current).get("resourceVersion"):
            raise conflict(rtype.group, rtype.plural, name)

    @staticmethod
    def _merge_for_mode(
        rtype: ResourceType, current: dict[str, Any], proposed: dict[str, Any], mode: WriteMode
    ) -> dict[str, Any]:
        if mode == "status":
            merged = copy.deepcopy(current)
            if "status" in proposed:
                merged["status"] = proposed["status"]
            else:
                merged.pop("status", None)
            return merged
        merged = proposed
        if mode == "main" and rtype.has_status:
            if "status" in current:
                merged["status"] = copy.deepcopy(current["status"])
            else:
                merged.pop("status", None)
        meta, old_meta = _meta(merged), _meta(current)
        for field in _SYSTEM_METADATA:
            if field in old_meta:
                meta[field] = old_meta[field]
            else:
                meta.pop(field, None)
        merged["kind"], merged["apiVersion"] = rtype.kind, rtype.api_version
        return merged

    def json_patch(
        self,
        rtype: ResourceType,
        namespace: str,
        name: str,
        ops: Any,
        *,
        mode: WriteMode,
        check: bool = True,
    ) -> dict[str, Any]:
        return self.update(
            rtype, namespace, name, lambda obj: _apply_json_patch(obj, ops), mode=mode, check=check
        )

    def merge_patch(
        self,
        rtype: ResourceType,
        namespace: str,
        name: str,
        patch: Any,
        *,
        mode: WriteMode,
        check: bool = True,
    ) -> dict[str, Any]:
        if not isinstance(patch, dict):
            raise bad_request("a merge patch must be a JSON object")
        return self.update(
            rtype, namespace, name, lambda obj: merge_patch(obj, patch), mode=mode, check=check
        )

    def delete(
        self,
        rtype: ResourceType,
        namespace: str,
        name: str,
        *,
        grace_period_seconds: int | None = None,
        preconditions: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Delete; a scheduled pod with a grace period only gets a deletionTimestamp (the
        kubelet removes it later), everything else goes at once."""
        current = self.get(rtype.store, namespace, name)
        if current is None:
            raise not_found(rtype.group, rtype.plural, name)
        self._check_delete_preconditions(rtype, current, name, preconditions or {})
        grace = self._effective_grace(rtype, current, grace_period_seconds)
        if grace > 0:
            return self._mark_terminating(rtype, current, grace)
        return self._commit(rtype.store, "DELETED", copy.deepcopy(current), current)

    @staticmethod
    def _check_delete_preconditions(
        rtype: ResourceType, current: dict[str, Any], name: str, preconditions: dict[str, Any]
    ) -> None:
        meta = _meta(current)
        for field in ("uid", "resourceVersion"):
            wanted = preconditions.get(field)
            if wanted is not None and str(wanted) != str(meta.get(field)):
                why = (
                    f"Precondition failed: {field.upper() if field == 'uid' else field} in "
                    f"precondition: {wanted}, {field} in object meta: {meta.get(field)}"
                )
                raise conflict(rtype.group, rtype.plural, name, why)

    @staticmethod
    def _effective_grace(
        rtype: ResourceType, current: dict[str, Any], requested: int | None
    ) -> int:
        raw_spec = current.get("spec")
        spec: dict[str, Any] = raw_spec if isinstance(raw_spec, dict) else {}
        if rtype is not PODS or not spec.get("nodeName"):
            return 0  # unscheduled pods and other kinds have nothing to wait for
        if requested is not None:
            return max(0, int(requested))
        configured = spec.get("terminationGracePeriodSeconds")
        return int(configured) if isinstance(configured, int) else DEFAULT_POD_GRACE_SECONDS

    def _mark_terminating(
        self, rtype: ResourceType, current: dict[str, Any], grace: int
    ) -> dict[str, Any]:
        meta = _meta(current)
        existing = meta.get("deletionGracePeriodSeconds")
        if meta.get("deletionTimestamp") and isinstance(existing, int) and existing <= grace:
            return current
        marked = copy.deepcopy(current)
        marked_meta = _meta(marked)
        marked_meta["deletionTimestamp"] = rfc3339(datetime.now(UTC) + timedelta(seconds=grace))
        marked_meta["deletionGracePeriodSeconds"] = grace
        return self._commit(rtype.store, "MODIFIED", marked, current)


def _rv_required(rtype: ResourceType, name: str) -> ApiError:
    cause = FieldCause(
        "metadata.resourceVersion",
        "FieldValueInvalid",
        "Invalid value: 0x0: must be specified for an update",
    )
    return invalid(rtype.group_kind, name, [cause], kind=rtype.kind, group=rtype.group)


def strip_for_list(rtype: ResourceType, items: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """List items of built-in kinds carry no kind/apiVersion on the wire (CR items do)."""
    if rtype.group:
        return list(items)
    return [{k: v for k, v in item.items() if k not in ("kind", "apiVersion")} for item in items]
