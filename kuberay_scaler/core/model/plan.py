"""What the planner decided, with a typed reason (core/model/reasons.py) for every decision."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from kuberay_scaler.core.model.availability import (
    AvailabilityChange,
    GroupAvailability,
    said_by,
)
from kuberay_scaler.core.model.cluster import ClusterSpec, Problem, WorkerGroup
from kuberay_scaler.core.model.gangs import GangLine
from kuberay_scaler.core.model.hosts import Host, HostClock
from kuberay_scaler.core.model.ray import GangDemand, TaskDemand, epoch_ms
from kuberay_scaler.core.model.reasons import (
    Action,
    Demand,
    Disruption,
    DisruptionKind,
    Hold,
    InfeasibleKind,
    PlanProblem,
    Reason,
    Replace,
    ScaleDown,
    ScaleUp,
    Unchanged,
    UnchangedKind,
)
from kuberay_scaler.core.model.slices import Slice, SliceMap

_EPOCH = datetime.fromtimestamp(0, UTC)


def mono_of(mono_s: float | None, now: datetime) -> float:
    """The planner's monotonic reading in seconds: every timer in `Memory` and every duration
    that licenses a deletion (broken-busy age, preemption deadlines, idle age, replace and
    refused-drain backoffs, availability, disruption, queue and reservation timers) is measured
    on it, never on the wall clock `now`, so an NTP step cannot shorten or stretch one. The
    daemon passes time.monotonic(); one-shot use (`plan`, tests) passes nothing and the wall
    clock stands in for it (seconds since the epoch, a naive `now` read as UTC: one reading,
    the two cannot diverge)."""
    if mono_s is not None:
        return mono_s
    return ((now if now.tzinfo is not None else now.replace(tzinfo=UTC)) - _EPOCH).total_seconds()


def mono_ms(mono: float) -> int:
    """A monotonic reading in whole milliseconds, the clock idle-since times are kept on (the
    daemon stamps GCS replies on it; exact to the microsecond, as `epoch_ms`)."""
    return epoch_ms(_EPOCH + timedelta(seconds=mono))


def seconds_until(instant: float, mono: float) -> float:
    """Seconds from the reading `mono` to the timer's `instant`, to the microsecond (what a
    plan says and wakes for carries no float noise of the clock's magnitude)."""
    return round(instant - mono, 6)


def shown(instant: float, mono: float, now: datetime) -> datetime:
    """A monotonic-clock instant (a deadline, a backoff's end, seconds) on the wall clock, for
    people and for Ray: as far from `now` as it is from the reading `mono`."""
    return now + timedelta(seconds=instant - mono)


@dataclass(frozen=True)
class At:
    """One planning moment on both clocks: `now` (wall: pods' timestamps, what Ray reads,
    what people see) and `mono_s` (monotonic seconds, `mono_of`: every timer in Memory, idle
    age)."""

    now: datetime
    mono_s: float

    def shown(self, instant: float) -> datetime:
        """A timer's instant (monotonic seconds) on the wall clock."""
        return shown(instant, self.mono_s, self.now)

    @property
    def mono_ms(self) -> int:
        """The monotonic reading in ms: what idle-since times are compared with."""
        return mono_ms(self.mono_s)


class DeleteKind(StrEnum):
    """How a slice leaves; IDLE and SURPLUS deletions go only if every drain is accepted."""

    IDLE = "idle"  # drain every host first; delete only if every drain is accepted
    REPLACE = "replace"  # broken: delete as a unit, KubeRay creates a fresh replica
    PREEMPT = "preempt"  # busy, above maxReplicas: drain (preemption, deadline), delete later
    # Above maxReplicas with no work: hosts that joined Ray are idle and drained first (none for
    # a slice still coming up or one already drained for preemption).
    SURPLUS = "surplus"
    # A slice whose pods never ran: a pending one of an unavailable group, or a queued one
    # (Kueue) no demand wants. Named whole, no drain (the gate's (c)), and the target lowered by
    # it: it is not replaced.
    CANCEL = "cancel"


@dataclass(frozen=True)
class SliceDeletion:
    slice_key: str
    pods: tuple[str, ...]
    node_ids: tuple[str, ...]  # Ray nodes to drain (hex ids)
    kind: DeleteKind
    reason: ScaleDown | Replace


@dataclass(frozen=True)
class GroupRules:
    """A group's disruption rules as the plan applied them, and where each came from."""

    budget: str  # "10" slices or "20%" of the group's slices
    budget_from: str  # "group" (its template annotation) or "default" (the daemon's env)
    scale_down_delay_after_add_s: float
    delay_from: str
    leaving: int  # slices already leaving, counted against the budget


