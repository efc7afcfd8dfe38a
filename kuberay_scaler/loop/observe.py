"""Observe: one snapshot per reconcile, everything `decide()` reads, each input read once.

The RayCluster is parsed once (and not again while the view holds the same object), pods come
parsed from the `PodCache` (a pod is parsed again only when its object changed), and Ray's state
is the latest `RayObservation` the poller pushed, already parsed. The snapshot also carries what
the loop itself remembers: groups held for an unobserved write of ours (expectations) or for
another writer's override (`hands_off`), and the liveness clock. `inputs` fingerprints the
parsed values the plan reads (never resourceVersions or GCS versions), so a reconcile woken by
a change that changes none of them can be skipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from kuberay_scaler.core.decision import Observation
from kuberay_scaler.core.liveness import LivenessTracker
from kuberay_scaler.core.model.cluster import ClusterSpec
from kuberay_scaler.core.model.plan import Plan
from kuberay_scaler.core.model.ray import RayObservation
from kuberay_scaler.core.model.reasons import Hold, HoldKind
from kuberay_scaler.core.parse.pod_cache import PodCache
from kuberay_scaler.core.parse.raycluster import parse_raycluster
from kuberay_scaler.core.planner.memo import FrameMemo
from kuberay_scaler.loop.expectations import Expectations
from kuberay_scaler.loop.handsoff import HandsOff, Overridden, OverrideBackoff, hands_off
from kuberay_scaler.loop.ports import CapacityFeed, ClusterView, NodeFeed, PodStore

# Input sources the loop can be blind to (the `source` label of kuberay_scaler_blind_seconds).
SOURCES = ("gcs", "pods", "raycluster")


@dataclass(frozen=True)
class Instant:
    """The one `now` of a reconcile, on both clocks."""

    wall: datetime
    mono: float


@dataclass(frozen=True)
class Snapshot:
    """One reconcile's inputs."""

    observation: Observation  # what decide() takes
    inputs: tuple[object, ...]  # what the plan reads, by content
    blind: Mapping[str, float]  # source → seconds it has been unknown or stale (0: fresh)
    unknown: frozenset[str]  # the sources not fresh now
    overridden: tuple[Overridden, ...] = ()  # overrides noticed in this snapshot
    recreated: str | None = None  # the old uid, when the RayCluster was recreated

    @property
    def fresh(self) -> bool:
        return not self.unknown


@dataclass(frozen=True)
class ObserveConfig:
    gcs_stale_after_s: float
    missing_node_grace_s: float
    expectation_timeout_s: float
    override: OverrideBackoff = field(default_factory=OverrideBackoff)


