"""The daemon process imports only the parts of `ray` and `kubernetes_asyncio` it uses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

DAEMON_IMPORTS = """
import sys
from kuberay_scaler.runtime import lightimports
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
    code = "import ray.core.generated.autoscaler_pb2\n"
    code += "from kuberay_scaler.runtime import lightimports\n"
    code += "assert not lightimports.install()\nimport ray\nassert hasattr(ray, 'init')\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_run_installs_them_before_anything_imports_kubernetes_asyncio() -> None:
    # `run` checks the kubeconfig (importing kube.session) before it starts: stubs come first.
    code = (
        "import sys\nfrom kuberay_scaler.cli import main as cli\n"
        "try:\n    cli.main(['run'])\nexcept SystemExit:\n    pass\n"
        "print('kubernetes_asyncio.client.models.v1_pod' in sys.modules,"
        " 'ray._raylet' in sys.modules)"
    )
    env = {"PATH": "/usr/bin:/bin", "RAY_CLUSTER_NAME": "x", "KUBERAY_SCALER_KUBECONFIG": "/nope"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.stdout.strip().splitlines()[-1] == "False False", done.stderr


# Every import statement the daemon can run (module level or inside a function: found by
# reading the source, so a lazy import added later is checked too), in the modules the daemon
# can reach from its entry point, executed in a process where the stubs are installed first.
WALK = """
import importlib, json, sys
from kuberay_scaler.runtime import lightimports
assert lightimports.install()
failed = []
for importer, module, names in json.loads(sys.stdin.read()):
    try:
        target = importlib.import_module(module)
        for name in names:
            if not hasattr(target, name):
                importlib.import_module(f"{module}.{name}")
    except Exception as err:
        failed.append(f"{importer}: from {module} import {names}: {type(err).__name__}: {err}")
print(json.dumps(failed))
"""


def _daemon_modules() -> list[str]:
    """The modules of ours the `run` entry point can import, lazy imports included."""
    import grimp

    graph = grimp.build_graph("kuberay_scaler")
    entry = "kuberay_scaler.cli.main"
    reachable = graph.find_upstream_modules(entry, as_package=False) | {entry}
    return sorted(m for m in reachable if m.startswith("kuberay_scaler"))


def _import_statements(modules: list[str]) -> list[tuple[str, str, list[str]]]:
    """(importer, module, names) for every import statement in those modules' source."""
    import ast
    import importlib.util

    out: list[tuple[str, str, list[str]]] = []
    for name in modules:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None
        tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
        package = name if spec.submodule_search_locations else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                out += [(name, alias.name, []) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                module = importlib.util.resolve_name(
                    "." * node.level + (node.module or ""), package
                )
                out.append((name, module, [a.name for a in node.names if a.name != "*"]))
    return out


def _failures(statements: list[tuple[str, str, list[str]]]) -> list[str]:
    import json

    done = subprocess.run(
        [sys.executable, "-c", WALK],
        input=json.dumps(statements),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    failed: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return failed


def test_every_import_the_daemon_can_run_works_under_the_stubs() -> None:
    modules = _daemon_modules()
    assert {"kuberay_scaler.app", "kuberay_scaler.loop.reconciler"} <= set(modules)
    statements = _import_statements(modules)
    assert any(m.startswith("kubernetes_asyncio") for _, m, _ in statements)
    assert any(m.startswith("ray.") for _, m, _ in statements)
    assert _failures(statements) == []


def test_the_walk_catches_an_import_the_stubs_break() -> None:
    # What the issue found: the bare `kubernetes_asyncio.client` lacks the package's re-exports.
    bad = [("example", "kubernetes_asyncio.client", ["ApiException"])]
    (failure,) = _failures(bad)
    assert "ApiException" in failure
