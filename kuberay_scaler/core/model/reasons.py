"""Why the planner decided what it did: kinds with structured fields, rendered only at the edges.

The planner produces these values; logs, Events, /debug/plan, the `plan` command, metrics and
the report to Ray turn them into text or labels (`str()` renders the sentence a person reads,
`kind` is the stable code). Tests assert kinds and fields, never the sentences.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from kuberay_scaler.core.model.availability import AvailabilityChange


class HoldKind(StrEnum):
    """Why nothing (or only part) is decided for the whole cluster or for one group."""

    NOT_SYNCED = "not_synced"  # pod cache or RayCluster view not trustworthy yet
    CLUSTER_SUSPENDED = "cluster_suspended"
    DEMAND_UNKNOWN = "demand_unknown"  # GCS unreachable, restarted or stale
    SHAPE_UNKNOWN = "shape_unknown"  # the group's host resources cannot be worked out
    AWAITING_WRITE = "awaiting_write"  # our last write to the group is not observed yet
    OVERRIDDEN = "overridden"  # another writer reset its replicas: left alone for a while
    WORKERS_TO_DELETE_PENDING = "workers_to_delete_pending"  # KubeRay still deleting named pods
    GROUP_SUSPENDED = "group_suspended"
    BACKING_OFF = "backing_off"  # replaced broken slices recently
    AT_MAX_REPLICAS = "at_max_replicas"
    AT_HOST_BOUND = "at_host_bound"  # MAX_GROUP_HOSTS: the planner never asks for more hosts
    PLAN_FAILED = "plan_failed"  # planning this group raised; it is skipped, the others planned
    CONSERVATIVE_UPSCALING = "conservative_upscaling"  # waiting for launching slices
    NO_ROOM = "no_room"  # the demand needs more slices than the group may add
    # Demand held by hosts that joined just now: it may be their own work still reported pending.
    JOIN_SETTLING = "join_settling"
    # The group cannot get capacity (stockout, quota, ...; core/planner/availability.py): no
    # slice is added until its probe; demand another group can serve goes there.
    GROUP_UNAVAILABLE = "group_unavailable"
    # Its backoff ended: one slice is being tried again; more demand goes elsewhere meanwhile.
    GROUP_PROBING = "group_probing"


@dataclass(frozen=True)
class Hold:
    kind: HoldKind
    group: str | None = None
    detail: str = ""  # free text from the source (a shape error, the expectation awaited)
    count: int = 0  # pods still named in workersToDelete
    limit: int | None = None  # maxReplicas
    until: datetime | None = None  # end of a backoff
    failures: int = 0  # replacements counted by a backoff

    def __str__(self) -> str:
        return _hold_text(self)


def _hold_text(h: Hold) -> str:
    match h.kind:
        case HoldKind.NOT_SYNCED:
            return "cluster view not synced yet: holding"
        case HoldKind.CLUSTER_SUSPENDED:
            return "RayCluster is suspended"
        case HoldKind.DEMAND_UNKNOWN:
            return "Ray demand unknown (GCS unreachable, restarted or stale): holding"
        case HoldKind.SHAPE_UNKNOWN:
            return f"resources unknown: {h.detail}"
        case HoldKind.AWAITING_WRITE:
            return h.detail or "waiting to observe our last write"
        case HoldKind.OVERRIDDEN:
            until = f" until {h.until.isoformat(timespec='seconds')}" if h.until else ""
            return (
                f"another writer set its replicas ({h.failures}x so far): left alone{until}"
                " instead of fighting it"
            )
        case HoldKind.WORKERS_TO_DELETE_PENDING:
            return f"waiting for KubeRay to delete {h.count} pod(s) named in workersToDelete"
        case HoldKind.GROUP_SUSPENDED:
            return "group is suspended"
        case HoldKind.BACKING_OFF:
            until = h.until.isoformat() if h.until else "?"
            return f"backing off until {until} (replaced broken slices {h.failures} time(s))"
        case HoldKind.AT_MAX_REPLICAS:
            return f"at maxReplicas {h.limit}"
        case HoldKind.AT_HOST_BOUND:
            return f"at {h.limit} replicas: the bound of hosts per group ({h.detail})"
        case HoldKind.PLAN_FAILED:
            return f"planning this group failed: {h.detail}"
        case HoldKind.CONSERVATIVE_UPSCALING:
            return "Conservative upscaling: waiting for launching slices"
        case HoldKind.NO_ROOM:
            return "needs more slices than allowed"
        case HoldKind.GROUP_UNAVAILABLE:
            at = f"; probed again at {h.until.strftime('%H:%M:%S')}" if h.until else ""
            return f"{h.group} {h.detail}{at}"
        case HoldKind.GROUP_PROBING:
            return f"{h.group} {h.detail}: one slice at a time until it comes up"
        case HoldKind.JOIN_SETTLING:
            return (
                f"{h.count} host(s) whose Ray container started less than {h.detail} ago hold "
                "demand their own work may still be reported as: no slice added for it yet"
            )


class DemandKind(StrEnum):
    """What asked for capacity: the key of scale-up and waiting reasons."""

    TASK = "task"  # pending tasks and actors
    REQUEST_RESOURCES = "request_resources"  # ray.autoscaler.sdk.request_resources floor
    PLACEMENT_GROUP = "placement_group"


_DEMAND_TEXT = {
    DemandKind.TASK: "pending task/actor",
    DemandKind.REQUEST_RESOURCES: "request_resources",
    DemandKind.PLACEMENT_GROUP: "placement group",
}


@dataclass(frozen=True)
class Demand:
    """One kind of unmet demand: `shape` describes the bundle(s), e.g. `{CPU: 1}`."""

    kind: DemandKind
    shape: str
    strategy: str | None = None  # placement groups: PACK, SPREAD, STRICT_PACK, STRICT_SPREAD

    def __str__(self) -> str:
        if self.kind is DemandKind.PLACEMENT_GROUP:
            return f"placement group ({self.strategy}) {self.shape}"
        return f"{_DEMAND_TEXT[self.kind]} {self.shape}"


@dataclass(frozen=True)
class ScaleUp:
    """Slices added for `count` units of `demand`."""

    demand: Demand
    count: int

    @property
    def kind(self) -> DemandKind:
        return self.demand.kind

    def __str__(self) -> str:
        return f"add slice(s) for {self.count}× {self.demand}"


@dataclass(frozen=True)
class FellBack:
    """Slices of this group added for demand that prefers `from_group`, which is unavailable."""

    demand: Demand
    count: int
    from_group: str
    cause: str  # the unavailable cause (metrics label)

    kind = "fallback"

    def __str__(self) -> str:
        return f"{self.count}× {self.demand} → here: {self.from_group} unavailable ({self.cause})"


@dataclass(frozen=True)
class Waiting:
    """Demand this group would serve but may not add a slice for now."""

    demand: Demand
    count: int
    blocked: Hold

    @property
    def kind(self) -> HoldKind:
        return self.blocked.kind

    def __str__(self) -> str:
        return f"{self.count}× {self.demand}: {self.blocked}: waiting"


class ScaleDownKind(StrEnum):
    IDLE = "idle"  # every host idle for at least the idle timeout
    RECORDED_DRAIN = "recorded_drain"  # finishing a drain recorded before a restart
    # Above maxReplicas (Ray: MAX_NUM_NODE_PER_TYPE): whole surplus slices leave, idle first.
    ABOVE_MAX = "above_max"  # a slice with no work (no Ray node, or all hosts idle)
    PREEMPT = "preempt"  # a busy surplus slice: drained (reason preemption) until its deadline
    PREEMPTED = "preempted"  # a preempted slice whose hosts are drained or whose deadline passed
    # Some hosts accepted their drain (their raylets exit), others refused: the refusing hosts
    # are drained for preemption until `deadline`, then the slice leaves whole (never half).
    PARTLY_DRAINED = "partly_drained"
    # The group is unavailable: a slice whose pods never ran is cancelled (no drain needed),
    # not replaced; its demand goes to the next group.
    CANCEL_UNAVAILABLE = "cancel_unavailable"
    # A host of the slice has the pod condition DisruptionTarget (eviction, preemption, taint
    # manager): the slice is going, its live hosts are drained for preemption now.
    DISRUPTION_TARGET = "disruption_target"
    # A node of the slice has GKE maintenance within the preemption deadline (or the
    # impending-node-termination taint): its live hosts are drained until the window.
    MAINTENANCE = "maintenance"
    # An idle slice on a node with upcoming maintenance leaves in place of another idle slice
    # the group removes (it leaves first, so maintenance runs on an empty slice).
    MAINTENANCE_FIRST = "maintenance_first"
    # A queued slice (held by a scheduling gate: Kueue) no demand has used for the idle timeout:
    # cancelled whole, undrained (its pods never ran), before it is ever admitted.
    CANCEL_QUEUED = "cancel_queued"
    # An idle slice of a gang (a pending placement group) still incomplete at its group's
    # provisioning deadline: drained and handed back; the gang is planned again whole.
    GANG_DEADLINE = "gang_deadline"


@dataclass(frozen=True)
class ScaleDown:
    kind: ScaleDownKind
    slice: str
    hosts: int = 0
    idle_s: float = 0.0
    timeout_s: float = 0.0
    running: int = 0  # ABOVE_MAX / PREEMPT: slices the group runs
    limit: int = 0  # ABOVE_MAX / PREEMPT: maxReplicas
    deadline: datetime | None = None  # PREEMPT / PREEMPTED: when the drain's time is up
    detail: str = ""  # CANCEL_UNAVAILABLE: why the group is unavailable
    cause: str = ""  # DISRUPTION_TARGET: the condition's reason (e.g. PreemptionByScheduler)

    def __str__(self) -> str:
        if self.kind is ScaleDownKind.CANCEL_UNAVAILABLE:
            what = f"slice {self.slice}" if self.slice else f"{self.hosts} replica(s) without pods"
            return f"cancel pending {what} (its pods never ran): {self.detail}"
        if self.kind is ScaleDownKind.CANCEL_QUEUED:
            return (
                f"cancel queued slice {self.slice}: no demand for it for {self.idle_s:.0f} s"
                f" ≥ {self.timeout_s:.0f} s (its pods never ran)"
            )
        if self.kind is ScaleDownKind.GANG_DEADLINE:
            return (
                f"release idle slice {self.slice} of an incomplete gang past its deadline"
                f" ({self.timeout_s:.0f} s): {self.detail}"
            )
        if self.kind is ScaleDownKind.RECORDED_DRAIN:
            return f"remove slice {self.slice}: finishing a drain recorded before a restart"
        above = f"{self.running} slices running, above maxReplicas {self.limit}"
        until = self.deadline.isoformat() if self.deadline else "?"
        if self.kind is ScaleDownKind.ABOVE_MAX:
            return f"remove slice {self.slice}: {above}; no work on it"
        if self.kind is ScaleDownKind.PREEMPT:
            return f"drain slice {self.slice} for preemption until {until}: {above}; busy"
        if self.kind is ScaleDownKind.PREEMPTED:
            return f"remove slice {self.slice}: drained for preemption (deadline {until})"
        if self.kind is ScaleDownKind.DISRUPTION_TARGET:
            return (
                f"drain slice {self.slice} for preemption until {until}: a host is going"
                f" (DisruptionTarget: {self.cause or '?'})"
            )
        if self.kind is ScaleDownKind.MAINTENANCE:
            return f"drain slice {self.slice} for preemption until {until}: {self.detail}"
        if self.kind is ScaleDownKind.MAINTENANCE_FIRST:
            return (
                f"remove idle slice {self.slice} before the group's other idle slices:"
                f" {self.detail}"
            )
        if self.kind is ScaleDownKind.PARTLY_DRAINED:
            return (
                f"slice {self.slice} partly drained: its other hosts are drained for preemption"
                f" until {until}, then it is removed whole"
            )
        return (
            f"remove slice {self.slice}: all {self.hosts} hosts idle for"
            f" {self.idle_s:.0f} s ≥ {self.timeout_s:.0f} s"
        )


class SliceFault(StrEnum):
    """Why a slice is broken (set by the slice map, carried by replace reasons)."""

    HOST_FAILED = "host_failed"  # a host pod Failed (evicted, preempted, crashed)
    TOO_MANY_HOSTS = "too_many_hosts"  # more pods than numOfHosts
    HOSTS_MISSING = "hosts_missing"  # fewer pods than numOfHosts for too long
    RAY_NODE_MISSING = "ray_node_missing"  # a running host's Ray node is gone
    NOT_UP_IN_TIME = "not_up_in_time"  # not running/joined within the provisioning timeout


@dataclass(frozen=True)
class Replace:
    """A broken slice deleted as a unit; KubeRay creates a fresh replica."""

    slice: str
    fault: SliceFault | None
    cause: str  # the slice map's diagnosis, e.g. "host 2 pod Failed (Evicted)"

    @property
    def kind(self) -> SliceFault | None:
        return self.fault

    def __str__(self) -> str:
        return f"replace slice {self.slice}: {self.cause}"


class KeepKind(StrEnum):
    """Why slices that could go are kept."""

    MIN_REPLICAS = "min_replicas"  # idle, but the group would fall below minReplicas
    DRAIN_REFUSED = "drain_refused"  # a host refused DrainNode
    REPLACE_BACKING_OFF = "replace_backing_off"  # broken, but replaced too recently
    # Broken, but a host's Ray node is alive and not idle in the fresh GCS reply: never deleted
    # over busy work (KubeRay deletes a multi-host replica itself when one of its pods fails).
    BROKEN_BUT_BUSY = "broken_but_busy"
    # A host's Ray node is absent from the latest replies, not yet for the whole liveness grace:
    # it may be busy (a partial reply, a GCS restart), so the slice is neither drained nor deleted.
    ABSENT_FROM_RAY = "absent_from_ray"
    # Decided after the drains (decision.after_drains), typed so `plan` and tests can see them:
    NO_LONGER_IDLE = "no_longer_idle"  # a fresh GCS read right before draining saw work
    DRAIN_NOT_SENT = "drain_not_sent"  # no fresh GCS read before draining: nothing drained
    RAY_NODE_BACK = "ray_node_back"  # judged gone, but the fresh read shows its Ray node alive
    RECORD_FAILED = "record_failed"  # the draining record was not written: nothing drained
    DRAIN_BACKING_OFF = "drain_backing_off"  # refused lately; retried on change or after a wait
    # Built to an older spec (numOfHosts lowered since): serves on, never preempted for it,
    # removed first once idle.
    OUTDATED = "outdated"
    # The deletion gate (core/planner/gate.py) dropped a deletion a planner path made: a pod whose
    # Ray node is neither drained now, nor DEAD, nor long gone. Non-zero means a planner bug.
    # Unneeded, but launched for a slice reservation (ray.util.tpu) seen within the grace
    # (KUBERAY_SCALER_RESERVATION_GRACE_S): kept so the next reservation finds it.
    RESERVATION_GRACE = "reservation_grace"
    # Idle, but a pending placement group (a gang) waits for the rest of its slices here, not
    # yet past its deadline (or elastic): kept for it (planner/gang_deadline.py).
    GANG_WAITING = "gang_waiting"
    GATE_NOT_DRAINED = "gate_not_drained"  # a live Ray node of the pod was not drained now
    GATE_ABSENT = "gate_absent"  # no Ray node, but not absent for the whole grace yet
    GATE_RAY_UNKNOWN = "gate_ray_unknown"  # Ray's view unknown: no running pod may go
    GATE_POD_UNKNOWN = "gate_pod_unknown"  # a pod the cache does not know
    # The pod cache shows another pod of that name (a new uid) than the one planned for.
    GATE_POD_REPLACED = "gate_pod_replaced"


@dataclass(frozen=True)
class Keep:
    kind: KeepKind
    count: int = 1
    slice: str | None = None
    min_replicas: int = 0
    detail: str = ""

    def __str__(self) -> str:
        if self.kind is KeepKind.MIN_REPLICAS:
            return f"{self.count} idle slice(s) kept: minReplicas {self.min_replicas}"
        if self.kind is KeepKind.DRAIN_REFUSED:
            return f"keep slice {self.slice}: drain refused" + (
                f" ({self.detail})" if self.detail else ""
            )
        if self.kind is KeepKind.GANG_WAITING:
            return f"{self.count} idle slice(s) kept for a gang: {self.detail}"
        if self.kind is KeepKind.BROKEN_BUT_BUSY:
            return f"keep broken slice {self.slice}: Ray nodes still busy ({self.detail})"
        if self.kind in _KEEP_SLICE_TEXT:
            text = f"keep slice {self.slice}: {_KEEP_SLICE_TEXT[self.kind]}"
            return text + (f" ({self.detail})" if self.detail else "")
        return f"{self.count} broken slice(s) left for now: backing off ({self.detail})"


_KEEP_SLICE_TEXT = {
    KeepKind.ABSENT_FROM_RAY: "Ray node absent, not yet for the whole grace",
    KeepKind.RESERVATION_GRACE: "slice reservations of its group seen within the grace",
    KeepKind.NO_LONGER_IDLE: "no longer idle in a fresh GCS read",
    KeepKind.DRAIN_NOT_SENT: "no fresh GCS read before draining or deleting",
    KeepKind.RAY_NODE_BACK: "its Ray node is back in a fresh GCS read",
    KeepKind.RECORD_FAILED: "the draining record could not be written",
    KeepKind.DRAIN_BACKING_OFF: "its drain was refused lately; retried on change or later",
    KeepKind.OUTDATED: "built to an older spec; serves until idle, then removed first",
    KeepKind.GATE_NOT_DRAINED: "deletion gate: a live Ray node was not drained",
    KeepKind.GATE_ABSENT: "deletion gate: Ray node absent, not yet for the whole grace",
    KeepKind.GATE_RAY_UNKNOWN: "deletion gate: Ray's view unknown",
    KeepKind.GATE_POD_UNKNOWN: "deletion gate: pod unknown",
    KeepKind.GATE_POD_REPLACED: "deletion gate: pod recreated since the plan (new uid)",
}
GATE_KINDS = frozenset(k for k in KeepKind if k.value.startswith("gate_"))


@dataclass(frozen=True)
class ClearWorkersToDelete:
    """Every pod named in workersToDelete is gone: the list is emptied."""

    count: int

    kind = "clear_workers_to_delete"

    def __str__(self) -> str:
        return (
            f"empty workersToDelete (the pods KubeRay was told to delete): all {self.count}"
            " are gone"
        )


@dataclass(frozen=True)
class RunsMinReplicas:
    """`replicas` is below `minReplicas`: KubeRay runs minReplicas, so the plan starts from (and
    writes) that, instead of a target below what runs."""

    replicas: int
    min_replicas: int

    kind = "replicas_below_min"  # also the decision's reason_code (GroupDecision)

    def __str__(self) -> str:
        return (
            f"replicas {self.replicas} below minReplicas {self.min_replicas}: KubeRay runs"
            f" {self.min_replicas}, planning from {self.min_replicas}"
        )


@dataclass(frozen=True)
class RunsMaxReplicas:
    """`replicas` is above `maxReplicas` while no more slices than that run: KubeRay runs at
    most maxReplicas (with autoscaling off it has deleted the surplus pods itself), so the plan
    writes that, as it does after removing surplus slices."""

    replicas: int
    max_replicas: int

    kind = "replicas_above_max"  # also the decision's reason_code (GroupDecision)

    def __str__(self) -> str:
        return (
            f"replicas {self.replicas} above maxReplicas {self.max_replicas}: KubeRay runs at"
            f" most {self.max_replicas}, writing {self.max_replicas}"
        )


class UnchangedKind(StrEnum):
    """Why a group's slices stay as they are (said for every group a plan leaves alone)."""

    NO_SLICES = "no_slices"  # nothing runs, none asked for, and no demand asks for this group
    AWAITING_PODS = "awaiting_pods"  # replicas asks for slices whose pods do not exist yet
    BUSY = "busy"  # some host of the slice runs work
    IDLE_BELOW_TIMEOUT = "idle_below_timeout"  # idle, not yet for the idle timeout
    NEEDED = "needed"  # idle, but pending demand or request_resources was placed on it
    KEPT = "kept"  # idle past the timeout but kept: minReplicas (see the Keep reason)
    PENDING = "pending"  # coming up
    QUEUED = "queued"  # held by a scheduling gate (Kueue): waiting for admission
    PARTIAL = "partial"  # fewer pods than numOfHosts (or unlabelled pods)
    BROKEN = "broken"  # broken, not replaced in this plan (see the Keep reason)
    TERMINATING = "terminating"  # being deleted already


