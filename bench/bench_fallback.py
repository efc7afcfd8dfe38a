"""Fallback from a group that cannot get capacity: ours vs Ray v2 on one world.

The world, per trial: three fresh RayClusters in the API-server stand-in, each in its own
namespace with its own KubeRay operator stand-in, beside one real Ray head holding 4 pending
`{TPU: 4}` tasks (num_cpus=0). Every cluster has two 4-host TPU groups of one shape: `v6e-16`
(priority 10) and `v5e-16` (priority 0, `v5litepod-16`); both ours and Ray v2 open v6e first.
A scheduler stand-in (the operator's `unschedulable` hook) leaves every v6e pod Pending,
`PodScheduled=False/Unschedulable` with kube-scheduler's message; v5e pods are bound and run.
A cluster-autoscaler stand-in (`kuberay_standins.ca_standin`, the real one's reasons and
message forms) posts on each stuck pod `TriggeredScaleUp`, 1.5 s later GKE's `FailedScaleUp`
"GCE out of resources", then `NotTriggerScaleUp ... in backoff`. Loopback only.

- `ours-events`: the daemon with the optional events Role (deploy/capacity-events): measured
  from the first `FailedScaleUp` Event to the PATCH raising `v5e-16` (goal p99 ≤ 15 s).
- `ours-deadline`: the daemon under KubeRay's Role alone (no Events), v6e's template annotated
  `kuberay-scaler.io/max-provision-time-s: DEADLINE_S`: from the first v6e pod marked
  Unschedulable to the PATCH raising `v5e-16`, minus the deadline (goal ≤ 5 s).
- `ray-v2`: Ray's own autoscaler v2, unmodified, on the same world: when (if) it raises v5e.
  Its pending-pod timeout (`allocate_status_timeout_s`) is 3,600 s, so within a bench window the
  honest answer is "no fallback within N s".
- `ray-v2-timeout`: the same, with that timeout set to the deadline
  (`RAY_AUTOSCALER_RECONCILE_ALLOCATE_STATUS_TIMEOUT_S`): Ray's own deadline path, the anchor
  for ours-deadline.

    .venv/bin/python bench/bench_fallback.py [--trials 3] [--window 40] [--out FILE]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import clusters
from bench_live import Driver, Proc, World, _quantile, live_world, ready
from common import BenchApiServer, loadavg

from kuberay_scaler.core.model.labels import ANNOTATION_MAX_PROVISION
from kuberay_standins._k8s_rbac import RESTRICTED_RULES
from kuberay_standins._k8s_store import StoredEvent
from kuberay_standins.ca_standin import ACCELERATOR, ClusterAutoscalerStandIn, accelerator_of
from kuberay_standins.operator import OperatorStandIn

KINDS = ("ours-events", "ours-deadline", "ray-v2", "ray-v2-timeout")
OURS = KINDS[:2]
DEADLINE_KINDS = ("ours-deadline", "ray-v2-timeout")  # the stuck group's deadline is DEADLINE_S
STUCK, FALLBACK = "v6e-16", "v5e-16"
STUCK_TPU, FALLBACK_TPU = "tpu-v6e-slice", "tpu-v5-lite-podslice"
TOPOLOGY = "cloud.google.com/gke-tpu-topology"
HOSTS = 4
TASKS = 4  # 4 x {TPU: 4}: one 4-host slice of either type
DEADLINE_S = 20
EVENTS_TOKEN = "bench-events-reader"
# kube-scheduler's words for a pod no node's labels fit (nodeaffinity ErrReasonPod).
SCHEDULER_MESSAGE = (
    "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."
    " preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
)


# ---- the world -------------------------------------------------------------------------------


def tpu_cluster(name: str, *, deadline_s: int | None) -> dict[str, Any]:
    """The bench cluster (one CPU-less head) with the two TPU groups instead of the CPU one."""
    cluster = clusters.raycluster(name)
    cluster["spec"]["workerGroupSpecs"] = [
        _tpu_group(STUCK, STUCK_TPU, priority=10, deadline_s=deadline_s),
        _tpu_group(FALLBACK, FALLBACK_TPU, priority=0, deadline_s=None),
    ]
    return cluster


def _tpu_group(name: str, tpu: str, *, priority: int, deadline_s: int | None) -> dict[str, Any]:
    amounts = {"cpu": "1", "memory": "1Gi", "google.com/tpu": "4"}
    worker = {
        "name": "ray-worker",
        "image": "rayproject/ray:2.60.0",
        "resources": {"limits": dict(amounts), "requests": dict(amounts)},
    }
    template: dict[str, Any] = {
        "spec": {"nodeSelector": {ACCELERATOR: tpu, TOPOLOGY: "4x4"}, "containers": [worker]}
    }
    if deadline_s is not None:
        template["metadata"] = {"annotations": {ANNOTATION_MAX_PROVISION: str(deadline_s)}}
    return {
        "groupName": name,
        "replicas": 0,
        "minReplicas": 0,
        "maxReplicas": 1,
        "numOfHosts": HOSTS,
        "priority": priority,
        "rayStartParams": {},
        "template": template,
    }


def no_node_fits(pod: dict[str, Any]) -> str | None:
    """The scheduler stand-in: no node of the stuck TPU type exists."""
    return SCHEDULER_MESSAGE if accelerator_of(pod) == STUCK_TPU else None


@dataclass(frozen=True)
class _Reply:
    status: int
    body: Any


class StoreClient:
    """The cluster-autoscaler stand-in's API client, in-process on the stand-in's store (it lists
    Pending pods and posts Events; nothing else)."""

    def __init__(self, api: BenchApiServer) -> None:
        self._api = api

    async def request(
        self, method: str, path: str, body: Any = None, *, query: Mapping[str, str] | None = None
    ) -> _Reply:
        namespace = path.split("/namespaces/", 1)[1].split("/", 1)[0]
        if method == "GET" and path.endswith("/pods"):
            pods = self._api.list("pods", namespace)
            pending = [p for p in pods if (p.get("status") or {}).get("phase") == "Pending"]
            return _Reply(200, {"items": pending})
        if method == "POST" and path.endswith("/events"):
            return _Reply(201, self._api.create("events", namespace, body))
        return _Reply(405, {})


@dataclass
class Stamps:
    """What one cluster went through (monotonic seconds): its first pod marked Unschedulable, its
    first `FailedScaleUp` Event, and every `replicas` write as (time, group, replicas)."""

    unschedulable: float | None = None
    failed_event: float | None = None
    replicas: list[tuple[float, str, int]] = field(default_factory=list)


def recorder(stamps: Mapping[str, Stamps]) -> Callable[[StoredEvent], None]:
    """A store listener filling `stamps` by namespace (= cluster name)."""

    def listener(event: StoredEvent) -> None:
        namespace = (event.obj.get("metadata") or {}).get("namespace")
        seen = stamps.get(str(namespace))
        if seen is None:
            return
        now = time.monotonic()
        if event.store == "pods" and seen.unschedulable is None and _unschedulable(event.obj):
            seen.unschedulable = now
        elif event.store == "events" and event.prev is None:
            if event.obj.get("reason") == "FailedScaleUp" and seen.failed_event is None:
                seen.failed_event = now
        elif event.store == "rayclusters" and event.prev is not None:
            before = _replicas(event.prev)
            for group, count in _replicas(event.obj).items():
                if before.get(group) != count:
                    seen.replicas.append((now, group, count))

    return listener


def _unschedulable(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(
        c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions
    )


def _replicas(cluster: Mapping[str, Any]) -> dict[str, int]:
    groups = (cluster.get("spec") or {}).get("workerGroupSpecs") or []
    return {str(g.get("groupName")): int(g.get("replicas") or 0) for g in groups}


# ---- measurement (pure: the unit test holds it) -----------------------------------------------


def first_raise(replicas: list[tuple[float, str, int]], group: str) -> float | None:
    """When `group`'s replicas were first raised above 0."""
    return next((at for at, g, count in replicas if g == group and count > 0), None)


