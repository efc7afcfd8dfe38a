"""The drop-in on the real operator: `autoscalerOptions.image` alone is the switch.

KubeRay renders its autoscaler container into the head pod. This test reads that container
back from the API server (command, args and env), resolves the env as the kubelet would
(fieldRefs from the pod, secret and config-map refs from the API), expands `$(VAR)` in the
command line, and runs exactly that command line as the daemon, with the installed entry points
standing in for our image (`ray` = `kuberay-scaler-ray`, first on PATH as in the image). Two
things a pod provides come from the test instead: the service-account credentials (a token
from the TokenRequest API for the pod's own service account, in a kubeconfig, instead of the
projected token mount) and the GCS address (127.0.0.1:6379 inside the pod, the Ray bridge's
head here). The daemon must sync, plan and scale a slice up.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from kuberay_scaler.cli.ray_shim import SUBCOMMAND
from tests.e2e.controlplane import free_port
from tests.e2e.deploy import (
    IMAGE,
    SHIM,
    image_path,
    lookup,
    service_account_kubeconfig,
)
from tests.e2e.deploy import (
    autoscaler_container as _autoscaler_container,
)
from tests.e2e.kubelet import expand, resolve_env
from tests.e2e.procs import Daemon
from tests.e2e.world import (
    CLUSTER,
    IDLE_TIMEOUT_S,
    SLICE_RESERVATION,
    SLICE_UP_S,
    TPU_GROUP,
    World,
    daemon_ready,
    tpu_raycluster,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
# ray-operator controllers/ray/common/pod.go BuildAutoscalerContainer: v1.4 .. v1.7 render
# utils.GetContainerCommand, `-c` plus `l` when the operator runs with ENABLE_LOGIN_SHELL=true
# (v1.2 .. v1.3: always `-lc`; v1.1: command ["ray"], args split; tests/unit/cli/test_ray_shim.py).
KUBERAY_COMMANDS = (["/bin/bash", "-c", "--"], ["/bin/bash", "-cl", "--"])
KUBERAY_ARGS = [
    f"ray {SUBCOMMAND} --cluster-name $(RAY_CLUSTER_NAME) "
    "--cluster-namespace $(RAY_CLUSTER_NAMESPACE)"
]


def drop_in_raycluster(http_address: str) -> dict[str, Any]:
    """The e2e cluster as a user switching from Ray's autoscaler writes it: our image, and
    our settings in autoscalerOptions.env (test-speed timings, a loopback HTTP address)."""
    cluster = tpu_raycluster(replicas=0, max_replicas=2)
    settings = {
        "KUBERAY_SCALER_HTTP_ADDRESS": http_address,
        "KUBERAY_SCALER_LOG_FORMAT": "json",
        "KUBERAY_SCALER_IDLE_TIMEOUT_S": str(IDLE_TIMEOUT_S),
        "KUBERAY_SCALER_GCS_POLL_INTERVAL_S": "0.5",
        "KUBERAY_SCALER_RESYNC_INTERVAL_S": "5",
        "KUBERAY_SCALER_DRAIN_DEADLINE_S": "10",
        "KUBERAY_SCALER_SCALE_DOWN_DELAY_AFTER_ADD_S": "0",
        # Nor a reservation grace (600 s): a test's reservation is served, then its job ends.
        "KUBERAY_SCALER_RESERVATION_GRACE_S": "0",
    }
    cluster["spec"]["autoscalerOptions"] |= {
        "image": IMAGE,
        "env": [{"name": k, "value": v} for k, v in settings.items()],
    }
    return cluster


async def test_rendered_autoscaler_command_runs_kuberay_scaler_and_scales_a_slice(
    world: World,
) -> None:
    assert SHIM.is_file(), f"{SHIM} missing: run `make install` (the `ray` entry point)"
    http = f"127.0.0.1:{free_port()}"
    await world.create_raycluster(drop_in_raycluster(http))
    await world.ray_up()
    head = world.observer.head_pod()
    assert head is not None
    container = _autoscaler_container(head)
    assert container["image"] == IMAGE
    assert container.get("command") in KUBERAY_COMMANDS, container.get("command")
    assert container.get("args") == KUBERAY_ARGS, container.get("args")

    env = await resolve_env(container, head, lookup(world))
    assert env["RAY_CLUSTER_NAME"] == CLUSTER  # from the pod's ray.io/cluster label
    assert env["RAY_CLUSTER_NAMESPACE"] == world.namespace
    assert env["RAY_HEAD_POD_NAME"] == head["metadata"]["name"]
    argv = [expand(part, env) for part in [*container["command"], *container["args"]]]
    assert argv[-1] == (
        f"ray {SUBCOMMAND} --cluster-name {CLUSTER} --cluster-namespace {world.namespace}"
    )

    kubeconfig = await service_account_kubeconfig(world, head)
    bin_dir = image_path(world.workdir)
    settings = env | {
        "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "KUBERAY_SCALER_KUBECONFIG": str(kubeconfig),
        "KUBERAY_SCALER_GCS_ADDRESS": world.bridge.head.gcs_address if world.bridge.head else "",
    }
    log_path = world.workdir / "daemon-drop-in.log"
    daemon = Daemon.start(settings, log_path, argv)
    world.daemons.append(daemon)
    world.timeline.add(f"daemon started from the rendered command line {argv} (pid {daemon.pid})")
    assert daemon.http == http

    # --- sync: bash exec'd the shim, which exec'd the daemon (same PID: signals reach it) ----
    await world.wait_for(lambda: daemon_ready(daemon), 120, "the daemon's /readyz", async_ok=True)
    assert _program(daemon.pid)[-2:] == ["kuberay-scaler", "run"]
    await world.wait_for(lambda: _plans(daemon, TPU_GROUP), 60, "a plan", async_ok=True)

    # --- plan and scale: a slice reservation makes it ask for one whole slice ----------------
    driver = await world.start_driver(SLICE_RESERVATION)
    await world.wait_for(lambda: world.replicas() == 1, 90, "replicas 0 -> 1")
    await world.wait_for(lambda: len(world.running_slices()) == 1, SLICE_UP_S, "the slice up")
    await world.wait_for(lambda: "SLICE_READY" in driver.output(), 180, "the reservation placed")
    assert world.observer.replicas_seen(TPU_GROUP) == [0, 1], "never more than the one slice"
    assert world.workers_to_delete() == []
    assert await daemon.metric("kuberay_scaler_patches_total") >= 1
    world.assert_invariants()


async def _plans(daemon: Daemon, group: str) -> bool:
    plan = await daemon.plan()
    return plan is not None and group in {g["name"] for g in plan["groups"]}


def _program(pid: int) -> list[str]:
    """The process's argv, executables by their base name."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return [Path(part.decode()).name for part in argv if part]
