"""`make bench` / `make bench QUICK=1`: every benchmark, ours and Ray's in the same run.

    .venv/bin/python bench/run.py [--quick] [--out bench/results/full.json] [--no-docs]

Full mode regenerates the results section of docs/benchmarks.md and its plots (docs/img/);
quick mode (≤ 5 min, plus ~3 min of fallback trials) writes bench/results/quick.json and
bench/results/quick.md only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_fallback
import bench_frame
import bench_gcs_poll
import bench_live
import bench_reconcile
import bench_rss
import bench_scale_live
import bench_shapes
import bench_spec_edit
import pyspy_summary
import report
from common import loadavg, machine

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mode:
    name: str
    trials: int
    sizes: tuple[int, ...]
    window_s: float
    long_s: float
    gcs_nodes: tuple[int, ...]
    gcs_window_s: float
    reconcile_sizes: tuple[int, ...]
    planner_scale: float
    fallback_trials: int
    fallback_window_s: float  # how long Ray v2's stuck pods are watched per trial


QUICK = Mode("quick", 8, (100, 1000), 15, 0, (1000, 10000), 10, (1000, 10000), 0.03, 3, 30)
FULL = Mode("full", 24, (100, 1000, 10000), 45, 180, (1000, 10000), 20, (1000, 10000), 0.1, 8, 60)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out")
    parser.add_argument("--no-docs", action="store_true")
    args = parser.parse_args()
    mode = QUICK if args.quick else FULL
    out = Path(args.out or ROOT / "bench" / "results" / f"{mode.name}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    results: dict[str, Any] = {"mode": mode.__dict__, "env": environment()}
    loads: list[tuple[str, tuple[float, float, float]]] = [("start", loadavg())]

    def log(text: str) -> None:
        print(f"[{time.monotonic() - started:6.0f} s] {text}", flush=True)

    def save() -> None:
        results["loads"] = loads
        results["elapsed_s"] = round(time.monotonic() - started)
        out.write_text(json.dumps(results, indent=1))

    log(f"{mode.name} mode; load {loadavg()}")
    results["reconcile"] = bench_reconcile.run(mode.reconcile_sizes, log)
    loads.append(("after reconcile", loadavg()))
    save()
    results["gcs_poll"] = [
        asyncio.run(bench_gcs_poll.measure(n, mode.gcs_window_s)) for n in mode.gcs_nodes
    ]
    log(f"gcs poll: {json.dumps(results['gcs_poll'])[:400]}")
    loads.append(("after gcs poll", loadavg()))
    save()
    results["live"] = asyncio.run(
        bench_live.run(
            trials=mode.trials,
            sizes=list(mode.sizes),
            window_s=mode.window_s,
            long_s=mode.long_s,
            log=log,
        )
    )
    loads.append(("after live", loadavg()))
    save()
    results["spec_edit"] = asyncio.run(bench_spec_edit.run(trials=mode.trials, log=log))
    table = bench_spec_edit.markdown(results["spec_edit"])
    out.with_name(f"{mode.name}-spec-edit.md").write_text(table + "\n")
    log(f"spec edit -> patch:\n{table}")
    save()
    # A group that cannot get capacity → the fallback group's PATCH, ours vs Ray v2.
    results["fallback"] = asyncio.run(
        bench_fallback.run(trials=mode.fallback_trials, log=log, window_s=mode.fallback_window_s)
    )
    table = bench_fallback.markdown(results["fallback"])
    out.with_name(f"{mode.name}-fallback.md").write_text(table + "\n")
    log(f"fallback:\n{table}")
    loads.append(("after fallback", loadavg()))
    save()
    results["planner"] = planner(mode.planner_scale, log)
    loads.append(("after planner", loadavg()))
    save()
    # Planning cost over distinct shapes, the decision frame, memory at real pod size.
    quick = mode.name == "quick"
    results["shapes"] = bench_shapes.run(quick=quick, log=log)
    save()
    frame_sizes = (10_000,) if quick else (10_000, 100_000)
    results["frame"] = bench_frame.run(frame_sizes, log, repeats=1 if quick else 3)
    save()
    # Ours live at 1k / 10k Ray nodes against a GCS stand-in: idle CPU and reaction (P1).
    # Trials 2-12 s apart: about half start from the idle cadence (the p99 that matters).
    # py-spy samples the daemon through the 10k trials: where its time goes at that size.
    spy = out.parent / f"{mode.name}-pyspy-10000.txt"
    results["scale_live"] = [
        asyncio.run(
            bench_scale_live.measure(
                n,
                30 if quick else 60,
                6 if quick else 12,
                phase=(2.0, 12.0),
                py_spy=str(spy) if n == 10_000 else None,
            )
        )
        for n in (1_000, 10_000)
    ]
    if spy.exists():
        results["pyspy_10k"] = pyspy_summary.summary(pyspy_summary.read(spy), top=12)
    log(f"scale live: {json.dumps(results['scale_live'])[:400]}")
    loads.append(("after scale live", loadavg()))
    save()
    results["rss"] = bench_rss.measure(10_000)
    log(f"rss at 10k real-size pods: {results['rss']}")
    loads.append(("end", loadavg()))
    save()
    to_docs = not (args.quick or args.no_docs)
    plots = ROOT / "docs" / "img" if to_docs else out.parent / "img"
    md = report.render(results, plots_dir=plots)
    if not to_docs:
        out.with_suffix(".md").write_text(md)
        log(f"wrote {out} and {out.with_suffix('.md')}")
    else:
        report.write_docs(ROOT / "docs" / "benchmarks.md", md)
        log(f"wrote {out} and docs/benchmarks.md")
    return 0


def planner(scale: float, log: Any) -> dict[str, Any]:
    path = ROOT / "bench" / "results" / "planner.json"
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "bench_planner.py"),
        "--repeats",
        "1",
        "--scale",
        str(scale),
        "--json",
        str(path),
    ]
    log(f"planner: {' '.join(cmd[1:])}")
    subprocess.run(cmd, check=True, capture_output=True)
    data: dict[str, Any] = json.loads(path.read_text())
    data["scale"] = scale
    return data


def environment() -> dict[str, Any]:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    versions = {
        name: metadata.version(name)
        for name in ("ray", "grpcio", "protobuf", "kubernetes-asyncio", "aiohttp")
    }
    return {
        "when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit,
        "machine": machine(),
        "versions": versions,
    }


if __name__ == "__main__":
    raise SystemExit(main())