def measure(kind: str, seen: Stamps, end: float, deadline_s: float) -> dict[str, Any]:
    """One cluster's row of a trial: the interval its goal is about, or why there is none.

    `fallback_s`: first FailedScaleUp (ours-events) or first Unschedulable (the others) → the
    PATCH raising the fallback group; `over_deadline_s` for the deadline paths; `opened_stuck`:
    first Unschedulable after the PATCH that opened the stuck group; `window_s`: how long the
    stuck pods had been Unschedulable when the trial ended, for a cluster that never fell back."""
    start = seen.failed_event if kind == "ours-events" else seen.unschedulable
    fell_back = first_raise(seen.replicas, FALLBACK)
    opened = first_raise(seen.replicas, STUCK)
    row: dict[str, Any] = {
        "fallback_s": None,
        "opened_stuck": opened is not None,
        "cancelled_stuck": any(g == STUCK and c == 0 for _, g, c in seen.replicas),
        "window_s": None if seen.unschedulable is None else round(end - seen.unschedulable, 2),
    }
    if seen.unschedulable is not None and fell_back is not None:
        row["from_unschedulable_s"] = round(fell_back - seen.unschedulable, 3)
    if start is not None and fell_back is not None:
        row["fallback_s"] = round(fell_back - start, 3)
        if kind in DEADLINE_KINDS:
            row["over_deadline_s"] = round(fell_back - start - deadline_s, 3)
    return row


