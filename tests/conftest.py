"""Session-wide: nothing a test run starts may outlive it (tests/reaper.py); under CI no test
skips unless marked so (tests/ci_required.py).

At the start, orphans of an earlier killed run are reaped (and named). At the end, any process
this run started that is still alive is named, killed by process group, and the run fails, on
success, failure and timeout alike.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests import reaper
from tests.ci_required import pytest_configure as _ci_configure
from tests.ci_required import (  # noqa: F401 (hooks: pytest finds them in this module)
    pytest_make_collect_report,
    pytest_runtest_makereport,
)

_session: dict[str, str] = {}


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
    _session["marker"] = reaper.mark_session()


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    marker = _session.get("marker")
    if not marker:
        return
    found = reaper.leftovers(marker)
    if not found:
        return
    reaper.reap(found)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    text = "\n  ".join(map(str, found))
    message = (
        f"{len(found)} process(es) started by this run were still alive (now killed):\n  {text}"
    )
    if reporter is not None:
        reporter.write_line(message, red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
