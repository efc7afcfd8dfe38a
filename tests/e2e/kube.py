"""A small asyncio client for the real kube-apiserver (aiohttp, bearer token, verified TLS).

Raw dicts in, raw dicts out: the tests want to see exactly what the server says, so nothing here
interprets objects. `watch()` yields decoded watch events until the server ends the stream.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

JSON = "application/json"
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"


@dataclass
class Reply:
    """Status code and decoded JSON body of one answer."""

    status: int
    body: dict[str, Any]

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


class KubeError(RuntimeError):
    """A request the test expected to succeed did not."""


class Kube:
    """One identity's view of the API server. Create and close it inside one event loop."""

    def __init__(self, url: str, ca_file: Path, token: str) -> None:
        self.url = url
        self._token = token
        self._ssl = ssl.create_default_context(cafile=str(ca_file))
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                headers={"Authorization": f"Bearer {self._token}", "Accept": JSON},
                connector=aiohttp.TCPConnector(ssl=self._ssl),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: Mapping[str, str] | None = None,
        content_type: str = JSON,
        timeout_s: float = 30.0,
    ) -> Reply:
        data = json.dumps(body) if body is not None else None
        headers = {"Content-Type": content_type} if data is not None else {}
        async with self._client().request(
            method,
            self.url + path,
            data=data,
            params=dict(query or {}),
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as response:
            raw = await response.read()
        return Reply(response.status, _decode(raw))

    async def ok(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: Mapping[str, str] | None = None,
        content_type: str = JSON,
    ) -> dict[str, Any]:
        """Like `request`, but any non-2xx answer raises `KubeError`."""
        reply = await self.request(method, path, body, query=query, content_type=content_type)
        if not reply.ok:
            raise KubeError(f"{method} {path}: {reply.status} {json.dumps(reply.body)[:1500]}")
        return reply.body

    async def watch(
        self, path: str, query: Mapping[str, str], *, idle_timeout_s: float = 90.0
    ) -> AsyncIterator[dict[str, Any]]:
        """Yield watch events (`{"type", "object"}`) until the stream ends.

        A non-2xx answer is yielded as one synthetic `{"type": "HTTP_ERROR", "object": Status}`,
        so callers can tell an HTTP 410 from an in-stream ERROR event.
        """
        params = {**query, "watch": "true"}
        timeout = aiohttp.ClientTimeout(total=None, sock_read=idle_timeout_s, sock_connect=10)
        async with self._client().get(self.url + path, params=params, timeout=timeout) as response:
            if response.status != 200:
                body = _decode(await response.read())
                yield {"type": "HTTP_ERROR", "object": {**body, "code": response.status}}
                return
            async for line in response.content:
                if line.strip():
                    yield json.loads(line)


def _decode(raw: bytes) -> dict[str, Any]:
    try:
        decoded = json.loads(raw) if raw else {}
    except ValueError:
        return {"raw": raw[:500].decode(errors="replace")}
    return decoded if isinstance(decoded, dict) else {"items": decoded}
