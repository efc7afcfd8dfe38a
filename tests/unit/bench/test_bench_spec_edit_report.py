"""The spec edit → patch numbers (bench/bench_spec_edit.py) reach the generated section of
docs/benchmarks.md: summary, table and issue 22's goals (p50 ≤ 2 s, p99 ≤ 5 s)."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[3] / "bench"
sys.path.insert(0, str(BENCH))

import report  # noqa: E402
from bench_spec_edit import summary  # noqa: E402


def _result(ours: list[float | None], ray: list[float]) -> dict[str, object]:
    rows = [
        {"trial": i + 1, "round": 0, "load1": 2.0 + i, "ours": o, "ray-v2": r}
        for i, (o, r) in enumerate(zip(ours, ray, strict=True))
    ]
    return {"trials": rows, "summary": summary(rows)}


def test_summary_has_quantiles_max_and_misses() -> None:
    s = _result([0.5, 1.0, 1.5, None], [2.0, 3.0, 4.0, 6.0])["summary"]
    assert isinstance(s, dict)
    assert (s["ours"]["n"], s["ours"]["missed"], s["ours"]["max"]) == (3, 1, 1.5)
    assert s["ours"]["p50"] == 1.0
    assert s["ray-v2"]["max"] == 6.0
    assert s["ratio_ray-v2_over_ours"]["median"] == 3.0


def test_section_and_goals() -> None:
    data = _result([0.5, 1.0, 1.5], [2.0, 3.0, 4.0])
    text = "\n".join(report._spec_edit(data))
    assert "(3 paired trials)" in text
    assert "p99 is about the maximum" in text
    assert "| Ray v2 | 3.00 s |" in text
    assert "load average during the trials: 2.0–4.0" in text
    goals = report._goals_22(data)
    assert [(name, ok) for name, _, _, ok in goals] == [
        ("spec edit → patch p50 ≤ 2 s", True),
        ("spec edit → patch p99 ≤ 5 s", True),
    ]
    missed = _result([0.5, 1.0, None], [2.0, 3.0, 4.0])
    assert [ok for *_, ok in report._goals_22(missed)] == [False, False]