@dataclass(frozen=True)
class GroupDecision:
    group: str
    index: int
    num_of_hosts: int
    current: int  # replicas as stored in the spec
    target: int
    deletions: tuple[SliceDeletion, ...] = ()
    clear_workers_to_delete: bool = False
    held: Hold | None = None  # why nothing (or only part) was decided for this group
    reasons: tuple[Reason, ...] = ()
    launching_hosts: int = 0  # hosts asked for and not yet in Ray, for the report to Ray
    new_hosts: int = 0  # of those, the hosts of slices this very plan adds (not yet written)
    # Busy slices above maxReplicas to drain with reason preemption now; deleted in a later plan
    # once drained or past their deadline (never in this one).
    preempt: tuple[SliceDeletion, ...] = ()
    rules: GroupRules | None = None  # the group's disruption rules (None: not planned at all)

    @classmethod
    def unchanged(cls, group: WorkerGroup, held: Hold | None = None) -> GroupDecision:
        """The group as it stands (target = replicas), held by `held` if given (its reason
        too): what every decision starts from."""
        return cls(
            group=group.name,
            index=group.index,
            num_of_hosts=group.num_of_hosts,
            current=group.replicas,
            target=group.replicas,
            held=held,
            reasons=(held,) if held is not None else (),
        )

    @property
    def changes(self) -> bool:
        return self.spec_changes or bool(self.preempt)

    @property
    def spec_changes(self) -> bool:
        """Whether the RayCluster's group changes (preemption drains alone do not patch)."""
        return self.target != self.current or bool(self.deletions) or self.clear_workers_to_delete

    @property
    def action(self) -> Action:
        if self.target > self.current:
            return Action.SCALE_UP
        if any(x.kind is DeleteKind.REPLACE for x in self.deletions):
            return Action.REPLACE
        if self.target < self.current or self.deletions or self.preempt:
            return Action.SCALE_DOWN
        if self.clear_workers_to_delete:
            return Action.CLEAR_WORKERS_TO_DELETE
        return Action.NONE

    @property
    def reason_code(self) -> str:
        """The kind of the reason behind `action`: a metrics label from a small, fixed set."""
        action = self.action
        if action is Action.SCALE_UP:
            ups = [r for r in self.reasons if isinstance(r, ScaleUp)]
            if not ups and any(
                isinstance(r, Disruption) and r.kind is DisruptionKind.REPLACED_AHEAD
                for r in self.reasons
            ):
                return DisruptionKind.REPLACED_AHEAD.value
            return ups[0].kind.value if ups else "replicas_below_min"
        if action is Action.REPLACE:
            faults = [x.reason.kind for x in self.deletions if x.kind is DeleteKind.REPLACE]
            return str(faults[0] or "broken")
        if action is Action.SCALE_DOWN:
            first = (*self.deletions, *self.preempt)
            if first:
                return str(first[0].reason.kind)
            downs = [r for r in self.reasons if isinstance(r, ScaleDown)]  # replicas without pods
            return str(downs[0].kind) if downs else "replicas_above_max"
        if action is Action.CLEAR_WORKERS_TO_DELETE:
            return "workers_deleted"
        return "none"


@dataclass(frozen=True)
class Infeasible:
    demand: Demand
    kind: InfeasibleKind
    missing: str = ""  # the bundle no host offers (placement groups)
    count: int = 1
    certain: bool = True  # no group of this cluster can ever serve it, whatever the replicas
    # What Ray asked for, so the report can name it back (ReportAutoscalingState).
    request: TaskDemand | GangDemand | None = None

    @property
    def reason(self) -> str:
        """The sentence for logs and the report to Ray."""
        if self.kind is InfeasibleKind.NO_GROUP_OFFERS_PACKED:
            return f"no worker group's host offers all bundles together {self.missing}"
        if self.kind is InfeasibleKind.NO_GROUP_OFFERS_BUNDLE:
            return f"no worker group's host offers bundle {self.missing}"
        return "no worker group's host offers this"


@dataclass(frozen=True)
class ReplaceBackoff:
    """A group that replaced broken slices recently: the next replacement waits until `until`
    (monotonic seconds, `mono_of`)."""

    until: float
    failures: int  # consecutive replacements; the next delay grows with it
    replaced: int  # slices replaced the last time


