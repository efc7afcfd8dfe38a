"""One idle reconcile at N pods, in-process: the work the daemon does per reconcile.

The input is the planner benchmark's cluster (scenario.py) scaled to about N pods, every pod a
Running host with its Ray node, and no demand (idle). Timed, median of 5 after a warm-up:

- `from_scratch`: parse the RayCluster, all N pods and the GCS reply, then `plan()` — what every
  reconcile did before pods were parsed per watch event;
- `daemon`: what a reconcile does now: `PodCache` already holds the parsed pods (one pod changed
  since the last reconcile is re-parsed), the parsed GCS state is reused, then `plan()`.
"""

from __future__ import annotations

import copy
import gc
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import scenario

from kuberay_scaler.adapters.ray_gcs.state import parse_ray_state
from kuberay_scaler.core.model.plan import Memory, Snapshot
from kuberay_scaler.core.model.ray import epoch_ms
from kuberay_scaler.core.parse.pods import parse_pods, slim_pod
from kuberay_scaler.core.parse.raycluster import parse_raycluster
from kuberay_scaler.core.planner.memo import FrameMemo
from kuberay_scaler.core.planner.pipeline import Policy, plan

HOSTS_AT_SCALE_1 = 1950
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def idle_cluster(pods: int) -> scenario.Scenario:
    sc = scenario.build(seed=7, scale=scenario.Scale(pods / HOSTS_AT_SCALE_1, 0.01))
    del sc.state.pending_resource_requests[:]
    del sc.state.pending_gang_resource_requests[:]
    return sc


def _median_ms(run: Callable[[], object], repeats: int = 5) -> float:
    run()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return round(statistics.median(times) * 1000, 2)


def measure(pods: int) -> dict[str, Any]:
    sc = idle_cluster(pods)
    reply = sc.reply()

    def from_scratch() -> None:
        spec = parse_raycluster(sc.raycluster)
        hosts, problems = parse_pods(sc.pods, spec)
        snapshot = Snapshot(spec, tuple(hosts), True, tuple(problems))
        plan(snapshot, parse_ray_state(reply, read_at_ms=epoch_ms(NOW)), Memory(), Policy(), NOW)

    out: dict[str, Any] = {"pods": len(sc.pods), "from_scratch_ms": _median_ms(from_scratch)}
    out |= _daemon_path(sc, reply)
    return out


def _daemon_path(sc: scenario.Scenario, reply: Any) -> dict[str, Any]:
    try:
        from kuberay_scaler.core.parse.pod_cache import PodCache
    except ImportError:
        return {}
    spec = parse_raycluster(sc.raycluster)
    store = {p["metadata"]["name"]: slim_pod(p) for p in sc.pods}
    cache = PodCache()
    cache.hosts(store, spec)
    state = parse_ray_state(reply, read_at_ms=epoch_ms(NOW))
    changed = sc.pods[len(sc.pods) // 2]["metadata"]["name"]
    memo = FrameMemo()  # the observer's, carried across its reconciles as the daemon does

    def daemon() -> None:
        store[changed] = copy.deepcopy(store[changed])  # one watch event since the last reconcile
        hosts, problems = cache.hosts(store, spec)
        snapshot = Snapshot(spec, hosts, True, problems)
        plan(snapshot, state, Memory(), Policy(), NOW, memo=memo)

    gc.collect()
    return {"daemon_ms": _median_ms(daemon)}


def run(sizes: tuple[int, ...], log: Callable[[str], None]) -> list[dict[str, Any]]:
    out = []
    for n in sizes:
        out.append(measure(n))
        log(f"reconcile at {n} pods: {out[-1]}")
    return out


if __name__ == "__main__":
    run(tuple(int(s) for s in (sys.argv[1] if len(sys.argv) > 1 else "1000").split(",")), print)
