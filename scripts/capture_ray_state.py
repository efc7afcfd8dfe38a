#!/usr/bin/env python
"""Capture real `GetClusterResourceStateReply` fixtures from local Ray clusters on loopback.

Starts Ray heads and hosts with `kuberay_standins.ray_local`, creates real demand with drivers,
waits until the GCS shows it, and writes `MessageToJson(reply)` to `<out>/<scenario>.json`.

    .venv/bin/python scripts/capture_ray_state.py [--out tests/fixtures/ray_state] [--only NAME ...]

Two clusters are used: one with a v6e-16 slice (4 TPU-like hosts) and a CPU host, and one with
only a head (num_cpus 0), so that every kind of demand stays pending there.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from ray.core.generated import autoscaler_pb2

from kuberay_scaler.adapters.ray_gcs.client import GcsClient
from kuberay_standins.ray_local import (
    HostSpec,
    RayDriver,
    RayHead,
    loopback_ip,
    start_hosts,
    stop_all,
    tpu_slice_specs,
)

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "ray_state"
TPU_SCENARIOS = ("idle_tpu_slice", "busy_tpu_slice", "pinned_slice_bundles")
DEMAND_SCENARIOS = (
    "pending_cpu_tasks",
    "pending_pgs",
    "pending_slice_reservation",
    "request_resources",  # last: a resource constraint stays in the GCS for good
)
SCENARIOS = TPU_SCENARIOS + DEMAND_SCENARIOS

CLUSTER = "raycluster-tpu"
SLICE_NAME = "tpu-group-q8m4z"  # the replica name KubeRay gives a slice (<group>-<5 chars>)
TPU_PODS = [f"{CLUSTER}-tpu-group-worker-{s}" for s in ("b7x2k", "c4m9p", "d2q8r", "f6t3w")]
CPU_POD = f"{CLUSTER}-cpu-group-worker-h2k9d"

IDLE = autoscaler_pb2.NodeStatus.Value("IDLE")
RUNNING = autoscaler_pb2.NodeStatus.Value("RUNNING")
DEAD = autoscaler_pb2.NodeStatus.Value("DEAD")

BUSY_SLICE = """
@ray.remote(num_cpus=0, resources={"TPU": 4})
def train_step():
    time.sleep(3600)

steps = [train_step.remote() for _ in range(4)]
"""

PINNED_SLICE = """
from ray.util import tpu
# Step 1 (the head bundle) fits: only the chips are busy. Step 2 then pends, pinned to the slice.
reservation = tpu.slice_placement_group(topology="4x4", accelerator_version="v6e")
"""

CPU_TASKS = """
@ray.remote(num_cpus=1)
def preprocess(i):
    time.sleep(3600)

@ray.remote(num_cpus=2)
class Server:
    pass

