"""Benchmark: our planner against Ray's v2 ResourceDemandScheduler on the same large input.

    .venv/bin/python bench/bench_planner.py [--repeats 5] [--scale 1.0] [--json out.json]

Builds 20 worker groups with 1,000 slices and 10,000 pending bundles (scenario.py), times
`plan()` and Ray's `schedule()` on it (median of the repeats, each on a fresh request), and
compares the replica targets. Both run in this process, one after the other, on the same CPU.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ray_side
import scenario

from kuberay_scaler.adapters.ray_gcs.state import parse_ray_state
from kuberay_scaler.core.model.plan import Memory, Plan, Snapshot
from kuberay_scaler.core.model.ray import epoch_ms
from kuberay_scaler.core.parse.pods import parse_pods
from kuberay_scaler.core.parse.raycluster import parse_raycluster
from kuberay_scaler.core.planner.pipeline import Policy, plan

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


@dataclass(frozen=True)
class Timing:
    ours_s: float
    ours_with_parse_s: float
    ray_s: float

    @property
    def ratio(self) -> float:
        return self.ours_s / self.ray_s


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    scale = scenario.Scale(args.scale, args.scale)
    sc = scenario.build(seed=args.seed, scale=scale, pinned=args.variant == "pinned")
    hosts = sum(1 for n in sc.state.node_states) - 1
    groups = len(sc.raycluster["spec"]["workerGroupSpecs"])
    print(
        f"input ({args.variant}): {groups} groups, {sc.num_slices} slices"
        f" ({hosts} hosts), {sc.num_bundles} pending bundles"
        f" ({len(sc.state.pending_resource_requests)} task entries,"
        f" {len(sc.state.pending_gang_resource_requests)} placement groups)",
        flush=True,
    )
    ours, ours_parse, result = _time_ours(sc, args.repeats)
    ray_time, request, reply = _time_ray(sc, args.repeats)
    timing = Timing(ours, ours_parse, ray_time)
    rows = compare(sc, result, request, reply)
    report = _report(sc, timing, rows, result, reply, args.repeats)
    print(_markdown(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each planner")
    parser.add_argument("--scale", type=float, default=1.0, help="size of cluster and demand")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--variant",
        choices=["pinned", "free"],
        default="pinned",
        help="pinned: every bundle selects its group by label; free: each planner picks groups",
    )
    parser.add_argument("--json", help="also write the results to this file")
    return parser.parse_args(argv)


def _snapshot(sc: scenario.Scenario) -> Snapshot:
    spec = parse_raycluster(sc.raycluster)
    hosts, problems = parse_pods(sc.pods, spec)
    return Snapshot(spec=spec, hosts=tuple(hosts), problems=tuple(problems))


def _time_ours(sc: scenario.Scenario, repeats: int) -> tuple[float, float, Plan]:
    snapshot = _snapshot(sc)
    reply = sc.reply()
    state = parse_ray_state(reply, read_at_ms=epoch_ms(NOW))
    result = plan(snapshot, state, Memory(), Policy(), NOW)
    plan_only = _median(repeats, lambda: plan(snapshot, state, Memory(), Policy(), NOW))
    with_parse = _median(
        repeats,
        lambda: plan(
            _snapshot(sc), parse_ray_state(reply, read_at_ms=epoch_ms(NOW)), Memory(), Policy(), NOW
        ),
    )
    print(f"ours: {plan_only * 1000:.0f} ms (with parsing {with_parse * 1000:.0f} ms)", flush=True)
    return plan_only, with_parse, result


def _time_ray(sc: scenario.Scenario, repeats: int) -> tuple[float, Any, Any]:
    times = []
    request = reply = None
    for _ in range(repeats):
        request = ray_side.scheduling_request(sc.raycluster, sc.state)
        gc.collect()
        start = time.perf_counter()
        reply = ray_side.schedule(request)
        times.append(time.perf_counter() - start)
        print(f"ray: {times[-1]:.2f} s", flush=True)
    return statistics.median(times), request, reply


def _median(repeats: int, run: Callable[[], object]) -> float:
    times = []
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def compare(sc: scenario.Scenario, result: Plan, request: Any, reply: Any) -> list[dict[str, Any]]:
    """Per group: our slice target and hosts, Ray's host target and what KubeRay makes of it."""
    ray_hosts = ray_side.host_targets(request, reply)
    pod_types = {spec[5]: spec[0] for spec in scenario.TPU_GROUPS}
    ray_infeasible = ray_side.infeasible_by_group(reply, pod_types)
    rows = []
    for d in result.groups:
        hosts = ray_hosts.get(d.group, 0)
        ray_replicas = hosts // d.num_of_hosts  # KubeRay's v2 provider floors pods → replicas
        rows.append(
            {
                "group": d.group,
                "num_of_hosts": d.num_of_hosts,
                "current": d.current,
                "ours": d.target,
                "ours_hosts": d.target * d.num_of_hosts,
                "ray_hosts": hosts,
                "ray_replicas": ray_replicas,
                "agree": ray_replicas == d.target,
                "ray_infeasible": ray_infeasible.get(d.group, 0),
                "ray_partial_slice": hosts % d.num_of_hosts != 0,
            }
        )
    return rows


