"""The process's open-files limit: raised at start where allowed (soft up to the hard limit).

A container runtime often starts a process at a soft limit of 1,024 with a far higher hard limit;
every web client, API-server connection and GCS channel takes a descriptor, and a process out of
them can no longer reconnect to anything. The web server's connection cap is a fraction of what
this leaves (adapters/web/server.py `connection_cap`).
"""

from __future__ import annotations

import resource

MOST = 65536  # no need for more; some kernels refuse RLIM_INFINITY as a soft limit


def raise_open_files_limit(most: int = MOST) -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE toward the hard limit (at most `most`); (before, now)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = most if hard == resource.RLIM_INFINITY else min(hard, most)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError):  # not allowed here: keep what we have
            return soft, soft
        return soft, wanted
    return soft, soft
