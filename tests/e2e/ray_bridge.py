"""Closing the loop with real Ray: every pod kwok marks Running becomes a real Ray process.

The head pod becomes a `RayHead` (GCS) on `HEAD_IP`; each worker pod a `RayHost` on its own
127.0.0.N with the pod's resources (CPU and `google.com/tpu` from the Ray container's limits),
the TPU env the GKE webhook would inject (slice name = the pod's replica-name label, worker id =
its host-index label, pod type and topology from the group's nodeSelector) and
`RAY_CLOUD_INSTANCE_ID` = pod name, `RAY_NODE_TYPE_NAME` = group. A pod that is deleted (or gets
a deletionTimestamp) stops its host. A host whose Ray exits on its own (an accepted idle drain
makes the raylet exit) turns its pod Failed with a terminated Ray container, as the kubelet would
under `restartPolicy: Never`. Pod IPs (kwok hands out 10.x) are never used for anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from kuberay_standins.ray_local import RayHead, RayHost, tpu_host_env
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


def host_setup(pod: Mapping[str, Any]) -> tuple[int, dict[str, float], dict[str, str]]:
    """(num_cpus, extra Ray resources, env) of the Ray host a worker pod stands for.

    Read from the pod alone, not from the daemon's code, so the world is built independently of
    what is being tested.
    """
    spec = pod.get("spec") or {}
    ray_container = (spec.get("containers") or [{}])[0]  # KubeRay's Ray container is index 0
    limits = (ray_container.get("resources") or {}).get("limits") or {}
    labels = labels_of(pod)
    env = {"RAY_CLOUD_INSTANCE_ID": pod_name(pod), "RAY_NODE_TYPE_NAME": labels.get(GROUP, "")}
    num_cpus = max(0, math.floor(_cpu(str(limits.get("cpu", "1")))))
    chips = int(str(limits.get("google.com/tpu", "0")) or 0)
    selector = spec.get("nodeSelector") or {}
    generation = TPU_GENERATIONS.get(str(selector.get(GKE_ACCELERATOR, "")))
    topology = str(selector.get(GKE_TOPOLOGY, ""))
    if not chips or not generation or not topology:
        return num_cpus, {}, env
    total_chips = math.prod(int(d) for d in topology.split("x"))
    env |= tpu_host_env(
        slice_name=labels.get(REPLICA_NAME, pod_name(pod)),
        worker_id=int(labels.get(HOST_INDEX, "0")),
        accelerator_type=f"{generation}-{total_chips}",
        topology=topology,
    )
    return num_cpus, {"TPU": float(chips)}, env


def _cpu(quantity: str) -> float:
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


class RayBridge:
    """Keeps one Ray process per Running pod of one RayCluster. Feed it pod events."""

    def __init__(self, admin: Kube, namespace: str, note: Note) -> None:
        self._admin = admin
        self._namespace = namespace
        self._note = note
        self.head: RayHead | None = None
        self.head_ready = asyncio.Event()
        self.hosts: dict[str, RayHost] = {}
        self.failed_pods: list[str] = []  # pods we turned Failed because their Ray exited
        self.start_errors: list[str] = []
        self._free_ips = list(HOST_IPS)
        self._starting: dict[str, asyncio.Task[None]] = {}
        self._stopping: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._watcher: asyncio.Task[None] | None = None
        self._closing = False

    def start(self) -> None:
        self._watcher = asyncio.get_running_loop().create_task(self._watch_exits())

    def on_pod(self, kind: str, pod: Mapping[str, Any]) -> None:
        """Called for every pod event (ADDED / MODIFIED / DELETED)."""
        name = pod_name(pod)
        if kind == "DELETED" or is_terminating(pod):
            self._spawn(self._stop_host(name))
        elif is_running(pod) and name not in self._starting and name not in self.hosts:
            self._starting[name] = asyncio.get_running_loop().create_task(self._start(dict(pod)))

    def _spawn(self, job: Any) -> None:
        task = asyncio.get_running_loop().create_task(job)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _start(self, pod: dict[str, Any]) -> None:
        name = pod_name(pod)
        try:
            if labels_of(pod).get(NODE_TYPE) == "head":
                await self._start_head(pod)
            else:
                await self._start_worker(pod)
        except Exception as error:  # a failed start is a finding, not a crash of the bridge
            self.start_errors.append(f"{name}: {error}")
            self._note(f"bridge: Ray for pod {name} failed to start: {str(error)[:300]}")
        finally:
            self._starting.pop(name, None)

    async def _start_head(self, pod: dict[str, Any]) -> None:
        env = {"RAY_CLOUD_INSTANCE_ID": pod_name(pod), "RAY_NODE_TYPE_NAME": "headgroup"}
        self.head = await asyncio.to_thread(RayHead.start, ip=HEAD_IP, num_cpus=0, env=env)
        self._note(f"bridge: Ray head for pod {pod_name(pod)} up, GCS {self.head.gcs_address}")
        self.head_ready.set()

    async def _start_worker(self, pod: dict[str, Any]) -> None:
        await self.head_ready.wait()
        if self._closing or self.head is None:
            return
        name = pod_name(pod)
        num_cpus, resources, env = host_setup(pod)
        ip = self._free_ips.pop(0)
        gcs = self.head.gcs_address
        try:
            host = await asyncio.to_thread(
                lambda: RayHost.spawn(
                    gcs, ip=ip, resources=resources, num_cpus=num_cpus, env=env
                ).wait_ready()
            )
        except BaseException:
            self._free_ips.append(ip)
            raise
        self.hosts[name] = host
        self._note(f"bridge: Ray host for pod {name} up on {ip} ({env.get('TPU_NAME', 'cpu')})")
        if name in self._stopping:  # the pod went away while its host was starting
            await self._stop_now(name)

    async def _stop_host(self, name: str) -> None:
        self._stopping.add(name)
        if name not in self._starting:  # else `_start_worker` stops it once it is up
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
        procs: list[RayHead | RayHost] = [*self.hosts.values()]
        if self.head is not None:
            procs.append(self.head)
        return [p.pid for p in procs if p.alive()]

    async def close(self) -> None:
        self._closing = True
        self.head_ready.set()  # releases workers still waiting for a head that never came
        if self._watcher is not None:
            self._watcher.cancel()
        for task in [*self._starting.values(), *self._tasks]:
            with contextlib.suppress(BaseException):
                await task
        hosts, self.hosts = list(self.hosts.values()), {}
        await asyncio.gather(*(asyncio.to_thread(h.stop) for h in hosts))
        if self.head is not None:
            await asyncio.to_thread(self.head.stop)
