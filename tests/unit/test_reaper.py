"""The session reaper finds what carries its marker, kills it by process group, and finds the
orphans of a session whose owner is gone."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tests import reaper


def _marked_sleeper(value: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, reaper.MARKER: value}
    return subprocess.Popen(["sleep", "120"], env=env, start_new_session=True)


def test_a_leftover_is_found_and_reaped_by_process_group() -> None:
    value = f"{os.getpid()}:unit-{time.monotonic_ns()}"
    sleeper = _marked_sleeper(value)
    try:
        [found] = reaper.leftovers(value, grace_s=0)
        assert found.pid == sleeper.pid and found.pgid == sleeper.pid and "sleep" in found.command
        reaper.reap([found])
        assert sleeper.wait(10) == -9
        assert reaper.leftovers(value, grace_s=0) == []
    finally:
        sleeper.kill()


def test_orphans_are_processes_of_a_session_whose_owner_is_dead() -> None:
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    value = f"{gone.stdout.strip()}:dead-owner"
    sleeper = _marked_sleeper(value)
    try:
        assert sleeper.pid in {o.pid for o in reaper.orphans()}
        live = _marked_sleeper(f"{os.getpid()}:live-owner")
        try:
            assert live.pid not in {o.pid for o in reaper.orphans()}
        finally:
            live.kill()
            live.wait()
    finally:
        sleeper.kill()
        sleeper.wait()