def unavailable_said(log_text: str) -> list[str]:
    """What our daemon said when a group became unavailable: its JSON log's `capacity` lines
    marking a group unavailable (the cause the bench claims for the fallback is in them)."""
    out = []
    for line in log_text.splitlines():
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if (
                isinstance(entry, dict)
                and entry.get("event") == "capacity"
                and entry.get("change") in ("marked_unavailable", "probe_failed")
            ):
                out.append(str(entry.get("text", "")))
    return out


def summary(rows: list[dict[str, Any]], deadline_s: float) -> dict[str, Any]:
    out: dict[str, Any] = {"deadline_s": deadline_s}
    for kind in KINDS:
        values = sorted(r[kind]["fallback_s"] for r in rows if r[kind]["fallback_s"] is not None)
        windows = [r[kind]["window_s"] for r in rows if r[kind]["window_s"] is not None]
        out[kind] = {
            "n": len(values),
            "missed": sum(1 for r in rows if r[kind]["fallback_s"] is None),
            **{f"p{q}": _quantile(values, q / 100) for q in (50, 99)},
            "max": values[-1] if values else None,
            "opened_stuck": sum(1 for r in rows if r[kind]["opened_stuck"]),
            "min_window_s": min(windows) if windows else None,
            "from_unschedulable_p99": _quantile(
                sorted(
                    r[kind]["from_unschedulable_s"]
                    for r in rows
                    if r[kind].get("from_unschedulable_s") is not None
                ),
                0.99,
            ),
        }
    for kind in DEADLINE_KINDS:
        over = sorted(
            r[kind]["over_deadline_s"] for r in rows if r[kind].get("over_deadline_s") is not None
        )
        out[kind] |= {f"over_p{q}": _quantile(over, q / 100) for q in (50, 99)}
    return out


def markdown(result: dict[str, Any]) -> str:
    """The table docs and reports show (seconds)."""
    s = result["summary"]
    lines = [
        "| fallback (s) | measured from | n | no fallback | p50 | p99 | max |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    starts = {
        "ours-events": "first FailedScaleUp Event",
        "ours-deadline": f"first Unschedulable (deadline {s['deadline_s']:.0f} s)",
        "ray-v2": "first Unschedulable",
        "ray-v2-timeout": f"first Unschedulable (allocate timeout {s['deadline_s']:.0f} s)",
    }
    for kind in KINDS:
        k = s[kind]
        lines.append(
            f"| {kind} | {starts[kind]} | {k['n']} | {k['missed']} | {k['p50']} | {k['p99']}"
            f" | {k['max']} |"
        )
    lines.append("")
    for kind in DEADLINE_KINDS:
        d = s[kind]
        lines.append(f"{kind} over the deadline: p50 {d['over_p50']} s, p99 {d['over_p99']} s")
    v2 = s["ray-v2"]
    if v2["n"] == 0:
        lines.append(
            f"Ray v2 opened v6e in {v2['opened_stuck']} of {v2['n'] + v2['missed']} trials and"
            f" fell back in none within {v2['min_window_s']} s of its pods being Unschedulable."
        )
    return "\n".join(lines)


# ---- trials -------------------------------------------------------------------------------------


async def run(
    *, trials: int, log: Callable[[str], None], window_s: float = 40.0, deadline_s: int = DEADLINE_S
) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    async with live_world("127.0.0.33", "krs-bench-fallback-") as world:
        world.api.add_token(
            EVENTS_TOKEN, [*RESTRICTED_RULES, (["get", "list", "watch"], ["events"])]
        )
        for index in range(trials):
            row = await _trial(world, index, window_s, deadline_s)
            rows.append(row)
            log(
                f"  fallback {index + 1}: "
                + ", ".join(f"{kind} {row[kind]['fallback_s']}" for kind in KINDS)
            )
    return {
        "trials": rows,
        "summary": summary(rows, deadline_s),
        "window_s": window_s,
        "load_after": loadavg(),
    }


