"""Closing the loop with real Ray: every pod kwok marks Running becomes a real Ray process.

The head pod becomes a `RayHead` (GCS) on `HEAD_IP`; each worker pod a `RayHost` on its own
127.0.0.N with the pod's resources: what the `ray start` line KubeRay rendered into the Ray
container says (`--num-cpus`, `--num-gpus`, `--resources`), else CPU from the container's limits,
and `google.com/tpu` from its limits,
the TPU env the GKE webhook would inject (slice name = the pod's replica-name label, worker id =
its host-index label, pod type and topology from the group's nodeSelector) and
`RAY_CLOUD_INSTANCE_ID` = pod name, `RAY_NODE_TYPE_NAME` = group. A pod that is deleted (or gets
a deletionTimestamp) stops its host. A host whose Ray exits on its own (an accepted idle drain
makes the raylet exit) turns its pod Failed with a terminated Ray container, as the kubelet would
under `restartPolicy: Never`. An init container running `sleep N` delays the host's start by
N s, as the kubelet would. Pod IPs (kwok hands out 10.x) are never used for anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import shlex
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from kuberay_standins.ray_local import MAX_CONCURRENT_STARTS, RayHead, RayHost, tpu_host_env
from kuberay_standins.ray_local import _wait_port_free as wait_port_free
from tests.e2e.kube import MERGE_PATCH, Kube

HEAD_IP = "127.0.0.100"
HOST_IPS = tuple(f"127.0.0.{n}" for n in range(101, 200))
GROUP = "ray.io/group"
NODE_TYPE = "ray.io/node-type"
REPLICA_NAME = "ray.io/worker-group-replica-name"
REPLICA_INDEX = "ray.io/worker-group-replica-index"
HOST_INDEX = "ray.io/replica-host-index"
GKE_ACCELERATOR = "cloud.google.com/gke-tpu-accelerator"
GKE_TOPOLOGY = "cloud.google.com/gke-tpu-topology"
# GKE accelerator label → TPU generation as Ray names it in TPU_ACCELERATOR_TYPE.
TPU_GENERATIONS = {
    "tpu-v4-podslice": "v4",
    "tpu-v5-lite-podslice": "v5litepod",
    "tpu-v5p-slice": "v5p",
    "tpu-v6e-slice": "v6e",
    "tpu7x": "v7x",
}
EXIT_POLL_S = 0.5
# `ray start` on 2 overloaded cores sometimes gives up on its own GCS ("Failed to get node info:
# Deadline Exceeded": Ray gives a starting node a fixed 30 s to register, ray/_private/node.py);
# that is this machine, not the pod. A kubelet restarts a crashed container again and again;
# the bridge starts a host up to START_ATTEMPTS times before calling it a finding, and at most
# MAX_CONCURRENT_STARTS at once (four hosts of a slice started together on 2 loaded cores
# missed the window together, twice, in CI).
START_ATTEMPTS = 4
_SLEEP = re.compile(r"sleep\s+(\d+(?:\.\d+)?)")

Note = Callable[[str], None]


def pod_name(pod: Mapping[str, Any]) -> str:
    return str(pod["metadata"]["name"])


def labels_of(pod: Mapping[str, Any]) -> dict[str, str]:
    return dict((pod.get("metadata") or {}).get("labels") or {})


def is_terminating(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def is_running(pod: Mapping[str, Any]) -> bool:
    phase = (pod.get("status") or {}).get("phase")
    return phase == "Running" and not is_terminating(pod)


def ray_start_options(pod: Mapping[str, Any]) -> dict[str, str]:
    """`--name=value` options of the `ray start` line KubeRay rendered into the Ray container."""
    container = ((pod.get("spec") or {}).get("containers") or [{}])[0]
    line = " ".join([*(container.get("command") or []), *(container.get("args") or [])])
    options: dict[str, str] = {}
    for part in line.split(";"):
        words = shlex.split(part)
        if words[:2] != ["ray", "start"]:
            continue
        for word in words[2:]:
            name, eq, value = word.partition("=")
            if word.startswith("--") and eq:
                options[name[2:]] = value
    return options


def startup_delay_s(pod: Mapping[str, Any]) -> float:
    """Seconds the pod's init containers sleep: those whose script is just `sleep N` (KubeRay's
    own `wait-gcs-ready` loops on the GCS instead, and that is up when workers start here)."""
    total = 0.0
    for container in (pod.get("spec") or {}).get("initContainers") or []:
        words = [*(container.get("command") or []), *(container.get("args") or [])]
        sleep = _SLEEP.fullmatch(words[-1].strip()) if words else None
        total += float(sleep.group(1)) if sleep else 0.0
    return total


def host_setup(pod: Mapping[str, Any]) -> tuple[int, int, dict[str, float], dict[str, str]]:
    """(num_cpus, num_gpus, extra Ray resources, env) of the Ray host a worker pod stands for.

    Read from the pod alone, not from the daemon's code, so the world is built independently of
    what is being tested.
    """
    spec = pod.get("spec") or {}
    ray_container = (spec.get("containers") or [{}])[0]  # KubeRay's Ray container is index 0
    limits = (ray_container.get("resources") or {}).get("limits") or {}
    labels = labels_of(pod)
    env = {"RAY_CLOUD_INSTANCE_ID": pod_name(pod), "RAY_NODE_TYPE_NAME": labels.get(GROUP, "")}
    options = ray_start_options(pod)
    cpus = options.get("num-cpus") or str(limits.get("cpu", "1"))
    num_cpus = max(0, math.floor(_cpu(cpus)))
    num_gpus = math.floor(float(options.get("num-gpus", "0")))
    extra = {k: float(v) for k, v in json.loads(options.get("resources") or "{}").items()}
    chips = int(str(limits.get("google.com/tpu", "0")) or 0) or int(extra.get("TPU", 0))
    selector = spec.get("nodeSelector") or {}
    generation = TPU_GENERATIONS.get(str(selector.get(GKE_ACCELERATOR, "")))
    topology = str(selector.get(GKE_TOPOLOGY, ""))
    if not chips or not generation or not topology:
        return num_cpus, num_gpus, {k: v for k, v in extra.items() if k != "TPU"}, env
    total_chips = math.prod(int(d) for d in topology.split("x"))
    env |= tpu_host_env(
        slice_name=labels.get(REPLICA_NAME, pod_name(pod)),
        worker_id=int(labels.get(HOST_INDEX, "0")),
        accelerator_type=f"{generation}-{total_chips}",
        topology=topology,
    )
    return num_cpus, num_gpus, {**extra, "TPU": float(chips)}, env


def _cpu(quantity: str) -> float:
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


class RayBridge:
    """Keeps one Ray process per Running pod of one RayCluster. Feed it pod events."""

    def __init__(self, admin: Kube, namespace: str, note: Note) -> None:
        self._admin = admin
        self._namespace = namespace
        self._note = note
        self.head: RayHead | None = None
        self.head_pod: str | None = None
        self._head_port: int | None = None
        self.head_ready = asyncio.Event()
        self.hosts: dict[str, RayHost] = {}
        self.failed_pods: list[str] = []  # pods we turned Failed because their Ray exited
        self.start_errors: list[str] = []
        self._free_ips = list(HOST_IPS)
        self._starting: dict[str, asyncio.Task[None]] = {}
        self._spawned: dict[str, RayHost] = {}  # launched, not ready yet
        self._stopping: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._watcher: asyncio.Task[None] | None = None
        self._closing = False
        self._start_slots = asyncio.Semaphore(MAX_CONCURRENT_STARTS)

    def start(self) -> None:
        self._watcher = asyncio.get_running_loop().create_task(self._watch_exits())

    def on_pod(self, kind: str, pod: Mapping[str, Any]) -> None:
        """Called for every pod event (ADDED / MODIFIED / DELETED)."""
        name = pod_name(pod)
        if kind == "DELETED" or is_terminating(pod):
            self._spawn(self._stop_head(name) if name == self.head_pod else self._stop_host(name))
        elif (
            is_running(pod)
            and name not in self._starting
            and name not in self.hosts
            and name != self.head_pod
            and name not in self._stopping
        ):
            self._starting[name] = asyncio.get_running_loop().create_task(self._start(dict(pod)))

    def _spawn(self, job: Any) -> None:
        task = asyncio.get_running_loop().create_task(job)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _start(self, pod: dict[str, Any]) -> None:
        name = pod_name(pod)
        try:
            for attempt in range(1, START_ATTEMPTS + 1):
                try:
                    await self._start_once(pod)
                    return
                except Exception as error:  # a failed start is a finding, not a crash
                    if name in self._stopping or self._closing:  # the pod went first
                        self._note(f"bridge: Ray for pod {name} failed to start after its pod went")
                        return
                    self._note(f"bridge: Ray for pod {name} failed to start: {str(error)[:300]}")
                    if attempt == START_ATTEMPTS:
                        self.start_errors.append(f"{name}: {error}")
        finally:
            self._starting.pop(name, None)

    async def _start_once(self, pod: dict[str, Any]) -> None:
        if labels_of(pod).get(NODE_TYPE) == "head":
            await self._start_head(pod)
        else:
            await self._start_worker(pod)

    async def _start_head(self, pod: dict[str, Any]) -> None:
        """A head pod Running: its Ray head. A replacement head pod (the old one deleted) gets a
        new Ray cluster on the same GCS address, as the head Service would give it."""
        name = pod_name(pod)
        self.head_pod = name
        env = {"RAY_CLOUD_INSTANCE_ID": name, "RAY_NODE_TYPE_NAME": "headgroup"}
        port = self._head_port
        if port is not None:
            await asyncio.to_thread(wait_port_free, HEAD_IP, port, 30.0)
        head = await asyncio.to_thread(RayHead.start, ip=HEAD_IP, port=port, num_cpus=0, env=env)
        if self.head_pod != name or self._closing:  # deleted while starting
            await asyncio.to_thread(head.stop)
            return
        self.head, self._head_port = head, head.port
        self._note(f"bridge: Ray head for pod {name} up, GCS {head.gcs_address}")
        self.head_ready.set()

    async def _stop_head(self, name: str) -> None:
        self._stopping.add(name)
        self.head_pod = None
        head, self.head = self.head, None
        self.head_ready.clear()
        if head is not None:
            await asyncio.to_thread(head.stop)
            self._note(f"bridge: Ray head of pod {name} stopped (pod gone)")

    async def _start_worker(self, pod: dict[str, Any]) -> None:
        await self.head_ready.wait()
        if self._closing or self.head is None:
            return
        name = pod_name(pod)
        num_cpus, num_gpus, resources, env = host_setup(pod)
        delay = startup_delay_s(pod)
        if delay:
            self._note(f"bridge: pod {name} init containers sleep {delay:.0f} s")
            await asyncio.sleep(delay)
            if self._closing or name in self._stopping:
                return
        async with self._start_slots:  # only the start itself: never while waiting for the head
            if self._closing or self.head is None or name in self._stopping:
                return
            ip = self._free_ips.pop(0)
            gcs = self.head.gcs_address
            try:
                host = await asyncio.to_thread(
                    lambda: RayHost.spawn(
                        gcs,
                        ip=ip,
                        resources=resources,
                        num_cpus=num_cpus,
                        num_gpus=num_gpus,
                        env=env,
                    )
                )
                self._spawned[name] = host  # killed at once if the pod goes while it starts
                if name in self._stopping or self._closing:
                    await asyncio.to_thread(host.stop)
                await asyncio.to_thread(host.wait_ready)
            except BaseException:
                self._free_ips.append(ip)
                raise
            finally:
                self._spawned.pop(name, None)
        self.hosts[name] = host
        self._note(f"bridge: Ray host for pod {name} up on {ip} ({env.get('TPU_NAME', 'cpu')})")
        if name in self._stopping:  # the pod went away while its host was starting
            await self._stop_now(name)

    async def _stop_host(self, name: str) -> None:
        self._stopping.add(name)
        starting = self._spawned.get(name)
        if starting is not None:  # its start then fails at once: nothing to wait for
            await asyncio.to_thread(starting.stop)
        elif name not in self._starting:  # else `_start_worker` stops it once it is up
            await self._stop_now(name)

    async def _stop_now(self, name: str) -> None:
        host = self.hosts.pop(name, None)
        if host is None:
            return
        await asyncio.to_thread(host.stop)
        self._free_ips.append(host.ip)
        self._note(f"bridge: Ray host of pod {name} stopped")

    async def _watch_exits(self) -> None:
        """A Ray host that exits while its pod lives: the kubelet would report the container
        terminated, and under restartPolicy Never the pod Failed."""
        while True:
            await asyncio.sleep(EXIT_POLL_S)
            for name, host in list(self.hosts.items()):
                if name in self._stopping or host.alive() or name in self.failed_pods:
                    continue
                self.failed_pods.append(name)
                self._note(f"bridge: Ray on pod {name} exited by itself: marking the pod Failed")
                with contextlib.suppress(Exception):
                    await self._mark_failed(name)

    async def _mark_failed(self, name: str) -> None:
        path = f"/api/v1/namespaces/{self._namespace}/pods/{name}"
        pod = await self._admin.ok("GET", path)
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        statuses = [
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {
                    "terminated": {
                        "exitCode": 0,
                        "reason": "Completed",
                        "startedAt": now,
                        "finishedAt": now,
                    }
                },
            }
            for c in pod["spec"]["containers"]
        ]
        body = {"status": {"phase": "Failed", "containerStatuses": statuses}}
        await self._admin.ok("PATCH", path + "/status", body, content_type=MERGE_PATCH)

    def log_tails(self, lines: int = 15) -> dict[str, str]:
        tails = {f"ray host {n}": h.log_tail(lines) for n, h in self.hosts.items()}
        if self.head is not None:
            tails["ray head"] = self.head.log_tail(lines)
        return tails

    def process_groups(self) -> list[int]:
        procs: list[RayHead | RayHost] = [*self.hosts.values(), *self._spawned.values()]
        if self.head is not None:
            procs.append(self.head)
        return [p.pid for p in procs if p.alive()]

    async def close(self) -> None:
        self._closing = True
        self.head_ready.set()  # releases workers still waiting for a head that never came
        if self._watcher is not None:
            self._watcher.cancel()
        for starting in list(self._spawned.values()):
            await asyncio.to_thread(starting.stop)
        for task in [*self._starting.values(), *self._tasks]:
            with contextlib.suppress(BaseException):
                await task
        hosts, self.hosts = list(self.hosts.values()), {}
        await asyncio.gather(*(asyncio.to_thread(h.stop) for h in hosts))
        if self.head is not None:
            await asyncio.to_thread(self.head.stop)
