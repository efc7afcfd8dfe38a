"""Live side-by-side: ours, Ray v1 (`KubeRayNodeProvider`) and Ray v2 (`KubeRayProvider`).

All three run as their own processes against one API-server stand-in (each through its own
counting proxy) and one real local Ray head. Two experiments:

- **reaction**: each autoscaler watches its own RayCluster (one CPU group, no pods yet) on the
  same Ray head. A driver adds one pending `num_cpus=1` task per trial; the bench polls the GCS
  every 20 ms and notes when the new demand is visible, then when each RayCluster's `replicas`
  reaches the new count (the stand-in timestamps every write). One demand, three reactions: a
  paired trial, and the ratio is taken per trial. Trials start at a random phase.
- **idle**: one RayCluster with N pods (head + N−1 Running workers, min = replicas, no demand);
  each autoscaler in turn is started on it, synced, then watched for a window: API requests and
  bytes through its proxy, CPU seconds and RSS from /proc.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import clusters
from common import (
    BenchApiServer,
    CountingProxy,
    Tls,
    cpu_seconds,
    loadavg,
    make_tls,
    rss_mb,
)

from kuberay_scaler.adapters.ray_gcs.client import GcsClient
from kuberay_standins.apiserver import RESTRICTED_TOKEN
from kuberay_standins.ray_local import RayHead, free_port

HERE = Path(__file__).resolve().parent
KINDS = ("ours", "ray-v2", "ray-v1")


@dataclass
class Proc:
    kind: str
    cluster: str
    process: subprocess.Popen[bytes]
    proxy: CountingProxy
    log_path: Path
    http: str | None = None

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def log_tail(self, chars: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""


@dataclass
class World:
    api: BenchApiServer
    head: RayHead
    tls: Tls
    workdir: Path
    procs: list[Proc] = field(default_factory=list)

    @property
    def upstream(self) -> tuple[str, int]:
        host, port = self.api.url.removeprefix("http://").rsplit(":", 1)
        return host, int(port)

    async def start(
        self, kind: str, cluster: str, token: str = RESTRICTED_TOKEN, **env: str
    ) -> Proc:
        proxy = CountingProxy(self.upstream, self.tls if kind != "ours" else None)
        url = await proxy.start()
        log_path = self.workdir / f"{kind}-{cluster}-{len(self.procs)}.log"
        if kind == "ours":
            cmd, full_env, http = self._ours(cluster, url, env, token)
        else:
            (cmd, full_env), http = self._ray(kind, cluster, proxy.port, env), None
        process = _spawn(cmd, full_env, log_path, self.workdir)
        proc = Proc(kind, cluster, process, proxy, log_path, http)
        self.procs.append(proc)
        return proc

    def _ours(
        self, cluster: str, url: str, extra: dict[str, str], token: str = RESTRICTED_TOKEN
    ) -> tuple[list[str], dict[str, str], str]:
        kubeconfig = self.workdir / f"kubeconfig-{cluster}"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "b", "cluster": {"server": url}}],
            "users": [{"name": "b", "user": {"token": token}}],
            "contexts": [{"name": "b", "context": {"cluster": "b", "user": "b"}}],
            "current-context": "b",
        }
        kubeconfig.write_text(json.dumps(config))
        http = f"127.0.0.1:{free_port()}"
        env = _clean_env() | {
            "RAY_CLUSTER_NAME": cluster,
            "RAY_CLUSTER_NAMESPACE": cluster,
            "KUBERAY_SCALER_KUBECONFIG": str(kubeconfig),
            "KUBERAY_SCALER_GCS_ADDRESS": self.head.gcs_address,
            "KUBERAY_SCALER_HTTP_ADDRESS": http,
            "KUBERAY_SCALER_LOG_FORMAT": "json",
            # Ray's autoscalers have no scale-down delay after a scale-up: none here either.
            "KUBERAY_SCALER_SCALE_DOWN_DELAY_AFTER_ADD_S": "0",
            **extra,
        }
        return [sys.executable, "-m", "kuberay_scaler", "run"], env, http

    def _ray(
        self, kind: str, cluster: str, port: int, extra: dict[str, str]
    ) -> tuple[list[str], dict[str, str]]:
        version = kind.removeprefix("ray-")
        env = (
            _clean_env()
            | self.head.client_env()
            | {
                "KUBERNETES_SERVICE_HOST": "127.0.0.1",
                "KUBERNETES_SERVICE_PORT_HTTPS": str(port),
                "RAY_KUBERAY_CLIENT_CERT_PATH": str(self.tls.cert),
                "RAY_KUBERAY_CLIENT_KEY_PATH": str(self.tls.key),
                "RAY_KUBERAY_CA_CERT_PATH": str(self.tls.cert),
                "RAY_HEAD_POD_NAME": clusters.HEAD_POD,
                "AUTOSCALER_METRIC_PORT": str(free_port()),
                "RAY_enable_autoscaler_v2": "1" if version == "v2" else "0",
                **extra,
            }
        )
        script = str(HERE / "ray_autoscaler.py")
        args = [sys.executable, script, version, cluster, cluster]
        return [*args, self.head.gcs_address], env

    def add_cluster(self, name: str, workers: int = 0, **spec: Any) -> None:
        self.api.create("rayclusters", name, clusters.raycluster(name, replicas=workers, **spec))
        self.api.create("pods", name, clusters.head_pod(name))
        for i in range(workers):
            self.api.create("pods", name, clusters.worker_pod(name, i))

    def drop_cluster(self, name: str) -> None:
        for pod in self.api.list("pods", name, f"ray.io/cluster={name}"):
            self.api.delete("pods", name, pod["metadata"]["name"], grace_period_seconds=0)
        self.api.delete("rayclusters", name, name)


def _spawn(
    cmd: list[str], env: dict[str, str], log_path: Path, cwd: Path
) -> subprocess.Popen[bytes]:
    with log_path.open("wb") as out:
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=cwd)


def _clean_env() -> dict[str, str]:
    drop = ("RAY_", "KUBERAY_", "KUBERNETES_")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


async def ready(proc: Proc, timeout_s: float) -> float:
    """Wait until the autoscaler has synced; returns seconds waited.

    Ours: /readyz answers 200. Ray's: it has listed the pods and read the RayCluster twice (one
    full update loop done, the second begun)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if not proc.alive():
            raise RuntimeError(f"{proc.kind} exited:\n{proc.log_tail()}")
        if proc.http is not None:
            if await asyncio.to_thread(_http_ok, f"http://{proc.http}/readyz"):
                return time.monotonic() - started
        elif proc.proxy.counter.requests >= 4:
            return time.monotonic() - started
        await asyncio.sleep(0.25)
    raise TimeoutError(f"{proc.kind} not synced after {timeout_s} s:\n{proc.log_tail()}")


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _http_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


