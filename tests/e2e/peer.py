"""Building blocks of the scenarios KubeRay's own autoscaler e2e tests run (`test_peer_*.py`).

Written by us, from what the peer tests expect (ray-project/kuberay
`ray-operator/test/e2eautoscaler/raycluster_autoscaler{,_part2}_test.go`, the v2 variants): the
RayCluster shapes (head with `num-cpus: 0`, worker groups described by `rayStartParams`), the Ray
programs that create demand (detached actors, tasks, placement groups, request_resources), and
the peer's observables: `status.desiredWorkerReplicas` as KubeRay computes it, the sum of the
groups' `replicas`, and a group's pods. The peer's timeouts are the budgets: `SHORT` 1 min,
`MEDIUM` 2 min, `LONG` 5 min (test/support `TestTimeoutShort/Medium/Long`).
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kuberay_standins.ray_local import RayDriver
from tests.e2e.deploy import Deploy
from tests.e2e.kube import JSON_PATCH, MERGE_PATCH
from tests.e2e.observer import groups_of
from tests.e2e.procs import Daemon
from tests.e2e.world import CLUSTER, World

SHORT, MEDIUM, LONG = 60.0, 120.0, 300.0
RAY_IMAGE = "rayproject/ray:2.60.0-py311"
# The peer leaves Ray's 60 s default idle timeout where a test does not set one; a shorter one
# here keeps the tier's time down and changes no expectation (each waits for idle scale-down).
IDLE_TIMEOUT_S = 10
ACTOR_NAMESPACE = "default_namespace"


def _resources(cpu: str) -> dict[str, Any]:
    amounts = {"cpu": cpu, "memory": "1Gi"}
    return {"limits": dict(amounts), "requests": dict(amounts)}


def worker_group(
    name: str,
    *,
    replicas: int = 0,
    min_replicas: int = 0,
    max_replicas: int = 3,
    params: Mapping[str, str] | None = None,
    idle_timeout_s: int | None = None,
    hosts: int = 1,
    node_selector: Mapping[str, str] | None = None,
    init_sleep_s: int | None = None,
) -> dict[str, Any]:
    """A worker group as the peer writes it: its Ray resources in `rayStartParams`."""
    start = dict(params or {"num-cpus": "1"})
    # The pod asks Kubernetes for at least one CPU, whatever Ray is told to offer.
    cpus = str(max(1, int(float(start.get("num-cpus", "1")))))
    template: dict[str, Any] = {
        "spec": {
            "containers": [
                {"name": "ray-worker", "image": RAY_IMAGE, "resources": _resources(cpus)}
            ]
        }
    }
    if node_selector:
        template["spec"]["nodeSelector"] = dict(node_selector)
    if init_sleep_s:
        template["spec"]["initContainers"] = [
            {
                "name": "init-sleep",
                "image": RAY_IMAGE,
                "command": ["bash", "-c", f"sleep {init_sleep_s}"],
            }
        ]
    group: dict[str, Any] = {
        "groupName": name,
        "replicas": replicas,
        "minReplicas": min_replicas,
        "maxReplicas": max_replicas,
        "rayStartParams": start,
        "template": template,
    }
    if hosts != 1:
        group["numOfHosts"] = hosts
    if idle_timeout_s is not None:
        group["idleTimeoutSeconds"] = idle_timeout_s
    return group


def raycluster(
    *groups: dict[str, Any],
    idle_timeout_s: int | None = IDLE_TIMEOUT_S,
    upscaling_mode: str | None = None,
) -> dict[str, Any]:
    """Autoscaling on (v2), a head with `num-cpus: 0`, the given worker groups."""
    options: dict[str, Any] = {"version": "v2"}
    if idle_timeout_s is not None:
        options["idleTimeoutSeconds"] = idle_timeout_s
    if upscaling_mode:
        options["upscalingMode"] = upscaling_mode
    head = {
        "rayStartParams": {"num-cpus": "0"},
        "template": {
            "spec": {
                "containers": [
                    {"name": "ray-head", "image": RAY_IMAGE, "resources": _resources("1")}
                ]
            }
        },
    }
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": CLUSTER},
        "spec": {
            "rayVersion": "2.60.0",
            "enableInTreeAutoscaling": True,
            "autoscalerOptions": options,
            "headGroupSpec": head,
            "workerGroupSpecs": list(groups),
        },
    }


# --- Ray programs (each runs as its own driver process, like the peer's ExecPodCmd) -----------


def create_actor(
    name: str, *, cpus: float = 1, gpus: float = 0, custom: Mapping[str, float] | None = None
) -> str:
    return f"""