class Observer:
    """Keeps what observing needs between reconciles; `snapshot()` once per reconcile."""

    def __init__(
        self,
        pods: PodStore,
        cluster: ClusterView,
        config: ObserveConfig,
        capacity: CapacityFeed | None = None,
        nodes: NodeFeed | None = None,
    ) -> None:
        self._pods = pods
        self._cluster = cluster
        self._capacity = capacity  # None: no Events source (tests, `plan`)
        self._nodes = nodes  # None: no nodes source (tests, `plan`)
        self._config = config
        self.expectations = Expectations(timeout=config.expectation_timeout_s)
        self.hands_off = HandsOff()
        self._liveness = LivenessTracker(
            grace_s=config.missing_node_grace_s, stale_after_s=config.gcs_stale_after_s
        )
        self._pod_cache = PodCache()
        self.ray: RayObservation | None = None  # the latest the poller pushed
        self._demand = False  # the last known Ray state had demand pending
        self._ray_content = 0  # rises when the GCS content (not its version) changed
        self._parsed: tuple[Mapping[str, Any] | None, ClusterSpec | None] = (None, None)
        self._uid: str | None = None
        self._fresh_at: dict[str, float] = {}  # source → when it was last fresh (monotonic)
        self.parses = 0  # RayCluster parses (for the reads-per-reconcile measurement)
        # The planner's frame memo: ours, carried from frame to frame and passed to decide();
        # a new one for a recreated RayCluster (it is keyed by values: only hits change).
        self.memo = FrameMemo()

    def see_ray(self, observation: RayObservation) -> None:
        """Every poll: the latest observation, and the liveness memory of Ray's nodes."""
        self.ray = observation
        if observation.known:
            self._demand = observation.demand_pending
        self._liveness.observe_ray(
            observation.observed_at,
            (observation.cluster_id, observation.epoch),
            observation.alive_instances(),
        )

    def ray_changed(self) -> None:
        self._ray_content += 1

    def snapshot(self, now: Instant) -> Snapshot | None:
        """Everything one reconcile decides from; None when there is no RayCluster."""
        raw = self._cluster.current()
        if raw is None:
            self.blindness(now.mono, found=False)
            return None
        spec = self._spec(raw)
        recreated = self._notice_recreation(spec.uid)
        groups = {g.name: g for g in spec.groups}
        self.expectations.settle(groups, now.mono)
        self.hands_off, overridden = hands_off(
            self.hands_off,
            spec,
            lambda name: self.expectations.pending(name, groups.get(name), now.mono),
            now.mono,
            self._config.override,
        )
        holds = self._holds(now)
        hosts, problems = self._pod_cache.hosts(self._pods.store, spec)
        self._liveness.observe_pods(now.mono, hosts)
        synced = self._pods.synced and self._cluster.synced
        ray = self._ray_view(now.mono)
        capacity = self._capacity.events() if self._capacity is not None else ()
        maintenance = self._nodes.maintenance() if self._nodes is not None else {}
        blind, unknown = self.blindness(now.mono, found=True)
        observation = Observation(
            spec=spec,
            hosts=hosts,
            pod_problems=problems,
            gcs=ray,
            synced=synced,
            awaiting_write=holds,
            clock=self._liveness.clock(now.mono),
            capacity_events=capacity,
            node_maintenance=maintenance,
        )
        inputs = (
            # The spec by content: not its version, nor who wrote it (our draining record is in
            # it, parsed: no other annotation of the RayCluster is read by the plan).
            replace(spec, resource_version="", spec_writers=()),
            self._pod_cache.version,
            self._ray_content,
            ray is not None and ray.known,
            synced,
            tuple(sorted((g, str(h)) for g, h in holds.items())),
            capacity,
            tuple(sorted(maintenance.values(), key=lambda m: m.node)),
        )
        return Snapshot(observation, inputs, blind, unknown, overridden, recreated)

    def wrote(self, result: Plan, now: float) -> None:
        """Our patch for `result` was applied: expect it, and remember the replicas we set."""
        for d in result.groups:
            if not d.changes:
                continue
            pods = [p for x in d.deletions for p in x.pods]
            self.expectations.expect(
                d.group,
                replicas=d.target,
                workers_to_delete=pods if (pods or d.clear_workers_to_delete) else None,
                now=now,
            )
        self.hands_off = self.hands_off.wrote(
            {d.group: d.target for d in result.groups if d.changes and d.spec_changes}
        )

    def demand_pending(self) -> bool:
        """The last Ray state known (fresh or not) had demand waiting."""
        return self._demand

    # --- the parts ------------------------------------------------------------------------------

    def _spec(self, raw: Mapping[str, Any]) -> ClusterSpec:
        """Parsed once per object: the view hands out the same dict until it changes."""
        seen, spec = self._parsed
        if seen is not raw or spec is None:
            spec = parse_raycluster(raw)
            self.parses += 1
            self._parsed = (raw, spec)
        return spec

    def _notice_recreation(self, uid: str | None) -> str | None:
        old, self._uid = self._uid, uid
        if old is None or old == uid:
            return None
        self.expectations.forget()
        self.hands_off = HandsOff()
        self.memo = FrameMemo()
        return old

    def _holds(self, now: Instant) -> dict[str, str | Hold]:
        holds: dict[str, str | Hold] = dict(self.hands_off.holds(now.mono, now.wall))
        for name in self.expectations.groups():
            holds[name] = Hold(
                HoldKind.AWAITING_WRITE, name, detail="waiting to observe our last write"
            )
        return holds

    def _ray_view(self, now: float) -> RayObservation | None:
        """The latest observation when recent enough to plan from (or to name as unusable)."""
        ray = self.ray
        if ray is None or now - ray.observed_at > self._config.gcs_stale_after_s:
            return None
        return ray if ray.known or ray.unusable else None

    def blindness(self, now: float, *, found: bool) -> tuple[dict[str, float], frozenset[str]]:
        """Per source, how long it has been unknown or stale; and which are not fresh now."""
        ray = self.ray
        fresh = {
            "gcs": ray is not None and ray.fresh(now, self._config.gcs_stale_after_s),
            "pods": self._pods.synced,
            "raycluster": self._cluster.synced and found,
        }
        blind = {}
        for source in SOURCES:
            if fresh[source]:
                self._fresh_at[source] = now
            since = self._fresh_at.setdefault(source, now) if not fresh[source] else now
            blind[source] = now - since
        return blind, frozenset(s for s in SOURCES if not fresh[s])