# ---- reaction -------------------------------------------------------------------------------


class GcsWatch:
    """Polls GetClusterResourceState every `period_s`; notes when the pending CPU count changes."""

    def __init__(self, address: str, period_s: float = 0.02) -> None:
        self.client = GcsClient(address)
        self.period_s = period_s
        self.pending = 0
        self.changed_at = 0.0
        self._changed = asyncio.Event()

    async def run(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                reply = await self.client.get_cluster_resource_state()
                count = _pending_cpu(reply)
                if count != self.pending:
                    self.pending, self.changed_at = count, time.monotonic()
                    self._changed.set()
            await asyncio.sleep(self.period_s)

    async def until(self, count: int, timeout_s: float) -> float:
        deadline = time.monotonic() + timeout_s
        while self.pending < count:
            self._changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"GCS never showed {count} pending tasks")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)
        return self.changed_at


def _pending_cpu(reply: Any) -> int:
    state = reply.cluster_resource_state
    return sum(
        int(r.count)
        for r in state.pending_resource_requests
        if r.request.resources_bundle.get("CPU", 0) >= 1
    )


class Driver:
    def __init__(self, head: RayHead, resources: Mapping[str, float] | None = None) -> None:
        env = _clean_env() | head.client_env()
        extra = [json.dumps(dict(resources))] if resources else []
        self.process = subprocess.Popen(
            [sys.executable, str(HERE / "demand_driver.py"), head.gcs_address, head.ip, *extra],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )

    def wait_ready(self) -> None:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if b"ready" not in line:
            raise RuntimeError(f"driver failed: {line!r}")

    def up(self) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(b"up\n")
        self.process.stdin.flush()
        self.process.stdout.readline()

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, 9)
        self.process.wait()


ROUND = 8  # trials per set of fresh autoscalers: Ray caps pending launches at 10