@dataclass(frozen=True)
class Unchanged:
    """`count` slices of one kind that stay; `slice` is one of them, for the reader."""

    kind: UnchangedKind
    count: int = 0
    slice: str = ""
    idle_s: float = 0.0  # IDLE_BELOW_TIMEOUT: the longest idle among them
    timeout_s: float = 0.0
    detail: str = ""  # the slice map's reason for PENDING / PARTIAL / BROKEN / TERMINATING

    def __str__(self) -> str:
        example = f" (e.g. {self.slice}: {self.detail})" if self.detail else ""
        match self.kind:
            case UnchangedKind.NO_SLICES:
                return "no slices and none asked for: no pending demand needs this group"
            case UnchangedKind.AWAITING_PODS:
                return (
                    f"{self.count} slice(s) asked for (replicas) with no pods yet: KubeRay creates"
                    " them, and pending demand this group serves is counted on them before more"
                    " are asked for"
                )
            case UnchangedKind.BUSY:
                return f"{self.count} slice(s) busy{example}"
            case UnchangedKind.IDLE_BELOW_TIMEOUT:
                return (
                    f"{self.count} slice(s) idle below the timeout"
                    f" (longest {self.idle_s:.0f} s < {self.timeout_s:.0f} s)"
                )
            case UnchangedKind.NEEDED:
                return f"{self.count} idle slice(s) kept: pending demand fits on them"
            case UnchangedKind.KEPT:
                return f"{self.count} idle slice(s) kept: minReplicas"
            case _:
                return f"{self.count} slice(s) {self.kind.value}{example}"


