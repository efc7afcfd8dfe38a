"""Shared fixtures for the Kubernetes contract tests: the API-server stand-in over real HTTP on
loopback, clients opened from a kubeconfig it writes, and sample objects."""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio.client import ApiClient

from kuberay_scaler.adapters.kube.informer import Change
from kuberay_scaler.adapters.kube.session import open_api
from kuberay_scaler.runtime.metrics import KubeCounters
from kuberay_standins.apiserver import ADMIN_TOKEN, ApiServerStandIn
from tests.factories import SAMPLES

NAMESPACE = "default"
CLUSTER = "rc"
GROUP = "tpu-group"
SAMPLE = SAMPLES / "ray-cluster.tpu-v6e-16-multihost.yaml"

Connect = Callable[[str], Awaitable[ApiClient]]


@pytest.fixture
async def apiserver() -> AsyncIterator[ApiServerStandIn]:
    server = ApiServerStandIn(bookmark_interval=0.1)
    await server.start()
    try:
        yield server
    finally:
        server.faults.refuse_connections(False)
        await server.stop()


@pytest.fixture
async def connect(apiserver: ApiServerStandIn, tmp_path: Path) -> AsyncIterator[Connect]:
    """Open a client for a token through a kubeconfig file, as the daemon would."""
    clients: list[ApiClient] = []

    async def open_for(token: str) -> ApiClient:
        kubeconfig = tmp_path / f"kubeconfig-{len(clients)}"
        apiserver.write_kubeconfig(kubeconfig, token=token, namespace=NAMESPACE)
        client = await open_api(str(kubeconfig), request_timeout=5.0)
        clients.append(client)
        return client

    yield open_for
    for client in clients:
        await client.close()


@pytest.fixture
async def api(connect: Connect) -> ApiClient:
    return await connect(ADMIN_TOKEN)


def pod(
    name: str, *, cluster: str = CLUSTER, group: str = GROUP, node: str | None = None
) -> dict[str, Any]:
    """A worker pod as KubeRay labels it; `node` makes it scheduled (graceful deletion)."""
    spec: dict[str, Any] = {"containers": [{"name": "ray-worker", "image": "rayproject/ray"}]}
    if node is not None:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {
                "ray.io/cluster": cluster,
                "ray.io/group": group,
                "ray.io/node-type": "worker",
            },
        },
        "spec": spec,
    }


def raycluster(name: str = CLUSTER, replicas: int = 1) -> dict[str, Any]:
    """The v6e-16 multi-host sample (4 hosts per slice), renamed."""
    obj: dict[str, Any] = copy.deepcopy(yaml.safe_load(SAMPLE.read_text()))
    obj["metadata"] = {"name": name, "namespace": NAMESPACE}
    obj["spec"]["workerGroupSpecs"][0]["replicas"] = replicas
    obj["spec"]["workerGroupSpecs"][0]["maxReplicas"] = 8
    return obj


def truth(server: ApiServerStandIn, resource: str = "pods") -> dict[str, str]:
    """name -> resourceVersion of the objects the informer under test should hold."""
    selector = f"ray.io/cluster={CLUSTER}" if resource == "pods" else None
    return {o["metadata"]["name"]: o["metadata"]["resourceVersion"]
            for o in server.list(resource, NAMESPACE, selector)}  # fmt: skip


def view(store: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    return {name: obj["metadata"]["resourceVersion"] for name, obj in store.items()}


async def eventually(check: Callable[[], bool], what: str, limit: float = 20.0) -> None:
    """Wait until `check()` holds. `limit` only guards against a hang; no timing is asserted."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"never happened: {what}")
        await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def running(job: Coroutine[Any, Any, None]) -> AsyncIterator[asyncio.Task[None]]:
    """Run `job` as a task for the block; a crash of the task fails the test."""
    task = asyncio.create_task(job)
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def metric(counters: KubeCounters, name: str, **labels: str) -> float:
    """A sample of the counters a test handed to the adapter it built (0 before any)."""
    return counters.sample(name, labels) or 0.0


class ChangeLog:
    """An `on_change` callback that keeps every batch, to inspect what the informer applied."""

    def __init__(self) -> None:
        self.batches: list[list[Change]] = []

    def __call__(self, changes: Sequence[Change]) -> None:
        self.batches.append(list(changes))

    @property
    def changes(self) -> list[Change]:
        return [change for batch in self.batches for change in batch]
