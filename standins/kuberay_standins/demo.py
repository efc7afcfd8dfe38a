"""`make demo`: watch kuberay-scaler scale a TPU-style multi-host group in whole slices.

Everything runs on 127.0.0.1: the API-server and operator stand-ins, a real Ray head, one real
Ray host per Running worker pod, the real daemon as a subprocess (env vars only) and a Ray driver
that reserves whole slices, runs work on every host, adds CPU work, then goes idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import json
import math
import re
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

import yaml

from kuberay_standins.harness import DaemonProcess, LocalCluster, Moment, Timeline
from kuberay_standins.ray_local import RayDriver

SAMPLE = "ray-cluster.tpu-v6e-16-multihost.yaml"
IDLE_TIMEOUT_S = 15
TOPOLOGIES = {4: "4x4", 2: "2x4", 1: "2x2", 8: "8x8"}  # v6e: 4 chips per host


@dataclass(frozen=True)
class Scenario:
    slices: int = 1
    hosts: int = 4
    timeout_s: float = 600.0

    @property
    def topology(self) -> str:
        return TOPOLOGIES[self.hosts]

    @property
    def pod_type(self) -> str:
        dims = [int(d) for d in self.topology.split("x")]
        return f"v6e-{math.prod(dims)}"


def demo_raycluster(scenario: Scenario, samples: Path | None = None) -> dict[str, Any]:
    """The v6e 4x4 multi-host sample, made small enough for one machine, plus a CPU group."""
    base = _load_sample(samples)
    tpu = base["spec"]["workerGroupSpecs"][0]
    container = tpu["template"]["spec"]["containers"][0]
    chips = "4"
    container["resources"] = {
        "limits": {"cpu": "1", "google.com/tpu": chips, "memory": "1G"},
        "requests": {"cpu": "1", "google.com/tpu": chips, "memory": "1G"},
    }
    container.pop("env", None)
    tpu.update(
        replicas=0, minReplicas=0, maxReplicas=scenario.slices + 1, numOfHosts=scenario.hosts
    )
    tpu["template"]["spec"]["nodeSelector"]["cloud.google.com/gke-tpu-topology"] = scenario.topology
    cpu = json.loads(json.dumps(tpu))
    cpu.update(groupName="cpu-group", numOfHosts=1, maxReplicas=2)
    cpu["template"]["spec"].pop("nodeSelector")
    cpu["template"]["spec"]["containers"][0]["resources"] = {
        "limits": {"cpu": "2", "memory": "1G"},
        "requests": {"cpu": "2", "memory": "1G"},
    }
    base["metadata"] = {"name": "demo-tpu", "namespace": "default"}
    base["spec"]["enableInTreeAutoscaling"] = True
    base["spec"]["autoscalerOptions"] = {"version": "v2", "idleTimeoutSeconds": IDLE_TIMEOUT_S}
    base["spec"]["headGroupSpec"]["rayStartParams"] = {"num-cpus": "0"}
    base["spec"]["workerGroupSpecs"] = [tpu, cpu]
    return base


def _load_sample(samples: Path | None) -> dict[str, Any]:
    # Only a folder the caller names is read: the demo never looks outside its own package.
    if samples is not None and (samples / SAMPLE).is_file():
        loaded: dict[str, Any] = yaml.safe_load((samples / SAMPLE).read_text())
        return loaded
    return yaml.safe_load(_EMBEDDED_SAMPLE)  # type: ignore[no-any-return]


def workload(scenario: Scenario) -> str:
    """The driver: reserve slices, run on every host, add CPU work, release, go idle."""
    return f"""
import time
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from ray.util.tpu import SlicePlacementGroup

print("DEMAND slice reservation: {scenario.slices} x v6e {scenario.topology}", flush=True)
handle = SlicePlacementGroup(topology={scenario.topology!r}, accelerator_version="v6e",
                             num_slices={scenario.slices}, head_reservation_timeout_s=600)
pg = handle.placement_group
ray.get(pg.ready(), timeout=600)
print("SLICE_READY", flush=True)

@ray.remote(num_cpus=0, resources={{"TPU": 4}})
def on_host(rank):
    import os, socket
    time.sleep(1)
    return (rank, os.environ.get("RAY_CLOUD_INSTANCE_ID", "?"))

ranks = ray.get([on_host.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
    placement_group=pg)).remote(i) for i in range({scenario.slices * scenario.hosts})])
print("WORK_DONE on " + ", ".join(sorted(p for _, p in ranks)), flush=True)

