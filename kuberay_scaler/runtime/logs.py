"""structlog set-up: JSON lines in containers, a readable console on a TTY.

Standard-library loggers (aiohttp, grpc, kubernetes_asyncio) are bridged into the same output.
A last processor masks anything that looks like a credential, so a token never reaches a log line:
values under secret-sounding keys (at any depth), `Bearer …`/`Basic …` credentials inside any text
(messages, rendered exceptions, reprs), and every value handed to `register_secret`.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any, Literal, TextIO

import structlog

MASK = "********"
_SECRET_KEYS = ("token", "authorization", "password", "secret", "credential", "cookie", "api_key")
_CREDENTIAL = re.compile(r"(?i)\b(bearer|basic)(\s+)[A-Za-z0-9._~+/=-]+")
_MAX_DEPTH = 8
_known_secrets: set[str] = set()


def register_secret(value: str) -> None:
    """Mask `value` wherever it shows up in a log line (e.g. the Ray auth token)."""
    if len(value) >= 4:  # masking a 1-3 character string would shred ordinary text
        _known_secrets.add(value)


def _secret_key(key: object) -> bool:
    lowered = str(key).lower().replace("-", "_")
    return any(word in lowered for word in _SECRET_KEYS)


def _scrub_text(text: str) -> str:
    text = _CREDENTIAL.sub(lambda m: m.group(1) + m.group(2) + MASK, text)
    for secret in _known_secrets:
        text = text.replace(secret, MASK)
    return text


def _scrub(value: Any, depth: int = 0) -> Any:
    if isinstance(value, str):
        return _scrub_text(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    if depth < _MAX_DEPTH and isinstance(value, Mapping):
        return {k: _masked(k, v, depth + 1) for k, v in value.items()}
    if depth < _MAX_DEPTH and isinstance(value, list | tuple | set | frozenset):
        return [_scrub(v, depth + 1) for v in value]
    # Renderers print other objects by repr: scrub that, but keep the object if it is clean.
    text = repr(value)
    clean = _scrub_text(text)
    return value if clean == text else clean


def _masked(key: object, value: Any, depth: int) -> Any:
    if _secret_key(key) and value is not None and not isinstance(value, bool):
        return MASK
    return _scrub(value, depth)


def _redact(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key in list(event):
        event[key] = _masked(key, event[key], 0)
    return event


def _static_context(context: Mapping[str, str]) -> structlog.types.Processor:
    # Not contextvars alone: lines logged from other threads (grpc, executors) need them too.
    def add(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        for key, value in context.items():
            event.setdefault(key, value)
        return event

    return add


def configure_logging(
    fmt: Literal["auto", "json", "console"] = "auto",
    level: str = "info",
    stream: TextIO | None = None,
    **context: str,
) -> None:
    """Send structlog and stdlib logs to `stream` (stderr), `context` bound to every line."""
    out = stream or sys.stderr
    use_json = fmt == "json" or (fmt == "auto" and not out.isatty())
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        _static_context({k: v for k, v in context.items() if v}),
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=out.isatty())
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            _redact,  # last before rendering: exceptions are text by now and get scrubbed too
            renderer,
        ],
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Chatty libraries stay at warning unless we debug.
    for noisy in ("aiohttp.access", "kubernetes_asyncio", "asyncio"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.clear_contextvars()