class DisruptionKind(StrEnum):
    """The disruption rules (core/planner/disruption.py): why a voluntary removal waits, or
    what a slice that is going gets."""

    # A pod of the slice says karpenter.sh/do-not-disrupt=true or safe-to-evict=false.
    DO_NOT_DISRUPT = "do_not_disrupt"
    SCALE_DOWN_DELAY = "scale_down_delay"  # the group added a slice lately
    BUDGET = "disruption_budget"  # the group's budget of slices leaving at once is spent
    # Above maxReplicas a do-not-disrupt slice is removed anyway (last of its kind).
    ABOVE_MAX_DESPITE = "above_max_despite_do_not_disrupt"
    GOING = "disruption_target"  # a host is going (DisruptionTarget): drained, not deleted
    REPLACED_AHEAD = "replaced_ahead"  # a replacement slice launched for a going busy slice
    SPARE_KEPT = "spare_kept"  # an idle slice kept for the work of a going slice
    NO_ROOM = "no_room_for_replacement"  # a going busy slice, but the group is at maxReplicas
    # Drained for a disruption that did not happen: replaced whole once its deadline passes.
    ABANDONED = "disruption_abandoned"
    # A node of the slice announces GKE maintenance (detail names the window).
    MAINTENANCE = "maintenance"


