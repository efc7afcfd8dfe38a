"""GCS poll cost: a synthetic `GetClusterResourceStateReply` with 1k or 10k nodes and demand.

A local grpc.aio server (in this process) answers `GetClusterId` and `GetClusterResourceState`
the way a GCS does: the state version rises and idle nodes' `idle_duration_ms` grows on every
call. Each poller runs in its own process at its default interval for a window and reports the
CPU it used (all threads, `time.process_time`):

- **ours**: `GcsClient` + `GcsPoller` exactly as the daemon builds them, and on every change the
  daemon's `parse_ray_state` (what a reconcile would read);
- **Ray v2**: `ray._raylet.GcsClient` + `ray.autoscaler.v2.sdk.get_cluster_resource_state`, what
  Ray's v2 autoscaler calls once per update (every `AUTOSCALER_UPDATE_INTERVAL_S`, 5 s). Only the
  poll: its reconcile over 10k instances comes on top.

Parse time is measured here, in-process: ours `parse_ray_state` of a decoded reply; both sides'
protobuf decode of the serialized reply.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import grpc
import scenario
from ray.core.generated import (
    autoscaler_pb2,
    autoscaler_pb2_grpc,
    gcs_service_pb2,
    gcs_service_pb2_grpc,
)

HERE = Path(__file__).resolve().parent
HOSTS_AT_SCALE_1 = 1950


def synthetic_reply(nodes: int, demand: bool = True) -> Any:
    """The planner benchmark's cluster (scenario.py), scaled so it has about `nodes` hosts;
    without `demand`, an idle cluster (no pending requests)."""
    scale = nodes / HOSTS_AT_SCALE_1
    reply = scenario.build(seed=7, scale=scenario.Scale(scale, min(1.0, scale))).reply()
    if not demand:
        state = reply.cluster_resource_state
        del state.pending_resource_requests[:]
        del state.pending_gang_resource_requests[:]
        del state.cluster_resource_constraints[:]
    return reply


class _State(autoscaler_pb2_grpc.AutoscalerStateServiceServicer):  # type: ignore[misc]
    def __init__(self, reply: Any) -> None:
        self.reply = reply
        self.idle = [n for n in reply.cluster_resource_state.node_states if n.idle_duration_ms]
        self.calls = 0
        self.last_call = time.monotonic()

    async def GetClusterResourceState(self, request: Any, context: Any) -> Any:
        self.calls += 1
        now = time.monotonic()  # idle clocks grow with the time that passed, as a GCS's do
        elapsed_ms, self.last_call = round((now - self.last_call) * 1000), now
        state = self.reply.cluster_resource_state
        state.cluster_resource_state_version += 1
        for node in self.idle:
            node.idle_duration_ms += elapsed_ms
        return self.reply

    async def ReportAutoscalingState(self, request: Any, context: Any) -> Any:
        return autoscaler_pb2.ReportAutoscalingStateReply()


class _NodeInfo(gcs_service_pb2_grpc.NodeInfoGcsServiceServicer):  # type: ignore[misc]
    async def GetClusterId(self, request: Any, context: Any) -> Any:
        reply = gcs_service_pb2.GetClusterIdReply()
        reply.cluster_id = bytes(range(28))
        return reply


async def serve(reply: Any) -> tuple[grpc.aio.Server, int, _State]:
    options = [("grpc.max_send_message_length", 512 * 2**20)]
    server = grpc.aio.server(options=options)
    state = _State(reply)
    autoscaler_pb2_grpc.add_AutoscalerStateServiceServicer_to_server(state, server)
    gcs_service_pb2_grpc.add_NodeInfoGcsServiceServicer_to_server(_NodeInfo(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port, state


def parse_times(reply: Any, repeats: int) -> dict[str, float]:
    from kuberay_scaler.adapters.ray_gcs.state import parse_ray_state

    data = reply.SerializeToString()
    decode, parse = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        decoded = autoscaler_pb2.GetClusterResourceStateReply.FromString(data)
        decode.append(time.perf_counter() - started)
        started = time.perf_counter()
        parse_ray_state(decoded, read_at_ms=time.time_ns() // 1_000_000)
        parse.append(time.perf_counter() - started)
    return {
        "reply_mb": round(len(data) / 2**20, 2),
        "decode_ms": round(statistics.median(decode) * 1000, 2),
        "ours_parse_ms": round(statistics.median(parse) * 1000, 2),
    }


async def measure(
    nodes: int, window_s: float, repeats: int = 5, demand: bool = True
) -> dict[str, Any]:
    reply = synthetic_reply(nodes, demand)
    out: dict[str, Any] = {
        "nodes": len(reply.cluster_resource_state.node_states),
        "demand": demand,
        **parse_times(reply, repeats),
    }
    server, port, state = await serve(reply)
    try:
        for kind in ("ours", "ray-v2"):
            calls0 = state.calls
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                str(HERE / "gcs_poll_proc.py"),
                kind,
                f"127.0.0.1:{port}",
                str(window_s),
                stdout=subprocess.PIPE,
            )
            stdout, _ = await proc.communicate()
            result = json.loads(stdout.decode().strip().splitlines()[-1])
            result["server_calls"] = state.calls - calls0
            result["cpu_pct_of_core"] = round(100 * result["cpu_s"] / result["wall_s"], 2)
            out[kind] = result
    finally:
        await server.stop(None)
    return out


if __name__ == "__main__":
    sizes = [int(s) for s in (sys.argv[1] if len(sys.argv) > 1 else "1000").split(",")]
    window = float(sys.argv[2]) if len(sys.argv) > 2 else 20.0
    demand = "--idle" not in sys.argv
    for n in sizes:
        print(json.dumps(asyncio.run(measure(n, window, demand=demand))), flush=True)
