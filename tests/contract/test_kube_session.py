"""Session: in-cluster credentials over real TLS on loopback, CA verification, token rotation.

A small HTTPS server (aiohttp, certificate made by the `openssl` CLI for IP 127.0.0.1) plays the
API server; it accepts exactly one bearer token at a time, like a server after a rotation.
"""

from __future__ import annotations

import os
import ssl
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import certifi
import pytest
from aiohttp import web
from kubernetes_asyncio.client import Configuration

from kuberay_scaler.adapters.kube.session import (
    SessionError,
    TimedApiClient,
    load_in_cluster,
    open_api,
)
from kuberay_scaler.adapters.kube.transport import ApiError, NoResponse, Target, request_json
from kuberay_scaler.runtime.metrics import KubeCounters

pytestmark = pytest.mark.contract

PODS = "/api/v1/namespaces/default/pods"
LIST_PODS = Target("list", "pods")


@dataclass
class TlsApiServer:
    url: str
    ca_path: Path
    accepted: str = "first"
    seen: list[str] = field(default_factory=list)


def make_certificate(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "server.crt", directory / "server.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


@pytest.fixture
async def tls_server(tmp_path: Path) -> AsyncIterator[TlsApiServer]:
    cert, key = make_certificate(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server = TlsApiServer(url="", ca_path=cert)

    async def list_pods(request: web.Request) -> web.Response:
        token = request.headers.get("Authorization", "")
        server.seen.append(token)
        if token != f"Bearer {server.accepted}":
            return web.json_response({"kind": "Status", "code": 401}, status=401)
        return web.json_response({"items": [], "metadata": {"resourceVersion": "7"}})

    app = web.Application()
    app.router.add_get(PODS, list_pods)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    server.url = f"https://127.0.0.1:{port}"
    yield server
    await runner.cleanup()


def in_cluster_client(server: TlsApiServer, token: Path, ca: Path) -> TimedApiClient:
    configuration = Configuration()
    port = server.url.rsplit(":", 1)[1]
    environ = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port}
    load_in_cluster(configuration, token_path=str(token), ca_path=str(ca), environ=environ)
    return TimedApiClient(configuration, request_timeout=5)


async def list_pods(api: Any) -> dict[str, Any]:
    """One list of pods, counted into counters of its own (these tests read no metrics)."""
    return await request_json(api, LIST_PODS, "GET", PODS, counters=KubeCounters.new())


def rotate(token_file: Path, value: str) -> None:
    """Swap the file like the kubelet does (new file, atomic rename)."""
    fresh = token_file.with_suffix(".new")
    fresh.write_text(value)
    os.replace(fresh, token_file)


async def test_in_cluster_uses_https_verified_ca_and_follows_token_rotation(
    tls_server: TlsApiServer, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("first")
    api = in_cluster_client(tls_server, token, tls_server.ca_path)
    try:
        assert api.configuration.host == tls_server.url
        assert api.configuration.verify_ssl is True
        listed = await list_pods(api)
        assert listed["metadata"]["resourceVersion"] == "7"

        tls_server.accepted = "second"
        rotate(token, "second")
        listed = await list_pods(api)
        assert listed["metadata"]["resourceVersion"] == "7"
        assert tls_server.seen == ["Bearer first", "Bearer second"]
    finally:
        await api.close()


async def test_server_certificate_not_signed_by_the_ca_is_refused(
    tls_server: TlsApiServer, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("first")
    api = in_cluster_client(tls_server, token, Path(certifi.where()))
    try:
        with pytest.raises(NoResponse):
            await list_pods(api)
        assert tls_server.seen == []  # the token never left the client
    finally:
        await api.close()


async def test_stale_token_gives_401_until_the_file_rotates(
    tls_server: TlsApiServer, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("first")
    api = in_cluster_client(tls_server, token, tls_server.ca_path)
    tls_server.accepted = "second"
    try:
        with pytest.raises(ApiError) as raised:
            await list_pods(api)
        assert raised.value.status == 401
        rotate(token, "second")
        assert (await list_pods(api))["items"] == []
    finally:
        await api.close()


async def test_in_cluster_without_service_environment_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(SessionError, match="in-cluster"):
        await open_api(None, request_timeout=5)


async def test_kubeconfig_with_cleartext_remote_server_is_refused(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'http://example.invalid:8080'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    with pytest.raises(SessionError, match="only HTTPS"):
        await open_api(str(kubeconfig), request_timeout=5)


async def test_missing_kubeconfig_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SessionError, match="kubeconfig"):
        await open_api(str(tmp_path / "absent"), request_timeout=5)


async def test_a_netrc_entry_for_any_host_does_not_break_bearer_requests(
    tls_server: TlsApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiohttp trusting the environment would add netrc basic auth and refuse our bearer header."""
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login someone password pw\ndefault login any password pw\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    token = tmp_path / "token"
    token.write_text("first")
    api = in_cluster_client(tls_server, token, tls_server.ca_path)
    try:
        listed = await list_pods(api)
        assert listed["metadata"]["resourceVersion"] == "7"
        assert tls_server.seen == ["Bearer first"]
    finally:
        await api.close()


PROXY_VARIABLES = ("HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "ALL_PROXY")


@pytest.fixture
def proxy_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    return monkeypatch


async def configured(host: str, proxy: str | None = None) -> Configuration:
    configuration = Configuration(host=host)
    configuration.proxy = proxy
    client = TimedApiClient(configuration, request_timeout=5)  # resolves the proxy, dials nothing
    await client.close()
    return configuration


async def test_the_proxy_environment_applies_as_client_go_reads_it(
    proxy_env: pytest.MonkeyPatch,
) -> None:
    proxy_env.setenv("HTTPS_PROXY", "http://user:p%40ss@127.0.0.1:3128")
    remote = await configured("https://10.0.0.1:6443")
    assert remote.proxy == "http://127.0.0.1:3128"
    assert remote.proxy_headers == {"Proxy-Authorization": "Basic dXNlcjpwQHNz"}  # user:p@ss

    assert (await configured("https://127.0.0.1:6443")).proxy is None  # loopback: never proxied
    from_kubeconfig = await configured("https://10.0.0.1:6443", proxy="http://127.0.0.1:9")
    assert from_kubeconfig.proxy == "http://127.0.0.1:9"  # a kubeconfig proxy-url wins
    proxy_env.setenv("NO_PROXY", "10.0.0.1")
    assert (await configured("https://10.0.0.1:6443")).proxy is None