@dataclass(frozen=True)
class ReservationMark:
    """Slice reservations (ray.util.tpu's head placement groups) a group served lately."""

    seen_s: float  # when one was last pending (the planner's monotonic reading, mono_s)
    slices: int  # slices they held or waited for then (placed heads + pending reservations)


@dataclass(frozen=True)
class RefusedDrain:
    """A slice whose drain every host refused (or failed): retried only once its Ray idle state
    changes (a host's idle-since moved later: it was busy and is idle again; or its nodes
    differ) or at `until` (monotonic seconds, `mono_of`), whichever comes first."""

    until: float
    # node id → since when Ray said it was idle (epoch ms) when the drain was refused
    idle_since_ms: Mapping[str, int]
    failures: int  # consecutive refused rounds; the wait doubles with each


@dataclass(frozen=True)
class Memory:
    """What the planner carries between loops. The loop keeps it; the planner returns a new one.

    Every timer in it is an instant on the monotonic clock in seconds (`mono_of`), never the
    wall clock (shown to people through `shown`). A daemon
    restart is a new monotonic clock and starts with an empty Memory, so each timer starts
    again, never shorter than the truth: a slice being drained is finished from the draining
    record on the RayCluster (restart adoption, `draining`), a preemption drain is sent again
    with a fresh deadline (the wait only grows), the broken-busy bound and the replace and
    refused-drain backoffs start over (later, never earlier, deletions); idle age is Ray's own
    idle duration, which a restart of ours does not touch.
    """

    backoff: Mapping[str, ReplaceBackoff] = field(default_factory=lambda: MappingProxyType({}))
    # Groups the loop holds (plan nothing for them): our write not yet observed (a text, or
    # Hold(AWAITING_WRITE)), or another writer's override (Hold(OVERRIDDEN)).
    awaiting_write: Mapping[str, str | Hold] = field(default_factory=lambda: MappingProxyType({}))
    # Slices recorded on the RayCluster as being drained (group → slice keys): a restart in the
    # middle of a scale-down finishes it instead of forgetting it.
    draining: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    # Busy slices above maxReplicas drained for preemption: slice key → when the drain's time is
    # up (kept by the planner; a restart forgets it and drains again, so the wait only grows).
    preempting: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    # Slices whose drain was refused lately (slice key → when to retry at the latest).
    refused: Mapping[str, RefusedDrain] = field(default_factory=lambda: MappingProxyType({}))
    # Broken slices kept because a host is busy: slice key → since when (bounded, see
    # KUBERAY_SCALER_BROKEN_BUSY_MAX_S).
    broken_busy_since: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    # Groups that added a slice lately: group → when it was planned (the planner's `mono_s`,
    # monotonic seconds); no idle slice of theirs leaves for the scale-down delay after it.
    scaled_up_at: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    # Going slices (DisruptionTarget) a replacement was launched for: slice key → group.
    replaced_ahead: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # Going slices drained for preemption (slice key → group): if the disruption does not
    # happen they stay DRAINING in Ray, and are replaced once their deadline passes.
    disrupted: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # Each group's availability (core/planner/availability.py): kept every frame, written or not.
    availability: Mapping[str, GroupAvailability] = field(
        default_factory=lambda: MappingProxyType({})
    )
    # Queued slices no demand uses: slice key → since when (mono_s); cancelled once
    # that lasts the idle timeout. Kept every frame, written or not.
    queued_unneeded_since: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    # Groups whose slice reservations were seen lately: their unneeded slices are kept
    # for the reservation grace. Kept every frame, written or not.
    reservations: Mapping[str, ReservationMark] = field(
        default_factory=lambda: MappingProxyType({})
    )


@dataclass(frozen=True)
class Fallback:
    """Slices opened in `to_group` for demand that prefers the unavailable `from_group`."""

    from_group: str
    to_group: str
    cause: str
    slices: int


@dataclass(frozen=True)
class Snapshot:
    """The cluster as the Kubernetes side sees it right now."""

    spec: ClusterSpec
    hosts: tuple[Host, ...]
    synced: bool = True  # False while the pod cache or the RayCluster view is not trustworthy
    problems: tuple[Problem, ...] = ()  # pods that cannot be used
    clock: HostClock | None = None  # the daemon's liveness memory; None: the pods' timestamps


