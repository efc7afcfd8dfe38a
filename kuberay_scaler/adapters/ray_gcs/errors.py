"""What can go wrong talking to the GCS, sorted by what the caller should do about it."""

from __future__ import annotations


class GcsError(Exception):
    """A GCS call failed; `method` is the RPC name, `code` the gRPC status name."""

    def __init__(self, method: str, code: str, message: str) -> None:
        super().__init__(f"{method}: {code}: {message}")
        self.method = method
        self.code = code
        self.message = message


class GcsUnavailable(GcsError):
    """Unreachable, timed out, restarting, or still backing off: the cluster state is unknown."""


class GcsReplaced(GcsError):
    """The GCS answering is not the one we knew (new cluster id): every node id we hold is stale."""


class GcsAuthError(GcsError):
    """The GCS refused our credentials (token missing or wrong, TLS mismatch)."""


class GcsCallError(GcsError):
    """The GCS answered with an error of its own (e.g. ABORTED for a bad drain request)."""
