"""Benchmark: one decision frame at 10k and 100k hosts, in-process.

    .venv/bin/python bench/bench_frame.py [--hosts 10000,100000] [--profile out.prof]

A frame is what one reconcile computes from what it already holds: the parsed pods (PodCache),
the parsed GCS state, then `decide()` and `report_from_plan()`. Cases, on the planner
benchmark's 20-group cluster scaled to N hosts (scenario.py, no pending demand):

- `known`: every pod Running with its Ray node (a steady cluster);
- `launching`: every pod exists but no Ray node has joined (all slices coming up: the case the
  issue measured at 0.84 s for 10k pods);
- `one_pod_changed` / `one_node_changed`: the frame after one watch event or one GCS change
  (the change itself, the pod cache's store update or the poller's parse, is not timed);
- `new_demand`: the frame after the GCS shows new pending demand (more `{"CPU": 16}` tasks than
  the free CPUs hold): the one on a reaction's path, where every live node becomes a bin;
- `scale_up`: every host busy (nothing free on any), and demand only new slices can take:
  many task shapes (60 entries of distinct shapes, 1,200 tasks), slice reservations (60
  `TPU-<pod type>-head` bundles pinned to worker 0) and gangs (40 STRICT_SPREAD slices of
  `TPU: 4`, 60 PACK, 20 STRICT_PACK, 20 SPREAD): the frame after that demand changed (the
  issue's "frame whose demand needs new slices"), at the same size as the others;
- `a_second_later`: the daemon's usual frame: one second has passed (the planner's `now`, the
  read time and every idle node's `idle_duration_ms` moved by 1 s) and one node changed (it
  was busy in between: its idle clock restarted). With idle durations in the model (before
  issue 23's idle-since) every idle node is a new value then and misses the slice memo.

Times are medians (wall and this process's CPU), with the load average of the machine. After
the inputs are built and one frame has run, the heap is frozen (`runtime/heap.freeze`) as the
daemon does after its first reconcile, where that function exists (older trees: not).
"""

from __future__ import annotations

import argparse
import copy
import cProfile
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

import inspect
from datetime import timedelta

import scenario
from common import loadavg
from ray.core.generated import autoscaler_pb2

from kuberay_scaler.adapters.ray_gcs.state import parse_ray_state
from kuberay_scaler.core.decision import Decision, Observation, decide

try:
    from kuberay_scaler.adapters.ray_gcs import unchanged
except ImportError:  # an older tree (a before/after run): every node a new object
    unchanged = None  # type: ignore[assignment]

try:  # the caller's frame memo (issue 31); an older tree keeps a process-global one
    from kuberay_scaler.core.planner.memo import FrameMemo
except ImportError:
    FrameMemo = None  # type: ignore[assignment,misc]


from kuberay_scaler.core.liveness import HostClock
from kuberay_scaler.core.model.plan import Memory
from kuberay_scaler.core.model.ray import RayObservation, RayState
from kuberay_scaler.core.parse.pod_cache import PodCache
from kuberay_scaler.core.parse.pods import slim_pod
from kuberay_scaler.core.parse.raycluster import parse_raycluster
from kuberay_scaler.core.planner.policy import Policy
from kuberay_scaler.loop.report import report_from_plan
from kuberay_scaler.runtime import heap

HOSTS_AT_SCALE_1 = 1950
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
_TAKES_READ_TIME = "read_at_ms" in inspect.signature(parse_ray_state).parameters


def _ms(at: datetime) -> int:
    return (at - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)


def parse(reply: Any, at: datetime) -> RayState:
    """`parse_ray_state` of this tree, read at `at` where it takes a read time (idle-since,
    issue 23); an older tree's keeps durations."""
    if _TAKES_READ_TIME:
        return parse_ray_state(reply, read_at_ms=_ms(at))
    return parse_ray_state(reply)  # type: ignore[call-arg]


