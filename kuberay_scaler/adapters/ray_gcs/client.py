"""Async client for the GCS `AutoscalerStateService`, over grpc.aio with the Ray wheel's stubs.

One channel at a time. A connection starts with `GetClusterId`; every later call carries that id
as `ray_cluster_id` metadata, so a GCS that was replaced behind the same address answers
`UNAUTHENTICATED WrongClusterID` instead of silently serving another cluster's state. After
`UNAVAILABLE`, a deadline or a wrong id the channel is dropped; the next call reconnects, with a
jittered backoff between failed connects (a call during the backoff fails at once, it does not
sleep, so callers keep their own pace). GCS restarts are routine, so that backoff stays within
`MAX_RECONNECT_BACKOFF_S`: a head that is back is seen within a few seconds. A run of failed
connects is logged once, when it starts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import structlog
from google.protobuf.message import DecodeError
from ray.core.generated import (
    autoscaler_pb2,
    autoscaler_pb2_grpc,
    gcs_service_pb2,
    gcs_service_pb2_grpc,
)

from kuberay_scaler.adapters.ray_gcs.errors import (
    GcsAuthError,
    GcsCallError,
    GcsError,
    GcsReplaced,
    GcsUnavailable,
)
from kuberay_scaler.adapters.ray_gcs.report import StateVersionClock
from kuberay_scaler.core.backoff import Backoff
from kuberay_scaler.core.defaults import GCS_RPC_TIMEOUT_S
from kuberay_scaler.runtime.metrics import GcsCounters

log = structlog.get_logger(__name__)

CLUSTER_ID_METADATA = "ray_cluster_id"
_WRONG_CLUSTER_ID = "WrongClusterID"
_OLD_WRONG_CLUSTER_ID = "AuthError"
_UNREACHABLE = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)
# A connect attempt is one cheap RPC to a local head: retrying every few seconds costs nothing,
# while a 30 s cap kept a daemon blind (not ready) long after the head came back.
MAX_RECONNECT_BACKOFF_S = 2.0
IDLE_TERMINATION = autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_IDLE_TERMINATION")
_STATE_METHOD = "/ray.rpc.autoscaler.AutoscalerStateService/GetClusterResourceState"
# Always version 0: a version above the GCS's own counter trips a RAY_CHECK and kills the GCS.
# The same request every time, serialized once.
_STATE_REQUEST = autoscaler_pb2.GetClusterResourceStateRequest(
    last_seen_cluster_resource_state_version=0
).SerializeToString()

Metadata = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for TLS to the GCS (KubeRay: RAY_TLS_CA_CERT, RAY_TLS_SERVER_CERT/KEY)."""

    ca_cert: Path | None = None
    cert: Path | None = None  # client certificate, when the GCS wants mutual TLS
    key: Path | None = None
    server_name: str | None = None  # overrides the name checked against the GCS certificate


@dataclass
class _Connection:
    channel: Any  # grpc.aio.Channel
    autoscaler: Any  # AutoscalerStateServiceStub
    cluster_id: str
    state_bytes: Any  # GetClusterResourceState, its reply left as bytes (see get_..._bytes)
    version_floor_known: bool = False


