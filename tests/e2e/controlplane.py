"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-scheduler, kwok and the
KubeRay operator, all built by `scripts/build-control-plane.sh` and started as child processes.

Everything here blocks (subprocesses, HTTP polling); it runs once per test session. Each process
gets its own session (process group) so `stop()` can signal exactly what we started, by PID.
Every component logs to its own file under the session's work dir; `tails()` collects the last
lines of each for failure reports.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kuberay_standins import ports

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "build-control-plane.sh"
LOOPBACK = "127.0.0.1"
START_DEADLINE_S = 90.0

# Users in tokens.csv. The restricted and sidecar users get RoleBindings per test namespace.
ADMIN_USER = "krs-admin"
RESTRICTED_USER = "krs-restricted"
SIDECAR_USER = "krs-sidecar"

# Fake Nodes kwok manages: TPU hosts (one v6e host per Node, as on GKE) and plain CPU Nodes.
TPU_NODE_COUNT = 12
CPU_NODE_COUNT = 2
TPU_NODE_LABELS = {
    "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
    "cloud.google.com/gke-tpu-topology": "4x4",
}
KWOK_ANNOTATION = {"kwok.x-k8s.io/node": "fake"}


class ControlPlaneError(RuntimeError):
    """A component did not start or answer in time; the message carries log tails."""


@dataclass
class Built:
    """What the build script's versions.env names."""

    bin_dir: Path
    crd_dir: Path
    kwok_stages: Path
    versions: dict[str, str]

    @classmethod
    def locate(cls) -> Built:
        """Run the build script (a no-op on a warm cache) and read its versions.env."""
        done = subprocess.run(
            [str(BUILD_SCRIPT)], capture_output=True, text=True, check=False, timeout=3600
        )
        if done.returncode != 0:
            raise ControlPlaneError(f"{BUILD_SCRIPT} failed:\n{done.stderr[-4000:]}")
        bin_dir = Path(done.stdout.strip().splitlines()[-1])
        versions = _read_env_file(bin_dir.parent / "versions.env")
        return cls(
            bin_dir=bin_dir,
            crd_dir=Path(versions["CRD_DIR"]),
            kwok_stages=Path(versions["KWOK_STAGES"]),
            versions=versions,
        )


def _read_env_file(path: Path) -> dict[str, str]:
    values = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip().strip('"')
    return values


def free_port() -> int:
    return ports.free_port(LOOPBACK)


