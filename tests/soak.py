"""`make soak MINUTES=n`: the demo harness under a random workload and random faults for n minutes.

Stand-ins (API server, operator, kubelet) + a real Ray head + one real Ray host per Running worker
pod + the real daemon as a subprocess. Two workload lanes run Ray drivers side by side, each one
driver after another: the TPU lane (SlicePlacementGroups, idle periods) and the CPU lane (tasks,
actors, `request_resources` of 2-CPU shapes only a CPU host has); a fault loop injects watch cuts,
410s, 409s, 422s, 429s, 5xx, an API-server restart, a GCS restart, a killed Ray host, a pod deleted
behind everyone's back and a paused operator; the daemon is SIGKILLed and restarted twice. Every
RayCluster write goes through tests/invariants.py. At the end: faults by kind, decisions by kind,
violations (must be 0), daemon RSS at start and end, reconcile p50/p99; exit 1 on any violation.

Dense enough to judge real work, whatever the machine's load: idle timeouts of seconds, a
scripted opening on the TPU lane (a TPU slice held by `request_resources`, one of its Ray hosts
killed, the replacement awaited, the slice released: minutes, as the missing-node grace runs)
while the CPU lane cycles its group up and down, so a slow slice never starves the run of
writes; random drivers are killed after DRIVER_LIFETIME_S. The run needs at least
`--min-writes` judged daemon writes (10 a minute by default), among them a scale-down, a
replacement, and drains; it runs past `--minutes` until it has them (at most
`--extra-minutes` more) and fails if it still has not.

    python -m tests.soak --minutes 2 [--seed N] [--min-writes 20]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import structlog
from prometheus_client.parser import text_string_to_metric_families

from kuberay_standins._k8s_errors import FieldCause, invalid, patch_not_applied
from kuberay_standins.demo import Scenario, demo_raycluster
from kuberay_standins.harness import DaemonProcess, LocalCluster
from kuberay_standins.ray_local import RayDriver, RayStartError
from tests import reaper
from tests.invariants import (
    REPLICA_NAME,
    WriteFeed,
    finish_local_cluster,
    gcs_node_states,
    groups_of,
    watch_local_cluster,
    workers_to_delete,
)

# v4 2x2x2: 8 chips, 2 hosts of 4 (small enough for a shared 2-core machine). Not v6e 2x4: Ray
# counts that as ONE host of 8 chips, so a 2-host group could never serve it.
SLICE_TOPOLOGY = "2x2x2"
SLICE_GENERATION = "v4"
# A driver whose demand cannot be met (a fault took its slice) is killed: its lane goes on.
DRIVER_LIFETIME_S = 100.0
SETTLE_S = 150.0
DAEMON_KILLS_AT = (0.15, 0.30)  # fractions of the run; the last daemon lives 70 % of it
RSS_WARMUP_S = 30.0
# The two 422s kube-apiserver sends: a JSON patch whose `test` fails, and a validation failure.
STALE_422 = patch_not_applied().status
INVALID_422 = invalid(
    "RayCluster.ray.io",
    "soak",
    [FieldCause("spec.workerGroupSpecs[0].replicas", "FieldValueInvalid", "Invalid value")],
    kind="RayCluster",
    group="ray.io",
).status
ECHOED = {"patch_replicas", "patch_delete", "patch_clear", "ray_host", "ray_host_gone"}
IDLE_TIMEOUT_S = 5  # scale-downs within seconds of idleness: many cycles in a short run
# A killed Ray host makes its slice broken in a minute (the default grace is 3 min). Not
# less: the grace also runs while a new pod's Ray host starts: 15-60 s on a loaded 2-core machine.
DAEMON_ENV = {
    "KUBERAY_SCALER_MISSING_NODE_GRACE_S": "60",
    "KUBERAY_SCALER_REPLACE_BACKOFF_S": "10",
}
# Faults that could take the opening's slice or its driver (the opening must be able to finish).
RAY_SIDE_FAULTS = frozenset(
    {"GCS restart", "Ray host killed", "pod deleted behind everyone's back"}
)
OPENING_STEP_S = 180.0  # each step of the scripted opening waits at most this long
WRITES_PER_MINUTE = 10
DRAINING_ANNOTATION = "kuberay-scaler.ray.io/draining"


def soak_raycluster() -> dict[str, Any]:
    cluster = demo_raycluster(Scenario(slices=1, hosts=2))
    cluster["metadata"]["name"] = "soak"
    cluster["spec"]["autoscalerOptions"]["idleTimeoutSeconds"] = IDLE_TIMEOUT_S
    tpu = cluster["spec"]["workerGroupSpecs"][0]
    tpu["template"]["spec"]["nodeSelector"] = {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v4-podslice",
        "cloud.google.com/gke-tpu-topology": SLICE_TOPOLOGY,
    }
    return cluster


# --- the workload ----------------------------------------------------------------------------

# The CPU lane's tasks, actors and bundles need 2 CPUs: a cpu-group host has 2, a TPU host 1, so
# they scale the CPU group even while a slice is up (with 1 they ran on the slice's hosts).
CPU_LANE_CPUS = 2
# After a driver a lane usually waits (bounded) for its group to scale down, so each driver makes
# a cycle of writes; otherwise the next demand meets the idle hosts before they go (a race kept).
WAIT_SCALED_DOWN = 0.7
SCALED_DOWN_WAIT_S = 60.0
LANE_GROUP = {"tpu": "tpu-group", "cpu": "cpu-group"}


def _tasks(rng: random.Random) -> tuple[str, str]:
    n, secs = rng.randint(1, 5), rng.uniform(1, 8)
    body = f"""