def keep_nodes(previous: RayState, state: RayState, at: datetime) -> RayState:
    """As the poller hands a parse over: unchanged nodes keep their objects (unchanged.py)."""
    if unchanged is None:
        return state
    if "read" in inspect.signature(unchanged.with_nodes_of).parameters:
        read = unchanged.ReadWindow.at(_ms(at))
        return unchanged.with_nodes_of(previous, state, read)
    return unchanged.with_nodes_of(previous, state)  # type: ignore[call-arg]


SCALE_UP_DEMAND = 0.2  # of the planner benchmark's demand (6,000 tasks, 1,000 gangs)


def busy_cluster(hosts: int) -> scenario.Scenario:
    """Every host busy (every resource taken, no node idle), with demand only new slices can
    take (the planner benchmark's shapes, reservations and gangs, SCALE_UP_DEMAND of them)."""
    sc = scenario.build(seed=7, scale=scenario.Scale(hosts / HOSTS_AT_SCALE_1, SCALE_UP_DEMAND))
    for node in sc.state.node_states[1:]:
        node.status = autoscaler_pb2.NodeStatus.RUNNING
        node.idle_duration_ms = 0
        taken = {name: 0.0 for name in node.total_resources}
        node.available_resources.clear()
        node.available_resources.update(taken)
    return sc


def cluster(hosts: int, launching: bool) -> scenario.Scenario:
    sc = scenario.build(seed=7, scale=scenario.Scale(hosts / HOSTS_AT_SCALE_1, 0.01))
    del sc.state.pending_resource_requests[:]
    del sc.state.pending_gang_resource_requests[:]
    if launching:  # every worker pod just created and Pending, no Ray node yet
        assert sc.state.node_states[0].ray_node_type_name == "headgroup"
        del sc.state.node_states[1:]
        for pod in sc.pods[1:]:
            pod["metadata"]["creationTimestamp"] = "2026-11-30T11:59:30Z"
            pod["status"] = {"phase": "Pending"}
    return sc


