"""The daemon process imports only the parts of `ray` and `kubernetes_asyncio` it uses."""

from __future__ import annotations

import subprocess
import sys

DAEMON_IMPORTS = """
import sys
from kuberay_scaler import lightimports
assert lightimports.install()
import kuberay_scaler.app
import kubernetes_asyncio.config
from kubernetes_asyncio.client import ApiClient, Configuration
from ray.core.generated import autoscaler_pb2
skipped = ("ray._raylet", "ray._private.worker", "kubernetes_asyncio.client.models.v1_pod")
heavy = [m for m in skipped if m in sys.modules]
assert not heavy, heavy
assert autoscaler_pb2.GetClusterResourceStateReply().cluster_resource_state is not None
import kubernetes_asyncio.client.models as models
assert models.V1Pod.__name__ == "V1Pod"  # still there when something does need a model
print("ok")
"""


def test_the_daemon_skips_ray_s_runtime_and_the_kubernetes_models() -> None:
    done = subprocess.run(
        [sys.executable, "-c", DAEMON_IMPORTS], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_nothing_is_stubbed_once_ray_is_imported() -> None:
    code = "import ray.core.generated.autoscaler_pb2\nfrom kuberay_scaler import lightimports\n"
    code += "assert not lightimports.install()\nimport ray\nassert hasattr(ray, 'init')\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_run_installs_them_before_anything_imports_kubernetes_asyncio() -> None:
    # `run` checks the kubeconfig (importing kube.session) before it starts: stubs come first.
    code = (
        "import sys\nfrom kuberay_scaler import cli\n"
        "try:\n    cli.main(['run'])\nexcept SystemExit:\n    pass\n"
        "print('kubernetes_asyncio.client.models.v1_pod' in sys.modules,"
        " 'ray._raylet' in sys.modules)"
    )
    env = {"PATH": "/usr/bin:/bin", "RAY_CLUSTER_NAME": "x", "KUBERAY_SCALER_KUBECONFIG": "/nope"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.stdout.strip().splitlines()[-1] == "False False", done.stderr