async def _trial(world: World, index: int, window_s: float, deadline_s: int) -> dict[str, Any]:
    names = {kind: f"f{index}-{kind}" for kind in KINDS}
    stamps = {name: Stamps() for name in names.values()}
    unsubscribe = world.api.subscribe(recorder(stamps))
    try:
        async with _clusters(world, names, deadline_s) as procs:
            for proc in procs.values():
                await ready(proc, 240)
            driver = Driver(world.head, {"TPU": 4})
            try:
                await asyncio.to_thread(driver.wait_ready)
                for _ in range(TASKS):
                    await asyncio.to_thread(driver.up)
                load = loadavg()[0]
                end = await _until_done(stamps, names, window_s, deadline_s)
            finally:
                driver.stop()
            said = {kind: unavailable_said(procs[kind].log_tail(1_000_000)) for kind in OURS}
    finally:
        unsubscribe()
    row: dict[str, Any] = {"trial": index + 1, "load1": load}
    for kind, name in names.items():
        row[kind] = measure(kind, stamps[name], end, deadline_s) | {"said": said.get(kind, [])}
    return row


async def _until_done(
    stamps: Mapping[str, Stamps], names: Mapping[str, str], window_s: float, deadline_s: int
) -> float:
    """Until both of ours fell back and each Ray v2 fell back or had its pods Unschedulable for
    long enough (`window_s`; with the timeout, the deadline + 20 s), or a bound passed; returns
    the end time."""
    started = time.monotonic()
    bound = deadline_s + window_s + 30

    def done() -> bool:
        ours = all(first_raise(stamps[names[k]].replicas, FALLBACK) for k in OURS)
        return ours and settled("ray-v2", window_s) and settled("ray-v2-timeout", deadline_s + 20)

    def settled(kind: str, watch_s: float) -> bool:
        """Ray fell back, or its stuck pods have been watched for `watch_s`."""
        seen = stamps[names[kind]]
        if first_raise(seen.replicas, FALLBACK) is not None:
            return True
        return seen.unschedulable is not None and time.monotonic() - seen.unschedulable > watch_s

    while not done() and time.monotonic() - started < bound:  # noqa: ASYNC110 - three conditions
        await asyncio.sleep(0.1)
    return time.monotonic()


@contextlib.asynccontextmanager
async def _clusters(
    world: World, names: Mapping[str, str], deadline_s: int
) -> AsyncIterator[dict[str, Proc]]:
    """Each cluster with its operator and cluster-autoscaler stand-ins and its autoscaler."""
    tasks: list[asyncio.Task[None]] = []
    procs: dict[str, Proc] = {}
    try:
        for kind, name in names.items():
            _add(world.api, name, deadline_s if kind == "ours-deadline" else None)
            operator = OperatorStandIn(world.api, name, name, unschedulable=no_node_fits)
            ca = ClusterAutoscalerStandIn(StoreClient(world.api), name, {STUCK_TPU: "stockout"})
            tasks += [asyncio.create_task(operator.run()), asyncio.create_task(ca.run())]
        for kind, name in names.items():
            procs[kind] = await _start(world, kind, name, deadline_s)
        yield procs
    finally:
        for proc in procs.values():
            proc.stop()
            await proc.proxy.stop()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for name in names.values():
            await asyncio.to_thread(world.drop_cluster, name)


def _add(api: BenchApiServer, name: str, deadline_s: int | None) -> None:
    created = api.create("rayclusters", name, tpu_cluster(name, deadline_s=deadline_s))
    head = clusters.head_pod(name)
    head["metadata"]["ownerReferences"][0]["uid"] = created["metadata"]["uid"]
    api.create("pods", name, head)


async def _start(world: World, kind: str, name: str, deadline_s: int) -> Proc:
    if kind == "ray-v2":
        return await world.start(kind, name)
    if kind == "ray-v2-timeout":
        timeout = {"RAY_AUTOSCALER_RECONCILE_ALLOCATE_STATUS_TIMEOUT_S": str(deadline_s)}
        return await world.start("ray-v2", name, **timeout)
    # The fallback group's pods run but never get a Ray node here: keep ours from calling them
    # broken within a trial.
    env = {"KUBERAY_SCALER_MISSING_NODE_GRACE_S": "36000"}
    if kind == "ours-events":
        return await world.start("ours", name, token=EVENTS_TOKEN, **env)
    return await world.start("ours", name, **env)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--window", type=float, default=40.0)
    parser.add_argument("--deadline", type=int, default=DEADLINE_S)
    parser.add_argument("--out")
    args = parser.parse_args()
    result = asyncio.run(
        run(
            trials=args.trials,
            log=lambda s: print(s, flush=True),
            window_s=args.window,
            deadline_s=args.deadline,
        )
    )
    print(json.dumps(result["summary"], indent=1))
    print(markdown(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