class GcsClient:
    """Talks to one GCS address. Safe to share between tasks of one event loop."""

    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        tls: TlsFiles | None = None,
        rpc_timeout_s: float = GCS_RPC_TIMEOUT_S,
        connect_timeout_s: float = 5.0,
        backoff_initial_s: float = 0.2,
        backoff_max_s: float = MAX_RECONNECT_BACKOFF_S,
        keepalive_time_s: float = 300.0,
        keepalive_timeout_s: float = 60.0,
        max_message_bytes: int = 512 * 1024 * 1024,
        monotonic: Callable[[], float] = time.monotonic,
        wall_clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
        counters: GcsCounters | None = None,
    ) -> None:
        self._address = address
        self._counters = counters or GcsCounters.new()
        self._token = token
        self._tls = tls
        self._rpc_timeout_s = rpc_timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._options = _channel_options(
            keepalive_time_s, keepalive_timeout_s, max_message_bytes, tls
        )
        self._backoff = Backoff(initial=backoff_initial_s, cap=backoff_max_s)
        self._monotonic = monotonic
        self._wall_clock_ms = wall_clock_ms
        self._versions = StateVersionClock()
        self._lock = asyncio.Lock()
        self._conn: _Connection | None = None
        self._next_connect_at = 0.0
        self._known_cluster_id: str | None = None
        self.replacements = 0  # times a reconnect found a different cluster id

    @property
    def address(self) -> str:
        return self._address

    @property
    def cluster_id(self) -> str | None:
        """Hex id of the GCS we last connected to (kept while disconnected)."""
        return self._known_cluster_id

    @property
    def connected(self) -> bool:
        return self._conn is not None

    def next_connect_in(self) -> float:
        """Seconds until a connect may be tried again (0 when connected or allowed now)."""
        if self._conn is not None:
            return 0.0
        return max(0.0, self._next_connect_at - self._monotonic())

    async def connect(self) -> str:
        """Connect now if needed; returns the cluster id. Raises `GcsError` subclasses."""
        return (await self._connection()).cluster_id

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.channel.close()

    async def __aenter__(self) -> GcsClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def get_cluster_resource_state(self) -> autoscaler_pb2.GetClusterResourceStateReply:
        reply = await self.get_cluster_resource_state_bytes()
        try:
            return autoscaler_pb2.GetClusterResourceStateReply.FromString(reply)
        except DecodeError as err:
            self._counters.rpc_error("GetClusterResourceState", "DECODE")
            raise GcsCallError("GetClusterResourceState", "DECODE", str(err)) from None

    async def get_cluster_resource_state_bytes(self) -> bytes:
        """`GetClusterResourceState`'s reply as it came off the wire (the poller decodes it
        itself, so it can tell its own CPU from what the event loop ran during the call: grpc.aio
        returns the bytes as they are when the call has no response deserializer)."""
        return bytes(await self._call("GetClusterResourceState", _STATE_REQUEST, raw=True))

    async def get_cluster_status(self) -> autoscaler_pb2.GetClusterStatusReply:
        return await self._call("GetClusterStatus", autoscaler_pb2.GetClusterStatusRequest())

    async def report(self, state: autoscaler_pb2.AutoscalingState) -> int:
        """Send `state` with a fresh `autoscaler_state_version`; returns that version."""
        conn = await self._connection()
        if not conn.version_floor_known:
            # A previous run may have reported with a later clock; stay above what the GCS holds.
            status = await self.get_cluster_status()
            self._versions.observe(int(status.autoscaling_state.autoscaler_state_version))
            conn.version_floor_known = True
        message = autoscaler_pb2.AutoscalingState()
        message.CopyFrom(state)
        message.autoscaler_state_version = self._versions.next(self._wall_clock_ms())
        request = autoscaler_pb2.ReportAutoscalingStateRequest(autoscaling_state=message)
        await self._call("ReportAutoscalingState", request)
        return int(message.autoscaler_state_version)

    async def drain_node(
        self,
        node_id: bytes,
        *,
        reason_message: str,
        deadline_timestamp_ms: int,
        reason: int = IDLE_TERMINATION,
        cluster_id: str | None = None,
    ) -> autoscaler_pb2.DrainNodeReply:
        """One `DrainNode`. Pass the `cluster_id` the node id was read under: if the GCS has been
        replaced since, it refuses (a new GCS would accept an unknown node id as drained)."""
        request = autoscaler_pb2.DrainNodeRequest(
            node_id=node_id,
            reason=reason,
            reason_message=reason_message,
            deadline_timestamp_ms=deadline_timestamp_ms,
        )
        return await self._call("DrainNode", request, cluster_id=cluster_id)

    async def _call(
        self, method: str, request: Any, *, cluster_id: str | None = None, raw: bool = False
    ) -> Any:
        conn = await self._connection()
        sent_id = cluster_id or conn.cluster_id
        rpc = conn.state_bytes if raw else getattr(conn.autoscaler, method)
        started = self._monotonic()
        try:
            reply = await rpc(
                request, metadata=self._metadata(sent_id), timeout=self._rpc_timeout_s
            )
        except grpc.aio.AioRpcError as err:
            failure = _classify(method, err)
            self._counters.rpc_error(method, failure.code)
            if isinstance(failure, GcsUnavailable) or (
                isinstance(failure, GcsReplaced) and sent_id == conn.cluster_id
            ):
                await self._drop(conn, failure)
            raise failure from None
        self._counters.rpc(method, self._monotonic() - started)
        return reply

    async def _connection(self) -> _Connection:
        async with self._lock:
            if self._conn is not None:
                return self._conn
            wait_s = self._next_connect_at - self._monotonic()
            if wait_s > 0:
                raise GcsUnavailable("connect", "BACKOFF", f"next attempt in {wait_s:.1f}s")
            self._conn = await self._open()
            return self._conn

    async def _open(self) -> _Connection:
        try:
            channel = self._new_channel()
        except OSError as err:  # TLS files removed or replaced after start: hold and retry
            failure = GcsAuthError("connect", "TLS_FILES", f"cannot read TLS files: {err}")
            self._connect_failed(failure)
            raise failure from None
        try:
            cluster_id = await self._fetch_cluster_id(channel)
        except GcsError as err:
            await channel.close()
            self._connect_failed(err)
            raise
        if self._backoff.failures:
            log.info(
                "gcs_reconnected", address=self._address, failed_attempts=self._backoff.failures
            )
        self._backoff.reset()
        self._note_cluster_id(cluster_id)
        stub = autoscaler_pb2_grpc.AutoscalerStateServiceStub(channel)
        # No serializer either way: the request is sent as the bytes given, the reply returned so.
        state_bytes = channel.unary_unary(_STATE_METHOD)
        return _Connection(
            channel=channel, autoscaler=stub, cluster_id=cluster_id, state_bytes=state_bytes
        )

    def _connect_failed(self, err: GcsError) -> None:
        self._next_connect_at = self._monotonic() + self._backoff.next_delay()
        if self._backoff.failures == 1:  # once per outage, not on every retry
            log.warning("gcs_connect_failed", address=self._address, error=str(err))
        else:
            log.debug("gcs_connect_failed", address=self._address, error=str(err))

    async def _fetch_cluster_id(self, channel: Any) -> str:
        method = "GetClusterId"
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        started = self._monotonic()
        try:
            reply = await stub.GetClusterId(
                gcs_service_pb2.GetClusterIdRequest(),
                metadata=self._metadata(None),
                timeout=self._connect_timeout_s,
            )
        except grpc.aio.AioRpcError as err:
            failure = _classify(method, err)
            self._counters.rpc_error(method, failure.code)
            raise failure from None
        self._counters.rpc(method, self._monotonic() - started)
        if reply.status.code != 0:
            self._counters.rpc_error(method, "GCS_STATUS")
            raise GcsCallError(method, f"GCS_STATUS_{reply.status.code}", reply.status.message)
        return str(reply.cluster_id.hex())

    def _note_cluster_id(self, cluster_id: str) -> None:
        if self._known_cluster_id is not None and cluster_id != self._known_cluster_id:
            self.replacements += 1
            log.warning(
                "gcs_replaced",
                address=self._address,
                old_cluster_id=self._known_cluster_id,
                new_cluster_id=cluster_id,
            )
        elif self._known_cluster_id is None:
            log.info("gcs_connected", address=self._address, cluster_id=cluster_id)
        self._known_cluster_id = cluster_id

    async def _drop(self, conn: _Connection, failure: GcsError) -> None:
        # Concurrent calls may all fail on the same connection; close it once.
        if self._conn is conn:
            self._conn = None
            log.warning("gcs_connection_lost", address=self._address, error=str(failure))
            await conn.channel.close()

    def _metadata(self, cluster_id: str | None) -> Metadata:
        pairs: list[tuple[str, str]] = []
        if self._token:
            pairs.append(("authorization", f"Bearer {self._token}"))
        if cluster_id:
            pairs.append((CLUSTER_ID_METADATA, cluster_id))
        return tuple(pairs)

    def _new_channel(self) -> Any:
        if self._tls is None:
            return grpc.aio.insecure_channel(self._address, options=self._options)
        return grpc.aio.secure_channel(
            self._address, _tls_credentials(self._tls), options=self._options
        )


