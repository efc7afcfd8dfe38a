"""The two ways users run kuberay-scaler, as e2e tests start it.

- **drop-in**: the RayCluster names our image in `autoscalerOptions.image` (our settings in
  `autoscalerOptions.env`); KubeRay renders its autoscaler container into the head pod, and the
  test runs exactly that container's command line (env resolved as the kubelet would, `$(VAR)`
  expanded), as the head pod's own service account (KubeRay's autoscaler Role: get/patch on
  rayclusters, no watch, no Events). The installed entry points stand in for the image (`ray` =
  `kuberay-scaler-ray`, first on PATH); the GCS address is the Ray bridge's head instead of the
  pod's 127.0.0.1:6379.
- **sidecar**: `kuberay-scaler run` as the user bound to deploy/sidecar's Role (limited to the
  RayCluster by `resourceNames`: get/list/watch/patch, Events), configured by env only.

Both run with the product's defaults: only the HTTP address and the log format are set.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tests.e2e.controlplane import SIDECAR_USER, free_port
from tests.e2e.kubelet import expand, resolve_env
from tests.e2e.procs import Daemon
from tests.e2e.world import CLUSTER, World, daemon_ready

Mode = Literal["drop-in", "sidecar"]
ALL_MODES: tuple[Mode, ...] = ("drop-in", "sidecar")


def _modes_from_env() -> tuple[Mode, ...]:
    """KUBERAY_SCALER_E2E_MODES narrows the modes the peer scenarios run in (CI: drop-in only,
    to keep a cold run inside its budget; `make e2e` runs both)."""
    asked = os.environ.get("KUBERAY_SCALER_E2E_MODES", "").replace(",", " ").split()
    unknown = sorted(set(asked) - set(ALL_MODES))
    if unknown:
        raise ValueError(f"KUBERAY_SCALER_E2E_MODES: unknown mode(s) {unknown}; use {ALL_MODES}")
    return tuple(m for m in ALL_MODES if m in asked) or ALL_MODES


MODES: tuple[Mode, ...] = _modes_from_env()
SHIM = Path(sys.executable).parent / "kuberay-scaler-ray"
IMAGE = "kuberay-scaler:0.1.0"


def live_head_pod(world: World) -> dict[str, Any] | None:
    """The head pod that is not being deleted (after a head restart there may be two)."""
    heads = [
        p
        for p in world.observer.pods.values()
        if (p["metadata"].get("labels") or {}).get("ray.io/node-type") == "head"
        and not p["metadata"].get("deletionTimestamp")
    ]
    return heads[0] if heads else None


def autoscaler_container(head: Mapping[str, Any]) -> dict[str, Any]:
    containers = {c["name"]: c for c in head["spec"]["containers"]}
    assert "autoscaler" in containers, f"KubeRay added no autoscaler container: {list(containers)}"
    return dict(containers["autoscaler"])


def lookup(world: World) -> Any:
    """(kind, name) -> object, for resolving secret/config-map env references."""

    async def get(kind: str, name: str) -> Mapping[str, Any]:
        reply = await world.admin.request(
            "GET", f"/api/v1/namespaces/{world.namespace}/{kind}/{name}"
        )
        if reply.status == 404:
            raise LookupError(f"{kind}/{name}")
        assert reply.ok, reply.body
        return dict(reply.body)

    return get


async def service_account_kubeconfig(world: World, head: Mapping[str, Any]) -> Path:
    """The head pod's own service account (KubeRay's, bound to KubeRay's autoscaler Role),
    with a token from the TokenRequest API: what the kubelet's projected token would carry."""
    account = head["spec"]["serviceAccountName"]
    assert account == CLUSTER, "KubeRay runs the head under the cluster's autoscaler account"
    path = f"/api/v1/namespaces/{world.namespace}/serviceaccounts/{account}/token"
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600},
    }
    await world.wait_for(
        lambda: _exists(world, path.rsplit("/", 1)[0]), 30, "the service account", async_ok=True
    )
    token = (await world.admin.ok("POST", path, request))["status"]["token"]
    kubeconfig = world.workdir / f"kubeconfig-service-account-{len(world.daemons)}"
    world.plane.write_kubeconfig(kubeconfig, token, namespace=world.namespace)
    return kubeconfig


