"""JSON-patch the RayCluster and say, in one word, what happened.

Every patch starts with a `test` of `metadata.uid`, so a write meant for one RayCluster can never
land on a namesake created after it was deleted. The outcome kinds and what the caller does:

- `applied`: done; `obj` is the RayCluster as stored after the patch.
- `stale`: 409, or 422 because the patch does not apply (a `test` op failed, or a path is
  missing: the object changed under the plan): refresh, replan, retry a bounded number of times
  (a patch built wrongly for an unchanged object would fail the same way every time).
- `invalid`: any other 422 (or 400): this plan can never apply; logged once with its ops.
- `forbidden`: 403; `message` names verb and resource.
- `throttled`: 429; wait `retry_after` seconds.
- `transient`: 5xx, 401 (token being rotated), timeout, no connection: back off and retry.
- `gone`: 404, the RayCluster no longer exists: stop writing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import structlog
from kubernetes_asyncio.client import ApiClient

from kuberay_scaler.adapters.kube.transport import (
    JSON_PATCH,
    ApiError,
    NoResponse,
    Target,
    request_json,
)
from kuberay_scaler.core.defaults import CRD_VERSION, rayclusters_path
from kuberay_scaler.core.model.outcome import OutcomeKind, PatchOutcome
from kuberay_scaler.core.patch.ops import Op, Test, ops_json
from kuberay_scaler.runtime.metrics import KubeCounters

__all__ = ["OutcomeKind", "PatchOutcome", "RayClusterWriter", "classify"]

log = structlog.get_logger(__name__)


_PATCH = Target("patch", "rayclusters")
# kube-apiserver answers a JSON patch that does not apply (failed `test`, path missing) with a
# generic 422 whose message is fixed and whose details carry no causes; a validation 422 instead
# names the object and lists causes. Other servers pass evanphx/json-patch's text through:
# "testing value /x failed: test failed", "test operation does not apply: is missing path: /x".
_PATCH_NOT_APPLICABLE = "the server rejected our request due to an error in our request"
_FAILED_TEST = re.compile(r"test(ing value .* failed| failed| operation does not apply)", re.I)
_DEFAULT_RETRY_AFTER = 1.0
_MAX_REMEMBERED_INVALID = 256


class RayClusterWriter:
    """Patches one RayCluster (`namespace`/`name`) with RFC 6902 JSON patches."""

    def __init__(
        self,
        api: ApiClient,
        *,
        namespace: str,
        name: str,
        crd_version: str = CRD_VERSION,
        counters: KubeCounters | None = None,
    ) -> None:
        self._api = api
        self._counters = counters or KubeCounters.new()
        self._namespace = namespace
        self._name = name
        self._path = f"{rayclusters_path(namespace, crd_version)}/{name}"
        self._logged_invalid: set[str] = set()

    async def apply(self, ops: Sequence[Op], *, expected_uid: str) -> PatchOutcome:
        """Send `ops` (guarded by a `test` of `metadata.uid` == `expected_uid`) and classify."""
        guard = Test("/metadata/uid", expected_uid)
        # Plans from patch.build_patch already open with this guard: don't send it twice.
        body = ops_json(ops if ops and ops[0] == guard else [guard, *ops])
        try:
            obj = await request_json(
                self._api,
                _PATCH,
                "PATCH",
                self._path,
                body=body,
                content_type=JSON_PATCH,
                counters=self._counters,
            )
            outcome = PatchOutcome("applied", obj=obj)
        except ApiError as error:
            outcome = classify(error, self._describe())
        except NoResponse as error:
            outcome = PatchOutcome("transient", message=str(error))
        self._counters.patch(outcome.kind)
        self._log(outcome, ops)
        return outcome

    def _describe(self) -> str:
        return f"patch rayclusters.ray.io {self._namespace}/{self._name}"

    def _log(self, outcome: PatchOutcome, ops: Sequence[Op]) -> None:
        if outcome.kind == "applied":
            log.info("raycluster patched", ops=len(ops), rv=_resource_version(outcome.obj))
        elif outcome.kind == "invalid":
            self._log_invalid_once(outcome, ops)
        else:
            log.warning("raycluster patch not applied", kind=outcome.kind, error=outcome.message)

    def _log_invalid_once(self, outcome: PatchOutcome, ops: Sequence[Op]) -> None:
        sent = ops_json(ops)
        key = json.dumps(sent, sort_keys=True, default=str)
        if key in self._logged_invalid:
            return
        if len(self._logged_invalid) >= _MAX_REMEMBERED_INVALID:
            self._logged_invalid.clear()
        self._logged_invalid.add(key)
        log.error("raycluster patch rejected as invalid", error=outcome.message, ops=sent)


def classify(error: ApiError, action: str) -> PatchOutcome:
    """Map an API error on `action` (e.g. "patch rayclusters.ray.io ns/name") to an outcome."""
    detail = f"{action}: {error.status} {error.reason}: {error.message}".rstrip(": ")
    status = error.status
    if status == 409 or (status == 422 and _patch_did_not_apply(error)):
        return PatchOutcome("stale", message=detail)
    if status in (400, 415, 422):
        return PatchOutcome("invalid", message=detail)
    if status == 403:
        return PatchOutcome("forbidden", message=f"forbidden: {detail}")
    if status == 404:
        return PatchOutcome("gone", message=detail)
    if status == 429:
        wait = error.retry_after if error.retry_after is not None else _DEFAULT_RETRY_AFTER
        return PatchOutcome("throttled", message=detail, retry_after=wait)
    return PatchOutcome("transient", message=detail)


def _patch_did_not_apply(error: ApiError) -> bool:
    """A 422 because the patch does not fit the stored object (our `test` guards), not a
    validation failure of the patched object."""
    if _FAILED_TEST.search(error.message):
        return True
    details = error.body.get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    return error.message.startswith(_PATCH_NOT_APPLICABLE) and not causes


def _resource_version(obj: dict[str, Any] | None) -> str | None:
    return ((obj or {}).get("metadata") or {}).get("resourceVersion")