@ray.remote(num_cpus=1)
def cpu_work(i):
    time.sleep(2)
    return i

print("DEMAND 3 CPU tasks", flush=True)
ray.get([cpu_work.remote(i) for i in range(3)], timeout=600)
print("CPU_DONE", flush=True)
handle.shutdown()  # the worker PG and the internal head reservation
print("IDLE", flush=True)
"""


class Printer:
    """Prints moments in the order they happened, not the order they were learnt.

    The API server's changes are seen at once, the daemon's log lines a poll later (with the
    time they were written): each moment is held for `hold_s` and printed in time order.
    """

    def __init__(self, out: TextIO, hold_s: float = 1.5) -> None:
        self.out = out
        self.hold_s = hold_s
        self._held: list[tuple[float, int, Moment]] = []
        self._count = 0
        self.sources: list[Callable[[], None]] = []

    def moment(self, m: Moment) -> None:
        heapq.heappush(self._held, (m.at, self._count, m))
        self._count += 1

    def flush(self, now: float | None = None) -> None:
        """Print every held moment older than `hold_s` (all of them when `now` is None)."""
        for pull in self.sources:  # what happened elsewhere first (the daemon's log)
            pull()
        while self._held and (now is None or self._held[0][0] <= now - self.hold_s):
            _, _, m = heapq.heappop(self._held)
            print(f"[{m.at:7.1f}s] {m.kind:<15} {m.text}", file=self.out, flush=True)

    async def run(self, timeline: Timeline) -> None:
        while True:
            self.flush(time.monotonic() - timeline.started)
            await asyncio.sleep(0.2)


async def run_demo(
    scenario: Scenario,
    out: TextIO = sys.stdout,
    judge: Callable[[LocalCluster], contextlib.AbstractAsyncContextManager[Any]] | None = None,
) -> int:
    """Run the scenario; `judge` (tests) wraps the started cluster, e.g. to check every write."""
    printer = Printer(out)
    print(
        f"kuberay-scaler demo: {scenario.slices} slice(s) of {scenario.hosts} hosts "
        f"(v6e {scenario.topology}), everything on 127.0.0.1\n",
        file=out,
        flush=True,
    )
    print(
        "starting the API-server and operator stand-ins, a real Ray head and the daemon "
        "(10-30 s); then every moment is printed as it happens:\n",
        file=out,
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, stop.set)
    cluster = LocalCluster(demo_raycluster(scenario), pod_start_delay=1.0)
    cluster.timeline.listeners.append(printer.moment)
    printing = asyncio.create_task(printer.run(cluster.timeline))
    try:
        async with cluster, (judge or _unjudged)(cluster):
            daemon = cluster.start_daemon(KUBERAY_SCALER_RESYNC_INTERVAL_S="5")
            result = await _race(_scenario(cluster, daemon, scenario, printer), stop)
            code, took = await asyncio.to_thread(daemon.stop)
            cluster.timeline.add(
                "daemon_stopped", f"daemon exited {code} after SIGTERM in {took:.1f} s"
            )
            printing.cancel()
            printer.flush()
            if result is None:
                print("\ninterrupted: cleaning up", file=out)
                return 130
            return _summary(cluster, daemon, result, code, out)
    finally:
        printing.cancel()
        printer.flush()
        loop.remove_signal_handler(signal.SIGINT)


def _unjudged(cluster: LocalCluster) -> contextlib.AbstractAsyncContextManager[Any]:
    return contextlib.nullcontext()


async def _race(job: Any, stop: asyncio.Event) -> Any:
    task = asyncio.ensure_future(job)
    stopper = asyncio.ensure_future(stop.wait())
    done, _ = await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    stopper.cancel()
    if task in done:
        return task.result()
    task.cancel()
    return None


async def _scenario(
    cluster: LocalCluster, daemon: DaemonProcess, s: Scenario, printer: Printer | None = None
) -> dict[str, Any]:
    assert cluster.head is not None
    driver = await asyncio.to_thread(
        RayDriver.start,
        cluster.head.gcs_address,
        workload(s),
        node_ip=cluster.head.ip,
        env=cluster.head.client_env(),
        wait_ready=False,
        hold=True,
    )
    echo = asyncio.create_task(_echo_driver(driver, cluster, s))
    reader = DaemonEcho(daemon, cluster)
    if printer is not None:
        printer.sources.append(reader.pull)
    decisions = asyncio.create_task(_echo_daemon(reader))
    try:
        await cluster.wait_for(lambda: "IDLE" in driver.output(), s.timeout_s, "the workload")
        await cluster.wait_for(
            lambda: not cluster.worker_pods("tpu-group"), s.timeout_s, "the idle slice(s) to go"
        )
        await cluster.wait_for(
            lambda: not _workers_to_delete(cluster), 60, "workersToDelete to be cleared"
        )
        await asyncio.sleep(1)
        output = driver.output()  # read before stop(): stopping removes the driver's log
    finally:
        echo.cancel()
        decisions.cancel()
        await asyncio.to_thread(driver.stop)
    return {"driver": output}


async def _echo_driver(driver: RayDriver, cluster: LocalCluster, s: Scenario) -> None:
    seen = 0
    while True:
        lines = driver.output().splitlines()
        for line in lines[seen:]:
            if line.startswith("SLICE_READY"):
                await _slice_hosts_noted(cluster, s)
            if line.startswith(("DEMAND", "SLICE_READY", "WORK_DONE", "CPU_DONE", "IDLE")):
                kind = "work" if not line.startswith("DEMAND") else "demand"
                cluster.timeline.add(kind, line)
        seen = len(lines)
        await asyncio.sleep(0.2)


async def _slice_hosts_noted(cluster: LocalCluster, s: Scenario, bound_s: float = 60) -> None:
    """Until every TPU host's "started" line is in the timeline (at most `bound_s`).

    Ray places the reservation once each host has joined the GCS; the stand-in kubelet notes a
    host as started only when its `ray start` returns, which on a busy machine can be a moment
    later. SLICE_READY is noted after those lines, so it never reads as coming before them.
    """
    with contextlib.suppress(TimeoutError):  # then noted anyway: the story goes on
        await cluster.wait_for(
            lambda: _tpu_hosts_started(cluster) >= s.slices * s.hosts,
            bound_s,
            "the slice's hosts",
            step=0.1,
        )


def _tpu_hosts_started(cluster: LocalCluster) -> int:
    started = cluster.hooks.hosts if cluster.hooks is not None else {}
    return sum(1 for p in cluster.worker_pods("tpu-group") if p["metadata"]["name"] in started)


class DaemonEcho:
    """Reads the daemon's new log lines into the timeline, stamped with when they were written.

    The printer calls `pull` before it prints, so a line the daemon wrote before a moment the
    API server saw is always in the timeline by the time that moment is printed.
    """

    def __init__(self, daemon: DaemonProcess, cluster: LocalCluster) -> None:
        self.daemon, self.cluster, self.seen = daemon, cluster, 0

    def pull(self) -> None:
        lines = self.daemon.lines()
        for line in lines[self.seen :]:
            moment = daemon_moment(line)
            if moment is not None:
                kind, text = moment
                self.cluster.timeline.add(kind, text, at=_happened(self.cluster, line))
        self.seen = len(lines)


async def _echo_daemon(echo: DaemonEcho) -> None:
    while True:
        echo.pull()
        await asyncio.sleep(0.2)


# The daemon's `decided` line names each group's change as `<group>: <action> <from>-><to>`
# (loop/record.py); the demo says it in words.
_GROUP_CHANGE = re.compile(r"^(?P<group>[^:]+): (?P<action>[a-z_]+) (?P<was>\d+)->(?P<to>\d+)")
_ACTION_WORDS = {
    "scale_up": "add slice(s), replicas {was} → {to}",
    "scale_down": "remove slice(s), replicas {was} → {to}",
    "replace": "replace a slice, replicas {was} → {to}",
    "clear_workers_to_delete": "replicas stay {to}",
}
_PATCH_WRITE = re.compile(r"^patch \((\d+) ops\)$")


def group_change_words(text: str) -> str:
    """`tpu: scale_up 0->1 (why)` → `tpu: add slice(s), replicas 0 → 1 (why)`."""
    match = _GROUP_CHANGE.match(text)
    words = _ACTION_WORDS.get(match["action"]) if match else None
    if match is None or words is None:
        return text
    rest = text[match.end() :]
    return f"{match['group']}: {words.format(was=match['was'], to=match['to'])}{rest}"


def write_words(text: str) -> str:
    """`patch (5 ops)` → what that patch is; other writes already say what they do."""
    if _PATCH_WRITE.match(text):
        return "patch the RayCluster"
    if text.startswith("record draining "):
        return "record which slices it drains (" + text.removeprefix("record draining ") + ")"
    return text


def daemon_moment(line: dict[str, Any]) -> tuple[str, str] | None:
    """The timeline line for one daemon log record, or None for the ones the story skips."""
    event = line.get("event")
    if event == "decided":
        groups = "; ".join(group_change_words(g) for g in line.get("groups") or [])
        writes = " → ".join(write_words(w) for w in line.get("writes") or [])
        return "plan", f"{groups} | writes: {writes}"
    if event in ("slice_drained", "slice_drain_refused"):
        where = f"{line.get('group')}/{line.get('slice')}: " if line.get("slice") else ""
        return "drain", f"{event}: {where}{line.get('hosts')} hosts, {line.get('reason')}"
    if line.get("level") in ("error", "critical"):
        return "daemon_error", str(event)
    return None


def _happened(cluster: LocalCluster, line: dict[str, Any]) -> float | None:
    """When the daemon wrote the line, on the timeline's clock (None: not stamped)."""
    stamp = line.get("timestamp")
    if not isinstance(stamp, str):
        return None
    try:
        return cluster.timeline.at_wall(datetime.fromisoformat(stamp).timestamp())
    except ValueError:
        return None


