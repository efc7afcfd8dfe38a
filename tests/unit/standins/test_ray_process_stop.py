"""Stopping a Ray node of the stand-ins leaves none of its processes behind, not even those in
a process group of their own (e2e runs ended with Ray `default_worker` processes of
stopped hosts alive, each its own group leader, which the reaper then killed).

Ray starts every worker in a process group of its own, so the node's group signal misses them;
here a `setsid` child with the node's HOME plays such a worker, without Ray.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from kuberay_standins.ray_local import RayDriver, RayHost, own_home, scratch_dir, strays_of


def _node_with_a_worker_of_its_own_group() -> tuple[RayHost, Path]:
    scratch = scratch_dir("krs-stop-")
    pid_file = scratch / "worker.pid"
    script = f"setsid sh -c 'echo $$ > {pid_file}; exec sleep 600' & exec sleep 600"
    process = subprocess.Popen(
        ["sh", "-c", script],
        env={"PATH": os.environ["PATH"], **own_home(scratch)},
        start_new_session=True,
    )
    node = RayHost(
        ip="127.0.0.250", temp_dir=scratch, process=process, log_path=scratch / "log", env={}
    )
    return node, pid_file


def _wait_for_pid(pid_file: Path) -> int:
    for _ in range(600):  # a bound, not a timing assumption: the child writes it at once
        text = pid_file.read_text().strip() if pid_file.exists() else ""
        if text:
            return int(text)
        time.sleep(0.05)
    raise AssertionError("the stand-in worker never started")


def test_stopping_a_node_kills_its_workers_in_their_own_process_groups() -> None:
    node, pid_file = _node_with_a_worker_of_its_own_group()
    scratch = node.temp_dir
    try:
        worker = _wait_for_pid(pid_file)
        assert os.getpgid(worker) != node.pid  # out of reach of the node's group signal
        assert worker in strays_of(scratch)
    finally:
        node.stop(grace_s=0.5)
    assert strays_of(scratch) == [], "a process of the stopped node is still alive"
    assert not Path(f"/proc/{worker}").exists() or _zombie(worker)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _reaped_leader_whose_pid_now_leads(other: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
    """A leader that exited and was reaped, its pid number now another session's group: pids
    wrap (pid_max 32768 here), so a stale number is someone else's group, as it was for a Ray
    head of another test. The reuse is simulated by giving the Popen the other group's pid."""
    gone = subprocess.Popen(["true"], start_new_session=True)
    gone.wait(10)
    gone.pid = other.pid
    return gone


def _session_sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["sleep", "600"], env={"PATH": os.environ["PATH"]}, start_new_session=True
    )


def test_a_node_whose_leader_was_reaped_never_signals_the_group_its_pid_now_leads() -> None:
    scratch = scratch_dir("krs-stop-")
    other = _session_sleeper()
    try:
        node = RayHost(
            ip="127.0.0.250",
            temp_dir=scratch,
            process=_reaped_leader_whose_pid_now_leads(other),
            log_path=scratch / "log",
            env={},
        )
        node.kill()
        node.stop(grace_s=0.5)
        assert other.poll() is None, "another session's process group was signalled"
    finally:
        other.kill()
        other.wait()


def test_a_driver_that_had_exited_never_signals_the_group_its_pid_now_leads() -> None:
    scratch = scratch_dir("krs-driver-")
    other = _session_sleeper()
    try:
        driver = RayDriver(
            process=_reaped_leader_whose_pid_now_leads(other), log_path=scratch / "driver.log"
        )
        driver.stop()
        assert other.poll() is None, "another session's process group was signalled"
    finally:
        other.kill()
        other.wait()
