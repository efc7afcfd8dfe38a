"""A whole local cluster for the demo and the integration tests.

API-server stand-in + KubeRay operator stand-in + a real Ray head; every worker pod the fake
kubelet marks Running becomes a real Ray host on its own 127.0.0.N, sized by the `ray start`
line the operator stand-in wrote into the pod as KubeRay does (ray_start.py), with the TPU env
(slice name, worker id) and `RAY_CLOUD_INSTANCE_ID` = pod name; deleting the pod stops the
host. The daemon runs as a real subprocess configured by env vars only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from ray._private.accelerators.tpu import infer_tpu_pod_type_from_topology

from kuberay_standins._k8s_store import StoredEvent
from kuberay_standins.apiserver import RESTRICTED_TOKEN, ApiServerStandIn
from kuberay_standins.operator import OperatorStandIn
from kuberay_standins.ray_local import (
    MAX_CONCURRENT_STARTS,
    RayHead,
    RayHost,
    RayStartError,
    free_port,
    scratch_dir,
    tpu_host_env,
)
from kuberay_standins.ray_start import flags_of_pod

log = structlog.get_logger(__name__)

REPLICA_NAME = "ray.io/worker-group-replica-name"
HOST_INDEX = "ray.io/replica-host-index"
GROUP = "ray.io/group"
GKE_TPU_ACCELERATOR = "cloud.google.com/gke-tpu-accelerator"
GKE_TPU_TOPOLOGY = "cloud.google.com/gke-tpu-topology"
# GKE accelerator label → TPU generation as Ray names it (TPU_ACCELERATOR_TYPE's prefix).
TPU_GENERATIONS = {
    "tpu-v4-podslice": "v4",
    "tpu-v5-lite-podslice": "v5litepod",
    "tpu-v5p-slice": "v5p",
    "tpu-v6e-slice": "v6e",
    "tpu7x": "v7x",
}


@dataclass
class Moment:
    """One line of the timeline."""

    at: float  # seconds since the cluster started
    kind: str
    text: str


@dataclass
class Timeline:
    started: float = field(default_factory=time.monotonic)
    started_wall: float = field(default_factory=time.time)
    moments: list[Moment] = field(default_factory=list)
    listeners: list[Callable[[Moment], None]] = field(default_factory=list)

    def add(self, kind: str, text: str, at: float | None = None) -> Moment:
        """Record a moment; `at` (seconds since start) when it happened earlier than now."""
        moment = Moment(time.monotonic() - self.started if at is None else at, kind, text)
        self.moments.append(moment)
        for listener in self.listeners:
            listener(moment)
        return moment

    def at_wall(self, epoch_s: float) -> float:
        """Seconds since start of a wall-clock moment (a daemon log line's timestamp)."""
        return epoch_s - self.started_wall

    def first(self, kind: str, after: float = 0.0) -> Moment | None:
        return next((m for m in self.moments if m.kind == kind and m.at >= after), None)


class RayPodHooks:
    """The fake kubelet's hooks: Running worker pod → real Ray host, deleted pod → stopped.

    Like a kubelet restarting a crashed container, a host that fails to start is started again
    (a loaded machine can miss a start timeout). A host still starting when its pod goes, or when
    the hooks stop, is stopped as soon as it is up: none outlives its pod or the cluster.
    """

    START_ATTEMPTS = 3
    START_CONCURRENCY = MAX_CONCURRENT_STARTS

    def __init__(self, head: RayHead, timeline: Timeline) -> None:
        self._head = head
        self._timeline = timeline
        self._free_ips = [f"127.0.0.{n}" for n in range(11, 250)]
        self.hosts: dict[str, RayHost] = {}
        self._starts: set[asyncio.Future[RayHost]] = set()
        self._late_stops: set[asyncio.Task[None]] = set()
        self._gone: set[str] = set()
        self._start_slots = asyncio.Semaphore(self.START_CONCURRENCY)

    async def on_running(self, pod: dict[str, Any]) -> None:
        labels = pod["metadata"].get("labels", {})
        if labels.get("ray.io/node-type") != "worker":
            return  # the head's Ray runs already: RayHead
        name = pod["metadata"]["name"]
        self._gone.discard(name)
        ip = self._free_ips.pop(0)
        for attempt in range(1, self.START_ATTEMPTS + 1):
            try:
                host = await self._start_host(pod, ip)
                break
            except RayStartError as error:
                if attempt == self.START_ATTEMPTS or name in self._gone:
                    self._free_ips.append(ip)
                    raise
                why = (str(error).strip().splitlines() or [""])[-1][
                    :300
                ]  # the cause, not the trace
                log.warning("ray_host_start_retried", pod=name, attempt=attempt, error=why)
                self._timeline.add("ray_host", f"Ray host for pod {name} failed; starting again")
        if name in self._gone:  # the pod went while its host started
            await self._stop(name, host)
            return
        self.hosts[name] = host
        self._timeline.add("ray_host", f"Ray host for pod {name} started on {ip}")

    async def _start_host(self, pod: dict[str, Any], ip: str) -> RayHost:
        async with self._start_slots:
            return await self._start_in_thread(pod, ip)

    async def _start_in_thread(self, pod: dict[str, Any], ip: str) -> RayHost:
        num_cpus, resources, memory, env = _host_setup(pod)
        start = asyncio.ensure_future(
            asyncio.to_thread(
                lambda: RayHost.spawn(
                    self._head.gcs_address,
                    ip=ip,
                    resources=resources,
                    num_cpus=num_cpus,
                    memory=memory,
                    env=env,
                    auth_token=self._head.auth_token,
                ).wait_ready()
            )
        )
        self._starts.add(start)
        start.add_done_callback(self._starts.discard)
        try:
            return await asyncio.shield(start)  # a cancelled caller does not abandon the host
        except asyncio.CancelledError:
            task = asyncio.get_running_loop().create_task(self._stop_when_up(start))
            self._late_stops.add(task)
            task.add_done_callback(self._late_stops.discard)
            raise

    async def _stop_when_up(self, start: asyncio.Future[RayHost]) -> None:
        with contextlib.suppress(Exception):
            host = await start
            await asyncio.to_thread(host.stop)

    async def on_deleted(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        self._gone.add(name)
        host = self.hosts.pop(name, None)
        if host is not None:
            await self._stop(name, host)

    async def _stop(self, name: str, host: RayHost) -> None:
        await asyncio.to_thread(host.stop)
        self._free_ips.append(host.ip)
        self._timeline.add("ray_host_gone", f"Ray host of pod {name} stopped")

    async def stop_all(self) -> None:
        hosts, self.hosts = list(self.hosts.values()), {}
        await asyncio.gather(*(asyncio.to_thread(h.stop) for h in hosts))
        # Hosts still starting (their pod went, or the cluster stops): stopped once up.
        await asyncio.gather(*(self._stop_when_up(s) for s in list(self._starts)))
        await asyncio.gather(*list(self._late_stops), return_exceptions=True)


def _host_setup(pod: dict[str, Any]) -> tuple[int, dict[str, float], int | None, dict[str, str]]:
    """(num_cpus, resources, memory bytes, env) of the Ray host a worker pod stands for: the
    flags of the `ray start` KubeRay wrote into the pod, plus the env the GKE TPU webhook would
    inject. Nothing here asks the daemon's code how big a host is."""
    labels = pod["metadata"]["labels"]
    env = {"RAY_CLOUD_INSTANCE_ID": pod["metadata"]["name"], "RAY_NODE_TYPE_NAME": labels[GROUP]}
    try:
        flags = flags_of_pod(pod)
    except ValueError as err:
        log.warning("harness cannot size pod", pod=pod["metadata"]["name"], error=str(err))
        return 1, {}, None, env
    resources = dict(flags.resources)
    selector = pod.get("spec", {}).get("nodeSelector") or {}
    generation = TPU_GENERATIONS.get(selector.get(GKE_TPU_ACCELERATOR, ""))
    topology = selector.get(GKE_TPU_TOPOLOGY, "")
    pod_type = infer_tpu_pod_type_from_topology(topology, generation) if generation else None
    if resources.get("TPU") and pod_type:
        env |= tpu_host_env(
            labels.get(REPLICA_NAME, pod["metadata"]["name"]),
            int(labels.get(HOST_INDEX, "0")),
            pod_type,
            topology,
        )
    else:
        resources.pop("TPU", None)  # without the webhook's env Ray would ask GCE metadata
    num_cpus = flags.num_cpus if flags.num_cpus is not None else 1
    return num_cpus, resources, flags.memory, env


@dataclass
class DaemonProcess:
    process: subprocess.Popen[bytes]
    log_path: Path
    http: str

    def lines(self) -> list[dict[str, Any]]:
        out = []
        with contextlib.suppress(OSError):
            for line in self.log_path.read_text(errors="replace").splitlines():
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
        return out

    def stop(self, timeout_s: float = 30.0) -> tuple[int, float]:
        """SIGTERM and wait; returns (exit code, seconds it took)."""
        started = time.monotonic()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        return code, time.monotonic() - started


class LocalCluster:
    """Everything `make demo` and the integration tests need, on loopback, cleaned up by PID."""

    def __init__(
        self,
        raycluster: dict[str, Any],
        *,
        namespace: str = "default",
        token: str = RESTRICTED_TOKEN,
        pod_start_delay: float = 0.5,
    ) -> None:
        self.raycluster = raycluster
        self.namespace = namespace
        self.name = raycluster["metadata"]["name"]
        self.token = token
        self.timeline = Timeline()
        self.api = ApiServerStandIn(bookmark_interval=5.0)
        self.head: RayHead | None = None
        self.hooks: RayPodHooks | None = None
        self.operator: OperatorStandIn | None = None
        self.daemons: list[DaemonProcess] = []
        self.violations: list[str] = []
        self.workdir = scratch_dir("krs-local-")
        self._pod_start_delay = pod_start_delay
        self._tasks: list[asyncio.Task[None]] = []
        self._unsubscribe: Callable[[], None] | None = None

    async def __aenter__(self) -> LocalCluster:
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def start(self) -> None:
        await self.api.start()
        self._unsubscribe = self.api.subscribe(self._watch)
        self.head = await asyncio.to_thread(RayHead.start)
        self.timeline.add("ray_head", f"Ray head up, GCS at {self.head.gcs_address}")
        self.hooks = RayPodHooks(self.head, self.timeline)
        self.operator = OperatorStandIn(
            self.api, self.namespace, self.name, hooks=self.hooks, start_delay=self._pod_start_delay
        )
        self._tasks.append(asyncio.create_task(self.operator.run()))
        self.api.create("rayclusters", self.namespace, self.raycluster)

    def kubeconfig(self) -> Path:
        path = self.workdir / f"kubeconfig-{self.token}"
        self.api.write_kubeconfig(path, self.token, namespace=self.namespace)
        return path

    def daemon_env(self, **overrides: str) -> dict[str, str]:
        assert self.head is not None
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "KUBERAY_SCALER_"))}
        home = self.workdir / "daemon-home"  # nothing in the user's home reaches the daemon
        home.mkdir(exist_ok=True)
        env |= {
            "HOME": str(home),
            "RAY_CLUSTER_NAME": self.name,
            "RAY_CLUSTER_NAMESPACE": self.namespace,
            "KUBERAY_SCALER_KUBECONFIG": str(self.kubeconfig()),
            "KUBERAY_SCALER_GCS_ADDRESS": self.head.gcs_address,
            "KUBERAY_SCALER_HTTP_ADDRESS": f"127.0.0.1:{free_port()}",
            "KUBERAY_SCALER_LOG_FORMAT": "json",
            "KUBERAY_SCALER_GCS_POLL_INTERVAL_S": "0.5",
            "KUBERAY_SCALER_RESYNC_INTERVAL_S": "5",
            # The stand-in world shows a slice scaled up, then idle and scaled down within a
            # minute or two: no scale-down delay after a scale-up (its own tests hold it).
            "KUBERAY_SCALER_SCALE_DOWN_DELAY_AFTER_ADD_S": "0",
            # Nor a reservation grace: the demo's slice reservation is served, then released by
            # a finished job; the grace (a slice outliving a timed-out reservation) has its own
            # tests (tests/unit/core/planner/: test_planner_reservations.py,
            # test_reservation_cycles.py).
            "KUBERAY_SCALER_RESERVATION_GRACE_S": "0",
        }
        if self.head.auth_token:
            env["RAY_AUTH_TOKEN"] = self.head.auth_token
        return env | overrides

    def start_daemon(self, **overrides: str) -> DaemonProcess:
        env = self.daemon_env(**overrides)
        log_path = self.workdir / f"daemon-{len(self.daemons)}.log"
        with log_path.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "kuberay_scaler", "run"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        daemon = DaemonProcess(process, log_path, env["KUBERAY_SCALER_HTTP_ADDRESS"])
        self.daemons.append(daemon)
        return daemon

    def current(self) -> dict[str, Any]:
        obj = self.api.get("rayclusters", self.namespace, self.name)
        assert obj is not None
        return obj

    def worker_pods(self, group: str | None = None) -> list[dict[str, Any]]:
        pods = self.api.list("pods", self.namespace, f"ray.io/cluster={self.name}")
        return [
            p
            for p in pods
            if p["metadata"]["labels"].get("ray.io/node-type") == "worker"
            and (group is None or p["metadata"]["labels"].get(GROUP) == group)
        ]

    async def wait_for(
        self, predicate: Callable[[], bool], timeout_s: float, what: str, step: float = 0.25
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate():
                return
            await asyncio.sleep(step)
        raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")

    async def close(self) -> None:
        for daemon in self.daemons:
            await asyncio.to_thread(daemon.stop)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        if self.hooks is not None:
            await self.hooks.stop_all()
        if self.head is not None:
            await asyncio.to_thread(self.head.stop)
        if self._unsubscribe is not None:
            self._unsubscribe()
        await self.api.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    # --- observation ------------------------------------------------------------------------
    def _watch(self, event: StoredEvent) -> None:
        if event.store == "rayclusters" and event.type == "MODIFIED" and event.prev is not None:
            self._raycluster_changed(event.prev, event.obj)
        elif event.store == "pods":
            self._pod_changed(event)

    def _raycluster_changed(self, before: dict[str, Any], after: dict[str, Any]) -> None:
        body = self._patch_in_flight()
        if body is not None:
            self.timeline.add("patch", f"PATCH rayclusters/{self.name}: {_ops_text(body)}")
        old = {g["groupName"]: g for g in before["spec"].get("workerGroupSpecs", [])}
        for group in after["spec"].get("workerGroupSpecs", []):
            prev = old.get(group["groupName"], {})
            name = group["groupName"]
            before_n, after_n = prev.get("replicas"), group.get("replicas")
            if before_n != after_n:
                self.timeline.add(
                    "patch_replicas", f"RayCluster patched: {name} replicas {before_n} → {after_n}"
                )
            doomed = (group.get("scaleStrategy") or {}).get("workersToDelete") or []
            was = (prev.get("scaleStrategy") or {}).get("workersToDelete") or []
            if doomed != was:
                self.timeline.add(
                    "patch_delete" if doomed else "patch_clear",
                    f"RayCluster patched: {name} workersToDelete = {doomed or '[] (cleared)'}",
                )
                self._check_whole_slices(group, doomed)

    def _patch_in_flight(self) -> Any:
        """The body of the PATCH being applied right now (the store commits inside it)."""
        for record in reversed(self.api.requests):
            if record.method == "PATCH" and record.status == 0 and "/rayclusters/" in record.path:
                return record.body
        return None

    def _check_whole_slices(self, group: dict[str, Any], doomed: list[str]) -> None:
        if int(group.get("numOfHosts", 1)) <= 1 or not doomed:
            return
        pods = {p["metadata"]["name"]: p for p in self.worker_pods(group["groupName"])}
        slices = {pods[n]["metadata"]["labels"].get(REPLICA_NAME) for n in doomed if n in pods}
        for key in slices:
            members = {
                n for n, p in pods.items() if p["metadata"]["labels"].get(REPLICA_NAME) == key
            }
            if not members <= set(doomed):
                self.violations.append(
                    f"partial slice requested: {key}: {sorted(members - set(doomed))} left out"
                )

    def _pod_changed(self, event: StoredEvent) -> None:
        meta = event.obj["metadata"]
        labels = meta.get("labels", {})
        if labels.get("ray.io/node-type") != "worker":
            return
        where = f"{labels.get(GROUP)}"
        if labels.get(REPLICA_NAME):
            where += f" slice {labels[REPLICA_NAME]} host {labels.get(HOST_INDEX)}"
        if event.type == "ADDED":
            self.timeline.add("pod_created", f"pod {meta['name']} created ({where})")
        elif event.type == "DELETED":
            self.timeline.add("pod_deleted", f"pod {meta['name']} deleted ({where})")


PATCH_CONDITION = " — applied only if "  # what follows the changes in a printed PATCH


def _ops_text(body: Any) -> str:
    """A JSON patch on one line: its changes, then its JSON-patch `test` ops said in words
    (the values it was planned from, which the API server checks before applying any change)."""
    if not isinstance(body, list):
        return json.dumps(body, separators=(",", ":"))[:400]
    tests = sum(1 for op in body if isinstance(op, dict) and op.get("op") == "test")
    changes = [op for op in body if not (isinstance(op, dict) and op.get("op") == "test")]
    text = json.dumps(changes, separators=(",", ":"), ensure_ascii=False)
    held = "field still holds the value" if tests == 1 else "fields still hold the values"
    return f"{text}{PATCH_CONDITION}{tests} {held} it was planned from"
