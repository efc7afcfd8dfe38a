"""Composition root: build the adapters from settings and run them in one TaskGroup."""

from __future__ import annotations

import asyncio
import gc
import signal
import time
from typing import Any

import structlog

from kuberay_scaler.adapters.kube.access import detect_access
from kuberay_scaler.adapters.kube.capacity import CapacityEventsReader
from kuberay_scaler.adapters.kube.events import EventRecorder
from kuberay_scaler.adapters.kube.informer import Informer, Source
from kuberay_scaler.adapters.kube.nodes import NodeMaintenanceReader
from kuberay_scaler.adapters.kube.raycluster import RayClusterView
from kuberay_scaler.adapters.kube.session import SessionError, open_api
from kuberay_scaler.adapters.kube.writer import RayClusterWriter
from kuberay_scaler.adapters.ray_gcs.adapter import RayGcs
from kuberay_scaler.adapters.ray_gcs.client import GcsClient, TlsFiles
from kuberay_scaler.adapters.ray_gcs.poller import GcsPoller, monotonic_ms
from kuberay_scaler.adapters.web.server import Probes, connection_cap, make_app, start_server
from kuberay_scaler.core.model.ray import RayObservation
from kuberay_scaler.core.parse.events import worker_group_names
from kuberay_scaler.core.parse.pods import slim_pod
from kuberay_scaler.loop.config import LoopConfig
from kuberay_scaler.loop.handsoff import OverrideBackoff
from kuberay_scaler.loop.health import Access, GiveUp, Progress, target_problem
from kuberay_scaler.loop.reconciler import Reconciler
from kuberay_scaler.loop.record import Recorder
from kuberay_scaler.loop.trigger import Trigger
from kuberay_scaler.runtime import heap
from kuberay_scaler.runtime.limits import raise_open_files_limit
from kuberay_scaler.runtime.logs import configure_logging, register_secret
from kuberay_scaler.runtime.metrics import Metrics
from kuberay_scaler.runtime.policy import policy_from_settings
from kuberay_scaler.runtime.settings import ConfigError, Settings, credentials_hint

log = structlog.get_logger(__name__)

TRIM_EVERY_S = 300.0
TARGET_CHECK_EVERY_S = 5.0
# Exit status after KUBERAY_SCALER_GIVE_UP_AFTER_S of a target not served (2 is bad config).
EXIT_TARGET_NOT_SERVED = 3


def run_daemon(settings: Settings) -> int:
    configure_logging(
        settings.log_format,
        settings.log_level,
        cluster=settings.cluster_name,
        namespace=settings.cluster_namespace,
    )
    if settings.ray_auth_token is not None:
        register_secret(settings.ray_auth_token.get_secret_value())
    # Everything imported so far lives as long as the process: leave it out of every later
    # collection, so a full collection (during plan(), say) walks only what the loop allocates.
    gc.collect()
    gc.freeze()
    return asyncio.run(Daemon(settings).run())


