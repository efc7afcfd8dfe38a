"""Helpers for the Ray tier (fixtures live in conftest.py)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import subprocess
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
from ray.core.generated import autoscaler_pb2

from kuberay_scaler.adapters.ray_gcs.client import GcsClient
from kuberay_standins.ray_local import RAY_CLI, RAY_PYTHON, RAY_VENV, RayHead, RayStartError

DEAD = autoscaler_pb2.NodeStatus.Value("DEAD")


@functools.cache
def ray_has(module: str) -> bool:
    """Whether the Ray under test (see make ray-matrix) has `module`: older Ray lacks some
    user APIs (ray.util.tpu's slice reservations), not the RPCs we use."""
    done = subprocess.run([RAY_PYTHON, "-c", f"import {module}"], capture_output=True, timeout=120)
    return done.returncode == 0


SLICE_RESERVATIONS = ray_has("ray.util.tpu")
_Test = TypeVar("_Test", bound=Callable[..., Any])


def needs_slice_reservations(test: _Test) -> _Test:
    """Skip without `ray.util.tpu`. Only the ray-matrix's older Ray (KUBERAY_STANDINS_RAY_VENV)
    may lack it under CI; with the pinned Ray the test is required like any other."""
    test = pytest.mark.skipif(not SLICE_RESERVATIONS, reason="this Ray has no ray.util.tpu")(test)
    if RAY_VENV:
        test = pytest.mark.ci_may_skip("the ray-matrix's older Ray has no ray.util.tpu")(test)
    return test


STATE_TIMEOUT_S = 90.0


def fast_client(address: str, **kwargs: Any) -> GcsClient:
    """A client that retries quickly: tests wait for recovery, not for production backoff."""
    return GcsClient(
        address, rpc_timeout_s=10.0, backoff_initial_s=0.1, backoff_max_s=0.5, **kwargs
    )


async def wait_for_state(
    client: GcsClient,
    predicate: Callable[[Any], bool],
    *,
    timeout_s: float = STATE_TIMEOUT_S,
    what: str = "condition",
) -> Any:
    """Poll GetClusterResourceState until `predicate(cluster_resource_state)` holds."""
    last: Any = None

    async def poll() -> Any:
        nonlocal last
        while True:
            last = (await client.get_cluster_resource_state()).cluster_resource_state
            if predicate(last):
                return last
            await asyncio.sleep(0.2)

    try:
        return await asyncio.wait_for(poll(), timeout_s)
    except TimeoutError:
        raise AssertionError(f"GCS never showed {what}; last state:\n{last}") from None


def node_by_instance(state: Any, instance_id: str) -> Any:
    """The live node state for a pod name (instance id), or None."""
    for node in state.node_states:
        if node.instance_id == instance_id and node.status != DEAD:
            return node
    return None


def node_by_id(state: Any, node_id: bytes) -> Any:
    for node in state.node_states:
        if node.node_id == node_id:
            return node
    return None


def gangs(state: Any) -> list[Any]:
    """Pending placement groups; the GCS also emits empty entries for placed ones."""
    return [g for g in state.pending_gang_resource_requests if g.requests]


def run_ray_status(head: RayHead, *, verbose: bool = False) -> str:
    """`ray status --address` as a user would run it, without RAY_enable_autoscaler_v2 set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env |= head.client_env()
    args = [RAY_CLI, "status", "--address", head.gcs_address, *(["-v"] if verbose else [])]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def head_postmortem(head: RayHead) -> str:
    """What the head looks like now, for a failure's message: alive or how `ray start` ended,
    what Ray said about its subprocesses (ray_process_exit.log) and the last log lines. Read
    before `stop()`, which removes the temp dir."""
    code = head.process.poll()
    members = head.group_pids()
    lines = [
        f"head {head.gcs_address} (pid {head.pid}): "
        + ("running" if code is None else f"`ray start` exited {code}")
        + f", {len(members)} process(es) left in its group"
    ]
    logs = head.temp_dir / "session_latest" / "logs"
    for path in (head.log_path, logs / "ray_process_exit.log", logs / "raylet.out"):
        try:
            text = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        tail = [line for line in text if "[state-dump]" not in line][-15:]
        lines += [f"--- {path.name} (last {len(tail)} lines)", *tail]
    return "\n".join(lines)


@contextlib.contextmanager
def head_explains(head: RayHead) -> Iterator[None]:
    """A driver that never got ready says what happened to the head it dialled."""
    try:
        yield
    except RayStartError as error:
        raise RayStartError(f"{error}\n{head_postmortem(head)}") from None