def _workers_to_delete(cluster: LocalCluster) -> list[str]:
    groups = cluster.current()["spec"]["workerGroupSpecs"]
    return [n for g in groups for n in (g.get("scaleStrategy") or {}).get("workersToDelete") or []]


def _summary(
    cluster: LocalCluster, daemon: DaemonProcess, result: dict[str, Any], code: int, out: TextIO
) -> int:
    t = cluster.timeline
    demand = t.first("demand")
    scaled = t.first("patch_replicas")
    hosts_up = [m for m in t.moments if m.kind == "ray_host"]
    created = {
        m.text.split(" slice ")[1].split(" ")[0]
        for m in t.moments
        if m.kind == "pod_created" and " slice " in m.text
    }
    deleted_pods = [m for m in t.moments if m.kind == "pod_deleted" and "tpu-group" in m.text]
    rows = [
        ("demand → patch (replicas up)", _since(demand, scaled)),
        (
            "demand → all Ray hosts of the first slice up",
            _since(demand, hosts_up[3] if len(hosts_up) > 3 else None),
        ),
        ("slices created (tpu-group)", str(len(created))),
        ("TPU pods deleted", str(len(deleted_pods))),
        ("partial slices ever requested", str(len(cluster.violations))),
        ("daemon exit code after SIGTERM", str(code)),
    ]
    print("\nSummary", file=out)
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"  {name:<{width}}  {value}", file=out)
    ok = (
        "WORK_DONE" in result["driver"]
        and "CPU_DONE" in result["driver"]
        and scaled is not None
        and len(created) >= 1
        and not cluster.violations
        and code == 0
    )
    print("\nscenario " + ("completed" if ok else "FAILED"), file=out)
    for v in cluster.violations:
        print(f"  violation: {v}", file=out)
    return 0 if ok else 1


