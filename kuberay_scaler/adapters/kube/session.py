"""Open an `ApiClient` from a kubeconfig or from the pod's service account.

In-cluster: HTTPS to `KUBERNETES_SERVICE_HOST:PORT`, server certificate verified against the
service-account CA, and the bearer token re-read whenever the projected token file changes
(kubelet rotates it; the library's own hook only re-reads once a minute, so a freshly rotated
token would give 401s for up to that long).

Every request carries a timeout: `TimedApiClient` fills in `request_timeout` when the caller
gives none. Watches pass their own timeout (no total, only connect), see `transport`.

The library's HTTP session trusts the environment, so aiohttp would read `~/.netrc` (or
`$NETRC`) in a thread on every request; a `default` or matching entry there collides with our
bearer header and fails every call. `TimedApiClient` swaps in a session that does not, and
resolves the proxy once, as client-go does: `HTTPS_PROXY`/`HTTP_PROXY` unless `NO_PROXY`
matches or the server is loopback; a kubeconfig `proxy-url` wins.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import re
from base64 import b64encode
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit
from urllib.request import getproxies, proxy_bypass

import aiohttp
import structlog
import yaml
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.config import ConfigException, load_kube_config
from kubernetes_asyncio.config.incluster_config import (
    SERVICE_CERT_FILENAME,
    SERVICE_TOKEN_FILENAME,
    InClusterConfigLoader,
)

log = structlog.get_logger(__name__)


class SessionError(Exception):
    """Credentials or server address unusable; the message is one line for the user."""


class TimedApiClient(ApiClient):
    """`ApiClient` whose requests default to `request_timeout` seconds in total."""

    def __init__(self, configuration: Configuration, *, request_timeout: float) -> None:
        if not configuration.proxy:
            use_env_proxy(configuration)
        super().__init__(configuration)
        self.request_timeout = request_timeout
        # Held, not dropped: a session collected while its connector is open warns as unclosed.
        self._library_session = _stop_trusting_env(self.rest_client)

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("_request_timeout") is None:
            kwargs["_request_timeout"] = self.request_timeout
        return super().request(method, url, *args, **kwargs)


# The library's own read buffer: watch events of large objects exceed aiohttp's default.
_READ_BUFSIZE = 2**21


def _stop_trusting_env(rest_client: Any) -> aiohttp.ClientSession:
    """Give `rest_client` a session on the same connector that never reads netrc or proxy env;
    return the library's. That one has sent nothing, and counts as closed once the connector it
    shares is closed with ours."""
    library_session: aiohttp.ClientSession = rest_client.pool_manager
    rest_client.pool_manager = aiohttp.ClientSession(
        connector=library_session.connector,
        connector_owner=True,
        trust_env=False,
        read_bufsize=_READ_BUFSIZE,
    )
    return library_session


def use_env_proxy(configuration: Configuration) -> None:
    """Set `configuration.proxy` (and its auth header) from the proxy environment, if it applies."""
    server = urlsplit(configuration.host or "")
    hostname = server.hostname or ""
    if not hostname or _is_loopback(hostname):
        return
    proxy = getproxies().get(server.scheme)
    if not proxy or proxy_bypass(hostname):
        return
    parts = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        configuration.proxy_headers = {"Proxy-Authorization": "Basic " + b64encode(pair).decode()}
    configuration.proxy = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


@dataclass
class RotatingToken:
    """Re-reads a token file when it changes (inode, size or mtime), so rotation is seen at once.

    Installed as `Configuration.refresh_api_key_hook`, which the client calls before every request.
    A failed re-read keeps the previous token: a half-written file must not break requests.
    """

    path: Path
    _seen: tuple[int, int, int] | None = None

    def __call__(self, configuration: Configuration, *_: Any) -> None:
        try:
            stat = os.stat(self.path)
            fingerprint = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
            if fingerprint == self._seen:
                return
            token = self.path.read_text().strip()
        except OSError as error:
            log.warning("token file unreadable, keeping previous token", error=str(error))
            return
        if not token:
            return
        configuration.api_key["BearerToken"] = "Bearer " + token
        if self._seen is not None:
            log.info("service-account token rotated, using the new one")
        self._seen = fingerprint


async def open_api(kubeconfig: str | None, *, request_timeout: float) -> TimedApiClient:
    """An API client for `kubeconfig`, or for the in-cluster service account when it is None.

    Raises `SessionError` (one line) when the credentials cannot be loaded or a plain-HTTP
    server address is not loopback (a bearer token must never travel unencrypted).
    """
    configuration = Configuration()
    if kubeconfig is None:
        load_in_cluster(configuration)
    else:
        await _load_kubeconfig(configuration, kubeconfig)
    _refuse_cleartext_remote(configuration.host or "")
    return TimedApiClient(configuration, request_timeout=request_timeout)


def load_in_cluster(
    configuration: Configuration,
    *,
    token_path: str = SERVICE_TOKEN_FILENAME,
    ca_path: str = SERVICE_CERT_FILENAME,
    environ: Mapping[str, str] = os.environ,
) -> None:
    """Fill `configuration` from the service account (paths overridable for tests)."""
    loader = InClusterConfigLoader(
        token_filename=token_path,
        cert_filename=ca_path,
        try_refresh_token=False,
        environ=dict(environ),
    )
    try:
        loader.load_and_set(configuration)
    except (ConfigException, OSError, ValueError) as error:
        raise SessionError(f"in-cluster Kubernetes credentials: {error}") from error
    configuration.verify_ssl = True
    hook = RotatingToken(Path(token_path))
    hook(configuration)
    configuration.refresh_api_key_hook = hook


async def _load_kubeconfig(configuration: Configuration, kubeconfig: str) -> None:
    _require_readable(kubeconfig)
    try:
        with _library_quiet():
            await load_kube_config(
                config_file=kubeconfig, client_configuration=configuration, persist_config=False
            )
        _refuse_cleartext_remote(configuration.host or "")
    except Exception as error:  # YAML errors, missing keys, exec plugins failing: all one line
        text = " ".join(str(error).split()) or type(error).__name__
        raise SessionError(f"kubeconfig {kubeconfig}: {_scrub(text, kubeconfig)}") from error


# The library's messages quote what it was given: an exec plugin's stderr (often the token it
# failed to refresh), server URLs with user info. They are one line for the user, never secrets.
_EXEC_FAILED = re.compile(r"(exec: process returned -?\d+)\..*", re.DOTALL)
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"]+")
_BEARER = re.compile(r"(Bearer\s+)\S+", re.IGNORECASE)
_SECRET_KEYS = re.compile(r"token|password|secret|key-data|certificate-data|credential", re.I)


def _scrub(text: str, kubeconfig: str) -> str:
    """`text` without an exec plugin's stderr, URL credentials or any secret of the file."""
    text = _EXEC_FAILED.sub(r"\1 (its stderr not shown: it may hold secrets)", text)
    text = _URL.sub(lambda m: safe_url(m.group(0)), text)
    text = _BEARER.sub(r"\1***", text)
    for secret in _kubeconfig_secrets(kubeconfig):
        text = text.replace(secret, "***")
    return text


