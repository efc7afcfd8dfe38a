"""The HTTP port's guard: the connection cap and the logging of what clients cause."""

from __future__ import annotations

import logging
import resource

from kuberay_scaler.adapters.web.server import Connections, connection_cap
from kuberay_scaler.runtime.limits import raise_open_files_limit
from kuberay_scaler.runtime.logs import Quiet


class FakeGuard:
    def __init__(self, head_seen: bool) -> None:
        self.head_seen = head_seen
        self.dropped = False

    def drop(self) -> None:
        self.dropped = True


def test_the_cap_is_a_quarter_of_the_file_limit_at_most() -> None:
    assert connection_cap(256) == 64 and connection_cap(1024) == 64 and connection_cap(40) == 10


def test_at_the_cap_the_oldest_slow_client_makes_room_and_a_busy_cap_refuses() -> None:
    connections = Connections(cap=2)
    slow, busy, probe = FakeGuard(False), FakeGuard(True), FakeGuard(True)
    assert connections.admit(slow, 0) and connections.admit(busy, 1)  # type: ignore[arg-type]
    assert connections.admit(probe, 2)  # type: ignore[arg-type]
    assert slow.dropped and not busy.dropped
    connections.leave(slow)  # type: ignore[arg-type]
    assert not connections.admit(FakeGuard(False), 3)  # type: ignore[arg-type]
    assert (connections.dropped, connections.refused) == (1, 1)


def record(exc: BaseException | None, level: int = logging.ERROR) -> logging.LogRecord:
    info = (type(exc), exc, None) if exc else None
    return logging.LogRecord("aiohttp.server", level, "f", 1, "Error handling request", (), info)


class HttpProcessingError(Exception):
    pass


class ClientError(HttpProcessingError):
    """Named like aiohttp's parser errors (matched by name)."""


def test_a_clients_bad_request_is_one_line_at_warning_and_a_bug_keeps_its_traceback() -> None:
    quiet = Quiet(clock=lambda: 0.0)
    bad = record(ClientError("400, message:\n  Duplicate 'Host' header found."))
    assert quiet.filter(bad)
    assert bad.levelno == logging.WARNING and bad.exc_info is None
    assert bad.getMessage() == (
        "Error handling request: ClientError: 400, message: Duplicate 'Host' header found."
    )
    bug = record(KeyError("plan"))
    assert quiet.filter(bug)
    assert bug.levelno == logging.ERROR and bug.exc_info is not None


def test_a_flood_is_a_few_lines_a_minute_and_then_says_how_many_were_dropped() -> None:
    now = [0.0]
    quiet = Quiet(per_window=5, window_s=60, clock=lambda: now[0])
    passed = [quiet.filter(record(OSError(24, "Too many open files"))) for _ in range(1000)]
    assert sum(passed) == 5
    now[0] = 61.0
    later = record(OSError(24, "Too many open files"))
    assert quiet.filter(later) and "995 similar dropped before" in later.getMessage()


def test_the_soft_file_limit_is_raised_toward_the_hard_one() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))
        before, now = raise_open_files_limit(most=min(512, hard))
        assert before == min(256, hard) and now == min(512, hard)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == now
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
