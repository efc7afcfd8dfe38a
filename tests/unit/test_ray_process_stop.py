"""Stopping a Ray node of the stand-ins leaves none of its processes behind, not even those in
a process group of their own (issue 22: e2e runs ended with Ray `default_worker` processes of
stopped hosts alive, each its own group leader, which the reaper then killed).

Ray starts every worker in a process group of its own, so the node's group signal misses them;
here a `setsid` child with the node's HOME plays such a worker, without Ray.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from kuberay_standins.ray_local import RayHost, own_home, scratch_dir, strays_of


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
