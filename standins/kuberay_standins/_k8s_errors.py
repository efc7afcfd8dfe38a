"""Kubernetes ``Status`` error bodies, shaped like the ones kube-apiserver sends."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_REASON_BY_CODE = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Gone",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}

_MESSAGE_BY_CODE = {
    429: "Too many requests, please try again later.",
    500: "Internal error occurred: injected fault",
    503: "the server is currently unable to handle the request",
    504: "the server was unable to return a response in the time allotted",
}


def status_body(
    code: int,
    reason: str,
    message: str,
    details: dict[str, Any] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details is not None:
        body["details"] = details
    return body


def generic_status(code: int, message: str | None = None) -> dict[str, Any]:
    """A Status for an injected fault with only a code (reason and message by convention)."""
    reason = _REASON_BY_CODE.get(code, "InternalError" if code >= 500 else "Unknown")
    text = message or _MESSAGE_BY_CODE.get(code, f"injected fault {code}")
    return status_body(code, reason, text)


@dataclass
class ApiError(Exception):
    """An API failure carrying the Status body the HTTP layer sends back as is."""

    status: dict[str, Any]

    @property
    def code(self) -> int:
        return int(self.status["code"])

    @property
    def reason(self) -> str:
        return str(self.status["reason"])

    def __str__(self) -> str:
        return f"{self.code} {self.reason}: {self.status['message']}"


class NotFound(ApiError):
    pass


class AlreadyExists(ApiError):
    pass


class Conflict(ApiError):
    pass


class Invalid(ApiError):
    pass


class BadRequest(ApiError):
    pass


class Gone(ApiError):
    pass


class Timeout(ApiError):
    pass


def _details(group: str, plural: str, name: str | None) -> dict[str, Any]:
    details: dict[str, Any] = {"kind": plural}
    if group:
        details["group"] = group
    if name:
        details["name"] = name
    return details


def qualified(group: str, plural: str) -> str:
    return f"{plural}.{group}" if group else plural


def not_found(group: str, plural: str, name: str) -> NotFound:
    message = f'{qualified(group, plural)} "{name}" not found'
    return NotFound(status_body(404, "NotFound", message, _details(group, plural, name)))


def already_exists(group: str, plural: str, name: str) -> AlreadyExists:
    message = f'{qualified(group, plural)} "{name}" already exists'
    return AlreadyExists(status_body(409, "AlreadyExists", message, _details(group, plural, name)))


def conflict(group: str, plural: str, name: str, why: str | None = None) -> Conflict:
    cause = why or (
        "the object has been modified; please apply your changes to the latest version "
        "and try again"
    )
    message = f'Operation cannot be fulfilled on {qualified(group, plural)} "{name}": {cause}'
    return Conflict(status_body(409, "Conflict", message, _details(group, plural, name)))


@dataclass(frozen=True)
class FieldCause:
    field: str
    reason: str  # FieldValueInvalid, FieldValueRequired, FieldValueTypeInvalid ...
    message: str


def invalid(
    group_kind: str, name: str, causes: list[FieldCause], *, kind: str, group: str
) -> Invalid:
    """422 Invalid listing every failing field, as validation failures are reported."""
    summary = ", ".join(f"{c.field}: {c.message}" for c in causes)
    if len(causes) > 1:
        summary = f"[{summary}]"
    message = f'{group_kind} "{name}" is invalid: {summary}'
    details: dict[str, Any] = {
        "name": name,
        "kind": kind,
        "causes": [{"reason": c.reason, "message": c.message, "field": c.field} for c in causes],
    }
    if group:
        details["group"] = group
    return Invalid(status_body(422, "Invalid", message, details))


def patch_not_applied() -> Invalid:
    """What kube-apiserver answers when an RFC 6902 patch does not apply (failed ``test``,
    missing path for ``replace``/``remove``...): a generic 422 whose details are empty. The
    server drops the JSON-patch library's message, so this is told apart from a validation
    422 by having no ``details.causes``.
    """
    message = "the server rejected our request due to an error in our request"
    return Invalid(status_body(422, "Invalid", message, {}))


def bad_request(message: str) -> BadRequest:
    return BadRequest(status_body(400, "BadRequest", message))


def expired(message: str) -> Gone:
    return Gone(status_body(410, "Expired", message))


def too_large_resource_version(requested: int, current: int) -> Timeout:
    message = f"Too large resource version: {requested}, current: {current}"
    details = {
        "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
        "retryAfterSeconds": 1,
    }
    return Timeout(status_body(504, "Timeout", message, details))