def capacity(sc: scenario.Scenario, rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """CPUs, GPUs and TPU chips of the whole cluster after each plan (KubeRay's replicas)."""
    out: dict[str, dict[str, float]] = {}
    for who, hosts in (("ours", "ours_hosts"), ("ray", "ray_replicas")):
        totals = dict.fromkeys(("CPU", "GPU", "TPU"), 0.0)
        for row in rows:
            count = row[hosts] * (row["num_of_hosts"] if hosts == "ray_replicas" else 1)
            offer = sc.offers[row["group"]][0]
            for resource in totals:
                totals[resource] += count * offer.get(resource, 0.0)
        out[who] = totals
    return out


def _report(
    sc: scenario.Scenario,
    timing: Timing,
    rows: list[dict[str, Any]],
    result: Plan,
    reply: Any,
    repeats: int,
) -> dict[str, Any]:
    return {
        "slices": sc.num_slices,
        "bundles": sc.num_bundles,
        "repeats": repeats,
        "ours_s": timing.ours_s,
        "ours_with_parse_s": timing.ours_with_parse_s,
        "ray_s": timing.ray_s,
        "ratio": timing.ratio,
        "groups": rows,
        "agree": sum(1 for r in rows if r["agree"]),
        "capacity": capacity(sc, rows),
        "ours_infeasible": sum(i.count for i in result.infeasible),
        "ray_infeasible": ray_side.infeasible_count(reply),
    }


def _markdown(report: dict[str, Any]) -> str:
    ours, ray = report["capacity"]["ours"], report["capacity"]["ray"]
    lines = [
        f"time ratio ours/Ray: {report['ratio']:.4f} (median of {report['repeats']}; ours"
        f" {report['ours_s'] * 1000:.0f} ms, with parsing {report['ours_with_parse_s'] * 1000:.0f}"
        f" ms; Ray {report['ray_s']:.2f} s)",
        f"targets agree on {report['agree']} of {len(report['groups'])} groups;"
        f" infeasible: ours {report['ours_infeasible']} bundles,"
        f" Ray {report['ray_infeasible']} requests",
        "capacity after the plan (KubeRay replicas × hosts): "
        + "; ".join(f"{r}: ours {ours[r]:,.0f}, Ray {ray[r]:,.0f}" for r in ("CPU", "GPU", "TPU")),
        "",
        "| group | hosts/slice | current | ours (slices) | ours (hosts) | Ray (hosts) |"
        " Ray → replicas | agree | Ray infeasible | Ray partial slice |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in report["groups"]:
        lines.append(
            f"| {r['group']} | {r['num_of_hosts']} | {r['current']} | {r['ours']} |"
            f" {r['ours_hosts']} | {r['ray_hosts']} | {r['ray_replicas']} |"
            f" {'yes' if r['agree'] else 'no'} | {r['ray_infeasible'] or ''} |"
            f" {'yes' if r['ray_partial_slice'] else ''} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
