"""Real Ray processes on loopback for tests, the demo and fixture capture.

Every head and host is one `ray start --block` child in its own session, so stopping it signals
the whole process group (raylet, gcs_server, agents, workers) and nothing outlives `stop()`.
Each node needs its own loopback address 127.0.0.N: Ray silently swaps 127.0.0.1 for the
machine's outside address, but keeps other loopback addresses.

Everything here blocks (subprocesses, polling a log file); from async code wrap calls in
`asyncio.to_thread(RayHead.start, ...)`. `start_hosts` overlaps the startup of several hosts.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import structlog

from kuberay_standins.ports import free_port as free_port

log = structlog.get_logger(__name__)

# KUBERAY_STANDINS_RAY_VENV: run Ray (nodes, drivers, `ray status`) from another virtualenv, so
# the Ray-version matrix (make ray-matrix) tests our client against older Ray heads.
RAY_VENV = os.environ.get("KUBERAY_STANDINS_RAY_VENV", "")
_BIN_DIR = Path(RAY_VENV) / "bin" if RAY_VENV else Path(sys.executable).parent
RAY_CLI = str(_BIN_DIR / "ray")
RAY_PYTHON = str(_BIN_DIR / "python") if RAY_VENV else sys.executable
_STARTED_MARKER = "Ray runtime started."
_MIN_OBJECT_STORE_BYTES = 78_643_200  # Ray's floor; keeps /dev/shm use small per node.
DEFAULT_STARTUP_TIMEOUT_S = 120.0
# Ray gives a starting node 30 s to register with the GCS (ray/_private/node.py, not
# configurable): hosts started all at once on a loaded 2-core machine miss it together. Whoever
# starts hosts for pods (the stand-in kubelet, the e2e bridge) starts at most this many at once.
MAX_CONCURRENT_STARTS = 2
DEFAULT_STOP_GRACE_S = 5.0
# A head's gcs_server and raylet sit out SIGTERM for many seconds; nothing needs telling.
HEAD_STOP_GRACE_S = 0.5

# Set on every Ray process we start: no usage reports dialing out, the v2 autoscaler path on.
# (Cloud metadata probes are avoided by `_refuse_tpu_without_env`, not by a variable.)
_QUIET_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DISABLE_DOCKER_CPU_WARNING": "1",
    "RAY_enable_autoscaler_v2": "1",
}


@functools.cache
def ray_version() -> tuple[int, ...]:
    """The version of the Ray that nodes and drivers run (RAY_VENV's, else this process's)."""
    done = subprocess.run(
        [RAY_PYTHON, "-c", "import ray; print(ray.__version__)"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return tuple(int(part) for part in done.stdout.strip().split(".")[:3] if part.isdigit())


class RayStartError(RuntimeError):
    """`ray start` exited or never reported readiness; the message carries its log tail."""


def loopback_ip(n: int) -> str:
    """127.0.0.N; N=1 is refused because Ray rewrites 127.0.0.1 to the outside address."""
    if not 2 <= n <= 254:
        raise ValueError(f"loopback host number must be in 2..254, got {n}")
    return f"127.0.0.{n}"


def tpu_host_env(
    slice_name: str, worker_id: int, accelerator_type: str = "v6e-16", topology: str = "4x4"
) -> dict[str, str]:
    """The variables the GKE TPU webhook injects into each host of a slice (contract §5)."""
    return {
        "TPU_NAME": slice_name,
        "TPU_WORKER_ID": str(worker_id),
        "TPU_ACCELERATOR_TYPE": accelerator_type,
        "TPU_TOPOLOGY": topology,
    }


def tpu_chips_per_host(accelerator_type: str = "v6e-16", topology: str = "4x4") -> int:
    """Chips on one host: 8 only for single-host v5e/v6e shapes, else 4 (Ray's own rule)."""
    version = accelerator_type.split("-")[0].lower()
    chips = 1
    for dim in topology.lower().split("x"):
        chips *= int(dim)
    if version in ("v5litepod", "v6e") and topology.lower() in ("1x1", "2x2", "2x4"):
        return chips
    return min(chips, 4)


@dataclass
class _RayProcess:
    """One `ray start --block` process group and its scratch directory."""

    ip: str
    temp_dir: Path
    process: subprocess.Popen[bytes]
    log_path: Path
    env: dict[str, str]
    node_id: bytes = b""
    _stopped: bool = field(default=False, repr=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def node_id_hex(self) -> str:
        return self.node_id.hex()

    def group_pids(self) -> list[int]:
        """Live members of our process group (zombies excluded)."""
        return [pid for pid, _ in _group_members(self.process.pid)]

    def pid_of(self, executable_name: str) -> int | None:
        """PID of the first group member whose command name is `executable_name`."""
        for pid, comm in _group_members(self.process.pid):
            if comm == executable_name:
                return pid
        return None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def alive(self) -> bool:
        return not self._stopped and self.process.poll() is None

    @property
    def stopped(self) -> bool:
        return self._stopped

    def kill(self) -> None:
        """SIGKILL the node's process group, as a crash would (only while the group is ours)."""
        if not _signal_own_group(self.process, signal.SIGKILL):
            _kill_strays(self.temp_dir)

    def stop(self, grace_s: float = DEFAULT_STOP_GRACE_S) -> None:
        """SIGTERM the group (raylets then tell the GCS they leave), SIGKILL what remains."""
        if self._stopped:
            return
        self._stopped = True
        _signal_own_group(self.process, signal.SIGTERM)
        _wait_group_gone(self.process, grace_s)
        if _signal_own_group(self.process, signal.SIGKILL):
            _wait_group_gone(self.process, 10.0)
        _kill_strays(self.temp_dir)  # by HOME: workers, and what outlived a reaped leader
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        log.debug("ray_process_stopped", ip=self.ip, pid=self.process.pid)

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RayStartError(f"ray start on {self.ip} exited:\n{self.log_tail()}")
            if _STARTED_MARKER in self.log_path.read_text(errors="replace"):
                self.node_id = self._raylet_node_id()
                if self.node_id:
                    return
            time.sleep(0.1)
        raise RayStartError(f"ray start on {self.ip} not ready in {timeout_s}s:\n{self.log_tail()}")

    def _raylet_node_id(self) -> bytes:
        # The raylet's own command line carries the id the GCS will know this node by.
        pid = self.pid_of("raylet")
        if pid is None:
            return b""
        with contextlib.suppress(OSError):
            for arg in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                if arg.startswith(b"--node_id="):
                    return bytes.fromhex(arg.split(b"=", 1)[1].decode())
        return b""


@dataclass
class RayHead(_RayProcess):
    """A head node: GCS, head raylet (num_cpus 0 by default, so demand stays pending)."""

    port: int = 0
    auth_token: str | None = None
    start_args: tuple[str, ...] = ()

    @property
    def gcs_address(self) -> str:
        return f"{self.ip}:{self.port}"

    @classmethod
    def start(
        cls,
        *,
        ip: str = "127.0.0.10",
        port: int | None = None,
        num_cpus: int = 0,
        env: Mapping[str, str] | None = None,
        auth_token: str | None = None,
        resources: Mapping[str, float] | None = None,
        labels: Mapping[str, str] | None = None,
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
        extra_args: Sequence[str] = (),
    ) -> RayHead:
        """Start `ray start --head --block` and return once its raylet runs. `extra_args` come
        last, so they override ours (`ray start` keeps the last value of a repeated option)."""
        gcs_port = port or free_port()
        args = (
            "--head",
            f"--port={gcs_port}",
            f"--ray-client-server-port={free_port()}",
            "--include-dashboard=false",
            f"--dashboard-host={ip}",
            f"--dashboard-port={free_port()}",
            # KubeRay runs the head with --no-monitor when an external autoscaler is used;
            # Ray's own v2 monitor would otherwise report over us.
            "--no-monitor",
            *_node_args(ip, num_cpus, resources, labels),
            *extra_args,
        )
        full_env = _node_env(env, auth_token)

        def spawn() -> RayHead:
            proc = _spawn(ip, args, full_env)
            return cls(
                ip=ip,
                temp_dir=proc[0],
                process=proc[1],
                log_path=proc[2],
                env=full_env,
                port=gcs_port,
                auth_token=auth_token,
                start_args=args,
            )

        head = _start_with_retries(spawn, startup_timeout_s, (ip, gcs_port))
        log.info("ray_head_started", gcs_address=head.gcs_address, node_id=head.node_id_hex)
        return head

    def gcs_server_pid(self) -> int | None:
        return self.pid_of("gcs_server")

    def kill_gcs(self) -> None:
        """SIGKILL the GCS alone, as a crash would; `ray start --block` then tears the head down."""
        pid = self.gcs_server_pid()
        if pid is None:
            raise RuntimeError(f"no gcs_server in head {self.gcs_address}")
        os.kill(pid, signal.SIGKILL)

    def restart(self, startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S) -> RayHead:
        """Stop this head and start a new one on the same address (a new cluster id)."""
        self.stop()
        _wait_port_free(self.ip, self.port, 30.0)
        full_env = dict(self.env)

        def spawn() -> RayHead:
            proc = _spawn(self.ip, self.start_args, full_env)
            return RayHead(
                ip=self.ip,
                temp_dir=proc[0],
                process=proc[1],
                log_path=proc[2],
                env=full_env,
                port=self.port,
                auth_token=self.auth_token,
                start_args=self.start_args,
            )

        head = _start_with_retries(spawn, startup_timeout_s, (self.ip, self.port))
        log.info("ray_head_restarted", gcs_address=head.gcs_address, node_id=head.node_id_hex)
        return head

    def stop(self, grace_s: float = HEAD_STOP_GRACE_S) -> None:
        super().stop(grace_s)

    def client_env(self) -> dict[str, str]:
        """Environment for a driver or the `ray` CLI talking to this head."""
        return _client_env(self.auth_token)


@dataclass
class RayHost(_RayProcess):
    """A worker node joined to a head: the stand-in for one pod of a worker group."""

    gcs_address: str = ""
    instance_id: str = ""
    node_type: str = ""

    @classmethod
    def spawn(
        cls,
        gcs_address: str,
        *,
        ip: str,
        resources: Mapping[str, float] | None = None,
        num_cpus: int = 1,
        labels: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        auth_token: str | None = None,
        memory: int | None = None,
        num_gpus: int = 0,
    ) -> RayHost:
        """Launch `ray start --address ... --block` without waiting (see `wait_ready`).
        `memory` is Ray's logical memory resource in bytes (`--memory`), as KubeRay sets it;
        `num_gpus` fakes GPUs (Ray takes `--num-gpus` as given, no device needed)."""
        _refuse_tpu_without_env(resources, env)
        full_env = _node_env(env, auth_token)
        args = (f"--address={gcs_address}", *_node_args(ip, num_cpus, resources, labels))
        if memory is not None:
            args = (*args, f"--memory={memory}")
        if num_gpus:
            args = (*args, f"--num-gpus={num_gpus}")  # the last --num-gpus wins
        temp_dir, process, log_path = _spawn(ip, args, full_env)
        return cls(
            ip=ip,
            temp_dir=temp_dir,
            process=process,
            log_path=log_path,
            env=full_env,
            gcs_address=gcs_address,
            instance_id=full_env.get("RAY_CLOUD_INSTANCE_ID", ""),
            node_type=full_env.get("RAY_NODE_TYPE_NAME", ""),
        )

    def wait_ready(self, timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S) -> RayHost:
        _ready_or_stop(self, timeout_s)
        log.info("ray_host_started", ip=self.ip, instance_id=self.instance_id)
        return self

    @classmethod
    def start(
        cls,
        gcs_address: str,
        *,
        ip: str,
        resources: Mapping[str, float] | None = None,
        num_cpus: int = 1,
        labels: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        auth_token: str | None = None,
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
    ) -> RayHost:
        host = _start_with_retries(
            lambda: cls.spawn(
                gcs_address,
                ip=ip,
                resources=resources,
                num_cpus=num_cpus,
                labels=labels,
                env=env,
                auth_token=auth_token,
            ),
            startup_timeout_s,
        )
        log.info("ray_host_started", ip=host.ip, instance_id=host.instance_id)
        return host


@dataclass(frozen=True)
class HostSpec:
    """What one host should look like; `start_hosts` launches several at once."""

    ip: str
    resources: Mapping[str, float] = field(default_factory=dict)
    num_cpus: int = 1
    labels: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)


def start_hosts(
    gcs_address: str,
    specs: Sequence[HostSpec],
    *,
    auth_token: str | None = None,
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
) -> list[RayHost]:
    """Spawn every host first, then wait for all: startup overlaps instead of adding up.
    (One at a time with another Ray venv: older `ray start` gives its raylet a fixed 30 s to
    register, too little for several starting together on two busy cores.)"""
    hosts: list[RayHost] = []

    def spawn(spec: HostSpec) -> RayHost:
        return RayHost.spawn(
            gcs_address,
            ip=spec.ip,
            resources=spec.resources,
            num_cpus=spec.num_cpus,
            labels=spec.labels,
            env=spec.env,
            auth_token=auth_token,
        )

    try:
        for spec in specs:
            hosts.append(spawn(spec))
            if RAY_VENV:
                hosts[-1].wait_ready(startup_timeout_s)
        for index, (spec, host) in enumerate(zip(specs, hosts, strict=True)):
            try:
                host.wait_ready(startup_timeout_s)
            except RayStartError as error:  # a missed registration window: that host again
                if _REGISTRATION_MISSED not in str(error):
                    raise
                again = functools.partial(spawn, spec)
                hosts[index] = _start_with_retries(again, startup_timeout_s)
    except BaseException:
        stop_all(hosts)
        raise
    return hosts


def tpu_slice_specs(
    slice_name: str,
    ips: Sequence[str],
    *,
    group: str = "tpu-group",
    accelerator_type: str = "v6e-16",
    topology: str = "4x4",
    num_cpus: int = 1,
    instance_ids: Sequence[str] | None = None,
) -> list[HostSpec]:
    """One HostSpec per host of a TPU slice, worker ids 0..len(ips)-1.

    `TPU` chips are passed as an explicit resource: without /dev/accel* devices Ray counts zero
    chips and then ignores the TPU env entirely. With the chips given, Ray itself derives the
    head resource, `<TPU_NAME>`, `accelerator_type:TPU-V6E` and the `ray.io/tpu-*` labels.
    """
    chips = tpu_chips_per_host(accelerator_type, topology)
    names = list(instance_ids) if instance_ids else [f"{slice_name}-{i}" for i in range(len(ips))]
    return [
        HostSpec(
            ip=ip,
            resources={"TPU": chips},
            num_cpus=num_cpus,
            env={
                **tpu_host_env(slice_name, worker_id, accelerator_type, topology),
                "RAY_CLOUD_INSTANCE_ID": names[worker_id],
                "RAY_NODE_TYPE_NAME": group,
            },
        )
        for worker_id, ip in enumerate(ips)
    ]


def stop_all(processes: Iterable[_RayProcess], grace_s: float = DEFAULT_STOP_GRACE_S) -> None:
    """Stop hosts (signals first, so grace periods overlap), then heads."""
    procs = [p for p in processes if not p.stopped]
    hosts = [p for p in procs if not isinstance(p, RayHead)]
    for host in hosts:
        _signal_own_group(host.process, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for host in hosts:
        _wait_group_gone(host.process, max(0.0, deadline - time.monotonic()))
    for proc in hosts:
        proc.stop(grace_s=0.0)
    for head in procs:
        if isinstance(head, RayHead):
            head.stop()


@dataclass
class RayDriver:
    """A Ray driver in its own process: creates demand, prints a marker, then holds it.

    Running drivers out of process keeps `ray.init` state out of the test process, and killing
    the driver releases everything it owned (tasks, actors, placement groups).
    """

    process: subprocess.Popen[bytes]
    log_path: Path
    _stopped: bool = field(default=False, repr=False)

    READY = "KRS_DRIVER_READY"

    @classmethod
    def start(
        cls,
        gcs_address: str,
        body: str,
        *,
        node_ip: str,
        env: Mapping[str, str] | None = None,
        wait_ready: bool = True,
        timeout_s: float = 120.0,
        hold: bool = True,
    ) -> RayDriver:
        """Run `body` after `ray.init(address=gcs_address)`; `print(READY)` ends it or holds it.

        `body` may use `ray` and is followed by the ready marker; with `hold` the driver then
        sleeps until stopped so its demand stays in the GCS.
        """
        script = _driver_script(gcs_address, node_ip, body, hold)
        scratch = scratch_dir("krs-driver-")
        log_name = scratch / "driver.log"
        with log_name.open("wb") as out:
            process = subprocess.Popen(
                [RAY_PYTHON, "-c", script],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={
                    **_clean_parent_env(),
                    **_client_env(None),
                    **(env or {}),
                    **own_home(scratch),
                },
                start_new_session=True,
            )
        driver = cls(process=process, log_path=log_name)
        if wait_ready:
            driver.wait_for(cls.READY, timeout_s)
        return driver

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_for(self, marker: str, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if marker in self.output():
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        tail = self.output()[-4000:]
        self.stop()
        raise RayStartError(f"driver never printed {marker!r}:\n{tail}")

    def exit_code(self, timeout_s: float = 120.0) -> int:
        return self.process.wait(timeout=timeout_s)

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if _signal_own_group(self.process, signal.SIGKILL):
            _wait_group_gone(self.process, 10.0)
        _kill_strays(self.log_path.parent)  # by HOME: what outlived a driver that had exited
        shutil.rmtree(self.log_path.parent, ignore_errors=True)


def _driver_script(gcs_address: str, node_ip: str, body: str, hold: bool) -> str:
    lines = [
        "import sys, time",
        "import ray",
        f"ray.init(address={gcs_address!r}, _node_ip_address={node_ip!r},"
        " log_to_driver=False, logging_level='warning')",
        body,
        f"print({RayDriver.READY!r}, flush=True)",
    ]
    if hold:
        lines.append("while True:\n    time.sleep(3600)")
    return "\n".join(lines)


def _auth_env(auth_token: str | None) -> dict[str, str]:
    # Always explicit: with RAY_AUTH_MODE unset, Ray turns token auth on by itself when it finds
    # ~/.ray/auth_token (what `ray get-auth-token --generate` writes), so a file in the user's
    # home would change who can join the test cluster.
    if auth_token:
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": auth_token}
    return {"RAY_AUTH_MODE": "disabled"}


def _client_env(auth_token: str | None) -> dict[str, str]:
    env = dict(_QUIET_ENV)
    env.pop("RAY_enable_autoscaler_v2")  # clients must find v2 through the head's KV flag
    return env | _auth_env(auth_token)


def _clean_parent_env() -> dict[str, str]:
    # The parent's RAY_* settings (e.g. a developer's RAY_ADDRESS) must not leak into Ray.
    return {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "TPU_"))}


def _node_env(env: Mapping[str, str] | None, auth_token: str | None) -> dict[str, str]:
    return {**_clean_parent_env(), **_QUIET_ENV, **(env or {}), **_auth_env(auth_token)}


# Set by a test session (tests/reaper.py); a scratch dir records it so leftovers can be found.
SESSION_ENV = "KRS_TEST_SESSION"
SESSION_FILE = ".krs-session"


def scratch_dir(prefix: str, parent: str | None = None) -> Path:
    """A fresh temp dir, tagged with the test session (if any) that made it."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    session = os.environ.get(SESSION_ENV)
    if session:
        (path / SESSION_FILE).write_text(session)
    return path


def own_home(scratch: Path) -> dict[str, str]:
    """HOME (and the XDG dirs) inside a process's own scratch directory: nothing in the user's
    home (~/.ray/auth_token, ~/.config, ~/.cache) reaches a Ray process we start."""
    home = scratch / "home"
    home.mkdir(parents=True, exist_ok=True)
    return {
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
    }


def _node_args(
    ip: str,
    num_cpus: int,
    resources: Mapping[str, float] | None,
    labels: Mapping[str, str] | None,
) -> tuple[str, ...]:
    args = [
        f"--node-ip-address={ip}",
        f"--num-cpus={num_cpus}",
        "--num-gpus=0",
        f"--object-store-memory={_MIN_OBJECT_STORE_BYTES}",
        f"--dashboard-agent-listen-port={free_port()}",
        "--min-worker-port=0",
        "--max-worker-port=0",
        "--disable-usage-stats",
        "--block",
    ]
    if resources:
        args.append(f"--resources={json.dumps(dict(resources))}")
    if labels:
        args.append("--labels=" + ",".join(f"{k}={v}" for k, v in labels.items()))
    return tuple(args)


def _refuse_tpu_without_env(
    resources: Mapping[str, float] | None, env: Mapping[str, str] | None
) -> None:
    # Without TPU_ACCELERATOR_TYPE/TPU_NAME/TPU_WORKER_ID Ray asks the GCE metadata server
    # (169.254.169.254) instead; tests must never dial out.
    if resources and resources.get("TPU"):
        missing = [
            k
            for k in ("TPU_NAME", "TPU_WORKER_ID", "TPU_ACCELERATOR_TYPE", "TPU_TOPOLOGY")
            if not (env or {}).get(k)
        ]
        if missing:
            raise ValueError(f"a TPU host needs {missing} in env (see tpu_host_env)")


def _spawn(
    ip: str, args: Sequence[str], env: Mapping[str, str]
) -> tuple[Path, subprocess.Popen[bytes], Path]:
    # Short temp path: Ray's unix sockets live under it and paths are limited to 107 bytes.
    temp_dir = scratch_dir("krs-", "/tmp")
    log_path = temp_dir / "ray-start.log"
    with log_path.open("wb") as out:
        process = subprocess.Popen(
            [RAY_CLI, "start", *args, f"--temp-dir={temp_dir}"],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**env, **own_home(temp_dir)},
            start_new_session=True,
        )
    log.debug("ray_start_spawned", ip=ip, pid=process.pid, temp_dir=str(temp_dir))
    return temp_dir, process, log_path


# Ray gives a starting node a fixed 30 s to register with the GCS (ray/_private/node.py); a
# loaded machine can miss it. That failure, and only that one, is worth starting again.
_REGISTRATION_MISSED = "The current node timed out during startup"
_Node = TypeVar("_Node", bound="_RayProcess")
START_ATTEMPTS = 3


def _start_with_retries(
    spawn: Callable[[], _Node], timeout_s: float, port: tuple[str, int] | None = None
) -> _Node:
    """Spawn and wait; again (a fresh process, `port` free first) if Ray's window was missed."""
    for attempt in range(1, START_ATTEMPTS + 1):
        node = spawn()
        try:
            _ready_or_stop(node, timeout_s)
            return node
        except RayStartError as error:
            if attempt == START_ATTEMPTS or _REGISTRATION_MISSED not in str(error):
                raise
            log.warning("ray_start_retried", ip=node.ip, attempt=attempt, why=_REGISTRATION_MISSED)
            if port is not None:
                _wait_port_free(*port, 30.0)
    raise AssertionError("unreachable")


def _ready_or_stop(node: _RayProcess, timeout_s: float) -> None:
    try:
        node._wait_ready(timeout_s)
    except BaseException:
        node.stop(grace_s=0.0)
        raise


def _group_members(pgid: int) -> list[tuple[int, str]]:
    """(pid, command name) of live processes in process group `pgid`, read from /proc."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        # comm may contain spaces and parentheses: split at the last ')'.
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        state, process_group = fields[0], int(fields[2])
        if process_group == pgid and state != "Z":
            members.append((int(entry.name), comm))
    return members


def strays_of(scratch: Path) -> list[int]:
    """Live processes outside any group we signal that still carry `scratch`'s HOME.

    Ray starts each worker in a process group of its own, so signalling a node's group misses
    its workers. They inherit the raylet's environment, HOME (`own_home`) included: a worker
    that outlived its raylet (one still starting when the raylet went stayed for minutes,
    found as e2e leftovers) is found by it.
    """
    marker = f"HOME={scratch / 'home'}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = Path(entry.path, "environ").read_bytes()
            state = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and marker in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def _kill_strays(scratch: Path, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while strays := strays_of(scratch):
        for pid in strays:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() >= deadline:
            log.warning("ray_strays_left", pids=strays, scratch=str(scratch))
            return
        time.sleep(0.05)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _signal_own_group(leader: subprocess.Popen[bytes], sig: signal.Signals) -> bool:
    """Signal the process group `leader` started, only while its id is still ours.

    Until the leader is reaped (`returncode` None: running, or a zombie) no other process can
    have its pid. Once reaped (a `poll()` that saw it exit), pids wrap (pid_max is 32768 on the
    test machines, passed in minutes with several Ray suites running) and the number may lead
    someone else's fresh group (a Ray head another run just started, say). Whatever of ours
    outlived a reaped leader is found by its HOME instead (`_kill_strays`).
    """
    if leader.returncode is not None:
        return False
    _signal_group(leader.pid, sig)
    return True


def _wait_group_gone(leader: subprocess.Popen[bytes], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        leader.poll()  # reap the leader so it does not linger as a zombie
        if not _group_members(leader.pid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def _wait_port_free(ip: str, port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((ip, port))
                return
            except OSError:
                pass
        time.sleep(0.1)
    raise RayStartError(f"port {ip}:{port} still busy after {timeout_s}s")
