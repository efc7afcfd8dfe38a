"""Free TCP ports that this process has not handed out before.

`bind(0)` then close returns a port the kernel may hand out again at the very next call, so two
listeners of one `ray start` (its dashboard and its agent's HTTP port, say) could be given the
same number and Ray refuses to start. Remembering every port issued in this process makes the
ports of one command line distinct by construction.
"""

from __future__ import annotations

import socket
import threading

_issued: set[int] = set()
_lock = threading.Lock()


def free_port(host: str = "0.0.0.0") -> int:
    """A port free on `host` now and never returned before by this process."""
    with _lock:
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.bind((host, 0))
                port = int(probe.getsockname()[1])
            if port not in _issued:
                _issued.add(port)
                return port
