"""Logging: JSON lines off a TTY, console on one, bound context, stdlib bridged, no secrets."""

from __future__ import annotations

import io
import json
import logging
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from kuberay_scaler.runtime import logs
from kuberay_scaler.runtime.logs import MASK, configure_logging, register_secret

TOKEN = "eyJhbGciOiJSUzI1NiJ9.secret-part"


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()


def json_lines(buffer: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in buffer.getvalue().splitlines()]


def configured(**context: str) -> io.StringIO:
    buffer = io.StringIO()  # not a TTY: "auto" must pick JSON
    configure_logging("auto", "info", buffer, **context)
    return buffer


def test_json_lines_with_bound_cluster_and_namespace() -> None:
    buffer = configured(cluster="rc", namespace="ml")

    structlog.get_logger("kuberay_scaler.test").info("scaled", group="tpu", target=2)

    [line] = json_lines(buffer)
    assert line["event"] == "scaled"
    assert line["group"] == "tpu"
    assert line["target"] == 2
    assert line["cluster"] == "rc"
    assert line["namespace"] == "ml"
    assert line["level"] == "info"
    assert line["logger"] == "kuberay_scaler.test"
    assert line["timestamp"].endswith("Z")


def test_stdlib_loggers_are_bridged_with_the_same_context() -> None:
    buffer = configured(cluster="rc", namespace="ml")

    logging.getLogger("kubernetes_asyncio.client").warning("retrying %s", "GET pods")

    [line] = json_lines(buffer)
    assert line["event"] == "retrying GET pods"
    assert line["logger"] == "kubernetes_asyncio.client"
    assert line["level"] == "warning"
    assert line["cluster"] == "rc"


def test_context_reaches_lines_logged_from_other_threads() -> None:
    buffer = configured(cluster="rc", namespace="ml")

    worker = threading.Thread(target=lambda: logging.getLogger("grpc").error("channel closed"))
    worker.start()
    worker.join()

    [line] = json_lines(buffer)
    assert (line["cluster"], line["namespace"]) == ("rc", "ml")


def test_level_filters_debug_lines() -> None:
    buffer = configured()

    log = structlog.get_logger("x")
    log.debug("hidden")
    log.info("shown")

    assert [line["event"] for line in json_lines(buffer)] == ["shown"]


def test_tokens_are_masked_in_nested_fields_and_headers() -> None:
    buffer = configured()

    structlog.get_logger("x").info(
        "gcs call",
        request={"token": TOKEN, "headers": {"authorization": f"Bearer {TOKEN}"}},
        metadata=[("authorization", f"Bearer {TOKEN}"), ("ray_cluster_id", "ab12")],
        ray_auth_token=TOKEN,
    )

    text = buffer.getvalue()
    assert TOKEN not in text
    [line] = json_lines(buffer)
    assert line["request"] == {"token": MASK, "headers": {"authorization": MASK}}
    assert line["metadata"] == [["authorization", f"Bearer {MASK}"], ["ray_cluster_id", "ab12"]]
    assert line["ray_auth_token"] == MASK


def test_bearer_credentials_are_masked_inside_messages_and_exceptions() -> None:
    buffer = configured()

    logging.getLogger("aiohttp.client").warning("sent Authorization: Bearer %s", TOKEN)
    try:
        raise PermissionError(f"401 for header Bearer {TOKEN}")
    except PermissionError:
        structlog.get_logger("x").exception("request failed")

    assert TOKEN not in buffer.getvalue()
    first, second = json_lines(buffer)
    assert first["event"] == f"sent Authorization: Bearer {MASK}"
    assert "PermissionError: 401 for header Bearer ********" in second["exception"]


def test_registered_secret_is_masked_wherever_it_appears(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logs, "_known_secrets", set())
    buffer = configured()
    secret = "plain-token-without-bearer-4821"
    register_secret(secret)

    structlog.get_logger("x").info(f"connecting with {secret}", url=f"grpc://h?t={secret}")

    assert secret not in buffer.getvalue()
    [line] = json_lines(buffer)
    assert line["url"] == f"grpc://h?t={MASK}"


def test_ordinary_fields_pass_through_unchanged() -> None:
    buffer = configured()

    structlog.get_logger("x").info("plan", pods=["a", "b"], replicas=3, held=None, token_auth=True)

    [line] = json_lines(buffer)
    assert line["pods"] == ["a", "b"]
    assert line["replicas"] == 3
    assert line["held"] is None
    assert line["token_auth"] is True  # a flag about a token is not a token


def test_console_rendering_on_a_tty() -> None:
    leader, follower = os.openpty()
    with os.fdopen(follower, "w") as tty:
        configure_logging("auto", "info", tty, cluster="rc")
        structlog.get_logger("x").info("hello console", token=TOKEN)
        tty.flush()
        output = os.read(leader, 65536).decode()
    os.close(leader)

    assert "hello console" in output
    assert "cluster" in output
    assert TOKEN not in output
    with pytest.raises(json.JSONDecodeError):
        json.loads(output.splitlines()[0])


def test_explicit_json_on_a_tty() -> None:
    leader, follower = os.openpty()
    with os.fdopen(follower, "w") as tty:
        configure_logging("json", "info", tty)
        structlog.get_logger("x").info("as json")
        tty.flush()
        output = os.read(leader, 65536).decode()
    os.close(leader)

    assert json.loads(output.splitlines()[0])["event"] == "as json"
