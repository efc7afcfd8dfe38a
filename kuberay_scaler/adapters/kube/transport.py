"""One JSON request, or one watch stream, against the API server.

Uses `ApiClient.call_api` with `_preload_content=False` so bodies stay raw dicts (no model
classes) and the caller chooses the Content-Type (the typed API would pick a patch type from the
body's Python type). Every request is counted by verb, resource and code into the caller's
`KubeCounters` (runtime/metrics.py).

Errors are split in two: `ApiError` (the server answered with a non-2xx status; carries the
`Status` reason/message and Retry-After) and `NoResponse` (refused, reset, timed out).
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from kubernetes_asyncio.client import ApiClient

from kuberay_scaler.core import defaults as D
from kuberay_scaler.runtime.metrics import KubeCounters

JSON = "application/json"
JSON_PATCH = "application/json-patch+json"
_AUTH = ["BearerToken"]


# A Retry-After longer than this (a day, a date years ahead) is read as this: honoured, but a
# misbehaving server or proxy cannot stop the daemon for longer.
MAX_RETRY_AFTER_S = D.MAX_RETRY_AFTER_S


@dataclass(frozen=True)
class Target:
    """What a request is about, for metrics and error messages: verb and resource (`pods`)."""

    verb: str
    resource: str


class NoResponse(Exception):
    """The API server gave no HTTP answer (connection refused/reset, timeout)."""


@dataclass
class ApiError(Exception):
    """A non-2xx answer. `message` is the server's `Status.message` when it sent one."""

    status: int
    reason: str
    message: str
    target: Target
    retry_after: float | None = None
    body: Mapping[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.target.verb} {self.target.resource}: {self.status} {self.reason}: " + (
            self.message
        )


async def request_json(
    api: ApiClient,
    target: Target,
    method: str,
    path: str,
    *,
    counters: KubeCounters,
    query: Mapping[str, str] | None = None,
    body: Any = None,
    content_type: str = JSON,
    request_timeout: float | None = None,
) -> dict[str, Any]:
    """Send one request and return the decoded JSON body of a 2xx answer.

    Raises `ApiError` for any other status and `NoResponse` when there was no answer.
    """
    try:
        response = await _call(api, method, path, query, body, content_type, request_timeout)
        async with response:
            raw = await response.read()
    except (aiohttp.ClientError, TimeoutError) as error:
        counters.request(target.verb, target.resource, "error")
        raise NoResponse(f"{target.verb} {target.resource}: {_describe(error)}") from error
    counters.request(target.verb, target.resource, str(response.status))
    decoded = _decode(raw)
    if not 200 <= response.status < 300:
        raise _api_error(target, response.status, response.headers, decoded)
    return decoded


@asynccontextmanager
async def open_stream(
    api: ApiClient,
    target: Target,
    path: str,
    query: Mapping[str, str],
    *,
    counters: KubeCounters,
    connect_timeout: float,
) -> AsyncIterator[aiohttp.StreamReader]:
    """Open a long-lived GET (a watch) and yield its body stream; closed on exit.

    No total timeout (the stream is meant to last); the caller bounds each read instead.
    """
    stream_timeout = aiohttp.ClientTimeout(
        total=None, connect=connect_timeout, sock_connect=connect_timeout
    )
    try:
        response = await _call(api, "GET", path, query, None, JSON, stream_timeout)
    except (aiohttp.ClientError, TimeoutError) as error:
        counters.request(target.verb, target.resource, "error")
        raise NoResponse(f"{target.verb} {target.resource}: {_describe(error)}") from error
    counters.request(target.verb, target.resource, str(response.status))
    try:
        if not 200 <= response.status < 300:
            raw = await _read_error_body(response, connect_timeout)
            raise _api_error(target, response.status, response.headers, _decode(raw))
        yield response.content
    finally:
        response.close()


async def _call(
    api: ApiClient,
    method: str,
    path: str,
    query: Mapping[str, str] | None,
    body: Any,
    content_type: str,
    request_timeout: float | aiohttp.ClientTimeout | None,
) -> aiohttp.ClientResponse:
    response: aiohttp.ClientResponse = await api.call_api(
        path,
        method,
        query_params=list((query or {}).items()),
        header_params={"Accept": JSON, "Content-Type": content_type},
        body=body,
        auth_settings=_AUTH,
        _preload_content=False,
        _request_timeout=request_timeout,
    )
    return response


async def _read_error_body(response: aiohttp.ClientResponse, limit_s: float) -> bytes:
    try:
        async with asyncio.timeout(limit_s):
            return await response.read()
    except (aiohttp.ClientError, TimeoutError):
        return b""  # the status code alone still classifies the error


def _decode(raw: bytes) -> dict[str, Any]:
    try:
        decoded = json.loads(raw) if raw else {}
    except ValueError:
        return {"message": raw[:200].decode("utf-8", "replace")}
    return decoded if isinstance(decoded, dict) else {"items": decoded}


def _api_error(
    target: Target, status: int, headers: Mapping[str, str], body: dict[str, Any]
) -> ApiError:
    return ApiError(
        status=status,
        reason=str(body.get("reason") or ""),
        message=str(body.get("message") or ""),
        target=target,
        retry_after=parse_retry_after(headers.get("Retry-After")),
        body=body,
    )


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date), at most
    MAX_RETRY_AFTER_S; None if absent/bad."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return min(float(value), MAX_RETRY_AFTER_S)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    current = time.time() if now is None else now
    return min(MAX_RETRY_AFTER_S, max(0.0, when.timestamp() - current))


def _describe(error: BaseException) -> str:
    if isinstance(error, TimeoutError):
        return "timed out"
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