@dataclass(frozen=True)
class Disruption:
    kind: DisruptionKind
    slice: str | None = None
    count: int = 1
    detail: str = ""  # the annotation, the condition's reason, the budget as written
    wait_s: float | None = None  # seconds until time alone changes it (delay end, a deadline)
    limit: int | None = None  # BUDGET: slices that may leave at once
    in_flight: int = 0  # BUDGET: slices of the group already leaving
    cause: str = "DisruptionTarget"  # what says the slice is going: the condition, maintenance

    def __str__(self) -> str:
        return _disruption_text(self)


def _disruption_text(d: Disruption) -> str:
    match d.kind:
        case DisruptionKind.DO_NOT_DISRUPT:
            return f"keep idle slice {d.slice}: a pod asks not to be disrupted ({d.detail})"
        case DisruptionKind.SCALE_DOWN_DELAY:
            return (
                f"{d.count} idle slice(s) kept: the group added a slice lately"
                f" (scale-down delay {d.detail}; {d.wait_s or 0:.0f} s left)"
            )
        case DisruptionKind.BUDGET:
            return (
                f"{d.count} idle slice(s) kept: disruption budget {d.detail} allows {d.limit}"
                f" slice(s) leaving at once, {d.in_flight} already leaving"
            )
        case DisruptionKind.ABOVE_MAX_DESPITE:
            return (
                f"slice {d.slice} leaves despite do-not-disrupt ({d.detail}): above maxReplicas,"
                " and the slices without the annotation are already chosen"
            )
        case DisruptionKind.GOING:
            return f"slice {d.slice} is going ({d.cause}: {d.detail})"
        case DisruptionKind.REPLACED_AHEAD:
            return (
                f"add a slice ahead for the work of going slice {d.slice} ({d.cause}: {d.detail})"
            )
        case DisruptionKind.SPARE_KEPT:
            return f"keep idle slice {d.slice}: it takes the work of a going slice ({d.detail})"
        case DisruptionKind.ABANDONED:
            return f"slice {d.slice} is no longer going (DisruptionTarget cleared): {d.detail}"
        case DisruptionKind.NO_ROOM:
            return f"no replacement for going slice {d.slice}: at maxReplicas ({d.detail})"
        case DisruptionKind.MAINTENANCE:
            return f"slice {d.slice} is on a node with upcoming maintenance: {d.detail}"


