"""The built image, run as KubeRay and the restricted PSS would run it: uid 10001, read-only root
filesystem, host networking (so loopback stand-ins and Ray are reachable). `make image` builds it
first (scripts/build-image.sh); these tests never build.

Runs with podman configured as what works on this machine kind (runc, vfs, cgroupfs, default
ulimits; see scripts/build-image.sh), storage in the cache directory the build used.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from kuberay_standins.harness import LocalCluster
from kuberay_standins.ray_local import RayDriver, free_port

pytestmark = [pytest.mark.image, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
VERSION = next(
    line.split('"')[1]
    for line in (ROOT / "pyproject.toml").read_text().splitlines()
    if line.startswith("version = ")
)
IMAGE = os.environ.get("IMAGE", f"localhost/kuberay-scaler:{VERSION}")
CACHE = Path(os.environ.get("KUBERAY_SCALER_CACHE", Path.home() / ".cache" / "kuberay-scaler"))
PODMAN = [
    "podman",
    "--root",
    str(CACHE / "images" / "storage"),
    "--runroot",
    str(CACHE / "images" / "run"),
    "--storage-driver",
    "vfs",
    "--runtime",
    "runc",
    "--cgroup-manager",
    "cgroupfs",
]
RUN = [
    "run",
    "--rm",
    "--network",
    "host",
    "--read-only",
    "--user",
    "10001",
    "--ulimit",
    "nofile=1024:1024",
    "--ulimit",
    "nproc=1024:1024",
]
SIZE_GOAL_MB = 400
RESERVE_SLICE = """
from ray.util.tpu import SlicePlacementGroup
handle = SlicePlacementGroup(topology="4x4", accelerator_version="v6e",
                             head_reservation_timeout_s=600)
ray.get(handle.placement_group.ready(), timeout=600)
print("SLICE_READY", flush=True)
"""


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PODMAN, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def run_image(*args: str, entrypoint: str | None = None) -> subprocess.CompletedProcess[str]:
    before = [] if entrypoint is None else ["--entrypoint", entrypoint]
    return podman(*RUN, *before, IMAGE, *args)


@pytest.fixture(scope="module", autouse=True)
def built() -> Iterator[None]:
    if shutil.which("podman") is None:
        pytest.fail("no podman: `make image` installs nothing; see .ci/run for the apt packages")
    found = podman("image", "exists", IMAGE)
    assert found.returncode == 0, f"{IMAGE} not built: run `make image` ({found.stderr})"
    yield


def test_image_size_within_goal() -> None:
    size = int(podman("image", "inspect", "--format", "{{.Size}}", IMAGE).stdout.strip())
    print(f"image {IMAGE}: {size / 1e6:.0f} MB")
    assert size <= SIZE_GOAL_MB * 1_000_000, f"{size / 1e6:.0f} MB > {SIZE_GOAL_MB} MB"


def test_version_and_identity() -> None:
    done = run_image("version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == VERSION
    config = json.loads(
        podman("image", "inspect", "--format", "{{json .Config}}", IMAGE).stdout or "{}"
    )
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["kuberay-scaler"]


def test_check_config_on_a_read_only_root() -> None:
    done = podman(
        *RUN, "-e", "RAY_CLUSTER_NAME=c", "-e", "RAY_CLUSTER_NAMESPACE=ns", IMAGE, "check-config"
    )
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["RAY_CLUSTER_NAME"] == "c"
    assert shown["KUBERAY_SCALER_HTTP_ADDRESS"] == "0.0.0.0:44217"
    bad = podman(*RUN, "-e", "KUBERAY_SCALER_DRY_RUN=maybe", IMAGE, "check-config")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_only_the_daemon_is_in_the_image() -> None:
    """No stand-ins, no Ray CLI: `ray` is our shim, first on a login shell's PATH."""
    probe = run_image(
        "-lc",
        "id -u; command -v ray; readlink -f $(command -v ray); "
        "/opt/kuberay-scaler/bin/python -c 'import importlib.util as u; "
        'print(u.find_spec("kuberay_standins"), u.find_spec("kuberay_scaler") is not None)\'; '
        "touch /x 2>/dev/null && echo writable || echo read-only",
        entrypoint="/bin/bash",
    )
    assert probe.returncode == 0, probe.stderr
    uid, ray, target, specs, root = probe.stdout.split("\n")[:5]
    assert uid == "10001"
    assert ray == "/usr/local/bin/ray"
    assert target == "/opt/kuberay-scaler/bin/kuberay-scaler-ray"
    assert specs == "None True"
    assert root == "read-only"
    # Login shell (KubeRay 1.2-1.3, or ENABLE_LOGIN_SHELL), plain shell (1.4-1.7) and the
    # exec form on the image's PATH (1.1): each finds our `ray`.
    for args, entrypoint in (
        (("-lc", "ray status"), "/bin/bash"),
        (("-c", "ray status"), "/bin/bash"),
        (("status",), "ray"),
    ):
        refused = run_image(*args, entrypoint=entrypoint)
        assert refused.returncode == 2, (args, refused.stderr)
        assert refused.stderr.strip().splitlines() == [
            "kuberay-scaler: this image runs kuberay-scaler, not Ray: `ray status` is not"
            " available (only `ray kuberay-autoscaler`, which starts `kuberay-scaler run`)"
        ]


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return 0


