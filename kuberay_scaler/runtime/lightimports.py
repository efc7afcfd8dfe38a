"""Keep the daemon process small: import only the parts of `ray` and `kubernetes_asyncio` it uses.

The daemon needs Ray's generated protobuf modules (`ray.core.generated.*`) and nothing else of
`ray`, but importing them runs `ray/__init__.py` (the worker, the raylet bindings: ~35 MB and a
second). From `kubernetes_asyncio` it needs `ApiClient`, `Configuration` and the kubeconfig
loader, but `kubernetes_asyncio.client` imports every API and ~800 model classes (~25 MB), which
responses read raw (`_preload_content=False`) never touch.

`install()` registers the two packages as plain package modules over their real directories
(so submodules import from the wheel as usual, without the package `__init__`), and the models
module lazily. Call it first thing in the daemon process; it does nothing when those packages are
already imported (a test process or a script that uses the real `ray`), because a later
`import ray` would otherwise get the bare package.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import types


def install() -> bool:
    """True when installed; False when `ray` or `kubernetes_asyncio` was already imported."""
    if any(name in sys.modules for name in ("ray", "kubernetes_asyncio")):
        return False
    _bare_package("ray")
    _bare_package("kubernetes_asyncio")
    client = _bare_package("kubernetes_asyncio.client")
    _lazy_module("kubernetes_asyncio.client.models")
    client.Configuration = importlib.import_module(  # type: ignore[attr-defined]
        "kubernetes_asyncio.client.configuration"
    ).Configuration
    client.ApiClient = importlib.import_module(  # type: ignore[attr-defined]
        "kubernetes_asyncio.client.api_client"
    ).ApiClient
    return True


def _bare_package(name: str) -> types.ModuleType:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None:
        raise ImportError(f"{name} is not an installed package")
    module = types.ModuleType(name)
    module.__path__ = list(spec.submodule_search_locations)
    module.__spec__ = spec
    module.__file__ = spec.origin
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)
    return module


def _lazy_module(name: str) -> None:
    """A stand-in module that loads the real one on the first attribute it lacks (PEP 562).

    Not importlib's LazyLoader: the import system reads `__spec__` of every module it finds in
    sys.modules, which would load a LazyLoader module at once.
    """
    parent_name, _, child = name.rpartition(".")
    parent = sys.modules[parent_name]
    spec = importlib.machinery.PathFinder.find_spec(name, list(parent.__path__))
    if spec is None or spec.loader is None:
        raise ImportError(f"{name} not found")
    stub = types.ModuleType(name)
    stub.__spec__ = spec
    stub.__path__ = list(spec.submodule_search_locations or [])

    def load_real(attr: str) -> object:
        real = importlib.util.module_from_spec(spec)
        sys.modules[name] = real
        setattr(parent, child, real)
        assert spec.loader is not None
        spec.loader.exec_module(real)
        return getattr(real, attr)

    stub.__getattr__ = load_real  # type: ignore[method-assign]
    sys.modules[name] = stub
    setattr(parent, child, stub)