@ray.remote(num_cpus={CPU_LANE_CPUS})
def work(i):
    time.sleep({secs:.1f})
    return i
ray.get([work.remote(i) for i in range({n})], timeout=90)
"""
    return f"CPU tasks ({n})", body


def _actor(rng: random.Random) -> tuple[str, str]:
    secs = rng.uniform(3, 20)
    body = f"""
@ray.remote(num_cpus={CPU_LANE_CPUS})
class Holder:
    def ping(self):
        return 1
holder = Holder.remote()
ray.get(holder.ping.remote(), timeout=90)
time.sleep({secs:.1f})
"""
    return "an actor", body


def _slice(rng: random.Random) -> tuple[str, str]:
    secs = rng.uniform(2, 15)
    body = f"""
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from ray.util.tpu import SlicePlacementGroup
handle = SlicePlacementGroup(topology={SLICE_TOPOLOGY!r}, accelerator_version={SLICE_GENERATION!r},
                             num_slices=1, head_reservation_timeout_s=90)
ray.get(handle.placement_group.ready(), timeout=90)
@ray.remote(num_cpus=0, resources={{"TPU": 4}})
def on_host(rank):
    time.sleep({secs:.1f})
    return rank
strategy = PlacementGroupSchedulingStrategy(placement_group=handle.placement_group)
ray.get([on_host.options(scheduling_strategy=strategy).remote(i) for i in range(2)], timeout=90)
handle.shutdown()
"""
    return "a slice reservation", body


def _request_resources(rng: random.Random) -> tuple[str, str]:
    n, secs = rng.randint(1, 3), rng.uniform(5, 20)
    body = f"""
from ray.autoscaler.sdk import request_resources
request_resources(bundles=[{{"CPU": {CPU_LANE_CPUS}}}] * {n})
time.sleep({secs:.1f})
request_resources(bundles=[])
"""
    return f"request_resources ({n} x {CPU_LANE_CPUS} CPU)", body


def _held_slice(release: Path) -> str:
    """The opening's driver: ask for one TPU slice's worth until `release` exists, then stop."""
    return f"""
import os
from ray.autoscaler.sdk import request_resources
request_resources(bundles=[{{"TPU": 4}}, {{"TPU": 4}}])
deadline = time.time() + {3 * OPENING_STEP_S:.0f}
while not os.path.exists({str(release)!r}) and time.time() < deadline:
    time.sleep(0.5)
