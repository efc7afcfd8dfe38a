"""Ours live at 1k / 10k Ray nodes: idle CPU and reaction (P1) against a GCS stand-in.

    .venv/bin/python bench/bench_scale_live.py [--hosts 1000,10000] [--window 60] [--trials 8]
    .venv/bin/python bench/bench_scale_live.py --hosts 10000 --real-pods --rss-minutes 30 \
        --rss-every 30

A real Ray head cannot hold 10k nodes here, so the GCS side is a stand-in: a grpc.aio server in
this process that serves the planner benchmark's 20-group TPU scenario (scenario.py, scaled to
N hosts) as `GetClusterResourceState` does, raising the state version, each node's
`node_state_version` and every idle node's idle clock on every call, as a GCS does. It also
answers `GetClusterId`, `GetClusterStatus`, `ReportAutoscalingState` and `DrainNode` (accepted).
The API-server stand-in holds the scenario's RayCluster and its N pods (every pod with its Ray
node). The daemon runs as its own process (`python -m kuberay_scaler run`), at its defaults except
an idle timeout of 10 h (the scenario's idle slices stay: nothing to do while idle).

- **idle**: after /readyz plus 10 s, the daemon's CPU (user + system, /proc) over the window.
- **rss** (`--rss-minutes M --rss-every S`, instead of idle and reaction): after /readyz plus
  10 s, the daemon's RSS every S seconds for M minutes while the cluster idles; first, last, min,
  max, peak (VmHWM), the least-squares slope in MB per 10 min, CPU and GCS calls over the span,
  the 1-minute load at start and end. `--real-pods` dresses every pod to real size (real_pods.py,
  managedFields included, as bench_rss.py does; the mean JSON size is reported).
- **reaction**: each trial sets a pending `{"CPU": 16}` request to the stand-in's reply at a
  random phase, more than every free CPU of the cluster can hold (and more each trial, so
  every trial needs more replicas); the time from that moment (the next call returns it) to
  the first RayCluster write that raises a group's replicas, taken from the API-server
  stand-in's store events. `--phase MIN,MAX` spaces the trials (default 2-7 s, mostly while
  the poller still polls at its "moving" pace; past 6 s a trial starts from the idle cadence:
  `from_idle` marks those, `from_idle_max_s` is their slowest). `--py-spy FILE` records the
  daemon's stacks through the trials (py-spy, not pausing it) for `pyspy_summary.py`.

Ray's own autoscalers are not run here: they need far more of the GCS than this stand-in serves
(v2: `GcsClient` node tables, KV for the cluster config, the autoscaler state; v1: the monitor's
`GetAllNodeInfo`, resource load by node, the internal KV), so their small-cluster figures come
from bench_live.py against a real head. `PYTHONPATH=<copy of an older tree>` runs an older daemon
for a before/after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import grpc
import real_pods
import scenario
from bench_live import _clean_env, _http_ok, _spawn
from common import BenchApiServer, cpu_seconds, loadavg, rss_mb
from ray.core.generated import (
    autoscaler_pb2,
    autoscaler_pb2_grpc,
    gcs_service_pb2,
    gcs_service_pb2_grpc,
)

from kuberay_standins.apiserver import RESTRICTED_TOKEN
from kuberay_standins.ray_local import free_port

HOSTS_AT_SCALE_1 = 1950
DEMAND = {"CPU": 16.0}
DEMAND_STEP = 40  # bundles added per trial: a few new cpu-16/cpu-32 hosts each time


class GcsStandIn(
    autoscaler_pb2_grpc.AutoscalerStateServiceServicer,  # type: ignore[misc]
    gcs_service_pb2_grpc.NodeInfoGcsServiceServicer,  # type: ignore[misc]
):
    """What the daemon calls on a GCS, over the scenario's state."""

    def __init__(self, state: Any) -> None:
        self.reply = autoscaler_pb2.GetClusterResourceStateReply()
        self.reply.cluster_resource_state.CopyFrom(state)
        self.calls = 0
        self.changed_at = 0.0  # when the demand last changed (monotonic)
        self.last_call = time.monotonic()
        # Copies of DEMAND the existing nodes could take: demand beyond them needs new hosts.
        self.room = sum(
            int(n.available_resources.get("CPU", 0.0) // DEMAND["CPU"]) for n in state.node_states
        )

    def set_demand(self, count: int) -> None:
        state = self.reply.cluster_resource_state
        del state.pending_resource_requests[:]
        if count:
            request = state.pending_resource_requests.add(count=count)
            request.request.resources_bundle.update(DEMAND)
        self.changed_at = time.monotonic()

    async def GetClusterResourceState(self, request: Any, context: Any) -> Any:
        self.calls += 1
        # Idle clocks grow with the time that passed, as a GCS's do (a fixed step per call made
        # every idle node look busy in between whenever polls were not exactly 1 s apart).
        now = time.monotonic()
        elapsed_ms = round((now - self.last_call) * 1000)
        self.last_call = now
        state = self.reply.cluster_resource_state
        state.cluster_resource_state_version += 1
        idle = autoscaler_pb2.NodeStatus.Value("IDLE")
        for node in state.node_states:
            node.node_state_version += 1
            if node.status == idle:
                node.idle_duration_ms += elapsed_ms
        return self.reply

    async def GetClusterStatus(self, request: Any, context: Any) -> Any:
        return autoscaler_pb2.GetClusterStatusReply()

    async def ReportAutoscalingState(self, request: Any, context: Any) -> Any:
        return autoscaler_pb2.ReportAutoscalingStateReply()

    async def DrainNode(self, request: Any, context: Any) -> Any:
        return autoscaler_pb2.DrainNodeReply(is_accepted=True)

    async def GetClusterId(self, request: Any, context: Any) -> Any:
        return gcs_service_pb2.GetClusterIdReply(cluster_id=bytes(range(28)))


async def serve_gcs(state: Any) -> tuple[grpc.aio.Server, str, GcsStandIn]:
    server = grpc.aio.server(options=[("grpc.max_send_message_length", 512 * 2**20)])
    gcs = GcsStandIn(state)
    autoscaler_pb2_grpc.add_AutoscalerStateServiceServicer_to_server(gcs, server)
    gcs_service_pb2_grpc.add_NodeInfoGcsServiceServicer_to_server(gcs, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}", gcs


def cluster(hosts: int) -> scenario.Scenario:
    sc = scenario.build(seed=7, scale=scenario.Scale(hosts / HOSTS_AT_SCALE_1, 0.01))
    del sc.state.pending_resource_requests[:]
    del sc.state.pending_gang_resource_requests[:]
    del sc.state.cluster_resource_constraints[:]
    return sc


def dress(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Real-size pods with the scenario pods' names and labels (bench_rss.py's way)."""
    out = []
    for index, pod in enumerate(pods):
        labels = pod["metadata"]["labels"]
        real = real_pods.real_pod(pod["metadata"]["name"], labels["ray.io/group"], index)
        real["metadata"]["labels"].update(labels)
        out.append(real)
    return out


def _daemon_env(workdir: Path, api_url: str, gcs_address: str) -> tuple[dict[str, str], str]:
    kubeconfig = workdir / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "b", "cluster": {"server": api_url}}],
                "users": [{"name": "b", "user": {"token": RESTRICTED_TOKEN}}],
                "contexts": [{"name": "b", "context": {"cluster": "b", "user": "b"}}],
                "current-context": "b",
            }
        )
    )
    http = f"127.0.0.1:{free_port()}"
    env = _clean_env() | {
        "RAY_CLUSTER_NAME": scenario.CLUSTER,
        "RAY_CLUSTER_NAMESPACE": "default",
        "KUBERAY_SCALER_KUBECONFIG": str(kubeconfig),
        "KUBERAY_SCALER_GCS_ADDRESS": gcs_address,
        "KUBERAY_SCALER_HTTP_ADDRESS": http,
        "KUBERAY_SCALER_LOG_FORMAT": "json",
        "KUBERAY_SCALER_IDLE_TIMEOUT_S": "36000",
    }
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env, http


async def _ready(process: Any, http: str, log_path: Path, timeout_s: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if process.poll() is not None:
            raise RuntimeError(f"daemon exited:\n{_tail(log_path)}")
        if await asyncio.to_thread(_http_ok, f"http://{http}/readyz"):
            return time.monotonic() - started
        await asyncio.sleep(0.25)
    raise TimeoutError(f"daemon not ready after {timeout_s} s:\n{_tail(log_path)}")


def _tail(log_path: Path) -> str:
    return log_path.read_text()[-3000:]


async def measure(
    hosts: int,
    window_s: float,
    trials: int,
    seed: int = 3,
    *,
    real: bool = False,
    rss_minutes: float = 0.0,
    rss_every_s: float = 30.0,
    phase: tuple[float, float] = (2.0, 7.0),
    py_spy: str | None = None,
) -> dict[str, Any]:
    sc = cluster(hosts)
    if real:
        sc.pods[:] = dress(sc.pods)
    workdir = Path(tempfile.mkdtemp(prefix="krs-scale-"))
    api = BenchApiServer(bookmark_interval=5.0, history_limit=50_000)
    api_url = await api.start()
    server, gcs_address, gcs = await serve_gcs(sc.state)
    ns = "default"
    api.create("rayclusters", ns, sc.raycluster)
    for pod in sc.pods:
        pod["metadata"]["namespace"] = ns
        api.create("pods", ns, pod)
    writes: list[tuple[float, str, int]] = []
    unsubscribe = api.on_replicas(lambda _c, g, replicas, at: writes.append((at, g, replicas)))
    env, http = _daemon_env(workdir, api_url, gcs_address)
    log_path = workdir / "daemon.log"
    process = _spawn([sys.executable, "-m", "kuberay_scaler", "run"], env, log_path, workdir)
    out: dict[str, Any] = {"hosts": hosts, "pods": len(sc.pods), "nodes": len(sc.state.node_states)}
    out["pod_json_bytes_mean"] = round(statistics.fmean(map(real_pods.pod_json_size, sc.pods)))
    out["real_pods"] = real
    try:
        out["sync_s"] = round(await _ready(process, http, log_path, 900), 2)
        out["rss_at_ready_mb"] = round(rss_mb(process.pid), 1)
        await asyncio.sleep(10)
        if rss_minutes > 0:
            out["rss"] = await _rss_series(process, gcs, writes, rss_minutes, rss_every_s)
            return out
        writes_before = len(writes)
        cpu0, calls0, t0 = cpu_seconds(process.pid), gcs.calls, time.monotonic()
        load0 = loadavg()
        await asyncio.sleep(window_s)
        minutes = (time.monotonic() - t0) / 60
        out["idle"] = {
            "cpu_s_per_min": round((cpu_seconds(process.pid) - cpu0) / minutes, 3),
            "gcs_calls_per_min": round((gcs.calls - calls0) / minutes, 1),
            "writes": len(writes) - writes_before,
            "rss_mb": round(rss_mb(process.pid), 1),
            "load": [load0, loadavg()],
        }
        spy = _py_spy(process.pid, py_spy) if py_spy else None
        try:
            out["reaction"] = await _reaction(gcs, writes, trials, random.Random(seed), phase)
        finally:
            if spy is not None:
                spy.send_signal(signal.SIGINT)  # py-spy writes its profile on SIGINT
                await asyncio.to_thread(spy.wait, 60)
    finally:
        unsubscribe()
        process.terminate()
        try:
            await asyncio.wait_for(asyncio.to_thread(process.wait), 20)
        except TimeoutError:
            process.kill()
        await server.stop(None)
        await api.stop()
        shutil.rmtree(workdir, ignore_errors=True)  # nothing left in /tmp after a bench
    return out


async def _rss_series(
    process: Any, gcs: GcsStandIn, writes: list[Any], minutes: float, every_s: float
) -> dict[str, Any]:
    """RSS every `every_s` for `minutes` while the cluster idles."""
    pid = process.pid
    load0, cpu0, calls0, writes0 = loadavg(), cpu_seconds(pid), gcs.calls, len(writes)
    t0 = time.monotonic()
    samples: list[tuple[float, float]] = []
    while True:
        if process.poll() is not None:  # a dead daemon's statm reads as 0 MB
            raise RuntimeError(f"daemon exited after {len(samples)} samples")
        samples.append((round(time.monotonic() - t0, 1), round(rss_mb(pid), 1)))
        if samples[-1][0] >= minutes * 60 - 0.5:
            break
        await asyncio.sleep(max(0.0, t0 + len(samples) * every_s - time.monotonic()))
    span_min = (time.monotonic() - t0) / 60
    rss = [mb for _t, mb in samples]
    return {
        "minutes": round(span_min, 2),
        "every_s": every_s,
        "first_mb": rss[0],
        "last_mb": rss[-1],
        "min_mb": min(rss),
        "max_mb": max(rss),
        "peak_vmhwm_mb": _vm_hwm_mb(pid),
        "slope_mb_per_10min": round(_slope(samples) * 600, 2),
        "cpu_s_per_min": round((cpu_seconds(pid) - cpu0) / span_min, 3),
        "gcs_calls_per_min": round((gcs.calls - calls0) / span_min, 1),
        "writes": len(writes) - writes0,
        "load": [load0, loadavg()],
        "samples": samples,
    }


def _slope(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB): MB per second."""
    if len(samples) < 2:
        return 0.0
    return statistics.linear_regression([t for t, _ in samples], [mb for _, mb in samples]).slope


def _vm_hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


# The poller polls faster for this long after the state moved (cadence.BUSY_FOR_S): a trial
# that starts later starts from the idle cadence.
MOVING_FOR_S = 5.0


def _py_spy(pid: int, output: str) -> subprocess.Popen[bytes]:
    """py-spy sampling the daemon (without pausing it) through the reaction trials, as
    collapsed stacks (`bench/pyspy_summary.py` reads them)."""
    binary = Path(sys.executable).with_name("py-spy")
    command = [str(binary) if binary.exists() else "py-spy", "record", "--pid", str(pid)]
    command += ["--rate", "200", "--nonblocking", "--format", "raw", "--output", output]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def _reaction(
    gcs: GcsStandIn,
    writes: list[tuple[float, str, int]],
    trials: int,
    rnd: random.Random,
    phase: tuple[float, float] = (2.0, 7.0),
) -> dict[str, Any]:
    rows: list[float | None] = []
    from_idle: list[bool] = []
    loads: list[float] = []
    for k in range(1, trials + 1):
        last_change = gcs.changed_at
        await asyncio.sleep(rnd.uniform(*phase))  # a random phase of the poll cadence
        seen = len(writes)
        gcs.set_demand(gcs.room + DEMAND_STEP * k)
        from_idle.append(k == 1 or gcs.changed_at - last_change > MOVING_FOR_S + 1.0)
        at = await _first_write(writes, seen, gcs.changed_at, 30.0)
        rows.append(None if at is None else round(at - gcs.changed_at, 4))
        loads.append(loadavg()[0])
    idle_rows = [r for r, idle in zip(rows, from_idle, strict=True) if idle and r is not None]
    return {
        "trials": rows,
        "from_idle": from_idle,  # started after the poller went back to its idle cadence
        "missed": sum(1 for r in rows if r is None),
        **_percentiles([r for r in rows if r is not None]),
        "from_idle_max_s": max(idle_rows) if idle_rows else None,
        "load1": loads,
    }


def _percentiles(done: list[float]) -> dict[str, float | None]:
    done = sorted(done)
    if not done:
        return {"p50_s": None, "p90_s": None, "p99_s": None, "max_s": None}

    def rank(q: float) -> float:
        return done[min(len(done) - 1, int(q * len(done)))]

    return {
        "p50_s": round(statistics.median(done), 3),
        "p90_s": round(rank(0.9), 3),
        "p99_s": round(rank(0.99), 3),
        "max_s": done[-1],
    }


async def _first_write(
    writes: list[tuple[float, str, int]], seen: int, after: float, timeout_s: float
) -> float | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for at, _group, _replicas in writes[seen:]:
            if at >= after:
                return at
        await asyncio.sleep(0.005)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="1000,10000")
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--real-pods", action="store_true", help="pods of real size (~3.8 KB)")
    parser.add_argument("--rss-minutes", type=float, default=0.0, help="RSS series instead")
    parser.add_argument("--rss-every", type=float, default=30.0, help="seconds between samples")
    parser.add_argument(
        "--phase", default="2,7", help="MIN,MAX seconds between trials (past 6 s: from idle)"
    )
    parser.add_argument("--py-spy", help="collapsed-stack profile of the daemon's trials here")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    low, high = (float(x) for x in args.phase.split(","))
    results = []
    for n in (int(s) for s in args.hosts.split(",")):
        rss = {"real": args.real_pods, "rss_minutes": args.rss_minutes}
        spy = f"{args.py_spy}.{n}" if args.py_spy else None
        run = measure(
            n, args.window, args.trials, **rss, rss_every_s=args.rss_every,
            phase=(low, high), py_spy=spy,
        )  # fmt: skip
        result = {"started": _utc(), **asyncio.run(run), "ended": _utc()}
        print(json.dumps(result), flush=True)
        results.append(result)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


def _utc() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


if __name__ == "__main__":
    raise SystemExit(main())
