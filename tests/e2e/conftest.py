"""Fixtures of the e2e tier: one real control plane per session, one fresh world per test.

The control plane (etcd, kube-apiserver, kube-scheduler, kwok, KubeRay operator) comes from
`scripts/build-control-plane.sh`'s cache; every component logs under the session's work dir, and a
failing test gets the timeline, the daemon's log and the tails of every component's log attached
to its report.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path

import pytest

from tests.e2e.controlplane import Built, ControlPlane
from tests.e2e.world import World

_WORLD = pytest.StashKey[World]()
_PLANE = pytest.StashKey[ControlPlane]()


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    built = Built.locate()
    plane = ControlPlane.start(built, tmp_path_factory.mktemp("control-plane"))
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture
async def world(
    control_plane: ControlPlane, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[World]:
    """A fresh namespace with the observer and the Ray bridge running; torn down by PID."""
    test_world = World(control_plane, tmp_path)
    request.node.stash[_WORLD] = test_world
    try:
        await test_world.open()
        yield test_world
    finally:
        await test_world.close()


@pytest.fixture
async def bare_world(
    control_plane: ControlPlane, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[World]:
    """A fresh namespace with the observer but no Ray: pods stay kwok's fakes."""
    test_world = World(control_plane, tmp_path, ray=False)
    request.node.stash[_WORLD] = test_world
    try:
        await test_world.open()
        yield test_world
    finally:
        await test_world.close()


@pytest.fixture
def plane(control_plane: ControlPlane, request: pytest.FixtureRequest) -> ControlPlane:
    """The control plane alone, for tests that need no Ray; its log tails go into failures."""
    request.node.stash[_PLANE] = control_plane
    return control_plane


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, None]:
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    test_world = item.stash.get(_WORLD, None)
    if test_world is not None:
        for title, text in test_world.report():
            report.sections.append((title, text))
        return
    plane = item.stash.get(_PLANE, None)
    if plane is not None:
        for name, tail in plane.tails(40).items():
            report.sections.append((f"{name} (last lines)", tail))
