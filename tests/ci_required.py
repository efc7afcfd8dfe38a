"""No silent skips in CI: under ``CI`` (set by .ci/run, and by most CI services), a skipped test
fails, unless it carries ``@pytest.mark.ci_may_skip("why CI may lack it")``.

Outside CI a skip stays a skip (a laptop without chromium, a Go toolchain or an e2e cache), and
its reason says how to get what is missing. ``CI=0``/``false``/empty means not CI.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import Any

import pytest

MARKER = "ci_may_skip"


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _reason(longrepr: Any) -> str:
    text = str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}(reason): this test may skip under CI (every other skip fails there)"
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or hasattr(report, "wasxfail") or not in_ci():
        return
    if item.get_closest_marker(MARKER) is not None:
        return
    report.outcome = "failed"
    report.longrepr = (
        f"skipped under CI, where this test is required: {_reason(report.longrepr)}\n"
        f"(mark it @pytest.mark.{MARKER}('why') only if CI truly cannot run it)"
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if report.skipped and in_ci():
        report.outcome = "failed"
        report.longrepr = f"a whole module skipped under CI: {_reason(report.longrepr)}"
