"""The benchmark on a tiny input: it runs, and where both planners must agree, they do."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"
sys.path.insert(0, str(BENCH))

import bench_planner  # noqa: E402
import ray_side  # noqa: E402
import scenario  # noqa: E402

from kuberay_scaler.adapters.ray_gcs.state import parse_ray_state  # noqa: E402
from kuberay_scaler.core.model.plan import Memory  # noqa: E402
from kuberay_scaler.core.planner.pipeline import plan  # noqa: E402
from kuberay_scaler.core.planner.policy import Policy  # noqa: E402
from tests.factories import NOW_MS  # noqa: E402

TINY = scenario.Scale(slices=0.05, demand=0.05)


@pytest.fixture(scope="module")
def rows() -> list[dict[str, object]]:
    sc = scenario.build(scale=TINY, pinned=True)
    result = plan(
        bench_planner._snapshot(sc),
        parse_ray_state(sc.reply(), read_at_ms=NOW_MS),
        Memory(),
        Policy(),
        bench_planner.NOW,
    )
    request = ray_side.scheduling_request(sc.raycluster, sc.state)
    return bench_planner.compare(sc, result, request, ray_side.schedule(request))


def test_scenario_has_the_documented_size() -> None:
    sc = scenario.build()
    assert len(sc.raycluster["spec"]["workerGroupSpecs"]) == 20
    assert sc.num_slices == 1_000
    assert sc.num_bundles == 10_000


def test_plain_cpu_groups_agree_with_ray_when_demand_is_pinned(
    rows: list[dict[str, object]],
) -> None:
    cpu = [r for r in rows if str(r["group"]).startswith("cpu-")]
    assert len(cpu) == 8
    assert all(r["agree"] for r in cpu), cpu
    assert any(r["ours"] != r["current"] for r in cpu)  # something was actually decided


def test_ray_counts_hosts_and_we_count_slices(rows: list[dict[str, object]]) -> None:
    for r in rows:
        assert r["ours_hosts"] == r["ours"] * r["num_of_hosts"]  # type: ignore[operator]
        assert r["ray_replicas"] == r["ray_hosts"] // r["num_of_hosts"]  # type: ignore[operator]


def test_main_prints_the_ratio_and_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_planner.main(["--scale", "0.02", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "time ratio ours/Ray:" in out
    assert "| cpu-4-a | 1 |" in out