def _classify(method: str, err: Any) -> GcsError:
    code = err.code()
    details = err.details() or ""
    name = code.name if code is not None else "UNKNOWN"
    if code in _UNREACHABLE:
        return GcsUnavailable(method, name, details)
    if code == grpc.StatusCode.UNAUTHENTICATED and _WRONG_CLUSTER_ID in details:
        return GcsReplaced(method, name, details)
    if code == grpc.StatusCode.ABORTED and details == _OLD_WRONG_CLUSTER_ID:
        # Ray before token auth (2.49 and older, seen in make ray-matrix) refuses a wrong
        # cluster id with its Status::AuthError, which reaches gRPC as ABORTED "AuthError".
        return GcsReplaced(method, name, f"{details} (older Ray's WrongClusterID)")
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return GcsAuthError(method, name, f"{details} (is the GCS token right?)")
    return GcsCallError(method, name, details)


def _channel_options(
    keepalive_time_s: float,
    keepalive_timeout_s: float,
    max_message_bytes: int,
    tls: TlsFiles | None,
) -> Sequence[tuple[str, Any]]:
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        # The GCS is always reached directly; an https_proxy in the pod env must not capture it.
        ("grpc.enable_http_proxy", 0),
        ("grpc.keepalive_time_ms", int(keepalive_time_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(keepalive_timeout_s * 1000)),
    ]
    if tls is not None and tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    return tuple(options)


def _tls_credentials(tls: TlsFiles) -> Any:
    # Read at every connect so rotated certificate files are picked up.
    def read(path: Path | None) -> bytes | None:
        return path.read_bytes() if path is not None else None

    return grpc.ssl_channel_credentials(
        root_certificates=read(tls.ca_cert),
        private_key=read(tls.key),
        certificate_chain=read(tls.cert),
    )