@dataclass(frozen=True)
class Plan:
    cluster: str
    uid: str
    resource_version: str
    groups: tuple[GroupDecision, ...]
    infeasible: tuple[Infeasible, ...]
    problems: tuple[PlanProblem, ...]
    slice_map: SliceMap | None
    memory: Memory
    held: Hold | None = None  # the whole plan held (unsynced view, unknown demand)
    # Seconds until the first host that held demand stops settling (planner/capacity.py).
    settle_s: float | None = None
    # Seconds until the first deadline its memory holds passes (a preemption notice, the
    # broken-busy bound, a replace or refused-drain backoff) or a group's provisioning
    # deadline or capacity grace: see `next_wake_s`.
    deadline_s: float | None = None
    # When it was planned, on the clock idle-since times are kept on (`mono_ms`, in ms; the
    # daemon stamps GCS replies on the monotonic clock): its documents' idle durations are as of
    # then.
    now_ms: int = 0
    # When it was planned on the wall clock (epoch ms): what times shown to people count from.
    wall_ms: int = 0
    # Group availability transitions this plan made, and where demand fell back to.
    availability_changes: tuple[AvailabilityChange, ...] = ()
    fallbacks: tuple[Fallback, ...] = ()
    # Seconds from this plan until each unavailable group's next probe (monotonic, from mono_s).
    next_probe_s: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    # Seconds until a queued slice's cancel or a reservation grace falls due.
    queue_wake_s: float | None = None
    # Pending placement groups' slices per group and their deadline (planner/gang_deadline.py).
    gangs: tuple[GangLine, ...] = ()

    @property
    def changes(self) -> bool:
        return any(g.changes for g in self.groups)

    def group(self, name: str) -> GroupDecision | None:
        return next((g for g in self.groups if g.group == name), None)

    @property
    def next_idle_expiry_s(self) -> float | None:
        """Seconds from this plan's observation until the first idle slice that stays reaches
        its idle timeout, a host that held demand stops settling, or an unavailable group's
        probe is due; None when none is.
        Those clocks move with time alone, so the loop plans again then instead of waiting for
        its resync timer."""
        waits = [
            r.timeout_s - r.idle_s
            for g in self.groups
            for r in g.reasons
            if isinstance(r, Unchanged) and r.kind is UnchangedKind.IDLE_BELOW_TIMEOUT
        ]
        waits += [  # idle slices kept by a scale-down delay: judged again when it ends
            r.wait_s
            for g in self.groups
            for r in g.reasons
            if isinstance(r, Disruption) and r.wait_s is not None
        ]
        if self.settle_s is not None:  # the demand it held may need a slice then
            waits.append(self.settle_s)
        waits.extend(self.next_probe_s.values())  # an unavailable group's probe is due then
        if self.queue_wake_s is not None:  # a queued slice's cancel, a reservation grace's end
            waits.append(self.queue_wake_s)
        return max(0.0, min(waits)) if waits else None

    @property
    def next_wake_s(self) -> float | None:
        """Seconds from this plan until time alone changes a decision: an idle slice reaching
        its timeout, a host done settling, or a deadline passing (every deadline the
        plan holds is a wake-up, so e.g. a preempted surplus slice leaves when its notice ends,
        not at the next resync). None when nothing is due."""
        waits = [w for w in (self.next_idle_expiry_s, self.deadline_s) if w is not None]
        return min(waits) if waits else None

    def availability_doc(self, group: str) -> dict[str, Any]:
        a = self.memory.availability.get(group)
        return availability_doc(a, self.next_probe_s.get(group), self.wall_ms)

    def _slices_doc(self, group: str) -> list[dict[str, Any]]:
        gs = self.slice_map.groups.get(group) if self.slice_map else None
        windows = self._maintenance(group)
        return (
            [{**slice_doc(sl, self.now_ms), "maintenance": windows.get(sl.key)} for sl in gs.slices]
            if gs
            else []
        )

    def _maintenance(self, group: str) -> dict[str, str]:
        """Slice key → the GKE maintenance window the disruption stage judged it by."""
        d = self.group(group)
        reasons = d.reasons if d is not None else ()
        return {
            r.slice: r.detail
            for r in reasons
            if isinstance(r, Disruption)
            and r.slice is not None
            and (r.kind is DisruptionKind.MAINTENANCE or r.cause == "maintenance")
        }

    def summary(self) -> dict[str, Any]:
        """The plan as the `plan` command and /debug/plan print it (without the patch)."""
        return {
            "cluster": self.cluster,
            "held": _hold_doc(self.held),
            "groups": [
                {
                    "name": g.group,
                    "num_of_hosts": g.num_of_hosts,
                    "replicas": {"current": g.current, "target": g.target},
                    "delete": [
                        {
                            "slice": d.slice_key,
                            "pods": list(d.pods),
                            "kind": d.kind.value,
                            "reason": _reason_doc(d.reason),
                        }
                        for d in g.deletions
                    ],
                    "drain": [n for d in g.deletions for n in d.node_ids],
                    "clear_workers_to_delete": g.clear_workers_to_delete,
                    "preempt": [
                        {
                            "slice": d.slice_key,
                            "pods": list(d.pods),
                            "reason": _reason_doc(d.reason),
                        }
                        for d in g.preempt
                    ],
                    "held": _hold_doc(g.held),
                    "disruption": None if g.rules is None else asdict(g.rules),
                    "reasons": [_reason_doc(r) for r in g.reasons],
                    "slices": self._slices_doc(g.group),
                    "availability": self.availability_doc(g.group),
                    "gangs": [gang_doc(x) for x in self.gangs if x.group == g.group],
                }
                for g in self.groups
            ],
            "fallbacks": [
                {"from": f.from_group, "to": f.to_group, "cause": f.cause, "slices": f.slices}
                for f in self.fallbacks
            ],
            "infeasible": [
                {
                    "demand": str(i.demand),
                    "count": i.count,
                    "kind": i.kind.value,
                    "reason": i.reason,
                    "certain": i.certain,
                }
                for i in self.infeasible
            ],
            "problems": [
                {"kind": p.kind.value, "group": p.group, "text": str(p)} for p in self.problems
            ],
        }