def _container_args(cluster: LocalCluster, name: str, config_dir: Path, http: str) -> list[str]:
    """`podman run` of KubeRay's autoscaler command line (KubeRay < 1.7, login shell)."""
    env = {
        k: v
        for k, v in cluster.daemon_env(KUBERAY_SCALER_HTTP_ADDRESS=http).items()
        if k.startswith(("RAY_", "KUBERAY_"))
    }
    env["KUBERAY_SCALER_KUBECONFIG"] = "/config/kubeconfig"
    flags: list[str] = ["--name", name, "-v", f"{config_dir}:/config:ro"]
    for key, value in sorted(env.items()):
        flags += ["-e", f"{key}={value}"]
    command = (
        "ray kuberay-autoscaler --cluster-name $RAY_CLUSTER_NAME "
        "--cluster-namespace $RAY_CLUSTER_NAMESPACE"
    )
    return [*PODMAN, *RUN, *flags, "--entrypoint", "/bin/bash", IMAGE, "-lc", "--", command]


def _start(argv: Sequence[str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("wb") as out:
        return subprocess.Popen(
            list(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )


def _config_dir(kubeconfig: Path) -> Path:
    """A folder to mount read-only, with a kubeconfig uid 10001 can read."""
    folder = Path(tempfile.mkdtemp(prefix="krs-image-"))
    folder.chmod(0o755)
    shutil.copy(kubeconfig, folder / "kubeconfig")
    (folder / "kubeconfig").chmod(0o644)
    return folder


async def test_daemon_in_the_image_scales_a_slice_up(cluster: LocalCluster) -> None:
    config_dir = _config_dir(cluster.kubeconfig())
    http = f"127.0.0.1:{free_port()}"
    name = f"krs-image-{uuid.uuid4().hex[:8]}"
    log_path = config_dir / "container.log"
    container = await asyncio.to_thread(
        _start, _container_args(cluster, name, config_dir, http), log_path
    )
    driver: RayDriver | None = None
    try:
        await cluster.wait_for(
            lambda: _get(f"http://{http}/readyz") == 200 or container.poll() is not None,
            180,
            "the containerised daemon's /readyz",
        )
        assert container.poll() is None, log_path.read_text()
        assert cluster.head is not None
        driver = await asyncio.to_thread(
            RayDriver.start,
            cluster.head.gcs_address,
            RESERVE_SLICE,
            node_ip=cluster.head.ip,
            env=cluster.head.client_env(),
            wait_ready=False,
        )
        ready = driver
        await cluster.wait_for(lambda: "SLICE_READY" in ready.output(), 300, "the slice")
        pods = cluster.worker_pods("tpu-group")
        assert len(pods) == 4, "one whole slice"
        labels = {p["metadata"]["labels"]["ray.io/worker-group-replica-name"] for p in pods}
        assert len(labels) == 1
        assert cluster.violations == []
        assert container.poll() is None, log_path.read_text()
    finally:
        if driver is not None:
            await asyncio.to_thread(driver.stop)
        await asyncio.to_thread(podman, "stop", "--time", "15", name)
        code = await asyncio.to_thread(container.wait, 60)
        shutil.rmtree(config_dir, ignore_errors=True)
    assert code == 0, "the daemon stops cleanly on SIGTERM (exec chain: bash -> ray -> daemon)"
