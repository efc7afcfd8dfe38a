"""The stand-ins' port picker never hands one process the same port twice.

Found in CI: Ray 2.49.2 refused `ray start` because the dashboard port and the agent's HTTP port,
picked by two bind(0) calls, were the same number.
"""

from __future__ import annotations

import socket

import pytest

from kuberay_standins.ports import LOWEST, ephemeral_range, free_port


def test_ports_handed_out_are_distinct_and_bindable() -> None:
    ports = [free_port() for _ in range(500)] + [free_port("127.0.0.1") for _ in range(500)]
    assert len(set(ports)) == len(ports)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", ports[-1]))


def test_ports_come_from_below_the_ephemeral_range() -> None:
    """Outgoing connections take their local ports from the ephemeral range: a port picked
    there may be taken before its listener binds it (an e2e head's Ray client server failed
    to bind so, and `ray start --block` stopped the head)."""
    low, _ = ephemeral_range()
    if low - LOWEST <= 1000:
        pytest.skip(f"this kernel's ephemeral range starts at {low}: no room below it")
    ports = [free_port("127.0.0.1") for _ in range(200)]
    assert all(LOWEST <= p < low for p in ports), sorted(p for p in ports if p >= low)[:5]
