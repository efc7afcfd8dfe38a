"""Benchmark: planning cost with many tasks over many distinct shapes (issue 20's bound).

    .venv/bin/python bench/bench_shapes.py [--quick] [--json out.json]

Input: 10 CPU groups of maxReplicas MAX_GROUP_HOSTS (the most we add to a group anyway),
1,000 distinct task shapes (CPU 1-4, distinct memory), 10^6 pending tasks reported as
100 entries per shape (the GCS lists each shape once per raylet). Times parse + plan (median of
the repeats, wall and this process's CPU) and Ray's v2 ResourceDemandScheduler on the same
reply at a smaller task count (it expands every task; at 10^6 it does not finish in minutes).
The machine's load average is recorded before and after each timing.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ray_side
from common import loadavg
from ray.core.generated import autoscaler_pb2

from kuberay_scaler.adapters.ray_gcs.state import parse_ray_state
from kuberay_scaler.core.model.cluster import MAX_GROUP_HOSTS
from kuberay_scaler.core.model.plan import Memory, Snapshot
from kuberay_scaler.core.model.ray import epoch_ms
from kuberay_scaler.core.parse.raycluster import parse_raycluster
from kuberay_scaler.core.planner.pipeline import Policy, plan

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
GiB = 2**30


def raycluster(groups: int) -> dict[str, Any]:
    workers = [
        {
            "groupName": f"cpu-{i}",
            "replicas": 0,
            "minReplicas": 0,
            "maxReplicas": MAX_GROUP_HOSTS,  # what an unset one means to us; Ray needs it set
            "numOfHosts": 1,
            "rayStartParams": {},
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "ray-worker",
                            "resources": {"limits": {"cpu": "8", "memory": "32Gi"}},
                        }
                    ]
                }
            },
        }
        for i in range(groups)
    ]
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": "shapes", "namespace": "default", "uid": "u", "resourceVersion": "1"},
        "spec": {
            "enableInTreeAutoscaling": True,
            "headGroupSpec": {
                "rayStartParams": {"num-cpus": "0"},
                "template": {"spec": {"containers": [{"name": "ray-head"}]}},
            },
            "workerGroupSpecs": workers,
        },
    }


def reply(shapes: int, tasks: int, entries_per_shape: int) -> Any:
    """A GetClusterResourceStateReply: the head node and `tasks` tasks over `shapes` shapes."""
    out = autoscaler_pb2.GetClusterResourceStateReply()
    state = out.cluster_resource_state
    head = state.node_states.add()
    head.node_id = b"head".ljust(28, b"\0")
    head.instance_id = "shapes-head"
    head.ray_node_type_name = "headgroup"
    head.status = autoscaler_pb2.NodeStatus.IDLE
    head.total_resources.update({"node:__internal_head__": 1, "memory": 8.0 * GiB})
    head.available_resources.update(head.total_resources)
    per_entry = max(1, tasks // shapes // entries_per_shape)
    for s in range(shapes):
        for _ in range(entries_per_shape):
            entry = state.pending_resource_requests.add()
            entry.request.resources_bundle.update(
                {"CPU": float(1 + s % 4), "memory": float((s + 1) * 2**20)}
            )
            entry.count = per_entry
    return out


def time_ours(rc: dict[str, Any], raw: Any, repeats: int) -> dict[str, Any]:
    spec = parse_raycluster(rc)
    snapshot = Snapshot(spec=spec, hosts=(), problems=())
    result = plan(snapshot, parse_ray_state(raw, read_at_ms=epoch_ms(NOW)), Memory(), Policy(), NOW)
    runs = [
        _timed(
            lambda: plan(
                snapshot, parse_ray_state(raw, read_at_ms=epoch_ms(NOW)), Memory(), Policy(), NOW
            )
        )
        for _ in range(repeats)
    ]
    return {
        "wall_s": statistics.median(r[0] for r in runs),
        "cpu_s": statistics.median(r[1] for r in runs),
        "hosts_planned": sum(d.target * d.num_of_hosts for d in result.groups),
        "load": [r[2] for r in runs],
    }


def time_ray(rc: dict[str, Any], raw: Any) -> dict[str, Any]:
    request = ray_side.scheduling_request(rc, raw.cluster_resource_state)
    wall, cpu, load = _timed(lambda: ray_side.schedule(request))
    reply = ray_side.schedule(request)
    hosts = sum(ray_side.host_targets(request, reply).values())
    return {"wall_s": wall, "cpu_s": cpu, "hosts_planned": hosts, "load": load}


def _timed(run: Callable[[], object]) -> tuple[float, float, tuple[float, ...]]:
    gc.collect()
    before = loadavg()
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - wall, time.process_time() - cpu, (*before, *loadavg()[:1])


def run(quick: bool, log: Callable[[str], None] = print) -> dict[str, Any]:
    groups, shapes = 10, 1000
    tasks = 10**5 if quick else 10**6
    repeats = 1 if quick else 3
    rc = raycluster(groups)
    raw = reply(shapes, tasks, entries_per_shape=10 if quick else 100)
    log(f"shapes: {groups} groups x {shapes} shapes, {tasks:,} tasks; load {loadavg()}")
    ours = time_ours(rc, raw, repeats)
    log(f"shapes: ours {ours}")
    # Ray expands each task into a request of its own: compare both at a count it finishes.
    small_tasks = 2_000  # Ray needs ~18 CPU s here (1000 shapes x 10 groups)
    small = reply(shapes, small_tasks, entries_per_shape=1)
    ours_small = time_ours(rc, small, repeats)
    ray_small = time_ray(rc, small)
    log(f"shapes at {small_tasks:,} tasks: ours {ours_small}, Ray {ray_small}")
    return {
        "groups": groups,
        "shapes": shapes,
        "tasks": tasks,
        "entries": len(raw.cluster_resource_state.pending_resource_requests),
        "max_group_hosts": MAX_GROUP_HOSTS,
        "ours": ours,
        "small_tasks": small_tasks,
        "ours_small": ours_small,
        "ray_small": ray_small,
        "ratio_small": ours_small["cpu_s"] / ray_small["cpu_s"],
        "goal_s": 1.0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    result = run(args.quick)
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
