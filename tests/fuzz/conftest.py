"""Prints the fuzzer's measured time and memory per plan at the end of the run."""

from __future__ import annotations

from typing import Any


def pytest_terminal_summary(terminalreporter: Any) -> None:
    from tests.fuzz import test_gate_stateful, test_pipeline_fuzz

    for line in (test_pipeline_fuzz.report(), test_gate_stateful.coverage()):
        if line:
            terminalreporter.write_line(line)