request_resources(bundles=[])
"""


Workload = Callable[[random.Random], tuple[str, str]]
# The lanes run side by side; a lane's drivers run one after another.
LANES: dict[str, list[Workload]] = {
    "tpu": [_slice],
    "cpu": [_tasks, _actor, _request_resources],
}


# --- what the run judged ----------------------------------------------------------------------


def write_kinds(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """What one RayCluster write did: scale-up, scale-down, replacement (pods named for deletion
    while replicas stay), clear (a processed list emptied), draining record (our annotation)."""
    kinds = []
    old = groups_of(before)
    for name, group in groups_of(after).items():
        prev = old.get(name, {})
        raised = int(group.get("replicas") or 0) - int(prev.get("replicas") or 0)
        named = set(workers_to_delete(group)) - set(workers_to_delete(prev))
        if named:
            kinds.append("scale-down" if raised < 0 else "replacement")
        elif raised > 0:
            kinds.append("scale-up")
        elif raised < 0:
            kinds.append("replicas lowered")
        if workers_to_delete(prev) and not workers_to_delete(group):
            kinds.append("clear")
    annotations = [
        ((x.get("metadata") or {}).get("annotations") or {}).get(DRAINING_ANNOTATION)
        for x in (before, after)
    ]
    if annotations[0] != annotations[1] and annotations[1]:
        kinds.append("draining record")
    return kinds


@dataclass
class Density:
    """How much real work the run judged; `problems` says what is missing."""

    judged: int = 0
    writes: Counter[str] = field(default_factory=Counter)
    drains: int = 0

    def problems(self, min_writes: int) -> list[str]:
        missing = []
        if self.judged < min_writes:
            missing.append(f"{self.judged} daemon writes judged, fewer than {min_writes}")
        for kind in ("scale-up", "scale-down", "replacement"):
            if not self.writes[kind]:
                missing.append(f"no {kind} write")
        if not self.drains:
            missing.append("no slice drained")
        return missing


# --- the run -----------------------------------------------------------------------------------


@dataclass
class Daemons:
    """The daemon instances of the run (one alive at a time) and what we know of each."""

    current: DaemonProcess
    started: float = field(default_factory=time.monotonic)
    all: list[DaemonProcess] = field(default_factory=list)
    rss: dict[int, list[tuple[float, int]]] = field(default_factory=dict)  # pid -> (age, kB)
    histograms: dict[int, dict[float, float]] = field(default_factory=dict)  # pid -> le -> count
    expected_exit: bool = False


@dataclass
class Soak:
    cluster: LocalCluster
    rng: random.Random
    deadline: float
    out: TextIO
    feed: WriteFeed | None = None
    daemons: Daemons | None = None
    faults: Counter[str] = field(default_factory=Counter)
    workload: Counter[str] = field(default_factory=Counter)
    blind_since: float | None = None
    demand_epoch: int = 0
    drivers: dict[str, RayDriver] = field(default_factory=dict)  # lane -> its running driver
    stopping: bool = False
    only: tuple[str, ...] = ()  # fault names to draw from (all when empty)
    workloads: tuple[str, ...] = ()  # tasks, actor, slice, request_resources (all when empty)
    writes: Counter[str] = field(default_factory=Counter)  # the daemon's writes, by kind
    opening: bool = True  # the scripted opening first (a replacement, a slice scale-down)
    min_writes: int = 0  # judged daemon writes the run needs (plus the kinds Density names)
    # Ray-side faults wait for the opening (API faults and daemon kills do not).
    opened: asyncio.Event = field(default_factory=asyncio.Event)

    def density(self) -> Density:
        judged = self.feed.checker.judged if self.feed is not None else 0
        drains = sum(
            1
            for daemon in (self.daemons.all if self.daemons else [])
            for line in daemon.lines()
            if line.get("event") == "slice_drained"
        )
        return Density(judged, Counter(self.writes), drains)

    def count_writes(self) -> Callable[[], None]:
        """Classify every committed write of the daemon (the writer holding the cluster token)."""
        daemon = self.cluster.api.user_of(self.cluster.token)

        def on_write(logged: Any) -> None:
            event = logged.event
            if event.store != "rayclusters" or event.type != "MODIFIED" or event.prev is None:
                return
            if logged.user == daemon:
                self.writes.update(write_kinds(event.prev, event.obj))

        unsubscribe: Callable[[], None] = self.cluster.api.subscribe_writes(on_write)
        return unsubscribe

    def say(self, text: str) -> None:
        elapsed = time.monotonic() - self.cluster.timeline.started
        print(f"[{elapsed:7.1f}s] {text}", file=self.out, flush=True)

    # -- daemon ----------------------------------------------------------------------------

    def start_daemon(self) -> DaemonProcess:
        daemon = self.cluster.start_daemon(**DAEMON_ENV)
        if self.daemons is None:
            self.daemons = Daemons(daemon, all=[daemon])
        else:
            self.daemons.current, self.daemons.started = daemon, time.monotonic()
            self.daemons.all.append(daemon)
            self.daemons.expected_exit = False
        return daemon

    async def kill_daemon(self) -> None:
        assert self.daemons is not None
        self.daemons.expected_exit = True
        self.daemons.current.process.send_signal(signal.SIGKILL)
        await asyncio.to_thread(self.daemons.current.process.wait)
        self.faults["daemon SIGKILL + restart"] += 1
        self.say("fault: daemon SIGKILLed; restarting it")
        self.start_daemon()

    async def watch_daemon(self) -> None:
        """Exits the tier did not ask for are violations; sample RSS and metrics meanwhile."""
        assert self.daemons is not None and self.feed is not None
        tick = 0
        while True:
            await asyncio.sleep(1.0)
            tick += 1
            d = self.daemons
            code = d.current.process.poll()
            if code is not None and not d.expected_exit:
                tail = "\n".join(str(x) for x in d.current.lines()[-15:])
                self.feed.checker.daemon_exited(code, tail)
                self.say(f"VIOLATION: daemon exited on its own with {code}; restarting it")
                self.start_daemon()
                continue
            pid = d.current.process.pid
            rss = _rss_kb(pid)
            if rss is not None:
                d.rss.setdefault(pid, []).append((time.monotonic() - d.started, rss))
            if tick % 10 == 0:
                with contextlib.suppress(Exception):
                    d.histograms[pid] = await asyncio.to_thread(_reconcile_buckets, d.current)

    # -- workload --------------------------------------------------------------------------

    async def run_workload(self) -> None:
        lanes = [asyncio.create_task(self.run_lane(lane)) for lane in LANES]
        try:
            await asyncio.gather(*lanes)
        finally:
            for lane in lanes:
                lane.cancel()

    async def run_lane(self, lane: str) -> None:
        if lane == "tpu" and self.opening:
            await self.run_opening()
        kinds = [w for w in LANES[lane] if not self.workloads or w.__name__[1:] in self.workloads]
        while kinds and not self.stopping:
            if lane == "tpu" and self.rng.random() < 0.2:  # the CPU lane idles between cycles
                idle = self.rng.uniform(5, 40)
                self.workload["idle period"] += 1
                self.say(f"workload ({lane}): idle for {idle:.0f} s")
                await asyncio.sleep(idle)
                continue
            what, body = self.rng.choice(kinds)(self.rng)
            self.workload[what.split(" (")[0]] += 1
            self.demand_epoch += 1
            self.say(f"workload ({lane}): {what}")
            await self._run_driver(lane, body)
            if self.rng.random() < WAIT_SCALED_DOWN:
                await self._scaled_down(LANE_GROUP[lane])
            await asyncio.sleep(self.rng.uniform(0, 5))

    async def _scaled_down(self, group: str) -> None:
        """Wait (bounded) until `group` has no worker pod."""
        deadline = time.monotonic() + SCALED_DOWN_WAIT_S
        await _until(lambda: not self.cluster.worker_pods(group), deadline, every=0.5)

    async def run_opening(self) -> None:
        """A TPU slice held by `request_resources`; one of its Ray hosts killed (the daemon must
        replace the broken slice whole); the replacement awaited; the slice released (the daemon
        must drain and delete it). Each step waits a bounded time; what did not happen shows in
        the density verdict."""
        self.workload["opening: held slice, broken, replaced, released"] += 1
        self.demand_epoch += 1
        release = self.cluster.workdir / "release-held-slice"
        self.say("workload: opening: request_resources for one TPU slice")
        driver = await self._start_driver(_held_slice(release))
        if driver is not None:
            self.drivers["tpu"] = driver
        try:
            first = await self._slice_up(set())
            if first is None:
                return
            key, pods = first
            victim = sorted(pods)[-1]
            hooks = self.cluster.hooks
            assert hooks is not None
            with contextlib.suppress(KeyError):
                hooks.hosts[victim].kill()
            self.faults["Ray host killed (opening: slice broken)"] += 1
            self.say(f"fault: opening: killed the Ray host of pod {victim} (slice {key})")
            await self._slice_up({key})
        finally:
            with contextlib.suppress(OSError):  # the cluster's workdir is gone on an interrupt
                release.touch()
            self.demand_epoch += 1
            self.opened.set()
            if driver is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    await asyncio.to_thread(driver.process.wait, 60)
                await asyncio.to_thread(driver.stop)
            self.drivers.pop("tpu", None)
            self.say("workload: opening: slice released")

    async def _slice_up(self, not_these: set[str]) -> tuple[str, set[str]] | None:
        """Wait (bounded) for a TPU slice, not one of `not_these`, with a Ray host on every pod."""
        deadline = time.monotonic() + OPENING_STEP_S
        while time.monotonic() < deadline and not self.stopping:
            hooks = self.cluster.hooks
            slices: dict[str, set[str]] = {}
            for pod in self.cluster.worker_pods("tpu-group"):
                key = pod["metadata"]["labels"].get(REPLICA_NAME)
                if key and key not in not_these:
                    slices.setdefault(key, set()).add(pod["metadata"]["name"])
            for key, pods in sorted(slices.items()):
                if len(pods) >= 2 and hooks is not None and pods <= set(hooks.hosts):
                    return key, pods
            await asyncio.sleep(0.5)
        self.say(f"workload: opening: no new TPU slice up within {OPENING_STEP_S:.0f} s")
        return None

    async def _start_driver(self, body: str) -> RayDriver | None:
        head = self.cluster.head
        if head is None or not head.alive():
            return None
        try:
            return await asyncio.to_thread(
                RayDriver.start,
                head.gcs_address,
                body,
                node_ip=head.ip,
                env=head.client_env(),
                wait_ready=False,
                hold=False,
            )
        except (RayStartError, OSError) as error:
            self.say(f"workload: driver failed to start: {error}")
            return None

    async def _run_driver(self, lane: str, body: str) -> None:
        driver = await self._start_driver(body)
        if driver is None:
            await asyncio.sleep(5)
            return
        self.drivers[lane] = driver
        with contextlib.suppress(subprocess.TimeoutExpired):  # a stuck driver is killed below
            await asyncio.to_thread(driver.process.wait, DRIVER_LIFETIME_S)
        code = driver.process.poll()
        if code != 0 and not self.stopping:
            tail = driver.output().strip().splitlines()[-3:]
            ended = "was killed after its lifetime" if code is None else f"ended with {code}"
            self.say(f"workload ({lane}): driver {ended}: {' | '.join(tail)[-400:]}")
        await asyncio.to_thread(driver.stop)
        self.drivers.pop(lane, None)

    # -- faults ----------------------------------------------------------------------------

    async def run_faults(self, kills_at: list[float]) -> None:
        if not self.opening:
            self.opened.set()
        while not self.stopping:
            await asyncio.sleep(self.rng.uniform(4, 15))
            if self.stopping:
                return
            if kills_at and time.monotonic() >= kills_at[0]:
                kills_at.pop(0)
                await self.kill_daemon()
                continue
            # While the opening runs, only faults that leave its slice's Ray side alone.
            opening = not self.opened.is_set()
            choices = [
                (n, f)
                for n, f in self._faults()
                if (not self.only or n in self.only) and not (opening and n in RAY_SIDE_FAULTS)
            ]
            if not choices:
                continue
            name, fault = self.rng.choice(choices)
            self.faults[name] += 1
            self.say(f"fault: {name}")
            try:
                await fault()
            except Exception as error:  # a fault that cannot be injected is noted, not fatal
                self.say(f"fault {name} could not be injected: {error!r}")

    def _faults(self) -> list[tuple[str, Callable[[], Any]]]:
        api = self.cluster.api
        rc = r"/apis/ray\.io/v1/namespaces/[^/]+/rayclusters"

        async def fail(status: int, method: str = "PATCH", count: int = 1, **kw: Any) -> None:
            api.faults.fail_next(method, rc, status, count=count, **kw)

        async def watch_cut() -> None:
            api.faults.drop_watches()

        async def gone() -> None:
            api.faults.expire_watches()

        return [
            ("watch cut", watch_cut),
            ("410 Gone on the watches", gone),
            ("409 on a patch", lambda: fail(409)),
            ("422 on a patch (guard failed)", lambda: fail(422, body=STALE_422)),
            ("422 on a patch (validation)", lambda: fail(422, body=INVALID_422)),
            ("429 with Retry-After", lambda: fail(429, "*", 3, headers={"Retry-After": "1"})),
            ("5xx", lambda: fail(self.rng.choice((500, 503)), "*", 2)),
            ("API-server restart", self._apiserver_restart),
            ("GCS restart", self._gcs_restart),
            ("Ray host killed", self._kill_host),
            ("pod deleted behind everyone's back", self._delete_pod),
            ("operator paused", self._pause_operator),
        ]

    async def _apiserver_restart(self) -> None:
        api = self.cluster.api
        api.faults.refuse_connections(True)
        await asyncio.sleep(self.rng.uniform(1, 6))
        api.compact()  # history is lost with the restart: resuming watches get 410
        api.faults.refuse_connections(False)

    async def _gcs_restart(self) -> None:
        head, hooks = self.cluster.head, self.cluster.hooks
        assert head is not None and hooks is not None
        self.blind_since = time.monotonic()
        with contextlib.suppress(RuntimeError):
            await asyncio.to_thread(head.kill_gcs)
        await asyncio.sleep(self.rng.uniform(1, 8))
        # Demand is known again once the new GCS answers, which on a loaded machine is well
        # before `restart` returns (it waits for the head's raylet): the daemon may act on it.
        answered = asyncio.create_task(
            _first_answer(head.gcs_address, head.auth_token, self.gcs_answered)
        )
        try:
            new = await asyncio.to_thread(head.restart)
        finally:
            answered.cancel()
        self.cluster.head = new
        hooks._head = new
        self.demand_epoch += 1
        self.blind_since = None
        with contextlib.suppress(BaseException):
            await answered

    def gcs_answered(self) -> None:
        """The new GCS answered: demand is known again (`_gcs_restart`)."""
        self.demand_epoch += 1
        self.blind_since = None

    async def _kill_host(self) -> None:
        hooks = self.cluster.hooks
        assert hooks is not None
        if not hooks.hosts:
            return
        name = self.rng.choice(sorted(hooks.hosts))
        hooks.hosts[name].kill()
        self.say(f"  killed the Ray host of pod {name}")

    async def _delete_pod(self) -> None:
        pods = self.cluster.worker_pods()
        if not pods:
            return
        name = self.rng.choice(sorted(p["metadata"]["name"] for p in pods))
        with contextlib.suppress(Exception):
            self.cluster.api.delete("pods", self.cluster.namespace, name)
        self.say(f"  deleted pod {name}")

    async def _pause_operator(self) -> None:
        operator = self.cluster.operator
        assert operator is not None
        operator.paused = True
        await asyncio.sleep(self.rng.uniform(5, 25))
        operator.paused = False

    # -- the end ---------------------------------------------------------------------------

    async def settle(self) -> None:
        """Faults off, workload gone: give the daemon time to finish what it started."""
        api = self.cluster.api
        api.faults.clear()
        api.faults.refuse_connections(False)
        if self.cluster.operator is not None:
            self.cluster.operator.paused = False
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline:
            # Done when nothing stale is listed and either the run judged enough or every slice
            # went idle and was scaled down (then nothing more can come).
            idle_out = not self.cluster.worker_pods()
            if not _stale_lists(self.cluster) and (idle_out or not self.density_problems()):
                break
            await asyncio.sleep(1.0)

    def density_problems(self) -> list[str]:
        return self.density().problems(self.min_writes)


async def _first_answer(address: str, token: str | None, then: Callable[[], None]) -> None:
    """Call `then` as soon as a GCS on `address` answers GetClusterResourceState.

    Asked often and briefly: the daemon may read the new GCS and write before this notices, and
    such a write is judged as made while blind (a late notice here is a false violation).
    """
    while True:
        try:
            await asyncio.wait_for(gcs_node_states(address, token), 2)
        except Exception:  # not up yet (refused, unavailable, timed out)
            await asyncio.sleep(0.05)
            continue
        then()
        return


async def _until(done: Callable[[], bool], deadline: float, every: float = 2.0) -> None:
    """Poll `done` (it reads logs and counters: nothing to await) until true or `deadline`."""
    while time.monotonic() < deadline:
        if done():
            return
        await asyncio.sleep(every)


def _stale_lists(cluster: LocalCluster) -> list[str]:
    names = {p["metadata"]["name"] for p in cluster.api.list("pods", cluster.namespace)}
    groups = cluster.current()["spec"]["workerGroupSpecs"]
    listed = [
        n for g in groups for n in (g.get("scaleStrategy") or {}).get("workersToDelete") or []
    ]
    return [n for n in listed if n not in names]


def _keep_logs(cluster: LocalCluster, seed: int) -> Path:
    """The daemons' JSON logs outlive the run (the cluster's workdir does not)."""
    import shutil

    kept = Path(tempfile.gettempdir()) / f"kuberay-scaler-soak-{seed}"
    kept.mkdir(exist_ok=True)
    for log in cluster.workdir.glob("daemon-*.log"):
        shutil.copy(log, kept / log.name)
    return kept


def _rss_kb(pid: int) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return None


def _reconcile_buckets(daemon: DaemonProcess) -> dict[float, float]:
    import urllib.request

    with urllib.request.urlopen(f"http://{daemon.http}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "kuberay_scaler_reconcile_duration_seconds":
            continue
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                buckets[float(sample.labels["le"])] = sample.value
    return buckets


def quantile(buckets: dict[float, float], q: float) -> float | None:
    """The upper bound of the histogram bucket holding quantile q (cumulative counts)."""
    total = buckets.get(float("inf"), 0.0)
    if total <= 0:
        return None
    for bound in sorted(buckets):
        if buckets[bound] >= q * total:
            return bound
    return None


def _summary(soak: Soak, checker_violations: list[Any], out: TextIO) -> None:
    d = soak.daemons
    assert d is not None and soak.feed is not None
    decisions: Counter[str] = Counter()
    for daemon in d.all:
        for line in daemon.lines():
            if line.get("event") == "decision":
                decisions[str(line.get("action"))] += 1
    merged: dict[float, float] = {}
    for buckets in d.histograms.values():
        for bound, count in buckets.items():
            merged[bound] = merged.get(bound, 0.0) + count
    longest = max(d.rss.items(), key=lambda kv: kv[1][-1][0], default=(0, []))
    warm = [kb for age, kb in longest[1] if age >= RSS_WARMUP_S] or [kb for _, kb in longest[1]]
    p50, p99 = quantile(merged, 0.5), quantile(merged, 0.99)
    print("\nSoak summary", file=out)
    print(f"  faults injected: {dict(sorted(soak.faults.items()))}", file=out)
    print(f"  workload: {dict(sorted(soak.workload.items()))}", file=out)
    print(f"  decisions: {dict(sorted(decisions.items()))}", file=out)
    print(
        f"  writes seen: {soak.feed.checker.writes_seen}, judged (daemon's): "
        f"{soak.feed.checker.judged}",
        file=out,
    )
    if warm:
        growth = (warm[-1] - warm[0]) / warm[0] * 100
        print(
            f"  daemon RSS (pid {longest[0]}, lived {longest[1][-1][0]:.0f} s): start "
            f"{warm[0] / 1024:.1f} MiB (after {RSS_WARMUP_S:.0f} s warm-up), end "
            f"{warm[-1] / 1024:.1f} MiB ({growth:+.1f} %)",
            file=out,
        )
    print(f"  reconcile p50 <= {p50} s, p99 <= {p99} s (histogram bucket bounds)", file=out)
    density = soak.density()
    print(f"  daemon writes by kind: {dict(sorted(density.writes.items()))}", file=out)
    print(f"  slices drained (the daemons' slice_drained lines): {density.drains}", file=out)
    problems = density.problems(soak.min_writes)
    print(
        f"  density (>= {soak.min_writes} judged writes, a scale-up, a scale-down, a "
        f"replacement, a drain): {'; '.join(problems) or 'ok'}",
        file=out,
    )
    print(f"  violations: {len(checker_violations)} {soak.feed.checker.counts()}", file=out)
    for violation in checker_violations[:20]:
        print(f"\n{violation}", file=out)


async def run_soak(
    minutes: float,
    seed: int,
    out: TextIO = sys.stdout,
    only: tuple[str, ...] = (),
    workloads: tuple[str, ...] = (),
    min_writes: int | None = None,
    extra_minutes: float = 5.0,
    opening: bool = True,
) -> int:
    rng = random.Random(seed)
    needed = round(WRITES_PER_MINUTE * minutes) if min_writes is None else min_writes
    print(f"soak: {minutes} min, seed {seed}, needs {needed} judged writes", file=out, flush=True)
    started = time.monotonic()
    deadline = started + minutes * 60
    async with LocalCluster(soak_raycluster(), pod_start_delay=0.5) as cluster:
        soak = Soak(
            cluster,
            rng,
            deadline,
            out,
            only=only,
            workloads=workloads,
            opening=opening,
            min_writes=needed,
        )
        stop_counting = soak.count_writes()
        cluster.timeline.listeners.append(
            lambda m: soak.say(f"  {m.text}") if m.kind in ECHOED else None
        )
        soak.feed = watch_local_cluster(
            cluster, blind_since=lambda: soak.blind_since, demand=lambda: soak.demand_epoch
        )
        soak.start_daemon()
        kills = [started + f * (deadline - started) for f in DAEMON_KILLS_AT]
        tasks = [
            asyncio.create_task(soak.run_workload()),
            asyncio.create_task(soak.run_faults(kills)),
            asyncio.create_task(soak.watch_daemon()),
        ]
        try:
            await asyncio.sleep(max(0.0, deadline - time.monotonic()))
            # A loaded machine does less in the same minutes: go on (bounded) until the run has
            # judged what it must, rather than judge less.
            cap = deadline + extra_minutes * 60
            if soak.density_problems() and time.monotonic() < cap:
                soak.say(f"soak: time is up but {'; '.join(soak.density_problems())}: going on")
                await _until(lambda: not soak.density_problems(), cap)
            soak.stopping = True
            soak.say("soak: time is up; stopping the workload and the faults, settling")
            for task in tasks[:2]:
                task.cancel()
            for task in tasks[:2]:
                with contextlib.suppress(BaseException):
                    await task
            for driver in list(soak.drivers.values()):
                await asyncio.to_thread(driver.stop)
            await soak.settle()
            checker = await finish_local_cluster(soak.feed, cluster)
        finally:
            tasks[2].cancel()
            with contextlib.suppress(BaseException):
                await tasks[2]
        stop_counting()
        _summary(soak, checker.violations, out)
        thin = soak.density_problems()  # reads the daemons' logs: before the workdir goes
        kept = _keep_logs(cluster, seed)
        print(f"  daemon logs kept in {kept}", file=out)
        code, _ = await asyncio.to_thread(soak.daemons.current.stop) if soak.daemons else (0, 0)
        if code != 0:
            print(f"  daemon exit code after SIGTERM: {code}", file=out)
    print(f"(soak took {time.monotonic() - started:.0f} s)", file=out)
    if thin:
        print(f"soak FAILED: it judged too little: {'; '.join(thin)}", file=out)
    return 1 if checker.violations or code != 0 or thin else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.soak")
    parser.add_argument("--minutes", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100_000)
    parser.add_argument("--only", action="append", default=[], help="a fault name (repeatable)")
    parser.add_argument(
        "--workload", action="append", default=[], help="tasks, actor, slice or request_resources"
    )
    parser.add_argument(
        "--min-writes",
        type=int,
        default=None,
        help=f"judged daemon writes needed (default {WRITES_PER_MINUTE} a minute)",
    )
    parser.add_argument(
        "--extra-minutes", type=float, default=5.0, help="how long past --minutes to go on"
    )
    parser.add_argument("--no-opening", action="store_true", help="skip the scripted opening")
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    marker = reaper.mark_session()
    try:
        code = _run(args)
    finally:  # on an interrupt too
        left = _reap(marker)
    return 1 if left else code


def _run(args: argparse.Namespace) -> int:
    return asyncio.run(
        run_soak(
            args.minutes,
            args.seed,
            only=tuple(args.only),
            workloads=tuple(args.workload),
            min_writes=args.min_writes,
            extra_minutes=args.extra_minutes,
            opening=not args.no_opening,
        )
    )


def _reap(marker: str) -> list[reaper.Leftover]:
    left = reaper.leftovers(marker)
    if left:
        reaper.reap(left)
    dirs = reaper.leftover_dirs(marker)
    reaper.remove_dirs(dirs)
    if dirs:
        print(f"removed {len(dirs)} temp dir(s) the soak left: {', '.join(map(str, dirs))}")
    if left:
        print(f"{len(left)} process(es) started by the soak were still alive (now killed):")
        for leftover in left:
            print(f"  {leftover}")
    return left


if __name__ == "__main__":
    sys.exit(main())
