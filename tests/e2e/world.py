"""One test's world: a fresh namespace on the shared control plane, the RayCluster, the observer,
the Ray bridge, the daemon(s) and Ray drivers; torn down by PID at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from kuberay_standins.ray_local import RayDriver
from tests.e2e.controlplane import (
    REPO,
    RESTRICTED_USER,
    SIDECAR_USER,
    ControlPlane,
    Identity,
)
from tests.e2e.kube import Kube
from tests.e2e.observer import Observer, Timeline, group_named, workers_to_delete
from tests.e2e.procs import Daemon, RayProbe, foreign_connections
from tests.e2e.ray_bridge import HOST_INDEX, RayBridge, labels_of, pod_name
from tests.invariants import gcs_node_states

SAMPLE = REPO / "tests" / "fixtures" / "rayclusters" / "ray-cluster.tpu-v6e-16-multihost.yaml"
SIDECAR_ROLE = REPO / "deploy" / "sidecar" / "base" / "role.yaml"
CLUSTER = "e2e"
TPU_GROUP = "tpu-group"
HOSTS = 4
IDLE_TIMEOUT_S = 10
SLICE_UP_S = 240.0  # 4 Ray hosts starting together on 2 busy cores
_namespaces = itertools.count(1)

# The demand of contract §5: `SlicePlacementGroup` reserves a v6e 4x4 slice (head bundle first,
# then 4 bundles pinned to that slice). Prints SLICE_READY once the whole reservation is placed.
SLICE_RESERVATION = """
from ray.util.tpu import SlicePlacementGroup
handle = SlicePlacementGroup(topology="4x4", accelerator_version="v6e",
                             head_reservation_timeout_s=900)
