"""A stray `~/.ray/auth_token` (what `ray get-auth-token --generate` writes) and stray RAY_*
variables on the machine change nothing for the Ray tier: every Ray process we start has its own
HOME and an explicit RAY_AUTH_MODE. (Without that, `ray start --head` turns token auth on by
itself when it finds the file; hosts and the daemon, which send no token, are refused. With the
previous ray_local this test failed: "InvalidAuthToken: Authentication token is missing".)
"""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from kuberay_standins.ray_local import (
    HostSpec,
    RayDriver,
    RayHead,
    loopback_ip,
    start_hosts,
    stop_all,
)
from tests.ray.helpers import fast_client, node_by_instance, wait_for_state

pytestmark = pytest.mark.ray

WORK = """
@ray.remote(num_cpus=1)
def where():
    import os
    return os.environ["HOME"]
print("HOME_OF_TASK=" + ray.get(where.remote(), timeout=120), flush=True)
"""


@pytest.fixture
def stray_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "user-home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text(secrets.token_hex(32))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")  # a developer's setting: must not leak
    return home


async def test_a_stray_token_file_in_home_changes_no_result(stray_home: Path) -> None:
    head = RayHead.start(ip=loopback_ip(12))
    hosts = []
    driver = None
    try:
        spec = HostSpec(
            ip=loopback_ip(42),
            env={"RAY_CLOUD_INSTANCE_ID": "hermetic-host", "RAY_NODE_TYPE_NAME": "g"},
        )
        hosts = start_hosts(head.gcs_address, [spec])
        async with fast_client(head.gcs_address) as client:  # no token, as the test tiers run
            await client.connect()
            state = await wait_for_state(
                client, lambda s: node_by_instance(s, "hermetic-host") is not None, what="the host"
            )
        assert node_by_instance(state, "hermetic-host").node_id == hosts[0].node_id
        driver = RayDriver.start(
            head.gcs_address, WORK, node_ip=head.ip, env=head.client_env(), timeout_s=180
        )
        task_home = driver.output().split("HOME_OF_TASK=")[1].split()[0]
        assert not task_home.startswith(str(stray_home)), task_home
        for process in (head, hosts[0]):
            assert process.env["RAY_AUTH_MODE"] == "disabled"
            assert "RAY_ADDRESS" not in process.env
    finally:
        if driver is not None:
            driver.stop()
        stop_all([*hosts, head])
