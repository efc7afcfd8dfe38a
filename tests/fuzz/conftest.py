"""Prints the fuzzer's measured time and memory per plan at the end of the run."""

from __future__ import annotations

from typing import Any


def pytest_terminal_summary(terminalreporter: Any) -> None:
    from tests.fuzz import test_pipeline_fuzz

    line = test_pipeline_fuzz.report()
    if line:
        terminalreporter.write_line(line)
