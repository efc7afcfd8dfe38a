"""Drain every host of a slice before the slice may be deleted.

`DRAIN_NODE_REASON_IDLE_TERMINATION` is refused for a busy node and, when accepted, makes that
raylet exit at once. A slice is deleted only if every host's drain was accepted; otherwise its
deletion is cancelled, and the hosts that did accept are reported because they are gone from Ray
(the slice is now broken and will need replacing, not reuse).

Node ids are hex everywhere in the daemon; they become bytes only in the request here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Protocol

import structlog
from ray.core.generated import autoscaler_pb2

from kuberay_scaler.adapters.ray_gcs.errors import GcsError
from kuberay_scaler.core.model.drains import DrainReason, HostDrain, SliceDrainResult
from kuberay_scaler.runtime.metrics import GcsCounters

__all__ = [
    "IDLE_TERMINATION",
    "PREEMPTION",
    "DrainClient",
    "DrainReason",
    "HostDrain",
    "SliceDrainResult",
    "deadline_in",
    "drain_slice",
]

log = structlog.get_logger(__name__)

# The wire values of DrainNodeRequest.reason.
IDLE_TERMINATION = autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_IDLE_TERMINATION")
PREEMPTION = autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION")
_WIRE_REASON = {DrainReason.IDLE_TERMINATION: IDLE_TERMINATION, DrainReason.PREEMPTION: PREEMPTION}


class DrainClient(Protocol):
    """The one call `drain_slice` needs (`GcsClient` has it)."""

    @property
    def cluster_id(self) -> str | None: ...

    async def drain_node(
        self,
        node_id: bytes,
        *,
        reason_message: str,
        deadline_timestamp_ms: int,
        reason: int = ...,
        cluster_id: str | None = None,
    ) -> object: ...


def deadline_in(seconds: float, *, now_s: float | None = None) -> int:
    """`deadline_ms` for a drain that may take `seconds` (epoch milliseconds)."""
    base = time.time() if now_s is None else now_s
    return int((base + seconds) * 1000)


async def drain_slice(
    client: DrainClient,
    node_ids: Sequence[str],
    *,
    reason_message: str,
    deadline_ms: int,
    cluster_id: str | None = None,
    reason: DrainReason = DrainReason.IDLE_TERMINATION,
    counters: GcsCounters | None = None,
) -> SliceDrainResult:
    """Drain all hosts (hex node ids) of one slice concurrently.

    `deadline_ms` is the absolute deadline (epoch ms, `DrainNodeRequest.deadline_timestamp_ms`);
    it must be positive (the GCS aborts on negative values). `cluster_id` should be the id of the
    observation the node ids came from; by default the client's current one is pinned.
    """
    if deadline_ms <= 0:
        raise ValueError(f"drain deadline must be a positive epoch-ms timestamp, got {deadline_ms}")
    pinned = cluster_id or client.cluster_id
    wire = _WIRE_REASON[reason]
    counted = counters or GcsCounters.new()
    results = await asyncio.gather(
        *(
            _drain_host(client, node_id, reason_message, deadline_ms, pinned, wire, counted)
            for node_id in node_ids
        )
    )
    result = SliceDrainResult(hosts=tuple(results))
    log.info(
        "slice_drained" if result.may_delete else "slice_drain_refused",
        hosts=len(result.hosts),
        drained=len(result.drained_node_ids),
        reason=result.reason,
    )
    return result


async def _drain_host(
    client: DrainClient,
    node_id: str,
    reason_message: str,
    deadline_ms: int,
    cluster_id: str | None,
    reason: int,
    counters: GcsCounters,
) -> HostDrain:
    try:
        reply = await client.drain_node(
            bytes.fromhex(node_id),
            reason_message=reason_message,
            deadline_timestamp_ms=deadline_ms,
            reason=reason,
            cluster_id=cluster_id,
        )
    except GcsError as err:
        counters.drain("error")
        return HostDrain(node_id, "error", str(err))
    if getattr(reply, "is_accepted", False):
        counters.drain("accepted")
        return HostDrain(node_id, "accepted")
    counters.drain("rejected")
    return HostDrain(node_id, "rejected", str(getattr(reply, "rejection_reason_message", "")))
