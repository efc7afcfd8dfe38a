"""A Ray-tier driver that never gets ready names what happened to its head: how `ray start`
ended and what Ray logged about its subprocesses (the temp dir is gone after `stop()`)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from kuberay_standins.ray_local import RayHead, RayStartError, scratch_dir
from tests.ray.helpers import head_explains


def test_a_driver_failure_carries_the_heads_state_and_logs() -> None:
    scratch = scratch_dir("krs-unit-")
    try:
        logs = scratch / "session_latest" / "logs"
        logs.mkdir(parents=True)
        (scratch / "ray-start.log").write_text("Some Ray subprocesses exited unexpectedly:\n")
        (logs / "ray_process_exit.log").write_text("raylet [exit code=1]\n")
        process = subprocess.Popen(["sh", "-c", "exit 3"], start_new_session=True)
        process.wait(10)
        head = RayHead(
            ip="127.0.0.250",
            temp_dir=scratch,
            process=process,
            log_path=scratch / "ray-start.log",
            env={},
            port=1,
        )
        with pytest.raises(RayStartError) as raised, head_explains(head):
            raise RayStartError("driver never printed 'KRS_DRIVER_READY'")
        text = str(raised.value)
        assert text.startswith("driver never printed")
        assert "`ray start` exited 3, 0 process(es) left in its group" in text
        assert "Some Ray subprocesses exited unexpectedly" in text
        assert "raylet [exit code=1]" in text
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
