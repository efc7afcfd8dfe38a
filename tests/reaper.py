"""Nothing left behind: every process a test session (or the soak) starts carries a marker in its
environment; at the end, whatever still carries it is reported, killed by process group, and the
run fails. Orphans of an earlier session that was itself killed (CI timeout, SIGKILL) are reaped
when the next one starts.

Temp dirs too: every scratch dir the stand-ins make (Ray temp dirs `/tmp/krs-*`, drivers, the
local cluster's workdir) holds the session marker in a `.krs-session` file
(`kuberay_standins.ray_local.scratch_dir`). At the end, this session's dirs that are still there
are named and removed (after its processes are killed: they write into them); an earlier
session's are removed when the next one starts.

The marker rides on inheritance: every tier builds child environments from `os.environ` (Ray
processes, drivers, the daemon, the e2e control plane), so grandchildren (raylet, gcs_server, Ray
workers, agents) carry it too.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kuberay_standins.ray_local import SESSION_ENV, SESSION_FILE

MARKER = SESSION_ENV


@dataclass(frozen=True)
class Leftover:
    pid: int
    pgid: int
    command: str

    def __str__(self) -> str:
        return f"pid {self.pid} (process group {self.pgid}): {self.command[:160]}"


def mark_session() -> str:
    """Set the marker for this process and everything it starts; returns its value."""
    value = f"{os.getpid()}:{uuid.uuid4().hex[:12]}"
    os.environ[MARKER] = value
    return value


def marker_of(pid: int) -> str | None:
    """The marker value in `pid`'s environment, if any. A process just started reads as its
    parent (fork) or empty (mid-exec) for a moment: wait for the value, never sample once."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    for item in raw.split(b"\0"):
        if item.startswith(MARKER.encode() + b"="):
            return item.split(b"=", 1)[1].decode(errors="replace")
    return None


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _leftover(pid: int) -> Leftover | None:
    try:
        pgid = os.getpgid(pid)
        command = (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except (OSError, ProcessLookupError):
        return None
    return Leftover(pid, pgid, command.strip())


def _ours_and_ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return pids


def marked(accept: Callable[[str], bool]) -> list[Leftover]:
    """Live processes (not this one or its ancestors) whose marker value `accept`s."""
    skip = _ours_and_ancestors()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        value = marker_of(int(entry.name))
        if value is not None and accept(value) and _alive(int(entry.name)):
            leftover = _leftover(int(entry.name))
            if leftover is not None:
                found.append(leftover)
    return found


def leftovers(session: str, grace_s: float = 10.0) -> list[Leftover]:
    """What this session started that is still alive after `grace_s` (stops take a moment)."""
    deadline = time.monotonic() + grace_s
    while True:
        found = marked(lambda value: value == session)
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.25)


def orphans() -> list[Leftover]:
    """Processes of earlier sessions whose owner (the pid in the marker) is gone."""

    return marked(_owner_dead)


def reap(found: list[Leftover]) -> None:
    """SIGKILL every process group found (our own group is never touched)."""
    own = os.getpgid(0)
    for pgid in sorted({f.pgid for f in found} - {own}):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    for f in found:
        if f.pgid == own:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(f.pid, signal.SIGKILL)


def _owner_dead(value: str) -> bool:
    owner = value.split(":", 1)[0]
    return owner.isdigit() and not _alive(int(owner)) and value != os.environ.get(MARKER)


def marked_dirs(accept: Callable[[str], bool]) -> list[Path]:
    """Tagged scratch dirs (in /tmp and the temp dir) whose session marker `accept`s."""
    found = []
    for parent in sorted({Path("/tmp"), Path(tempfile.gettempdir())}):
        with contextlib.suppress(OSError):
            for entry in parent.glob("krs-*"):
                try:
                    value = (entry / SESSION_FILE).read_text().strip()
                except OSError:
                    continue
                if accept(value):
                    found.append(entry)
    return sorted(found)


def leftover_dirs(session: str) -> list[Path]:
    return marked_dirs(lambda value: value == session)


def orphan_dirs() -> list[Path]:
    """Dirs of earlier sessions whose owner is gone."""
    return marked_dirs(_owner_dead)


def remove_dirs(found: list[Path]) -> None:
    for path in found:
        shutil.rmtree(path, ignore_errors=True)
