"""Session-wide: nothing a test run starts may outlive it, processes or temp dirs
(tests/reaper.py); under CI no test skips unless marked so (tests/ci_required.py).

At the start, orphans of an earlier killed run are reaped (processes named) and their temp dirs
removed. At the end, any process this run started that is still alive is named, killed by process
group, and the run fails, on success, failure and timeout alike; its temp dirs still there are
named and removed (a line in the report, not a failure: nothing is left either way).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import settings

from tests import reaper
from tests.ci_required import pytest_configure as _ci_configure
from tests.ci_required import (  # noqa: F401 (hooks: pytest finds them in this module)
    pytest_make_collect_report,
    pytest_runtest_makereport,
)

if TYPE_CHECKING:
    from kuberay_standins.harness import LocalCluster

# No property test may fail on how long an example took: a loaded machine stalls any example
# (hypothesis' default 200 ms deadline does, outside its own CI profile). The rest of the
# profile in force (CI's, when CI is set) is kept.
settings.register_profile(
    "suite", settings.get_profile(settings.get_current_profile_name()), deadline=None
)
settings.load_profile("suite")

_session: dict[str, str] = {}
_run: dict[str, Any] = {
    "started": time.monotonic(),
    "tiers": Counter(),
    "seen": set(),
    "named": Counter(),
}


def pytest_configure(config: Any) -> None:
    _ci_configure(config)
    found = reaper.orphans()
    if found:
        reaper.reap(found)
        lines = "\n  ".join(map(str, found))
        config.issue_config_time_warning(
            pytest.PytestWarning(f"reaped {len(found)} orphan(s) of an earlier run:\n  {lines}"),
            stacklevel=2,
        )
    reaper.remove_dirs(reaper.orphan_dirs())  # an earlier killed run's scratch dirs
    _session["marker"] = reaper.mark_session()
    _run["config"] = config


def _tier(nodeid: str) -> str:
    parts = nodeid.split("::", 1)[0].split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else ""


@pytest.hookimpl(trylast=True)  # after `-m` deselection: count what runs
def pytest_collection_modifyitems(items: list[Any]) -> None:
    _run["tiers"] = Counter(_tier(item.nodeid) for item in items)


# Tiers whose tests take a minute or more each: every test is named as it starts, so a person
# sees the run is alive (13 integration tests are ~12 minutes of otherwise silent dots).
NAMED_TIERS = frozenset({"integration", "e2e", "image"})


def pytest_runtest_logstart(nodeid: str) -> None:
    """A line as each tier starts (unit, contract, ray, integration...) when the run spans more
    than one tier, and one per test of a slow tier: progress a newcomer can read, rather than
    minutes of dots."""
    tiers, seen, tier = _run["tiers"], _run["seen"], _tier(nodeid)
    reporter = _run["config"].pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    elapsed = time.monotonic() - _run["started"]
    if len(tiers) >= 2 and tier not in seen:
        seen.add(tier)
        _line_start(reporter)
        reporter.write_line(
            f"-- tier {tier or '(top)'}: {tiers[tier]} tests "
            f"({len(seen)} of {len(tiers)} tiers, {elapsed / 60:.1f} min in) --"
        )
    if tier in NAMED_TIERS and _run["config"].option.verbose <= 0:  # -v names every test
        _run["named"][tier] += 1
        _line_start(reporter)
        reporter.write(
            f"   {tier} {_run['named'][tier]} of {tiers[tier]}, {elapsed / 60:.1f} min in: "
            f"{nodeid.split('/', 2)[-1]} "
        )


def _line_start(reporter: Any) -> None:
    if getattr(reporter._tw, "width_of_current_line", 0):  # after a line of dots
        reporter.write("\n")


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    marker = _session.get("marker")
    if not marker:
        return
    found = reaper.leftovers(marker)
    if found:
        reaper.reap(found)
    dirs = reaper.leftover_dirs(marker)  # after the kill: live processes write into them
    reaper.remove_dirs(dirs)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if dirs and reporter is not None:
        text = "\n  ".join(map(str, dirs))
        reporter.write_line(f"removed {len(dirs)} temp dir(s) this run left:\n  {text}")
    if not found:
        return
    text = "\n  ".join(map(str, found))
    message = (
        f"{len(found)} process(es) started by this run were still alive (now killed):\n  {text}"
    )
    if reporter is not None:
        reporter.write_line(message, red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_runtest_logreport(report: Any) -> None:
    """A failure is named when it happens (its details come at the end, as usual)."""
    if not report.failed:
        return
    reporter = _run["config"].pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    crash = getattr(report.longrepr, "reprcrash", None)
    why = crash.message.splitlines()[0][:200] if crash is not None and crash.message else ""
    if getattr(reporter._tw, "width_of_current_line", 0):
        reporter.write("\n")
    reporter.write_line(f"FAILED {report.nodeid} ({report.when}): {why}", red=True)


# The local cluster of the integration and image tiers. The stand-ins are imported when a test
# asks for it: a unit run does not pay for them.
@pytest.fixture
def local_raycluster() -> dict[str, Any]:
    """The RayCluster `cluster` serves: the demo's; a module overrides this to serve another."""
    from kuberay_standins.demo import Scenario, demo_raycluster

    return demo_raycluster(Scenario())


@pytest.fixture
def judge_writes() -> bool:
    """Whether `cluster` judges every RayCluster write the daemon makes (tests/invariants); a
    module overrides this to say True."""
    return False


@pytest.fixture
async def cluster(
    local_raycluster: dict[str, Any], judge_writes: bool
) -> AsyncIterator[LocalCluster]:
    """The stand-ins (API server, operator, kubelet) serving `local_raycluster`, and a real Ray
    head on loopback."""
    from kuberay_standins.harness import LocalCluster
    from tests.invariants import watch_local_cluster

    async with LocalCluster(local_raycluster, pod_start_delay=0.5) as local:
        if not judge_writes:
            yield local
            return
        feed = watch_local_cluster(local)
        try:
            yield local
            await feed.drain()
        finally:
            await feed.close()
        feed.checker.assert_clean()
