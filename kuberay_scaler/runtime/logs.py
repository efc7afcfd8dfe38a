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
import time
from collections.abc import Callable, Mapping, MutableMapping
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
    # What any client of the HTTP port (or a descriptor shortage) makes them say: one line each,
    # a few a minute.
    for name in CLIENT_LOGGERS:
        client_logger = logging.getLogger(name)
        client_logger.filters[:] = [f for f in client_logger.filters if not isinstance(f, Quiet)]
        client_logger.addFilter(Quiet())
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.clear_contextvars()


# Loggers a client of the HTTP port can make speak (aiohttp's request errors, asyncio's accept
# failures when descriptors run out): a flood must not become megabytes of tracebacks.
CLIENT_LOGGERS = ("aiohttp.server", "aiohttp.web", "asyncio")


class Quiet(logging.Filter):
    """At most `per_window` records per `window_s` from the logger it is on; what a client caused
    is one line at warning (`_one_line`); the first record after some were dropped says how
    many."""

    def __init__(
        self,
        per_window: int = 5,
        window_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self._per_window, self._window_s, self._clock = per_window, window_s, clock
        self._window_start = -float("inf")
        self._passed = 0
        self._dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        now = self._clock()
        if now - self._window_start >= self._window_s:
            self._window_start, self._passed = now, 0
        if self._passed >= self._per_window:
            self._dropped += 1
            return False
        self._passed += 1
        _one_line(record, self._dropped)
        self._dropped = 0
        return True


def _one_line(record: logging.LogRecord, dropped: int) -> None:
    """A client's doing (a malformed request, a reset, descriptors run out) becomes one line at
    warning; anything else (a bug of ours in a handler) keeps its level and traceback."""
    err = record.exc_info[1] if record.exc_info else None
    if err is not None and _clients_doing(err):
        message = record.getMessage()
        first = str(err).strip().splitlines()
        text = (message.splitlines()[0] if message else "") + f": {type(err).__name__}"
        text += f": {' '.join(line.strip() for line in first[:2])[:200]}" if first else ""
        record.msg, record.args = text, None
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        if record.levelno > logging.WARNING:
            record.levelno, record.levelname = logging.WARNING, "WARNING"
    if dropped:
        record.msg, record.args = f"{record.getMessage()} ({dropped} similar dropped before)", None


def _clients_doing(err: BaseException) -> bool:
    # aiohttp's parser errors all derive from HttpProcessingError (named, not imported here).
    names = {cls.__name__ for cls in type(err).__mro__}
    return "HttpProcessingError" in names or isinstance(err, OSError)
