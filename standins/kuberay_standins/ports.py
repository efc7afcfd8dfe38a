"""Free TCP ports that this process has not handed out before, outside the kernel's ephemeral
range.

`bind(0)` then close returns a port the kernel may hand out again at the very next call, so two
listeners of one `ray start` (its dashboard and its agent's HTTP port, say) could be given the
same number and Ray refuses to start. Remembering every port issued in this process makes the
ports of one command line distinct by construction.

`bind(0)` also picks from the ephemeral range (`ip_local_port_range`), the range every outgoing
connection on the machine takes its local port from: in the seconds between the probe and the
listener's own bind (a loaded `ray start` takes 15 s), any client may take the port. Found in
the e2e tier: a head's Ray client server failed to bind its port, `ray start --block` then
stopped the whole head and the daemon's GCS connection was refused. Ports come from below
that range instead, where only explicit binds go.
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

_issued: set[int] = set()
_lock = threading.Lock()
_random = random.Random()
LOWEST = 20_000  # the start of the range ports are picked from (when the kernel's allows)
_TRIES = 200


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for ports it picks by itself (Linux default 32768–60999)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[:2]
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = "0.0.0.0") -> int:
    """A port free on `host` now, below the ephemeral range, never returned before by this
    process (the kernel's own pick when that range leaves no room below it)."""
    low = ephemeral_range()[0]
    with _lock:
        for _ in range(_TRIES if low - LOWEST > 1000 else 0):
            port = _random.randrange(LOWEST, low)
            if port not in _issued and _bindable(host, port):
                _issued.add(port)
                return port
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.bind((host, 0))
                port = int(probe.getsockname()[1])
            if port not in _issued:
                _issued.add(port)
                return port


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True
