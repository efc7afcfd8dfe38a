"""The stand-ins' port picker never hands one process the same port twice.

Found in CI: Ray 2.49.2 refused `ray start` because the dashboard port and the agent's HTTP port,
picked by two bind(0) calls, were the same number.
"""

from __future__ import annotations

import socket

from kuberay_standins.ports import free_port


def test_ports_handed_out_are_distinct_and_bindable() -> None:
    ports = [free_port() for _ in range(500)] + [free_port("127.0.0.1") for _ in range(500)]
    assert len(set(ports)) == len(ports)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", ports[-1]))
