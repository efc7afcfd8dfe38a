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

Other processes pick from that range too: test sessions beside this one (other checkouts, CI)
start Ray heads of their own, and a port both picked in the seconds before either bound it
stops one head (`ray start --block` stops everything when its client server cannot bind).
So a port handed out is also claimed machine-wide for `CLAIM_S`, long enough for the slowest
start to bind it, by creating a file named after it in `CLAIMS` (O_EXCL): no other process
using this module hands it out meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import tempfile
import threading
import time
from pathlib import Path

_issued: set[int] = set()
_lock = threading.Lock()
_random = random.Random()
LOWEST = 20_000  # the start of the range ports are picked from (when the kernel's allows)
_TRIES = 400
CLAIMS = Path(tempfile.gettempdir()) / "kuberay-standins-port-claims"
CLAIM_S = 300.0  # > the 120 s a `ray start` may take to come up and bind its ports


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
            if port not in _issued and _bindable(host, port) and _claim(port):
                _issued.add(port)
                return port
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.bind((host, 0))
                port = int(probe.getsockname()[1])
            if port not in _issued:
                _issued.add(port)
                return port


def _claim(port: int, now: float | None = None) -> bool:
    """Claim `port` machine-wide unless another process claimed it under `CLAIM_S` ago. A
    claims directory that cannot be used (another user's, read-only) claims nothing."""
    now = time.time() if now is None else now
    path = CLAIMS / str(port)
    try:
        CLAIMS.mkdir(mode=0o1777, exist_ok=True)
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            return True
        except FileExistsError:
            if now - path.stat().st_mtime < CLAIM_S:
                return False
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # an old claim: its listener bound long ago, or never will
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            return True
    except FileExistsError:
        return False  # another process re-claimed it first
    except OSError:
        return True


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True