Reason = (
    ScaleUp
    | FellBack
    | Waiting
    | ScaleDown
    | Replace
    | Keep
    | ClearWorkersToDelete
    | RunsMinReplicas
    | RunsMaxReplicas
    | Hold
    | Unchanged
    | AvailabilityChange
    | Disruption
)


class ProblemKind(StrEnum):
    """Where a problem with the input was found."""

    SPEC = "spec"  # the RayCluster object
    POD = "pod"  # a pod that cannot be used
    SLICE_MAP = "slice_map"  # pods that do not add up to slices
    SHAPE = "shape"  # a group whose host resources cannot be worked out
    WAITS_ON_EXISTING_NODE = "waits_on_existing_node"  # demand only an existing node can serve
    RAY_STATE = "ray_state"  # the GCS reply cannot be used
    PLAN_FAILED = "plan_failed"  # planning one group raised: that group is skipped


@dataclass(frozen=True)
class PlanProblem:
    kind: ProblemKind
    message: str
    group: str | None = None
    demand: Demand | None = None  # WAITS_ON_EXISTING_NODE: what waits
    count: int = 0  # units of that demand

    def __str__(self) -> str:
        return f"group {self.group!r}: {self.message}" if self.group else self.message


class InfeasibleKind(StrEnum):
    """Why demand can never be served by this cluster."""

    NO_GROUP_OFFERS = "no_group_offers"  # no worker group's host fits the bundle
    NO_GROUP_OFFERS_BUNDLE = "no_group_offers_bundle"  # one bundle of a placement group
    NO_GROUP_OFFERS_PACKED = "no_group_offers_packed"  # STRICT_PACK: all bundles on one host


class Action(StrEnum):
    """What a group decision does to the RayCluster (metrics label, Event reason)."""

    SCALE_UP = "scale_up"
    SCALE_DOWN = "scale_down"
    REPLACE = "replace"
    CLEAR_WORKERS_TO_DELETE = "clear_workers_to_delete"
    NONE = "none"
