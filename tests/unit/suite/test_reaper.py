"""The session reaper finds what carries its marker, kills it by process group, and finds the
orphans of a session whose owner is gone."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from kuberay_standins.ray_local import scratch_dir
from tests import reaper


def _marked_sleeper(value: str) -> subprocess.Popen[bytes]:
    """A sleeper whose /proc environ carries `value`: until its exec, a child reads as its
    parent (this session's marker) or empty, so a scan right after Popen can miss it."""
    env = {**os.environ, reaper.MARKER: value}
    process = subprocess.Popen(["sleep", "120"], env=env, start_new_session=True)
    deadline = time.monotonic() + 10
    while reaper.marker_of(process.pid) != value and process.poll() is None:
        if time.monotonic() >= deadline:
            process.kill()
            process.wait()
            raise AssertionError(f"the sleeper never carried {reaper.MARKER}={value}")
        time.sleep(0.01)
    # Exited already: only a reaper (of another session, for a dead owner's marker) kills it.
    assert process.returncode in (None, -signal.SIGKILL), process.returncode
    return process


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


def _killed(process: subprocess.Popen[bytes]) -> bool:
    """Killed by another session's reaper: waited for, since SIGKILL sent is not yet exited."""
    try:
        return process.wait(timeout=5) == -signal.SIGKILL
    except subprocess.TimeoutExpired:
        return False


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
        # A made-up orphan is an orphan to every reaper: a pytest session starting beside this
        # one (another checkout, CI) reaps it on sight (SIGKILL), and that too is it being found.
        found = sleeper.pid in {o.pid for o in reaper.orphans()}
        assert found or _killed(sleeper), "the orphan was not found"
        live = _marked_sleeper(f"{os.getpid()}:live-owner")
        try:
            assert live.pid not in {o.pid for o in reaper.orphans()}
        finally:
            live.kill()
            live.wait()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_scratch_dir_carries_its_session_and_is_found_and_removed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    value = f"{os.getpid()}:dirs-{time.monotonic_ns()}"
    monkeypatch.setenv(reaper.MARKER, value)
    made = scratch_dir("krs-unit-")
    untagged = Path(tempfile.mkdtemp(prefix="krs-unit-"))
    try:
        assert reaper.leftover_dirs(value) == [made]
        reaper.remove_dirs([made])
        assert not made.exists()
        assert untagged.exists()  # not ours (another session, another user): never touched
    finally:
        shutil.rmtree(made, ignore_errors=True)
        shutil.rmtree(untagged, ignore_errors=True)


def test_orphan_dirs_are_those_of_a_session_whose_owner_is_dead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    monkeypatch.setenv(reaper.MARKER, f"{gone.stdout.strip()}:dead-owner")
    orphan = scratch_dir("krs-unit-")
    monkeypatch.setenv(reaper.MARKER, f"{os.getpid()}:live-owner")
    live = scratch_dir("krs-unit-")
    try:
        found = reaper.orphan_dirs()
        # As above: a session starting beside this one removes a dead owner's dir on sight.
        assert orphan in found or not orphan.exists()
        assert live not in found
    finally:
        shutil.rmtree(orphan, ignore_errors=True)
        shutil.rmtree(live, ignore_errors=True)