@ray.remote(num_cpus={cpus}, num_gpus={gpus}, resources={dict(custom or {})!r})
class Actor:
    pass
Actor.options(name={name!r}, namespace={ACTOR_NAMESPACE!r}, lifetime="detached").remote()
"""


def terminate_actor(name: str) -> str:
    return f"ray.kill(ray.get_actor({name!r}, namespace={ACTOR_NAMESPACE!r}))"


def concurrent_tasks(count: int, low_s: int, high_s: int) -> str:
    """Many one-CPU tasks at once, waited for (the peer's create_concurrent_tasks.py)."""
    return f"""
import random
@ray.remote(num_cpus=1)
def f():
    time.sleep(random.randint({low_s}, {high_s}))
ray.get([f.remote() for _ in range({count})])
"""


def request_resources(cpus: int) -> str:
    return f"""
from ray.autoscaler.sdk import request_resources
request_resources(num_cpus={cpus})
"""


# Named placement groups live in the job's namespace: reconnect in a fixed one (drivers start in
# an anonymous namespace each), so a later driver finds the group by name.
IN_NAMESPACE = f"""
_address, _ip = ray.get_runtime_context().gcs_address, ray.util.get_node_ip_address()
ray.shutdown()
ray.init(address=_address, _node_ip_address=_ip, namespace={ACTOR_NAMESPACE!r},
         log_to_driver=False, logging_level="warning")
"""


def detached_placement_group(bundles: int, cpus_per_bundle: float, strategy: str) -> str:
    return f"""{IN_NAMESPACE}
from ray.util.placement_group import placement_group
placement_group([{{"CPU": {cpus_per_bundle}}}] * {bundles}, strategy={strategy!r},
                name="detached-pg", lifetime="detached")
"""


PLACEMENT_GROUP_READY = f"""{IN_NAMESPACE}
from ray.util import get_placement_group
pg = get_placement_group("detached-pg")
ray.get(pg.ready(), timeout=600)
print("PG_READY", flush=True)
"""

# The peer's do_not_remove_idles_for_pg.py, in our words: pg1 (1 bundle) brings worker 1; pg1
# removed; pg2 (2 bundles, STRICT_SPREAD) needs worker 1 plus a new one that takes 15 s to start.
# Worker 1, idle longer than the 6 s idle timeout meanwhile, must not be removed.
IDLES_KEPT_FOR_PLACEMENT_GROUP = """
from ray.util.placement_group import placement_group, remove_placement_group
def alive():
    return {n["NodeID"] for n in ray.nodes() if n.get("Alive", n.get("alive"))}
pg1 = placement_group([{"CPU": 1}], strategy="STRICT_SPREAD")
ray.get(pg1.ready(), timeout=600)
first = alive()
assert len(first) == 2, first
remove_placement_group(pg1)
pg2 = placement_group([{"CPU": 1}] * 2, strategy="STRICT_SPREAD")
ray.get(pg2.ready(), timeout=600)
second = alive()
assert first < second, ("a node was removed", first, second)
assert len(second) == 3, second
remove_placement_group(pg2)
print("PG_SCRIPT_OK", flush=True)
"""


class Scenario:
    """One peer scenario: the world, the deploy mode and the daemon it started."""

    def __init__(self, world: World, deploy: Deploy) -> None:
        self.world = world
        self.deploy = deploy
        self.daemon: Daemon | None = None
        self.manifest: dict[str, Any] = {}

    async def start(self, manifest: dict[str, Any]) -> None:
        self.manifest = self.deploy.dress(copy.deepcopy(manifest))
        await self.world.create_raycluster(self.manifest)
        self.daemon = await self.deploy.start(self.world)

    async def run(self, body: str, timeout_s: float = LONG) -> str:
        """Run a Ray program to completion (the peer's ExecPodCmd); returns its output."""
        head = self.world.bridge.head
        assert head is not None
        driver = await asyncio.to_thread(
            RayDriver.start,
            head.gcs_address,
            body,
            node_ip=head.ip,
            env=head.client_env(),
            wait_ready=False,
            hold=False,
        )
        self.world.drivers.append(driver)
        self.world.timeline.add(f"driver started (pid {driver.process.pid}): {body.strip()[:80]}")
        try:
            code = await asyncio.to_thread(driver.exit_code, timeout_s)
        except Exception as error:
            raise AssertionError(f"driver did not finish: {driver.output()[-3000:]}") from error
        output = driver.output()
        assert code == 0, f"driver exited {code}:\n{output[-3000:]}"
        self.world.timeline.add("driver finished")
        return output

    async def run_all(self, bodies: Sequence[str]) -> None:
        """Several programs at once (the peer's `for ...; do python ... & done; wait`): one
        driver runs them back to back, so the demand appears together (and 2 cores are not
        asked to start ten drivers)."""
        await self.run("\n".join(bodies))

    # --- the peer's observables --------------------------------------------------------------

    @property
    def raycluster_now(self) -> Mapping[str, Any]:
        return self.world.observer.raycluster or {}

    def desired_workers(self) -> int:
        """KubeRay's status.desiredWorkerReplicas (the peer's RayClusterDesiredWorkerReplicas);
        KubeRay omits it when 0 (`omitempty`), which the peer's Go client reads as 0 too."""
        value = (self.raycluster_now.get("status") or {}).get("desiredWorkerReplicas", 0)
        return value if isinstance(value, int) else -1

    def replica_sum(self) -> int:
        """Sum of every group's spec replicas (the peer's GetRayClusterWorkerGroupReplicaSum)."""
        return sum(int(g.get("replicas") or 0) for g in groups_of(self.raycluster_now))

    def pods(self, group: str) -> int:
        """Worker pods of `group`, terminating ones included (the peer's GroupPods). Our
        observer's pod watch may lag its RayCluster watch, so counts are waited for."""
        return len(self.world.observer.worker_pods(group, live=False))

    def live_pods(self, group: str) -> int:
        return len(self.world.observer.worker_pods(group))

    async def busy_workers(self, group: str, count: int) -> bool:
        """Whether `count` live pods of `group` have a busy Ray node (work placed on them)."""
        if self.world.probe is None:
            return False
        names = [p["metadata"]["name"] for p in self.world.observer.worker_pods(group)]
        return len(names) == count and len(await self.world.probe.busy(names)) == count

    def all_workers(self) -> int:
        return len(self.world.observer.worker_pods(None, live=False))

    async def until(self, check: Callable[[], Any], timeout_s: float, what: str) -> None:
        await self.world.wait_for(check, timeout_s, what)

    # --- edits a user makes ------------------------------------------------------------------

    async def patch(self, ops: Sequence[Mapping[str, Any]]) -> None:
        await self.world.admin.ok(
            "PATCH", self.world.raycluster_path, list(ops), content_type=JSON_PATCH
        )
        self.world.timeline.add(f"test: edited the RayCluster {list(ops)}")

    async def merge(self, body: Mapping[str, Any]) -> None:
        await self.world.admin.ok(
            "PATCH", self.world.raycluster_path, dict(body), content_type=MERGE_PATCH
        )

    async def set_group_field(self, index: int, field: str, value: Any) -> None:
        await self.patch(
            [{"op": "replace", "path": f"/spec/workerGroupSpecs/{index}/{field}", "value": value}]
        )

    def finish(self) -> None:
        """Our invariants: no partial, busy or undrained deletion, bounds, clean logs."""
        self.world.assert_invariants()