@dataclass
class Component:
    """One child process and its log file."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @classmethod
    def spawn(cls, name: str, argv: Sequence[str], log_dir: Path) -> Component:
        log_path = log_dir / f"{name}.log"
        with log_path.open("ab") as out:
            process = subprocess.Popen(
                list(argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return cls(name, process, log_path)

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM our process group, then SIGKILL whatever is left."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)


@dataclass(frozen=True)
class Identity:
    """A bearer token and the kubeconfig file that carries it."""

    user: str
    token: str
    kubeconfig: Path


@dataclass
class ControlPlane:
    """The running control plane. Build it with `start`; `stop` ends every child by PID."""

    built: Built
    workdir: Path
    apiserver_url: str = ""
    etcd_url: str = ""
    ca_file: Path = Path()
    identities: dict[str, Identity] = field(default_factory=dict)
    components: dict[str, Component] = field(default_factory=dict)
    started_in_s: dict[str, float] = field(default_factory=dict)

    @property
    def admin(self) -> Identity:
        return self.identities[ADMIN_USER]

    @property
    def restricted(self) -> Identity:
        return self.identities[RESTRICTED_USER]

    @property
    def sidecar(self) -> Identity:
        return self.identities[SIDECAR_USER]

    def pids(self) -> dict[str, int]:
        return {name: c.pid for name, c in self.components.items() if c.alive()}

    def tails(self, lines: int = 30) -> dict[str, str]:
        return {name: c.tail(lines) for name, c in self.components.items()}

    def dead_components(self) -> list[str]:
        return [name for name, c in self.components.items() if not c.alive()]

    # --- lifecycle ---------------------------------------------------------------------------

    @classmethod
    def start(cls, built: Built, workdir: Path) -> ControlPlane:
        plane = cls(built=built, workdir=workdir)
        try:
            plane._start_all()
        except BaseException:
            plane.stop()
            raise
        (workdir / "startup-seconds.json").write_text(json.dumps(plane.started_in_s, indent=1))
        return plane

    def _start_all(self) -> None:
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        self._timed("etcd", self._start_etcd)
        self._timed("kube-apiserver", self._start_apiserver)
        self._timed("crds", self._install_crds)
        self._timed("nodes", self._create_nodes)
        self._timed("kube-scheduler", self._start_scheduler)
        self._timed("kwok", self._start_kwok)
        self._timed("ray-operator", self._start_operator)
        self._timed("scheduling", self._probe_scheduling)

    def _timed(self, what: str, step: Callable[[], None]) -> None:
        started = time.monotonic()
        step()
        self.started_in_s[what] = round(time.monotonic() - started, 2)

    def stop(self) -> None:
        # Clients first (they would log connection errors while the server goes), etcd last.
        for name in ("ray-operator", "kwok", "kube-scheduler", "kube-apiserver", "etcd"):
            component = self.components.get(name)
            if component is not None:
                component.stop()

    # --- components --------------------------------------------------------------------------

    def _bin(self, name: str) -> str:
        return str(self.built.bin_dir / name)

    def _spawn(self, name: str, argv: Sequence[str]) -> Component:
        component = Component.spawn(name, argv, self.workdir / "logs")
        self.components[name] = component
        return component

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        data = self.workdir / "etcd-data"
        etcd = self._spawn(
            "etcd",
            [
                self._bin("etcd"),
                f"--data-dir={data}",
                "--name=t",
                f"--listen-client-urls=http://{LOOPBACK}:{client}",
                f"--advertise-client-urls=http://{LOOPBACK}:{client}",
                f"--listen-peer-urls=http://{LOOPBACK}:{peer}",
                f"--initial-advertise-peer-urls=http://{LOOPBACK}:{peer}",
                f"--initial-cluster=t=http://{LOOPBACK}:{peer}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )
        self.etcd_url = f"http://{LOOPBACK}:{client}"
        _wait(
            lambda: _http_ok(f"{self.etcd_url}/health", expect=b'"health":"true"'),
            "etcd /health",
            [etcd],
        )

    def _start_apiserver(self) -> None:
        pki = self.workdir / "pki"
        pki.mkdir(exist_ok=True)
        sa_key = pki / "sa.key"
        subprocess.run(
            ["openssl", "genrsa", "-out", str(sa_key), "2048"], check=True, capture_output=True
        )
        port = free_port()
        self.apiserver_url = f"https://{LOOPBACK}:{port}"
        self.ca_file = pki / "apiserver.crt"
        tokens = self._write_tokens()
        apiserver = self._spawn(
            "kube-apiserver",
            [
                self._bin("kube-apiserver"),
                f"--etcd-servers={self.etcd_url}",
                f"--bind-address={LOOPBACK}",
                f"--secure-port={port}",
                f"--advertise-address={LOOPBACK}",
                "--endpoint-reconciler-type=none",
                f"--cert-dir={pki}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={sa_key}",
                f"--service-account-signing-key-file={sa_key}",
                f"--token-auth-file={tokens}",
                "--authorization-mode=RBAC",
                # TaintNodesByCondition would add node.kubernetes.io/not-ready to new Nodes; only
                # kube-controller-manager (not run here) lifts it again.
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
                "--allow-privileged=true",
                "--enable-priority-and-fairness=false",
                "--v=1",
            ],
        )
        _wait(lambda: self.ca_file.exists(), "kube-apiserver serving certificate", [apiserver])
        _wait(
            lambda: _http_ok(
                f"{self.apiserver_url}/readyz", token=self.admin.token, ca=self.ca_file
            ),
            "kube-apiserver /readyz",
            [apiserver],
        )

    def _write_tokens(self) -> Path:
        users = {
            ADMIN_USER: "system:masters",
            RESTRICTED_USER: "krs-e2e",
            SIDECAR_USER: "krs-e2e",
        }
        lines = []
        for index, (user, group) in enumerate(users.items()):
            token = secrets.token_hex(16)
            lines.append(f'{token},{user},uid-{index},"{group}"')
            self.identities[user] = Identity(user, token, self.workdir / f"kubeconfig-{user}")
        path = self.workdir / "tokens.csv"
        path.write_text("\n".join(lines) + "\n")
        path.chmod(0o600)
        for identity in self.identities.values():
            self.write_kubeconfig(identity.kubeconfig, identity.token)
        return path

    def write_kubeconfig(self, path: Path, token: str, namespace: str = "default") -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "e2e",
                    "cluster": {
                        "server": self.apiserver_url,
                        "certificate-authority": str(self.ca_file),
                    },
                }
            ],
            "users": [{"name": "e2e-user", "user": {"token": token}}],
            "contexts": [
                {
                    "name": "e2e",
                    "context": {"cluster": "e2e", "user": "e2e-user", "namespace": namespace},
                }
            ],
            "current-context": "e2e",
        }
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)

    def _install_crds(self) -> None:
        names = []
        for crd_file in sorted(self.built.crd_dir.glob("ray.io_*.yaml")):
            for doc in yaml.safe_load_all(crd_file.read_text()):
                if doc:
                    self.request(
                        "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", doc
                    )
                    names.append(doc["metadata"]["name"])
        for name in names:
            _wait(
                functools.partial(self._crd_established, name),
                f"CRD {name} Established",
                [self.components["kube-apiserver"]],
            )

    def _crd_established(self, name: str) -> bool:
        crd = self.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        return _condition_true(crd, "Established")

    def _create_nodes(self) -> None:
        for index in range(TPU_NODE_COUNT):
            self.request("POST", "/api/v1/nodes", _node(f"kwok-tpu-{index}", tpu=True))
        for index in range(CPU_NODE_COUNT):
            self.request("POST", "/api/v1/nodes", _node(f"kwok-cpu-{index}", tpu=False))

    def _start_scheduler(self) -> None:
        self._spawn(
            "kube-scheduler",
            [
                self._bin("kube-scheduler"),
                f"--kubeconfig={self.admin.kubeconfig}",
                f"--authentication-kubeconfig={self.admin.kubeconfig}",
                f"--authorization-kubeconfig={self.admin.kubeconfig}",
                # No kube-system/extension-apiserver-authentication here (no client CA): skip
                # looking it up instead of logging a failed lookup every few seconds.
                "--authentication-skip-lookup=true",
                "--leader-elect=false",
                f"--bind-address={LOOPBACK}",
                f"--secure-port={free_port()}",
                "--v=1",
            ],
        )

    def _start_kwok(self) -> None:
        self._spawn(
            "kwok",
            [
                self._bin("kwok"),
                f"--kubeconfig={self.admin.kubeconfig}",
                f"--config={self.built.kwok_stages}",
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                f"--node-ip={LOOPBACK}",
                "--cidr=10.0.0.0/16",
            ],
        )

    def _start_operator(self) -> None:
        operator = self._spawn(
            "ray-operator",
            [
                self._bin("ray-operator"),
                f"--kubeconfig={self.admin.kubeconfig}",
                "--enable-leader-election=false",
                "--metrics-addr=0",
                "--health-probe-bind-address=0",
                "--log-stdout-encoder=json",
            ],
        )
        _wait(
            lambda: any(
                "controllers.RayCluster" in line and "Starting workers" in line
                for line in operator.log_text().splitlines()
            ),
            "ray-operator RayCluster workers",
            [operator],
        )

    def _probe_scheduling(self) -> None:
        """A pod must get bound by the scheduler and marked Running by kwok."""
        namespace = "e2e-probe"
        self.request("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
        pod = {
            "metadata": {"name": "probe"},
            "spec": {"containers": [{"name": "c", "image": "probe"}]},
        }
        self.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod)
        path = f"/api/v1/namespaces/{namespace}/pods/probe"
        _wait(
            lambda: (self.request("GET", path).get("status") or {}).get("phase") == "Running",
            "a probe pod to be scheduled and Running",
            [self.components[n] for n in ("kube-scheduler", "kwok")],
        )
        self.request("DELETE", path)

    # --- admin HTTP (blocking; for setup and teardown) --------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        token: str | None = None,
        ok_statuses: Sequence[int] = (),
    ) -> dict[str, Any]:
        """One JSON request as admin (or `token`); raises ControlPlaneError on non-2xx."""
        status, answer = http_json(
            method,
            self.apiserver_url + path,
            body,
            token=token or self.admin.token,
            ca=self.ca_file,
            content_type=content_type,
        )
        if not 200 <= status < 300 and status not in ok_statuses:
            raise ControlPlaneError(f"{method} {path}: {status} {json.dumps(answer)[:2000]}")
        return answer


def tpu_node(name: str, accelerator: str, topology: str) -> dict[str, Any]:
    """A kwok Node hosting one TPU host of `accelerator` (GKE's label value, e.g.
    `tpu-v5-lite-podslice`) in a slice of `topology`: what a test adds for a type the shared
    plane lacks (and deletes at its end: Nodes outlive namespaces)."""
    node = _node(name, tpu=True)
    node["metadata"]["labels"] |= {
        "cloud.google.com/gke-tpu-accelerator": accelerator,
        "cloud.google.com/gke-tpu-topology": topology,
    }
    return node


def _node(name: str, *, tpu: bool) -> dict[str, Any]:
    capacity = {"cpu": "64", "memory": "256Gi", "pods": "110"}
    labels = {"kubernetes.io/hostname": name, "type": "kwok"}
    if tpu:
        capacity["google.com/tpu"] = "4"
        labels |= TPU_NODE_LABELS
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": dict(KWOK_ANNOTATION)},
        "status": {"capacity": capacity, "allocatable": capacity},
    }


def _condition_true(obj: Mapping[str, Any], kind: str) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)


def ssl_context(ca: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca))


def http_json(
    method: str,
    url: str,
    body: Any = None,
    *,
    token: str,
    ca: Path,
    content_type: str = "application/json",
    timeout_s: float = 30.0,
) -> tuple[int, dict[str, Any]]:
    """Blocking JSON request with a bearer token; returns (status, decoded body)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Authorization", f"Bearer {token}")
    request.add_header("Accept", "application/json")
    if data is not None:
        request.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=ssl_context(ca)) as reply:
            return reply.status, _decode(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, _decode(error.read())


def _decode(raw: bytes) -> dict[str, Any]:
    try:
        decoded = json.loads(raw) if raw else {}
    except ValueError:
        return {"raw": raw[:500].decode(errors="replace")}
    return decoded if isinstance(decoded, dict) else {"items": decoded}


def _http_ok(
    url: str, *, expect: bytes = b"", token: str | None = None, ca: Path | None = None
) -> bool:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    context = ssl_context(ca) if ca else None
    try:
        with urllib.request.urlopen(request, timeout=2.0, context=context) as reply:
            return reply.status == 200 and expect in reply.read()
    except (OSError, ValueError):
        return False


def _wait(
    check: Callable[[], bool],
    what: str,
    watched: Sequence[Component],
    deadline_s: float = START_DEADLINE_S,
) -> None:
    """Poll `check` until true; fail fast (with log tails) when a watched process exits."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        with contextlib.suppress(ControlPlaneError, OSError):
            if check():
                return
        dead = [c for c in watched if not c.alive()]
        if dead:
            raise ControlPlaneError(_failure(f"{dead[0].name} exited waiting for {what}", dead))
        time.sleep(0.2)
    raise ControlPlaneError(_failure(f"no {what} after {deadline_s:.0f} s", watched))


def _failure(message: str, components: Sequence[Component]) -> str:
    tails = "\n".join(f"--- {c.name} (last lines) ---\n{c.tail()}" for c in components)
    return f"{message}\n{tails}"