def safe_url(url: str) -> str:
    """`url` without user info or query values (both may carry credentials)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    netloc = parts.netloc.rpartition("@")[2] if "@" in parts.netloc else parts.netloc
    netloc = f"***@{netloc}" if "@" in parts.netloc else netloc
    query = "&".join(
        f"{p.partition('=')[0]}=***" if "=" in p else p for p in parts.query.split("&")
    )
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def _kubeconfig_secrets(kubeconfig: str) -> list[str]:
    """Every value of the file stored under a secret-looking key, longest first (best effort:
    a file that does not parse has its YAML error shown, which carries no value). A path
    (`tokenFile`) goes too: it says where a secret lives."""
    try:
        with open(kubeconfig, "rb") as stream:
            doc = yaml.safe_load(stream.read(1 << 20))
    except Exception:  # unreadable or not YAML: nothing more to hide
        return []
    found: set[str] = set()
    stack: list[tuple[str, object]] = [("", doc)]
    while stack:
        key, value = stack.pop()
        if isinstance(value, dict):
            stack.extend((str(k), v) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((key, v) for v in value)
        elif isinstance(value, str) and len(value) >= 4 and _SECRET_KEYS.search(key):
            found.add(value)
    return sorted(found, key=len, reverse=True)


@contextlib.contextmanager
def _library_quiet() -> Iterator[None]:
    """The library logs (at error) the exception it then raises, exec stderr included: as a
    second line on stderr before logging is set up, and into our logs after."""
    loggers = [
        logging.getLogger(name)
        for name in (
            "kubernetes_asyncio",
            "kubernetes_asyncio.config.kube_config",
            "kubernetes_asyncio.config.exec_provider",
        )
    ]
    was = [logger.disabled for logger in loggers]
    for logger in loggers:
        logger.disabled = True
    try:
        yield
    finally:
        for logger, disabled in zip(loggers, was, strict=True):
            logger.disabled = disabled


def _require_readable(kubeconfig: str) -> None:
    # The library only logs a missing file and goes on; a directory or unreadable file raises.
    if not os.path.isfile(kubeconfig) or not os.access(kubeconfig, os.R_OK):
        raise SessionError(f"kubeconfig {kubeconfig}: no such readable file")


def check_credentials(kubeconfig: str | None) -> None:
    """Load the credentials `open_api` would use, without talking to the server.

    For `run` and `check-config` before anything starts; raises `SessionError` (one line).
    """
    with _library_quiet():  # its warnings would add lines
        configuration = Configuration()
        if kubeconfig is None:
            load_in_cluster(configuration)
        else:
            asyncio.run(_load_kubeconfig(configuration, kubeconfig))
        _refuse_cleartext_remote(configuration.host or "")


def _refuse_cleartext_remote(host: str) -> None:
    url = urlsplit(host)
    if url.scheme == "https":
        return
    if url.scheme == "http" and _is_loopback(url.hostname or ""):
        return
    raise SessionError(
        f"refusing API server {safe_url(host)}: only HTTPS, or plain HTTP on loopback"
    )


def _is_loopback(hostname: str) -> bool:
    if hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(hostname).is_loopback
    except ValueError:
        return False