def _since(a: Moment | None, b: Moment | None) -> str:
    return f"{b.at - a.at:.1f} s" if a and b else "n/a"


def main(slices: int, hosts: int) -> int:
    if hosts not in TOPOLOGIES:
        print(f"--hosts must be one of {sorted(TOPOLOGIES)}", file=sys.stderr)
        return 2
    started = time.monotonic()
    code = asyncio.run(run_demo(Scenario(slices=slices, hosts=hosts)))
    print(f"(demo took {time.monotonic() - started:.0f} s)")
    return code


_EMBEDDED_SAMPLE = """
apiVersion: ray.io/v1
kind: RayCluster
metadata: {name: raycluster-tpu-v6e-multihost}
spec:
  headGroupSpec:
    rayStartParams: {}
    template:
      spec:
        containers:
        - name: ray-head
          image: rayproject/ray:2.52.0-py310
          resources:
            limits: {cpu: "8", memory: 40G}
  workerGroupSpecs:
  - groupName: tpu-group
    replicas: 1
    minReplicas: 0
    maxReplicas: 1
    numOfHosts: 4
    rayStartParams: {}
    template:
      spec:
        containers:
        - name: ray-worker
          image: rayproject/ray:2.52.0-py310
          resources:
            limits: {cpu: "24", google.com/tpu: "4", memory: 200G}
        nodeSelector:
          cloud.google.com/gke-tpu-accelerator: tpu-v6e-slice
          cloud.google.com/gke-tpu-topology: 4x4
"""