def gang_doc(line: GangLine) -> dict[str, Any]:
    """A pending placement group's slices in one group, as /debug/plan and /debug/slices say."""
    return {**asdict(line), "text": str(line)}


def availability_doc(
    a: GroupAvailability | None, next_probe_s: float | None, now_ms: int
) -> dict[str, Any]:
    """A group's availability as people read it: state, cause, who said so, the next probe."""
    if a is None:
        return {"state": "available"}
    doc: dict[str, Any] = {"state": a.state.value, "text": str(a)}
    if a.cause is not None:
        doc["cause"] = a.cause.value
    if a.source:
        doc["said_by"] = said_by(a)
    if a.failures:
        doc["failures"] = a.failures
    if a.probing:
        doc["probing"] = True
    if next_probe_s is not None:
        doc["next_probe_in_s"] = round(next_probe_s, 1)
        at = datetime.fromtimestamp(now_ms / 1000 + next_probe_s, UTC)
        doc["next_probe_at"] = at.isoformat(timespec="seconds")
    return doc


def slice_doc(sl: Slice, now_ms: int) -> dict[str, Any]:
    """One slice as people read it at `now_ms` (epoch ms): state and why, and each host with
    its Ray node and how long it has been idle."""
    idle_ms = sl.idle_ms(now_ms)
    return {
        "slice": sl.key,
        "state": sl.state.value,
        "reason": sl.reason,
        "idle_s": None if idle_ms is None else round(idle_ms / 1000, 1),
        "do_not_disrupt": sl.do_not_disrupt,  # the pod annotation that protects it, if any
        "going": sl.going,  # "<pod>: <DisruptionTarget reason>", if a host is going
        "queued_s": None if sl.queued_s is None else round(sl.queued_s, 1),
        "gates": list(sl.gates),
        "hosts": [
            {
                "pod": h.pod_name,
                "host_index": h.host_index,
                "phase": h.phase.value,
                "detail": h.detail,
                "ray_node": sl.nodes[h.pod_name].node_id if h.pod_name in sl.nodes else None,
                "ray_status": sl.nodes[h.pod_name].status.value if h.pod_name in sl.nodes else None,
                "idle_s": (
                    round(sl.nodes[h.pod_name].idle_ms(now_ms) / 1000, 1)
                    if h.pod_name in sl.nodes and sl.nodes[h.pod_name].idle
                    else None
                ),
            }
            for h in sl.hosts
        ],
    }


def _hold_doc(hold: Hold | None) -> dict[str, Any] | None:
    return None if hold is None else {"kind": hold.kind.value, "text": str(hold)}


def _reason_doc(reason: Reason) -> dict[str, Any]:
    """A reason for the documents people read: its kind, its sentence and its slice if any."""
    doc: dict[str, Any] = {"type": type(reason).__name__, "kind": str(reason.kind)}
    slice_key = getattr(reason, "slice", None)
    if slice_key is not None:
        doc["slice"] = slice_key
    count = getattr(reason, "count", None)
    if count:
        doc["count"] = count
    doc["text"] = str(reason)
    return doc
