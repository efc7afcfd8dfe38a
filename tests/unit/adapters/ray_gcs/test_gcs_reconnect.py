"""GCS restarts are routine: reconnect within a few seconds, say so once, expose it as a metric."""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path
from typing import Any

from structlog.testing import capture_logs

from kuberay_scaler.adapters.ray_gcs.client import MAX_RECONNECT_BACKOFF_S, GcsClient, TlsFiles
from kuberay_scaler.adapters.ray_gcs.errors import GcsError, GcsUnavailable
from kuberay_scaler.adapters.ray_gcs.poller import GcsPoller
from kuberay_scaler.runtime.metrics import GcsCounters
from tests.factories import gcs_reply


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_reconnect_backoff_is_capped_at_a_few_seconds() -> None:
    clock = Clock()
    client = GcsClient(f"127.0.0.1:{closed_port()}", connect_timeout_s=2, monotonic=clock)
    waits = []
    try:
        for _ in range(12):  # a GCS down for a long time
            with contextlib.suppress(GcsUnavailable):
                await client.connect()
            waits.append(client.next_connect_in())
            clock.now += waits[-1] + 0.001  # the next attempt comes as soon as allowed
    finally:
        await client.close()
    assert max(waits) <= MAX_RECONNECT_BACKOFF_S <= 5, waits
    assert waits[-1] >= MAX_RECONNECT_BACKOFF_S / 2  # still jittered backoff, not a busy loop


class DownSource:
    """A GCS that is down; the client's message changes on every call, as a backoff's does."""

    def __init__(self) -> None:
        self.calls = 0
        self.cluster_id: str | None = "abc"
        self.reply: Any = None

    async def get_cluster_resource_state(self) -> Any:
        self.calls += 1
        if self.reply is not None:
            self.reply.cluster_resource_state.cluster_resource_state_version = self.calls
            return self.reply
        raise GcsUnavailable("connect", "BACKOFF", f"next attempt in {1.0 / self.calls:.1f}s")


def connected_metric(counters: GcsCounters) -> float | None:
    return counters.sample("kuberay_scaler_gcs_connected")


async def test_poller_logs_the_state_change_once_and_sets_the_metric() -> None:
    source = DownSource()
    counters = GcsCounters.new()
    poller = GcsPoller(source, interval_s=0.5, counters=counters)
    with capture_logs() as logs:
        for _ in range(10):
            await poller.poll_once()
    unknown = [e for e in logs if e["event"] == "gcs_state_unknown"]
    assert len(unknown) == 1, logs
    assert connected_metric(counters) == 0.0

    source.reply = gcs_reply(1)
    with capture_logs() as logs:
        for _ in range(3):
            await poller.poll_once()
    assert [e["event"] for e in logs] == ["gcs_state_known"]
    assert connected_metric(counters) == 1.0

    source.reply = None
    with capture_logs() as logs:
        for _ in range(3):
            await poller.poll_once()
    assert [e["event"] for e in logs] == ["gcs_state_unknown"]  # a new spell: said once again


async def test_a_different_kind_of_failure_is_a_state_change_worth_a_line() -> None:
    class AuthFailing(DownSource):
        async def get_cluster_resource_state(self) -> Any:
            self.calls += 1
            if self.calls > 2:
                raise GcsError("GetClusterResourceState", "UNAUTHENTICATED", "bad token")
            return await super().get_cluster_resource_state()

    poller = GcsPoller(AuthFailing(), interval_s=0.5)
    with capture_logs() as logs:
        for _ in range(5):
            await poller.poll_once()
    assert [e["event"] for e in logs].count("gcs_state_unknown") == 2


async def test_tls_files_gone_after_start_fail_the_connect_not_the_daemon(tmp_path: Path) -> None:
    """Catalogue row 23, after start: replaced or removed TLS files are a failed connect (held,
    reported, retried with backoff), never an exception that ends the poller."""
    tls = TlsFiles(ca_cert=tmp_path / "ca.pem", cert=tmp_path / "c.pem", key=tmp_path / "k.pem")
    client = GcsClient(f"127.0.0.1:{closed_port()}", tls=tls, connect_timeout_s=2)
    poller = GcsPoller(client, interval_s=0.5)
    try:
        observation = await poller.poll_once()
    finally:
        await client.close()
    assert not observation.known
    assert observation.error is not None and "TLS" in observation.error
    assert client.next_connect_in() > 0  # backing off, not hammering