class Frame:
    """The inputs a reconcile holds, and one frame over them."""

    def __init__(self, sc: scenario.Scenario) -> None:
        self.sc = sc
        self.spec = parse_raycluster(sc.raycluster)
        self.store = {p["metadata"]["name"]: slim_pod(p) for p in sc.pods}
        self.cache = PodCache()
        self.reply = sc.reply()
        self.at = NOW
        self.state = parse(self.reply, self.at)
        # The observer's memo, carried from frame to frame as the daemon carries it.
        self.memo = FrameMemo() if FrameMemo is not None else None

    def run(self) -> Decision:
        parsed = self.cache.hosts(self.store, self.spec)
        # The daemon passes its liveness clock, built once per reconcile (O(pods), timed here
        # too); without one, decide() would derive it from timestamps in each of its users.
        clock = HostClock.from_timestamps(parsed[0], self.state.node_by_instance(), self.at)
        observed = Observation(
            spec=self.spec,
            hosts=parsed[0],
            pod_problems=parsed[1],
            gcs=RayObservation(self.state, 0.0, cluster_id="c"),
            clock=clock,
        )
        if self.memo is not None:
            decision = decide(observed, Memory(), Policy(), self.at, memo=self.memo)
        else:
            decision = decide(observed, Memory(), Policy(), self.at)
        report_from_plan(decision.plan, int(self.at.timestamp()))
        return decision

    def touch_pod(self) -> None:
        name = self.sc.pods[len(self.sc.pods) // 2]["metadata"]["name"]
        self.store[name] = copy.deepcopy(self.store[name])

    def touch_node(self) -> None:
        nodes = self.reply.cluster_resource_state.node_states
        node = nodes[len(nodes) // 2]
        node.idle_duration_ms += 1000
        self.state = keep_nodes(self.state, parse(self.reply, self.at), self.at)

    def new_demand(self) -> None:
        """New pending demand in the reply (each time more: `{"CPU": 16}` tasks beyond what the
        free CPUs hold, as bench_scale_live's reaction trials ask): the frame on a reaction's
        path, where every live node becomes a bin."""
        requests = self.reply.cluster_resource_state.pending_resource_requests
        if not requests:
            requests.add().request.resources_bundle.update({"CPU": 16.0})
        requests[0].count += 40
        self.state = keep_nodes(self.state, parse(self.reply, self.at), self.at)

    def more_demand(self) -> None:
        """The scale-up frame's change: one more task of the first shape (new demand, every
        node unchanged, as a poll that sees new work hands it on)."""
        self.reply.cluster_resource_state.pending_resource_requests[0].count += 1
        self.state = keep_nodes(self.state, parse(self.reply, self.at), self.at)

    def second_later(self) -> None:
        """One second passes (every idle clock and the read time move) and the middle node's
        idle clock restarts (it ran a task in between)."""
        self.at += timedelta(seconds=1)
        nodes = self.reply.cluster_resource_state.node_states
        for node in nodes:
            if node.idle_duration_ms:
                node.idle_duration_ms += 1000
        middle = next(n for n in nodes[len(nodes) // 2 :] if n.idle_duration_ms)
        middle.idle_duration_ms = 500
        self.state = keep_nodes(self.state, parse(self.reply, self.at), self.at)


def _median(
    run: Callable[[], object], repeats: int, before: Callable[[], object] | None = None
) -> dict[str, Any]:
    """Median of `run`; `before` (untimed) makes the change the frame then sees."""
    run()  # warm-up (and the memo of a previous frame)
    walls, cpus, load = [], [], loadavg()
    for _ in range(repeats):
        if before is not None:
            before()
        gc.collect()
        wall, cpu = time.perf_counter(), time.process_time()
        run()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return {
        "wall_ms": round(statistics.median(walls) * 1000, 1),
        "cpu_ms": round(statistics.median(cpus) * 1000, 1),
        "load": load,
    }


def measure(hosts: int, repeats: int, log: Callable[[str], None] = print) -> dict[str, Any]:
    out: dict[str, Any] = {"hosts": hosts}
    freeze = getattr(heap, "freeze", None)
    out["frozen"] = freeze is not None
    for case, launching in (("known", False), ("launching", True)):
        frame = Frame(cluster(hosts, launching))
        frame.run()
        if freeze is not None:
            freeze()
        out["pods"] = len(frame.sc.pods)
        out[case] = _median(frame.run, repeats)
        if not launching:
            # The change itself (the pod cache's store, the poller's parse) is not timed.
            out["one_pod_changed"] = _median(frame.run, repeats, frame.touch_pod)
            out["one_node_changed"] = _median(frame.run, repeats, frame.touch_node)
            out["a_second_later"] = _median(frame.run, repeats, frame.second_later)
            out["new_demand"] = _median(frame.run, repeats, frame.new_demand)
        log(f"frame at {hosts} hosts, {case}: {out[case]}")
        if not launching:
            log(f"  one pod changed: {out['one_pod_changed']}")
            log(f"  one node changed: {out['one_node_changed']}")
            log(f"  a second later (one node changed): {out['a_second_later']}")
            log(f"  new demand (every live node a bin): {out['new_demand']}")
    out["scale_up"] = scale_up(hosts, repeats)
    log(f"  scale-up frame (every host busy, demand for new slices): {out['scale_up']}")
    return out


def scale_up(hosts: int, repeats: int) -> dict[str, Any]:
    """The `scale_up` case: its median, and how many slices the frame adds."""
    frame = Frame(busy_cluster(hosts))
    decision = frame.run()
    timed = _median(frame.run, repeats, frame.more_demand)
    added = sum(max(0, d.target - d.current) for d in decision.plan.groups)
    return {**timed, "slices_added": added, "tasks": frame.sc.num_bundles}


def run(
    sizes: tuple[int, ...], log: Callable[[str], None], repeats: int = 3
) -> list[dict[str, Any]]:
    return [measure(n, repeats, log) for n in sizes]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="10000,100000")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--launching", action="store_true", help="profile the launching case")
    parser.add_argument("--profile", help="cProfile one frame at the first size into this file")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    sizes = tuple(int(s) for s in args.hosts.split(","))
    if args.profile:
        frame = Frame(cluster(sizes[0], args.launching))
        frame.run()
        cProfile.runctx("frame.run()", globals(), {"frame": frame}, args.profile)
        return 0
    result = run(sizes, print, args.repeats)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