ray.get(handle.placement_group.ready(), timeout=900)
print("SLICE_READY", [b for b in handle.placement_group.bundle_specs], flush=True)
"""


def tpu_raycluster(
    *, replicas: int = 0, min_replicas: int = 0, max_replicas: int = 2
) -> dict[str, Any]:
    """The v6e-16 multi-host fixture, shrunk to fit one machine, in drop-in mode
    (enableInTreeAutoscaling + autoscaler v2, so KubeRay creates its autoscaler Role)."""
    cluster: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    cluster["metadata"] = {"name": CLUSTER}
    spec = cluster["spec"]
    spec["rayVersion"] = "2.60.0"
    spec["enableInTreeAutoscaling"] = True
    spec["autoscalerOptions"] = {"version": "v2", "idleTimeoutSeconds": IDLE_TIMEOUT_S}
    head = spec["headGroupSpec"]
    head["rayStartParams"] = {"num-cpus": "0"}
    head["template"]["spec"]["containers"][0]["resources"] = _small(cpu="1")
    group = spec["workerGroupSpecs"][0]
    group.update(replicas=replicas, minReplicas=min_replicas, maxReplicas=max_replicas)
    group["numOfHosts"] = HOSTS
    worker = group["template"]["spec"]["containers"][0]
    worker["resources"] = _small(cpu="1", tpu="4")
    return cluster


def cpu_group(
    name: str = "cpu-group", *, replicas: int = 0, max_replicas: int = 2
) -> dict[str, Any]:
    return {
        "groupName": name,
        "replicas": replicas,
        "minReplicas": 0,
        "maxReplicas": max_replicas,
        "rayStartParams": {},
        "template": {
            "spec": {
                "containers": [
                    {
                        "name": "ray-worker",
                        "image": "rayproject/ray:2.60.0-py311",
                        "resources": _small(cpu="2"),
                    }
                ]
            }
        },
    }


def _small(*, cpu: str, tpu: str | None = None) -> dict[str, Any]:
    amounts = {"cpu": cpu, "memory": "1Gi"} | ({"google.com/tpu": tpu} if tpu else {})
    return {"limits": dict(amounts), "requests": dict(amounts)}


class World:
    def __init__(self, plane: ControlPlane, workdir: Path, *, ray: bool = True) -> None:
        self.plane = plane
        self.with_ray = ray
        self.workdir = workdir
        self.namespace = f"e2e-{next(_namespaces)}-{int(time.time()) % 100000}"
        self.timeline = Timeline()
        self.admin = Kube(plane.apiserver_url, plane.ca_file, plane.admin.token)
        self.observer = Observer(self.admin, self.namespace, CLUSTER, self.timeline)
        self.bridge = RayBridge(self.admin, self.namespace, self.timeline.add)
        self.daemons: list[Daemon] = []
        self.drivers: list[RayDriver] = []
        self.probe: RayProbe | None = None
        self.foreign: list[str] = []
        self._sampler: asyncio.Task[None] | None = None
        self._kubes: list[Kube] = [self.admin]

    # --- setup -------------------------------------------------------------------------------

    async def open(self) -> None:
        await self.admin.ok("POST", "/api/v1/namespaces", {"metadata": {"name": self.namespace}})
        await self._bind_test_users()
        if self.with_ray:
            self.observer.pod_listeners.append(self.bridge.on_pod)
            self.observer.ray_view = self._ray_states
            self.bridge.start()
        self.observer.start()
        self._sampler = asyncio.get_running_loop().create_task(self._sample_connections())
        self.timeline.add(f"namespace {self.namespace} ready")

    async def _bind_test_users(self) -> None:
        """krs-restricted gets exactly the Role KubeRay creates for its autoscaler (named after
        the RayCluster, created by the operator); krs-sidecar our deploy/ Role."""
        rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{self.namespace}"
        await self.admin.ok("POST", f"{rbac}/rolebindings", _binding(RESTRICTED_USER, CLUSTER))
        role = yaml.safe_load(SIDECAR_ROLE.read_text())
        for rule in role["rules"]:  # limited to the RayCluster by name, as the example does
            if "resourceNames" in rule:
                rule["resourceNames"] = [CLUSTER]
        await self.admin.ok("POST", f"{rbac}/roles", role)
        binding = _binding(SIDECAR_USER, role["metadata"]["name"])
        await self.admin.ok("POST", f"{rbac}/rolebindings", binding)

    def kube_as(self, identity: Identity) -> Kube:
        kube = Kube(self.plane.apiserver_url, self.plane.ca_file, identity.token)
        self._kubes.append(kube)
        return kube

    @property
    def raycluster_path(self) -> str:
        return f"/apis/ray.io/v1/namespaces/{self.namespace}/rayclusters/{CLUSTER}"

    async def create_raycluster(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        path = f"/apis/ray.io/v1/namespaces/{self.namespace}/rayclusters"
        created = await self.admin.ok("POST", path, dict(manifest))
        self.timeline.add("raycluster created")
        return created

    async def ray_up(self) -> RayProbe:
        """Wait for the head pod's Ray (GCS) and return a probe of it."""
        await self.wait_for(lambda: self.bridge.head_ready.is_set(), 180, "the Ray head")
        assert self.bridge.head is not None
        if self.probe is None:
            self.probe = RayProbe(self.bridge.head.gcs_address)
        return self.probe

    def daemon_identity(self, user: str) -> Identity:
        """The user's token in a kubeconfig whose default namespace is this test's."""
        base = self.plane.identities[user]
        path = self.workdir / f"kubeconfig-{user}-{self.namespace}"
        self.plane.write_kubeconfig(path, base.token, namespace=self.namespace)
        return Identity(user, base.token, path)

    async def start_daemon(self, user: str, **settings: str) -> Daemon:
        head = self.bridge.head
        assert head is not None, "start the daemon once the Ray head is up (ray_up)"
        identity = self.daemon_identity(user)
        env = {
            "RAY_CLUSTER_NAME": CLUSTER,
            "RAY_CLUSTER_NAMESPACE": self.namespace,
            "KUBERAY_SCALER_KUBECONFIG": str(identity.kubeconfig),
            "KUBERAY_SCALER_GCS_ADDRESS": head.gcs_address,
            "KUBERAY_SCALER_IDLE_TIMEOUT_S": str(IDLE_TIMEOUT_S),
            "KUBERAY_SCALER_GCS_POLL_INTERVAL_S": "0.5",
            "KUBERAY_SCALER_RESYNC_INTERVAL_S": "5",
            "KUBERAY_SCALER_DRAIN_DEADLINE_S": "10",
            # Test-speed timings: no scale-down delay after a scale-up (300 s by default).
            "KUBERAY_SCALER_SCALE_DOWN_DELAY_AFTER_ADD_S": "0",
            # Nor a reservation grace (600 s): a test's reservation is served, then its job ends.
            "KUBERAY_SCALER_RESERVATION_GRACE_S": "0",
            **settings,
        }
        log_path = self.workdir / f"daemon-{len(self.daemons)}-{user}.log"
        daemon = Daemon.start(env, log_path)
        self.daemons.append(daemon)
        self.timeline.add(f"daemon started as {user} (pid {daemon.pid}, log {log_path.name})")
        await self.wait_for(lambda: daemon_ready(daemon), 90, "the daemon's /readyz", async_ok=True)
        return daemon

    async def start_driver(self, body: str) -> RayDriver:
        head = self.bridge.head
        assert head is not None
        driver = await asyncio.to_thread(
            RayDriver.start,
            head.gcs_address,
            body,
            node_ip=head.ip,
            env=head.client_env(),
            wait_ready=False,
        )
        self.drivers.append(driver)
        self.timeline.add(f"driver started (pid {driver.process.pid})")
        return driver

    async def stop_driver(self, driver: RayDriver) -> None:
        await asyncio.to_thread(driver.stop)
        self.timeline.add("driver stopped: its demand is gone")

    # --- waiting and reading -----------------------------------------------------------------

    async def wait_for(
        self,
        check: Callable[[], Any],
        timeout_s: float,
        what: str,
        *,
        async_ok: bool = False,
        step_s: float = 0.25,
    ) -> None:
        """Poll `check` (sync, or returning an awaitable when `async_ok`) until truthy."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            result = check()
            if async_ok and isinstance(result, Awaitable):
                result = await result
            if result:
                return
            self._fail_fast(what)
            await asyncio.sleep(step_s)
        raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")

    def _fail_fast(self, what: str) -> None:
        dead = [d for d in self.daemons if not d.alive() and not d.stopped]
        if dead:
            raise AssertionError(
                f"daemon exited ({dead[0].process.returncode}) while waiting for {what}"
            )
        gone = self.plane.dead_components()
        if gone:
            raise AssertionError(f"control plane component(s) {gone} died while waiting for {what}")

    def group(self, name: str = TPU_GROUP) -> dict[str, Any]:
        group = group_named(self.observer.raycluster, name)
        assert group is not None, f"no group {name} in the RayCluster"
        return group

    def replicas(self, name: str = TPU_GROUP) -> int | None:
        value = self.group(name).get("replicas")
        return value if isinstance(value, int) else None

    def workers_to_delete(self, name: str = TPU_GROUP) -> list[str]:
        return workers_to_delete(self.group(name))

    def running_slices(self, name: str = TPU_GROUP) -> dict[str, list[dict[str, Any]]]:
        """Complete slices whose pods are all Running and whose Ray hosts are all up."""
        complete = {}
        for replica, pods in self.observer.slices(name).items():
            names = {pod_name(p) for p in pods}
            up = names <= set(self.bridge.hosts)
            running = all((p.get("status") or {}).get("phase") == "Running" for p in pods)
            if replica and len(pods) == HOSTS and running and up:
                complete[replica] = sorted(pods, key=lambda p: int(labels_of(p)[HOST_INDEX]))
        return complete

    async def _ray_states(self) -> dict[str, str] | None:
        head = self.bridge.head
        if head is None or not head.alive():
            return None
        return await gcs_node_states(head.gcs_address, head.auth_token)

    # --- invariants --------------------------------------------------------------------------

    def assert_invariants(self) -> None:
        problems = list(self.observer.violations)
        problems += [f"non-loopback connection: {c}" for c in self.foreign]
        problems += [f"Ray host failed to start: {e}" for e in self.bridge.start_errors]
        for daemon in self.daemons:
            for line in daemon.lines():
                if line.get("level") in ("error", "critical") or line.get("exception"):
                    problems.append(f"daemon logged: {str(line)[:600]}")
        assert not problems, "invariants violated:\n" + "\n".join(problems)

    async def _sample_connections(self) -> None:
        while True:
            groups = [
                *self.plane.pids().values(),
                *(d.pid for d in self.daemons if d.alive()),
                *self.bridge.process_groups(),
                *(d.process.pid for d in self.drivers if d.process.poll() is None),
            ]
            found = await asyncio.to_thread(foreign_connections, groups)
            self.foreign += [c for c in found if c not in self.foreign]
            await asyncio.sleep(1.0)

    # --- teardown and reports ----------------------------------------------------------------

    async def close(self) -> None:
        self.timeline.add("teardown")
        if self._sampler is not None:
            self._sampler.cancel()
        for daemon in self.daemons:
            code = await asyncio.to_thread(daemon.stop)
            self.timeline.add(f"daemon pid {daemon.pid} exited {code}")
        for driver in self.drivers:
            await asyncio.to_thread(driver.stop)
        with contextlib.suppress(Exception):
            await self.admin.request("DELETE", self.raycluster_path)
        with contextlib.suppress(Exception):
            await self.admin.request(
                "DELETE",
                f"/api/v1/namespaces/{self.namespace}/pods",
                query={"gracePeriodSeconds": "0"},
            )
        await self.observer.close()
        await self.bridge.close()
        if self.probe is not None:
            await self.probe.close()
        for kube in self._kubes:
            await kube.close()
        (self.workdir / "timeline.txt").write_text(self.timeline.text(last=100_000) + "\n")

    def report(self) -> list[tuple[str, str]]:
        """Sections for a failure report: timeline, daemon logs, Ray and control-plane tails."""
        sections = [("e2e timeline", self.timeline.text())]
        for daemon in self.daemons:
            tail = "\n".join(daemon.text().splitlines()[-60:])
            sections.append((f"daemon {daemon.log_path.name} (last lines)", tail))
        sections += [(f"{name} (last lines)", t) for name, t in self.bridge.log_tails().items()]
        sections += [(f"{n} (last lines)", t) for n, t in self.plane.tails(25).items()]
        return sections


async def daemon_ready(daemon: Daemon) -> bool:
    try:
        status, _ = await daemon.get("/readyz")
    except Exception:
        return False
    return status == 200


def _binding(user: str, role: str) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": f"{user}-{role}"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