async def _exists(world: World, path: str) -> bool:
    return (await world.admin.request("GET", path)).ok


def image_path(workdir: Path) -> Path:
    """A PATH entry like the image's /usr/local/bin: `ray` is our entry point."""
    folder = workdir / "image-bin"
    folder.mkdir(exist_ok=True)
    if not (folder / "ray").exists():
        (folder / "ray").symlink_to(SHIM)
    return folder


@dataclass
class Deploy:
    """One deploy mode: `dress` the manifest before it is created, `start` once Ray is up."""

    mode: Mode
    settings: dict[str, str] = field(default_factory=dict)  # beyond the defaults, if a test must
    http: str = field(default_factory=lambda: f"127.0.0.1:{free_port()}")

    def _env(self) -> dict[str, str]:
        return {
            "KUBERAY_SCALER_HTTP_ADDRESS": self.http,
            "KUBERAY_SCALER_LOG_FORMAT": "json",
            # Ray's autoscaler has no scale-down delay after a scale-up; the peer scenarios
            # compare with it at test-speed idle timeouts.
            "KUBERAY_SCALER_SCALE_DOWN_DELAY_AFTER_ADD_S": "0",
            # Nor a reservation grace (600 s): a test's reservation is served, then its job ends.
            "KUBERAY_SCALER_RESERVATION_GRACE_S": "0",
            **self.settings,
        }

    def dress(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Drop-in: our image and settings in autoscalerOptions (the whole switch)."""
        if self.mode == "drop-in":
            options = manifest["spec"].setdefault("autoscalerOptions", {})
            options["image"] = IMAGE
            options["env"] = [{"name": k, "value": v} for k, v in self._env().items()]
        return manifest

    async def start(self, world: World) -> Daemon:
        await world.ray_up()
        if self.mode == "drop-in":
            daemon = await self._start_rendered(world)
        else:
            daemon = self._start_sidecar(world)
        await world.wait_for(
            lambda: daemon_ready(daemon), 120, "the daemon's /readyz", async_ok=True
        )
        return daemon

    def _start_sidecar(self, world: World) -> Daemon:
        head = world.bridge.head
        assert head is not None
        identity = world.daemon_identity(SIDECAR_USER)
        env = {
            "RAY_CLUSTER_NAME": CLUSTER,
            "RAY_CLUSTER_NAMESPACE": world.namespace,
            "KUBERAY_SCALER_KUBECONFIG": str(identity.kubeconfig),
            "KUBERAY_SCALER_GCS_ADDRESS": head.gcs_address,
            **self._env(),
        }
        log_path = world.workdir / f"daemon-{len(world.daemons)}-sidecar.log"
        daemon = Daemon.start(env, log_path)
        world.daemons.append(daemon)
        world.timeline.add(f"daemon started as sidecar (pid {daemon.pid}, {log_path.name})")
        return daemon

    async def _start_rendered(self, world: World) -> Daemon:
        assert SHIM.is_file(), f"{SHIM} missing: run `make install` (the `ray` entry point)"
        head = live_head_pod(world)
        assert head is not None
        container = autoscaler_container(head)
        assert container["image"] == IMAGE
        env = await resolve_env(container, head, lookup(world))
        argv = [expand(part, env) for part in [*container["command"], *container["args"]]]
        kubeconfig = await service_account_kubeconfig(world, head)
        assert world.bridge.head is not None
        settings = env | {
            "PATH": f"{image_path(world.workdir)}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "KUBERAY_SCALER_KUBECONFIG": str(kubeconfig),
            "KUBERAY_SCALER_GCS_ADDRESS": world.bridge.head.gcs_address,
        }
        log_path = world.workdir / f"daemon-{len(world.daemons)}-drop-in.log"
        daemon = Daemon.start(settings, log_path, argv)
        world.daemons.append(daemon)
        world.timeline.add(f"daemon started from the rendered command {argv} (pid {daemon.pid})")
        return daemon
