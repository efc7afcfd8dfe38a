"""A head with token authentication (RAY_AUTH_MODE=token): the token opens it, nothing else does."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from kuberay_scaler.adapters.ray_gcs.errors import GcsAuthError
from kuberay_scaler.adapters.ray_gcs.poller import GcsPoller
from kuberay_scaler.adapters.ray_gcs.report import (
    AutoscalingReport,
    LaunchingGroup,
    build_autoscaling_state,
)
from kuberay_standins.ray_local import HostSpec, RayHead, loopback_ip, start_hosts, stop_all
from tests.ray.helpers import fast_client, node_by_instance, run_ray_status, wait_for_state

pytestmark = pytest.mark.ray

TOKEN = secrets.token_hex(32)


@pytest.fixture(scope="module")
def head() -> Iterator[RayHead]:
    ray_head = RayHead.start(ip="127.0.0.10", auth_token=TOKEN)
    try:
        yield ray_head
    finally:
        ray_head.stop()


async def test_token_opens_every_call(head: RayHead) -> None:
    async with fast_client(head.gcs_address, token=TOKEN) as client:
        cluster_id = await client.connect()
        state = await client.get_cluster_resource_state()
        version = await client.report(
            build_autoscaling_state(AutoscalingReport(launching=(LaunchingGroup("g", 2),)))
        )
    assert cluster_id
    assert state.cluster_resource_state.node_states
    assert version > 0
    assert " g, 2 launching" in run_ray_status(head)


async def test_hosts_join_with_the_token(head: RayHead) -> None:
    spec = HostSpec(
        ip=loopback_ip(41), env={"RAY_CLOUD_INSTANCE_ID": "auth-host", "RAY_NODE_TYPE_NAME": "g"}
    )
    hosts = start_hosts(head.gcs_address, [spec], auth_token=TOKEN)
    try:
        async with fast_client(head.gcs_address, token=TOKEN) as client:
            state = await wait_for_state(
                client, lambda s: node_by_instance(s, "auth-host") is not None, what="auth-host"
            )
        assert node_by_instance(state, "auth-host").node_id == hosts[0].node_id
    finally:
        stop_all(hosts)


async def test_missing_token_fails_clearly(head: RayHead) -> None:
    async with fast_client(head.gcs_address) as client:
        with pytest.raises(GcsAuthError) as caught:
            await client.connect()
    assert caught.value.code == "UNAUTHENTICATED"
    assert "token" in str(caught.value)


async def test_wrong_token_fails_and_is_never_echoed(head: RayHead) -> None:
    wrong = secrets.token_hex(32)
    async with fast_client(head.gcs_address, token=wrong) as client:
        with pytest.raises(GcsAuthError) as caught:
            await client.get_cluster_resource_state()
    assert wrong not in str(caught.value)
    assert TOKEN not in str(caught.value)


async def test_poller_reports_refused_auth_as_unknown(head: RayHead) -> None:
    async with fast_client(head.gcs_address) as client:
        observation = await GcsPoller(client, interval_s=1.0).poll_once()
    assert observation.state is None
    assert observation.error is not None
    assert "UNAUTHENTICATED" in observation.error