tasks = [preprocess.remote(i) for i in range(10)]
servers = [Server.remote() for _ in range(2)]
"""

PGS = """
from ray.util.placement_group import placement_group
spread = placement_group([{"CPU": 2}] * 3, strategy="STRICT_SPREAD", name="spread-gang")
pack = placement_group(
    [{"CPU": 1, "TPU": 4}, {"CPU": 1, "TPU": 4}],
    strategy="STRICT_PACK",
    name="pack-gang",
    bundle_label_selector=[
        {"ray.io/accelerator-type": "TPU-V6E"},
        {"ray.io/accelerator-type": "TPU-V6E", "ray.io/tpu-topology": "in(4x4,4x8)"},
    ],
)
"""

SLICE_RESERVATION = """
import threading
from ray.util import tpu
# Step 1 blocks until some host has TPU-v6e-16-head; none exists here.
threading.Thread(
    target=tpu.slice_placement_group,
    kwargs=dict(topology="4x4", accelerator_version="v6e", head_reservation_timeout_s=None),
    daemon=True,
).start()
time.sleep(1)
"""

REQUEST_RESOURCES = """
from ray.autoscaler.sdk import request_resources
request_resources(bundles=[{"TPU": 4}] * 4)
"""

State = Any
Predicate = Callable[[State], bool]


async def wait_for(client: GcsClient, predicate: Predicate, what: str) -> Any:
    """The first reply whose state satisfies `predicate` (gives up after two minutes)."""

    async def poll() -> Any:
        while True:
            reply = await client.get_cluster_resource_state()
            if predicate(reply.cluster_resource_state):
                return reply
            await asyncio.sleep(0.3)

    try:
        return await asyncio.wait_for(poll(), 120)
    except TimeoutError:
        raise SystemExit(f"gave up waiting for {what}") from None


def write(out: Path, name: str, reply: Any) -> None:
    path = out / f"{name}.json"
    path.write_text(json_format.MessageToJson(reply, sort_keys=True) + "\n")
    print(f"wrote {path}")


def live(state: State) -> list[Any]:
    return [n for n in state.node_states if n.status != DEAD]


def node_status(state: State, instance_id: str) -> int | None:
    return next((int(n.status) for n in live(state) if n.instance_id == instance_id), None)


def pending_gangs(state: State) -> list[Any]:
    return [g for g in state.pending_gang_resource_requests if g.requests]


def no_demand(state: State) -> bool:
    return not state.pending_resource_requests and not pending_gangs(state)


def bundles(request: Any) -> dict[str, float]:
    return dict(request.resources_bundle)


async def capture_tpu_cluster(out: Path, wanted: set[str]) -> None:
    head = await asyncio.to_thread(RayHead.start, ip="127.0.0.10")
    tpu_ips = [loopback_ip(n) for n in (21, 22, 23, 24)]
    specs = [
        *tpu_slice_specs(SLICE_NAME, tpu_ips, group="tpu-group", instance_ids=TPU_PODS),
        HostSpec(
            ip=loopback_ip(31),
            num_cpus=4,
            env={"RAY_CLOUD_INSTANCE_ID": CPU_POD, "RAY_NODE_TYPE_NAME": "cpu-group"},
        ),
    ]
    hosts = await asyncio.to_thread(start_hosts, head.gcs_address, specs)
    drivers: list[RayDriver] = []
    try:
        async with GcsClient(head.gcs_address) as client:
            await _tpu_scenarios(client, head, drivers, out, wanted)
    finally:
        for driver in drivers:
            driver.stop()
        await asyncio.to_thread(stop_all, [*hosts, head])


async def _tpu_scenarios(
    client: GcsClient, head: RayHead, drivers: list[RayDriver], out: Path, wanted: set[str]
) -> None:
    def all_idle(state: State) -> bool:
        return len(live(state)) == 6 and all(n.status == IDLE for n in live(state))

    if "idle_tpu_slice" in wanted:
        write(out, "idle_tpu_slice", await wait_for(client, all_idle, "an idle cluster"))
    if not wanted & {"busy_tpu_slice", "pinned_slice_bundles"}:
        return
    drivers.append(await start_driver(head, BUSY_SLICE))

    def slice_busy(state: State) -> bool:
        return all(node_status(state, pod) == RUNNING for pod in TPU_PODS)

    reply = await wait_for(client, slice_busy, "all four TPU hosts busy")
    if "busy_tpu_slice" in wanted:
        write(out, "busy_tpu_slice", reply)
    if "pinned_slice_bundles" in wanted:
        drivers.append(await start_driver(head, PINNED_SLICE))

        def pinned(state: State) -> bool:
            return any(
                "ray.io/tpu-slice-name" in str(g.bundle_selectors) for g in pending_gangs(state)
            )

        write(out, "pinned_slice_bundles", await wait_for(client, pinned, "pinned bundles"))


async def capture_demand_cluster(out: Path, wanted: set[str]) -> None:
    head = await asyncio.to_thread(RayHead.start, ip="127.0.0.10")
    try:
        async with GcsClient(head.gcs_address) as client:
            for name, body, predicate in _demand_steps():
                if name in wanted:
                    await _one_demand(client, head, out, name, body, predicate)
    finally:
        await asyncio.to_thread(head.stop)


async def _one_demand(
    client: GcsClient, head: RayHead, out: Path, name: str, body: str, predicate: Predicate
) -> None:
    driver = await start_driver(head, body)
    try:
        write(out, name, await wait_for(client, predicate, name))
    finally:
        driver.stop()
    await wait_for(client, no_demand, f"demand of {name} gone")


def _demand_steps() -> Iterable[tuple[str, str, Predicate]]:
    def cpu_tasks(state: State) -> bool:
        counts = {
            tuple(sorted(bundles(r.request).items())): r.count
            for r in state.pending_resource_requests
        }
        return counts.get((("CPU", 1.0),)) == 10 and counts.get((("CPU", 2.0),)) == 2

    def two_gangs(state: State) -> bool:
        return len(pending_gangs(state)) == 2

    def reservation(state: State) -> bool:
        return any("TPU-v6e-16-head" in bundles(g.requests[0]) for g in pending_gangs(state))

    def constraint(state: State) -> bool:
        return len(state.cluster_resource_constraints) == 1

    return [
        ("pending_cpu_tasks", CPU_TASKS, cpu_tasks),
        ("pending_pgs", PGS, two_gangs),
        ("pending_slice_reservation", SLICE_RESERVATION, reservation),
        ("request_resources", REQUEST_RESOURCES, constraint),
    ]


async def start_driver(head: RayHead, body: str) -> RayDriver:
    return await asyncio.to_thread(
        RayDriver.start, head.gcs_address, body, node_ip=head.ip, env=head.client_env()
    )


async def capture(out: Path, wanted: set[str]) -> None:
    if wanted & set(TPU_SCENARIOS):
        await capture_tpu_cluster(out, wanted)
    if wanted & set(DEMAND_SCENARIOS):
        await capture_demand_cluster(out, wanted)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--only", nargs="*", choices=SCENARIOS, default=list(SCENARIOS))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    asyncio.run(capture(args.out, set(args.only)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
