"""A head with mutual TLS (RAY_USE_TLS=1), certificates made by the openssl CLI for this module."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from kuberay_scaler.adapters.ray_gcs.client import TlsFiles
from kuberay_scaler.adapters.ray_gcs.errors import GcsUnavailable
from kuberay_standins.ray_local import RayHead
from tests.ray.helpers import fast_client

pytestmark = [
    pytest.mark.ray,
    pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI"),
]

HEAD_IP = "127.0.0.10"


def _make_certs(directory: Path) -> TlsFiles:
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=krs-test-ca")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes",
            "-keyout", "tls.key", "-out", "tls.csr", "-subj", "/CN=ray-head")  # fmt: skip
    (directory / "san.cnf").write_text(f"subjectAltName=IP:{HEAD_IP},DNS:localhost\n")
    openssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "tls.crt", "-days", "1", "-extfile", "san.cnf")  # fmt: skip
    return TlsFiles(
        ca_cert=directory / "ca.crt", cert=directory / "tls.crt", key=directory / "tls.key"
    )


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return _make_certs(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def head(tls_files: TlsFiles) -> Iterator[RayHead]:
    # Ray uses one certificate for server and client side; so do we.
    env = {
        "RAY_USE_TLS": "1",
        "RAY_TLS_SERVER_CERT": str(tls_files.cert),
        "RAY_TLS_SERVER_KEY": str(tls_files.key),
        "RAY_TLS_CA_CERT": str(tls_files.ca_cert),
    }
    ray_head = RayHead.start(ip=HEAD_IP, env=env)
    try:
        yield ray_head
    finally:
        ray_head.stop()


async def test_tls_client_reads_the_cluster(head: RayHead, tls_files: TlsFiles) -> None:
    async with fast_client(head.gcs_address, tls=tls_files) as client:
        cluster_id = await client.connect()
        state = await client.get_cluster_resource_state()
    assert cluster_id
    assert any(n.node_id == head.node_id for n in state.cluster_resource_state.node_states)


async def test_plaintext_client_cannot_connect(head: RayHead) -> None:
    # A TLS mismatch is not an auth error: the server just closes the socket.
    async with fast_client(head.gcs_address, connect_timeout_s=5.0) as client:
        with pytest.raises(GcsUnavailable):
            await client.connect()


async def test_client_without_a_certificate_is_refused(head: RayHead, tls_files: TlsFiles) -> None:
    ca_only = TlsFiles(ca_cert=tls_files.ca_cert)
    async with fast_client(head.gcs_address, tls=ca_only, connect_timeout_s=5.0) as client:
        with pytest.raises(GcsUnavailable):
            await client.connect()
