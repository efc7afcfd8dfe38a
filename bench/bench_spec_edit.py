"""Spec edit -> patch: how soon a user's RayCluster edit is acted on, ours vs Ray v2.

Both autoscalers run under KubeRay's autoscaler Role (get/patch on rayclusters, no watch), each
on its own RayCluster (one CPU group, `maxReplicas: 0`) against the API-server stand-in and one
real Ray head with pending `num_cpus=1` tasks that no group may serve yet. Each trial, at a
random phase, the bench raises both clusters' `maxReplicas` by one in the same instant (a store
write, timestamped) and notes when each autoscaler's patch raises `replicas` to it. Nothing
launches pods, so Ray's launch cap (10 pending) bounds a round to `ROUND` trials; each round
starts fresh autoscalers on fresh clusters.

Ours reads the RayCluster every `KUBERAY_SCALER_RAYCLUSTER_POLL_INTERVAL_S` (2.5 s) in this mode;
Ray v2 reads it once per 5 s update loop.

    .venv/bin/python bench/bench_spec_edit.py [--trials 8]
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_live import GcsWatch, World, _quantile, _reached, fresh_round, live_world
from common import BenchApiServer, loadavg

KINDS = ("ours", "ray-v2")
ROUND = 8
PENDING_TASKS = 10
TIMEOUT_S = 30.0


async def run(*, trials: int, log: Callable[[str], None]) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    rnd = random.Random(29)
    async with live_world("127.0.0.32", "krs-bench-edit-") as world:
        watch = GcsWatch(world.head.gcs_address)
        watcher = asyncio.create_task(watch.run())
        try:
            for first in range(0, trials, ROUND):
                count = min(ROUND, trials - first)
                rows += await _round(world, watch, rnd, first // ROUND, first, count, log)
        finally:
            watcher.cancel()
            await watch.client.close()
    return {"trials": rows, "summary": summary(rows), "load_after": loadavg()}


async def _round(
    world: World,
    watch: GcsWatch,
    rnd: random.Random,
    index: int,
    first: int,
    count: int,
    log: Callable[[str], None],
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    async with fresh_round(world, KINDS, f"e{index}", max_replicas=0) as live:
        for _ in range(PENDING_TASKS):
            await asyncio.to_thread(live.driver.up)
        await watch.until(PENDING_TASKS, 60)
        await asyncio.sleep(6)  # let every loop settle into its rhythm
        for k in range(1, count + 1):
            await asyncio.sleep(rnd.uniform(0.5, 5.5))
            edited = time.monotonic()
            for name in live.names.values():
                _set_max(world.api, name, k)
            row: dict[str, Any] = {"trial": first + k, "round": index, "load1": loadavg()[0]}
            for kind, name in live.names.items():
                at = await _reached(live.seen[name], k, edited, TIMEOUT_S)
                row[kind] = None if at is None else round(at - edited, 4)
            rows.append(row)
            log(f"  spec edit {first + k}: " + ", ".join(f"{kind} {row[kind]}" for kind in KINDS))
    return rows


def _set_max(api: BenchApiServer, cluster: str, value: int) -> None:
    path = "/spec/workerGroupSpecs/0/maxReplicas"
    api.json_patch(
        "rayclusters", cluster, cluster, [{"op": "replace", "path": path, "value": value}]
    )


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in KINDS:
        values = sorted(r[kind] for r in rows if r[kind] is not None)
        out[kind] = {
            "n": len(values),
            "missed": sum(1 for r in rows if r[kind] is None),
            **{f"p{q}": _quantile(values, q / 100) for q in (50, 90, 99)},
            "max": values[-1] if values else None,
        }
    ratios = sorted(
        r["ray-v2"] / r["ours"]
        for r in rows
        if r["ray-v2"] is not None and r["ours"] is not None and r["ours"] > 0
    )
    out["ratio_ray-v2_over_ours"] = {"median": _quantile(ratios, 0.5)}
    return out


def markdown(result: dict[str, Any]) -> str:
    """The table docs and reports show."""
    s = result["summary"]
    lines = [
        "| spec edit → patch (s) | n | missed | p50 | p90 | p99 | max |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for kind in KINDS:
        k = s[kind]
        lines.append(
            f"| {kind} | {k['n']} | {k['missed']} | {k['p50']} | {k['p90']} | {k['p99']}"
            f" | {k.get('max')} |"
        )
    lines.append(f"\nMedian per-trial ratio Ray v2 / ours: {s['ratio_ray-v2_over_ours']['median']}")
    return "\n".join(lines)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--out")
    args = parser.parse_args()
    result = asyncio.run(run(trials=args.trials, log=lambda s: print(s, flush=True)))
    print(json.dumps(result["summary"], indent=1))
    print(markdown(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
