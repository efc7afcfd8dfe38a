"""Shared helpers for the Ray tier: real `ray start` processes on loopback, drivers in subprocesses.

Every test module that needs Ray starts ONE head (module-scoped, synchronous fixture) and stops it
at the end, so nothing outlives the module. GCS clients are per test (each test has its own
event loop).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import pytest_asyncio

from kuberay_scaler.adapters.ray_gcs.client import GcsClient
from kuberay_standins.ray_local import RayDriver, RayHead
from tests.ray.helpers import fast_client, head_explains


@pytest.fixture(scope="module")
def head() -> Iterator[RayHead]:
    ray_head = RayHead.start(ip="127.0.0.10")
    try:
        yield ray_head
    finally:
        ray_head.stop()


@pytest_asyncio.fixture
async def client(head: RayHead) -> AsyncIterator[GcsClient]:
    gcs = fast_client(head.gcs_address)
    try:
        yield gcs
    finally:
        await gcs.close()


@pytest.fixture
def start_driver(head: RayHead) -> Iterator[Callable[..., RayDriver]]:
    """Start drivers against the module's head; all are killed when the test ends."""
    started: list[RayDriver] = []

    def start(body: str, **kwargs: Any) -> RayDriver:
        with head_explains(head):
            driver = RayDriver.start(
                head.gcs_address, body, node_ip=head.ip, env=head.client_env(), **kwargs
            )
        started.append(driver)
        return driver

    try:
        yield start
    finally:
        for driver in started:
            driver.stop()