class Daemon:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.stop = asyncio.Event()
        self.trigger = Trigger()
        self.metrics = Metrics()  # the recorder's and /metrics'
        self.reconciler: Reconciler | None = None
        self._recorder: Recorder | None = None  # says each reconcile; keeps what the probes read
        self._pods: Informer | None = None
        self._view: RayClusterView | None = None
        self._poller: GcsPoller | None = None
        self._capacity: CapacityEventsReader | None = None
        self._nodes: NodeMaintenanceReader | None = None
        self._started = time.monotonic()
        self._give_up = GiveUp(after_s=settings.give_up_after_s)
        self.exit_code = 0
        self._open_files_at_start = self._open_files = 1024

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._request_stop, sig.name)
        self._open_files_at_start, self._open_files = raise_open_files_limit()
        runner = await self._serve_http()
        try:
            await self._run_tasks()
        finally:
            if runner is not None:
                await runner.cleanup()
        log.info("stopped")
        return self.exit_code

    def _request_stop(self, why: str) -> None:
        log.info("stopping", signal=why)
        self.stop.set()
        self.trigger.fire("stop")

    async def _serve_http(self) -> Any:
        if not self.settings.http_address:
            return None
        probes = Probes(healthy=self._healthy, ready=self._ready, plan=self._plan_document)
        address = self.settings.http_address
        cap = connection_cap(self._open_files)
        try:
            app = make_app(probes, self.metrics)
            runner = await start_server(app, address, max_connections=cap)
        except OSError as err:
            # A port already taken (say by Ray's metrics export in the same pod) is a setting to
            # fix, not a crash: one line and exit 2, like every other configuration error.
            raise ConfigError(
                f"KUBERAY_SCALER_HTTP_ADDRESS: cannot listen on {address}: {err.strerror or err}"
            ) from None
        log.info(
            "http serving",
            address=self.settings.http_address,
            connections_max=cap,
            open_files_limit=self._open_files,
            open_files_limit_at_start=self._open_files_at_start,
        )
        return runner

    async def _run_tasks(self) -> None:
        s = self.settings
        kubeconfig = str(s.kubeconfig) if s.kubeconfig else None
        try:
            api = await open_api(kubeconfig, request_timeout=s.k8s_request_timeout_s)
        except SessionError as err:  # checked before start; the files changed since
            raise ConfigError(credentials_hint(str(err), kubeconfig)) from None
        gcs = GcsClient(
            s.gcs_address,
            token=s.ray_auth_token.get_secret_value() if s.ray_auth_token else None,
            tls=self._tls(),
            rpc_timeout_s=s.gcs_rpc_timeout_s,
            counters=self.metrics.gcs,
        )
        try:
            async with asyncio.TaskGroup() as group:
                access_task = group.create_task(
                    detect_access(
                        api, s.cluster_namespace, name=s.cluster_name, counters=self.metrics.kube
                    )
                )
                await self._until_stopped(access_task)
                if self.stop.is_set():
                    return
                self._build(api, gcs, access_task.result())
                await self._supervise(group)
        finally:
            await gcs.close()
            await api.close()

    async def _until_stopped(self, task: asyncio.Task[Any]) -> None:
        stopper = asyncio.ensure_future(self.stop.wait())
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if not task.done():
            task.cancel()

    def _build(self, api: Any, gcs: GcsClient, access: Any) -> None:
        s, kube, gcs_counters = self.settings, self.metrics.kube, self.metrics.gcs
        self._pods = Informer(
            api,
            Source.pods(s.cluster_namespace, s.cluster_name),
            silent_timeout=s.watch_silence_timeout_s,
            on_change=lambda _changes: self._on_pods(),
            transform=slim_pod,
            counters=kube,
        )
        self._view = RayClusterView(
            api,
            namespace=s.cluster_namespace,
            name=s.cluster_name,
            mode="watch" if access.watch_rayclusters else "poll",
            refresh_interval=s.raycluster_poll_interval_s,
            silent_timeout=s.watch_silence_timeout_s,
            debounce=s.debounce_s,
            on_change=lambda: self.trigger.fire("raycluster"),
            crd_version=s.crd_version,
            counters=kube,
        )
        self._poller = GcsPoller(
            gcs,
            interval_s=s.gcs_poll_interval_s,
            on_change=self._on_gcs,
            on_observation=self._on_observation,
            # Replies are stamped on the monotonic clock, the planner's `mono_s`: idle age is
            # Ray's idle duration plus monotonic time since the reply, never a wall-clock step.
            wall=monotonic_ms,
            counters=gcs_counters,
        )
        view = self._view
        self._capacity = CapacityEventsReader(
            api,
            namespace=s.cluster_namespace,
            cluster=s.cluster_name,
            enabled=access.read_events,
            pods=lambda: self._pods.store if self._pods else {},
            groups=lambda: worker_group_names(view.current()),
            on_change=lambda: self.trigger.fire("capacity"),
            silent_timeout=s.watch_silence_timeout_s,
            counters=kube,
        )
        self._nodes = NodeMaintenanceReader(
            api,
            enabled=access.read_nodes,
            on_change=lambda: self.trigger.fire("nodes"),
            silent_timeout=s.watch_silence_timeout_s,
            counters=kube,
        )
        events = EventRecorder(
            api,
            namespace=s.cluster_namespace,
            enabled=access.create_events,
            involved=self._view.current,
            instance=s.head_pod_name,
            counters=kube,
        )
        self._recorder = Recorder(
            events,
            Progress(time.monotonic(), s.unhealthy_after_s, s.unhealthy_after_failures),
            metrics=self.metrics,
        )
        self.reconciler = Reconciler(
            config=LoopConfig(
                dry_run=s.dry_run,
                gcs_stale_after_s=s.gcs_stale_after_s,
                expectation_timeout_s=s.write_expectation_timeout_s,
                unhealthy_after_failures=s.unhealthy_after_failures,
                unhealthy_after_s=s.unhealthy_after_s,
                override=OverrideBackoff(
                    s.override_backoff_s, s.override_backoff_max_s, s.override_memory_s
                ),
            ),
            policy=policy_from_settings(s),
            pods=self._pods,
            cluster=self._view,
            feed=self._poller,
            gcs=RayGcs(gcs, self._poller, counters=gcs_counters),
            writer=RayClusterWriter(
                api,
                namespace=s.cluster_namespace,
                name=s.cluster_name,
                crd_version=s.crd_version,
                counters=kube,
            ),
            recorder=self._recorder,
            capacity=self._capacity,
            nodes=self._nodes,
        )
        if s.dry_run:
            log.info("dry run: plans are logged and served, nothing is drained or patched")

    async def _supervise(self, group: asyncio.TaskGroup) -> None:
        assert self._pods and self._view and self._poller and self._capacity and self._nodes
        workers = [
            group.create_task(self._pods.run()),
            group.create_task(self._capacity.run()),
            group.create_task(self._nodes.run()),
            group.create_task(self._view.run()),
            group.create_task(self._poller.run()),
            group.create_task(self._watch_target()),
        ]
        loop_task = group.create_task(self._loop())
        await self.stop.wait()
        try:
            # Let an in-flight reconcile (and its patch) finish, within a bound.
            async with asyncio.timeout(self.settings.shutdown_grace_s):
                await asyncio.shield(loop_task)
        except TimeoutError:
            log.warning("abandoning an in-flight reconcile at shutdown")
        for task in (*workers, loop_task):
            task.cancel()

    async def _loop(self) -> None:
        assert self.reconciler is not None
        s = self.settings
        next_trim = 0.0
        while not self.stop.is_set():
            wake = self.reconciler.seconds_to_wake()
            max_wait = s.resync_interval_s if wake is None else min(s.resync_interval_s, wake)
            reasons = await self.trigger.wait(max_wait=max_wait, debounce=s.debounce_s)
            if self.stop.is_set():
                break
            log.debug("reconcile", reasons=sorted(reasons))
            await self.reconciler.reconcile(reasons)
            if time.monotonic() >= next_trim:
                # After the first reconcile (the synced pods parsed) and then now and then: give
                # the memory of decoded-then-dropped API responses back to the OS, and keep
                # the long-lived caches out of the collector's full passes (heap.freeze).
                heap.trim()
                heap.freeze()
                next_trim = time.monotonic() + TRIM_EVERY_S

    async def _watch_target(self) -> None:
        """A target that does not exist or is not served: say so once a minute (an Event where
        there is an object to attach it to) and give up after KUBERAY_SCALER_GIVE_UP_AFTER_S."""
        while not self.stop.is_set():
            await asyncio.sleep(TARGET_CHECK_EVERY_S)
            problem = self._target_problem()
            say, give_up = self._give_up.check(problem, time.monotonic())
            recorder = self._recorder
            if problem is None or recorder is None:
                continue
            if say:
                recorder.not_served(
                    problem, event=self._view is not None and self._view.current() is not None
                )
            if give_up:
                recorder.giving_up(problem, self.settings.give_up_after_s)
                self.exit_code = EXIT_TARGET_NOT_SERVED
                self._request_stop("target not served")
                return

    def _target_problem(self) -> str | None:
        if not (self._pods and self._view):
            return None
        s = self.settings
        access = Access(
            raycluster_synced=self._view.synced,
            raycluster_found=self._view.current() is not None,
            raycluster_failure=self._view.failure_status,
            pods_failure=self._pods.failure_status,
        )
        return target_problem(access, f"{s.cluster_namespace}/{s.cluster_name}")

    def _on_pods(self) -> None:
        if self._view is not None:
            self._view.nudge()
        self.trigger.fire("pods")

    def _on_gcs(self, observation: RayObservation) -> None:
        if self.reconciler is not None:
            self.reconciler.gcs_changed(observation)
        self.trigger.fire("gcs")

    def _on_observation(self, observation: RayObservation) -> None:
        if self.reconciler is not None:
            self.reconciler.observe_gcs(observation)

    def _tls(self) -> TlsFiles | None:
        s = self.settings
        if not s.ray_use_tls:
            return None
        return TlsFiles(
            ca_cert=s.ray_tls_ca_cert, cert=s.ray_tls_server_cert, key=s.ray_tls_server_key
        )

    # --- probes -------------------------------------------------------------------------------
    def _healthy(self) -> tuple[bool, str]:
        """Alive unless reconciles keep failing or none succeeded for a while (see LoopStatus)."""
        limit = max(60.0, 3 * self.settings.resync_interval_s)
        if self._recorder is None:
            waited = time.monotonic() - self._started
            return waited < 5 * limit, f"starting for {waited:.0f} s"
        return self._recorder.health()

    def _ready(self) -> tuple[bool, str]:
        if not (self._pods and self._view and self._poller):
            return False, "starting"
        problem = self._target_problem()
        if problem is not None:
            return False, problem
        if not self._pods.synced:
            return False, "pod cache not synced"
        if not self._view.synced:
            return False, "RayCluster view not synced"
        fresh = self._poller.latest.fresh(time.monotonic(), self.settings.gcs_stale_after_s)
        if not fresh:
            return False, f"GCS state not fresh ({self._poller.latest.error or 'stale'})"
        return True, "synced and GCS fresh"

    def _plan_document(self) -> dict[str, Any] | None:
        document = self._recorder.document() if self._recorder else None
        if document is not None and self._capacity is not None:
            document["capacity_signals"] = self._capacity.document()
        if document is not None and self._nodes is not None:
            document["node_maintenance"] = self._nodes.document()
        return document