@contextlib.asynccontextmanager
async def live_world(ip: str, prefix: str) -> AsyncIterator[World]:
    """The API-server stand-in and one real Ray head; every process started in it is stopped."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    api = BenchApiServer(bookmark_interval=5.0, history_limit=50_000)
    await api.start()
    head_env = {"RAY_CLOUD_INSTANCE_ID": clusters.HEAD_POD, "RAY_NODE_TYPE_NAME": "headgroup"}
    head = await asyncio.to_thread(RayHead.start, ip=ip, env=head_env)
    world = World(api, head, make_tls(workdir), workdir)
    try:
        yield world
    finally:
        for proc in world.procs:
            proc.stop()
        await asyncio.to_thread(head.stop)
        await api.stop()
        shutil.rmtree(workdir, ignore_errors=True)  # nothing left in /tmp after a bench


@dataclass
class Round:
    """One round's fresh clusters (kind → name), autoscalers and driver, and every `replicas`
    write the stand-in saw on each cluster (monotonic time, value)."""

    names: Mapping[str, str]
    procs: Mapping[str, Proc]
    driver: Driver
    seen: Mapping[str, list[tuple[float, int]]]


@contextlib.asynccontextmanager
async def fresh_round(
    world: World, kinds: tuple[str, ...], prefix: str, **spec: Any
) -> AsyncIterator[Round]:
    """Fresh RayClusters (one per kind, `spec` for each), their autoscalers started and ready,
    and a fresh driver; all of it stopped and deleted after."""
    names = {kind: f"{prefix}-{kind}" for kind in kinds}
    for name in names.values():
        world.add_cluster(name, **spec)
    seen: dict[str, list[tuple[float, int]]] = {name: [] for name in names.values()}
    unsubscribe = world.api.on_replicas(
        lambda cluster, _g, replicas, at: (
            seen[cluster].append((at, replicas)) if cluster in seen else None
        )
    )
    procs = {kind: await world.start(kind, names[kind]) for kind in kinds}
    driver = Driver(world.head)
    try:
        for proc in procs.values():
            await ready(proc, 240)
        await asyncio.to_thread(driver.wait_ready)
        yield Round(names, procs, driver, seen)
    finally:
        driver.stop()
        unsubscribe()
        for proc in procs.values():
            proc.stop()
            await proc.proxy.stop()
        for name in names.values():
            await asyncio.to_thread(world.drop_cluster, name)


async def reaction(world: World, trials: int, log: Callable[[str], None]) -> dict[str, Any]:
    """Trials in rounds: nothing ever launches pods, so each round starts fresh autoscalers on
    fresh RayClusters and a fresh driver (Ray's autoscalers stop launching once 10 launches are
    pending, `AUTOSCALER_MAX_CONCURRENT_LAUNCHES`)."""
    watch = GcsWatch(world.head.gcs_address)
    watcher = asyncio.create_task(watch.run())
    rows: list[dict[str, Any]] = []
    rnd = random.Random(13)
    try:
        for first in range(0, trials, ROUND):
            count = min(ROUND, trials - first)
            rows += await _round(world, watch, rnd, first // ROUND, first, count, log)
    finally:
        watcher.cancel()
        await watch.client.close()
    return {"trials": rows, "summary": _reaction_summary(rows)}


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
    async with fresh_round(world, KINDS, f"r{index}") as live:
        while watch.pending:  # noqa: ASYNC110 - the last round's driver is gone; so its demand
            await asyncio.sleep(0.1)
        await asyncio.sleep(6)  # let every loop settle into its rhythm
        for k in range(1, count + 1):
            await asyncio.sleep(rnd.uniform(0.5, 5.5))
            sent = time.monotonic()
            await asyncio.to_thread(live.driver.up)
            visible = await watch.until(k, 30)
            row: dict[str, Any] = {"trial": first + k, "round": index, "load1": loadavg()[0]}
            for kind, name in live.names.items():
                at = await _reached(live.seen[name], k, sent, 30)
                row[kind] = None if at is None else round(at - visible, 4)
            rows.append(row)
            log(f"  trial {first + k}: " + ", ".join(f"{kind} {row[kind]}" for kind in KINDS))
    return rows


async def _reached(
    events: list[tuple[float, int]], count: int, after: float, timeout_s: float
) -> float | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for at, replicas in events:
            if replicas >= count and at >= after:
                return at
        await asyncio.sleep(0.01)
    return None


def _reaction_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in KINDS:
        values = sorted(r[kind] for r in rows if r[kind] is not None)
        out[kind] = {
            "n": len(values),
            "missed": sum(1 for r in rows if r[kind] is None),
            **{f"p{q}": _quantile(values, q / 100) for q in (50, 90, 99)},
        }
    for ray in ("ray-v1", "ray-v2"):
        ratios = sorted(
            r[ray] / r["ours"]
            for r in rows
            if r[ray] is not None and r["ours"] is not None and r["ours"] > 0
        )
        out[f"ratio_{ray}_over_ours"] = {"median": _quantile(ratios, 0.5), "per_trial": ratios}
    return out


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return round(statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1], 4)


# ---- idle -------------------------------------------------------------------------------------


async def idle(
    world: World, size: int, window_s: float, log: Callable[[str], None], long_s: float = 0
) -> dict[str, Any]:
    name = f"idle-{size}"
    await asyncio.to_thread(world.add_cluster, name, size - 1)
    out: dict[str, Any] = {}
    try:
        for kind in KINDS:
            out[kind] = await _idle_one(world, kind, name, window_s)
            log(f"  {size} pods, {kind}: {json.dumps(out[kind])[:300]}")
        if long_s:
            out["ours-long"] = await _idle_one(world, "ours", name, long_s)
            log(f"  {size} pods, ours for {long_s:.0f} s: {json.dumps(out['ours-long'])[:300]}")
    finally:
        await asyncio.to_thread(world.drop_cluster, name)
    return out


async def _idle_one(world: World, kind: str, cluster: str, window_s: float) -> dict[str, Any]:
    # Pods here never get a Ray node: keep ours from calling them broken within the run.
    env = {"KUBERAY_SCALER_MISSING_NODE_GRACE_S": "36000"} if kind == "ours" else {}
    proc = await world.start(kind, cluster, **env)
    try:
        sync_s = await ready(proc, 600)
        await asyncio.sleep(5)
        pid = proc.process.pid
        rss_after_sync = rss_mb(pid)
        cpu0, (req0, bytes0), t0 = cpu_seconds(pid), proc.proxy.counter.snapshot(), time.monotonic()
        metrics0 = _reconcile_metrics(proc)
        samples = [(0.0, rss_after_sync)]
        while (elapsed := time.monotonic() - t0) < window_s:
            await asyncio.sleep(min(5.0, window_s - elapsed))
            if not proc.alive():
                raise RuntimeError(f"{kind} exited:\n{proc.log_tail()}")
            samples.append((round(time.monotonic() - t0, 1), round(rss_mb(pid), 1)))
        minutes = (time.monotonic() - t0) / 60
        req1, bytes1 = proc.proxy.counter.snapshot()
        result = {
            "sync_s": round(sync_s, 2),
            "requests_per_min": round((req1 - req0) / minutes, 2),
            "bytes_per_min": round((bytes1 - bytes0) / minutes),
            "cpu_s_per_min": round((cpu_seconds(pid) - cpu0) / minutes, 3),
            "rss_after_sync_mb": round(rss_after_sync, 1),
            "rss_end_mb": samples[-1][1],
            "rss_samples": samples,
            "load1": loadavg()[0],
        }
        metrics1 = _reconcile_metrics(proc)
        if metrics0 and metrics1:
            count = metrics1[1] - metrics0[1]
            result["reconciles"] = count
            if count:
                result["reconcile_mean_s"] = round((metrics1[0] - metrics0[0]) / count, 4)
        return result
    finally:
        proc.stop()
        await proc.proxy.stop()


def _reconcile_metrics(proc: Proc) -> tuple[float, float] | None:
    """(sum, count) of the daemon's reconcile-duration histogram."""
    if proc.http is None:
        return None
    try:
        text = _http_text(f"http://{proc.http}/metrics")
    except OSError:
        return None
    values = {}
    for line in text.splitlines():
        for key in ("_sum", "_count"):
            if line.startswith(f"kuberay_scaler_reconcile_duration_seconds{key} "):
                values[key] = float(line.split()[1])
    return (values["_sum"], values["_count"]) if len(values) == 2 else None


# ---- entry --------------------------------------------------------------------------------------


async def run(
    *,
    trials: int,
    sizes: list[int],
    window_s: float,
    log: Callable[[str], None],
    long_s: float = 0,
) -> dict[str, Any]:
    results: dict[str, Any] = {"load_before": loadavg()}
    async with live_world("127.0.0.31", "krs-bench-") as world:
        if trials:
            log(f"reaction: {trials} trials")
            results["reaction"] = await reaction(world, trials, log)
        results["idle"] = {}
        for size in sizes:
            log(f"idle: {size} pods, {window_s:.0f} s window each")
            long = long_s if size == max(sizes) else 0
            results["idle"][str(size)] = await idle(world, size, window_s, log, long)
    results["load_after"] = loadavg()
    return results


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--sizes", default="100")
    parser.add_argument("--window", type=float, default=15)
    args = parser.parse_args()
    out = asyncio.run(
        run(
            trials=args.trials,
            sizes=[int(s) for s in args.sizes.split(",") if s],
            window_s=args.window,
            log=lambda s: print(s, flush=True),
        )
    )
    print(json.dumps(out, indent=1))
