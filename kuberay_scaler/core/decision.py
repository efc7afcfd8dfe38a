"""decide(): one observation → the plan and every write it takes, in order. Pure.

The daemon executes the writes (loop/execute.py), the `plan` command prints them and
/debug/plan shows them; all three build them here, so they cannot disagree. The writes are:

1. `RecordIntent`: annotate the RayCluster with the slices about to be drained, so a restart in
   the middle finishes the scale-down instead of forgetting it;
2. one `Drain` per idle slice (every live raylet of its hosts, pinned to the GCS the plan was
   made from), one per broken slice being replaced whose hosts' Ray nodes are still alive (and
   idle: a busy broken slice is kept by the planner), and one per busy slice to drain for
   preemption (above maxReplicas, or broken and busy for too long; not deleted by this patch);
3. `Patch`: the guarded JSON patch (replicas, workersToDelete, the record cleared).

Every deletion passes the deletion gate (core/planner/gate.py) twice: here, with every drain assumed
accepted (so a slice it would refuse is never drained, and `plan` / /debug/plan show the patch
the daemon sends when Ray accepts), and in `after_drains`, with what the drains really did.
`drains_to_send` and `after_drains` are the rules the shell (loop/execute.py) applies around
the drains, pure and typed so `plan` and tests see them.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any

from kuberay_scaler.core.backoff import exponential_delay
from kuberay_scaler.core.defaults import DRAIN_DEADLINE_S, DRAIN_RETRY_S, MAX_DRAIN_RETRY_S
from kuberay_scaler.core.liveness import HostClock
from kuberay_scaler.core.model.cluster import ClusterSpec, Problem
from kuberay_scaler.core.model.hosts import Host
from kuberay_scaler.core.model.plan import (
    DeleteKind,
    Memory,
    Plan,
    RefusedDrain,
    SliceDeletion,
    Snapshot,
    shown,
    tick_of,
)
from kuberay_scaler.core.model.ray import RayObservation, RayState
from kuberay_scaler.core.model.reasons import (
    Hold,
    Keep,
    KeepKind,
    PlanProblem,
    ProblemKind,
    Reason,
    ScaleDown,
    ScaleDownKind,
)
from kuberay_scaler.core.model.signals import CapacityEvent, NodeMaintenance
from kuberay_scaler.core.parse.pods import parse_pods
from kuberay_scaler.core.parse.raycluster import parse_raycluster
from kuberay_scaler.core.patch.intent import clear_ops, read_draining, record_ops, with_record
from kuberay_scaler.core.patch.ops import Op, PatchError, build_patch
from kuberay_scaler.core.planner.core import Policy, plan
from kuberay_scaler.core.planner.gate import (
    Blocked,
    Evidence,
    SliceRef,
    evidence_for,
    gate,
    quiet,
    without,
)
from kuberay_scaler.core.planner.memo import FrameMemo


@dataclass(frozen=True)
class Observation:
    """Everything one reconcile decides from, read once."""

    raycluster: Mapping[str, Any]
    pods: Sequence[Any] = ()
    # Ray's state as last read, parsed; None, or a state of None: unknown or stale (it holds).
    gcs: RayObservation | None = None
    synced: bool = True  # pod cache and RayCluster view trustworthy
    # Groups whose last write is not observed yet → what is awaited (from the loop's expectations).
    awaiting_write: Mapping[str, str | Hold] = field(default_factory=lambda: MappingProxyType({}))
    clock: HostClock | None = None  # the daemon's own liveness memory; None: pod timestamps
    # `pods` already parsed (the daemon's PodCache, once per watch event); `pods` is then unused.
    parsed_pods: tuple[Sequence[Host], Sequence[Problem]] | None = None
    spec: ClusterSpec | None = None  # `raycluster` already parsed (the daemon parses it once)
    # Capacity news read from Events (empty where the Role cannot read them), oldest first.
    capacity_events: tuple[CapacityEvent, ...] = ()
    # GKE maintenance announced on nodes, node name → window (empty without the nodes
    # permission: deploy/node-maintenance).
    node_maintenance: Mapping[str, NodeMaintenance] = field(
        default_factory=lambda: MappingProxyType({})
    )


@dataclass(frozen=True)
class RecordIntent:
    """Annotate the RayCluster with the slices about to be drained (group → slice keys)."""

    draining: Mapping[str, tuple[str, ...]]
    ops: tuple[Op, ...]


@dataclass(frozen=True)
class Drain:
    """Drain every Ray node of one slice; the slice is deleted only if all accept."""

    group: str
    slice_key: str
    node_ids: tuple[str, ...]  # hex
    cluster_id: str | None  # the GCS the plan was made from
    deadline_ms: int  # epoch milliseconds
    message: str
    # Reason preemption: a busy slice above maxReplicas, deleted by a later plan once drained
    # or past `deadline_ms` (never by this decision's patch). Otherwise idle termination.
    preempt: bool = False
    # A broken slice being replaced: its live hosts are drained like idle ones.
    broken: bool = False
    pods: tuple[str, ...] = ()  # the slice's pods (the fresh read checks each one)


@dataclass(frozen=True)
class Patch:
    """The guarded JSON patch that applies the plan (opens with the uid guard)."""

    ops: tuple[Op, ...]


Write = RecordIntent | Drain | Patch


@dataclass(frozen=True)
class Decision:
    plan: Plan  # already past the gate, every drain assumed accepted (what `plan` shows)
    writes: tuple[Write, ...]
    raycluster: Mapping[str, Any]  # the object planned from (the patch's base)
    gcs: RayObservation | None = None
    error: str | None = None  # the plan no longer fits the object (replan)
    now: datetime | None = None  # when it was decided, wall clock (what Ray reads, people see)
    # ... and on the monotonic clock (`tick_of`): what deadlines and backoffs are judged by.
    tick: datetime | None = None
    evidence: Evidence | None = None  # what the deletion gate judges pods by
    # Deletions the gate dropped from the plan a planner path made: non-zero is a planner bug.
    blocked: tuple[Blocked, ...] = ()

    @property
    def drains(self) -> tuple[Drain, ...]:
        return tuple(w for w in self.writes if isinstance(w, Drain))

    @property
    def record(self) -> RecordIntent | None:
        return next((w for w in self.writes if isinstance(w, RecordIntent)), None)

    @property
    def patch(self) -> Patch | None:
        return next((w for w in self.writes if isinstance(w, Patch)), None)

    def document(self) -> dict[str, Any]:
        """The plan and its writes as `plan` prints them and /debug/plan shows them."""
        patch = self.patch
        return {
            **self.plan.summary(),
            "writes": [write_document(w) for w in self.writes],
            "patch": list(patch.ops) if patch else [],
            "deletions_blocked": [_blocked_doc(b) for b in self.blocked],
        }


@dataclass(frozen=True)
class LastRead:
    """What the shell read once every drain answered, right before the patch: the gate's
    evidence must be newer than every drain answer."""

    ray: RayState | None  # Ray's state then; None: the read failed (only the gate's (d) goes)
    uids: Mapping[str, str]  # the pod cache then: pod name → uid


@dataclass(frozen=True)
class DrainResults:
    """What happened to a decision's drains (the shell fills it in; `after_drains` judges it)."""

    accepted: frozenset[str] = frozenset()  # node ids (hex) whose drain was accepted now
    refused: Mapping[SliceRef, str] = field(default_factory=lambda: MappingProxyType({}))
    not_sent: Mapping[SliceRef, Keep] = field(default_factory=lambda: MappingProxyType({}))
    fresh: RayState | None = None  # the read made right before draining
    base: Mapping[str, Any] | None = None  # the RayCluster the record write left (its patch base)
    last: LastRead | None = None  # the read after the drains (None: `plan`'s assumed answers)

    @classmethod
    def assumed(cls, drains: Sequence[Drain]) -> DrainResults:
        """Every drain accepted: the patch `plan` and /debug/plan show."""
        return cls(accepted=frozenset(n for d in drains if not d.preempt for n in d.node_ids))


@dataclass(frozen=True)
class Writes:
    """The patch to send once the drains answered, and what was decided on the way."""

    plan: Plan  # as carried out: kept slices put back, each with its typed reason
    patch: Patch | None
    drains: tuple[Drain, ...] = ()  # follow-up preemption drains (partly drained slices)
    blocked: tuple[Blocked, ...] = ()  # dropped by the deletion gate


def decide(
    observed: Observation,
    memory: Memory,
    policy: Policy,
    now: datetime,
    drain_deadline_s: float = DRAIN_DEADLINE_S,
    *,
    mono_s: float | None = None,
    memo: FrameMemo | None = None,
) -> Decision:
    """Plan from `observed` at `now` (wall clock) and `mono_s` (monotonic: every timer that
    licenses a deletion; None: `now` stands in) and list the writes that carry the plan out.
    `memo`: the caller's frame memo, carried across its frames (None: a cold one); the
    decision is the same either way."""
    tick = tick_of(mono_s, now)
    raw = observed.raycluster
    spec = observed.spec if observed.spec is not None else parse_raycluster(raw)
    if observed.parsed_pods is not None:
        hosts, pod_problems = observed.parsed_pods
    else:
        hosts, pod_problems = parse_pods(list(observed.pods), spec)
    ray, ray_problem = _ray_state(observed.gcs)
    # One liveness clock and one gate evidence per frame: the slice map, the planner's deletion
    # paths and the gate below all judge by the same ones (without a daemon clock, one built
    # from the pods' timestamps, as each of them would build it).
    clock = observed.clock
    if clock is None:
        clock = HostClock.from_timestamps(hosts, ray.node_by_instance() if ray else {}, now)
    snapshot = Snapshot(spec, tuple(hosts), observed.synced, tuple(pod_problems), clock)
    memory = replace(
        memory,
        awaiting_write=MappingProxyType(dict(observed.awaiting_write)),
        draining=MappingProxyType(read_draining(raw)),
    )
    grace_s = policy.timeouts.missing_node_grace_s
    ev = evidence_for(snapshot.hosts, ray, clock, grace_s, now, memory.preempting)
    events = observed.capacity_events
    nodes = observed.node_maintenance
    result = plan(
        snapshot,
        ray,
        memory,
        policy,
        now,
        ev,
        mono_s=mono_s,
        events=events,
        maintenance=nodes,
        memo=memo,
    )
    if ray_problem is not None:
        result = replace(result, problems=(*result.problems, ray_problem))
    # The gate also honours deadlines this plan set (preemptions it starts).
    deadlines = {**memory.preempting, **result.memory.preempting}
    ev = replace(ev, deadlines=MappingProxyType(deadlines))
    try:
        result, writes, blocked = writes_for(
            raw, result, observed.gcs, now, drain_deadline_s, ev, tick=tick
        )
    except PatchError as err:
        return Decision(
            result, (), raw, observed.gcs, error=str(err), now=now, tick=tick, evidence=ev
        )
    return Decision(
        result, writes, raw, observed.gcs, now=now, tick=tick, evidence=ev, blocked=blocked
    )


def writes_for(
    raw: Mapping[str, Any],
    result: Plan,
    gcs: RayObservation | None,
    now: datetime,
    drain_deadline_s: float,
    ev: Evidence,
    *,
    tick: datetime | None = None,
) -> tuple[Plan, tuple[Write, ...], tuple[Blocked, ...]]:
    """The plan past the gate, and its record → drains → patch; raises PatchError. `now` is
    the wall clock (the drain deadlines Ray reads), `tick` the monotonic one (`tick_of`).

    The gate runs before any drain is sent (every drain assumed accepted): a slice it would
    refuse is not drained at all, so no host of it exits for nothing.
    """
    if not result.changes:
        stale = _stale_record(raw, result)
        return result, ((Patch(tuple(stale)),) if stale else ()), ()
    tick = tick or now
    cluster_id = gcs.cluster_id if gcs else None
    deadline_ms = int((now.timestamp() + drain_deadline_s) * 1000)
    drains = _drains(result, cluster_id, deadline_ms, ev, tick)
    result, blocked = gate(result, ev, DrainResults.assumed(drains).accepted, tick)
    kept = {(x.group, x.slice_key) for x in _drained_first_deletions(result)}
    drains = [d for d in drains if (d.group, d.slice_key) in kept]
    draining = _slices_to_drain(result, ev, tick)
    writes: list[Write] = []
    base = raw
    if draining and not _recorded(raw, draining):
        writes.append(
            RecordIntent(
                draining=MappingProxyType({g: tuple(keys) for g, keys in draining.items()}),
                ops=tuple(record_ops(raw, draining)),
            )
        )
        base = with_record(raw, draining)
    writes += drains
    writes += _preemptions(result, cluster_id, tick, now)
    ops = _patch_ops(base, result)
    if ops:
        writes.append(Patch(tuple(ops)))
    return result, tuple(writes), blocked


def drains_to_send(
    decision: Decision, fresh: RayState | None, cluster_id: str | None
) -> tuple[tuple[Drain, ...], dict[SliceRef, Keep]]:
    """The drains to send given a fresh GCS read made right before (None: it failed), and the
    slices kept, each with why. Idle-termination drains need the fresh read: a host turned busy
    (or gone, or another GCS) keeps its slice whole, undrained. Preemption drains go regardless
    (Ray moves the work). A deletion with nothing to drain is kept if the read shows one of its
    Ray nodes back (or cannot be made)."""
    send: list[Drain] = []
    kept: dict[SliceRef, Keep] = {}
    idle_now = {n.node_id for n in fresh.nodes if quiet(n)} if fresh is not None else set()
    busy_now = fresh.node_by_instance() if fresh is not None else {}
    for d in decision.drains:
        ref = (d.group, d.slice_key)
        if d.preempt:
            send.append(d)
        elif fresh is None:
            kept[ref] = Keep(KeepKind.DRAIN_NOT_SENT, slice=d.slice_key)
        elif d.cluster_id != cluster_id:
            kept[ref] = Keep(KeepKind.NO_LONGER_IDLE, slice=d.slice_key, detail="another GCS")
        elif not set(d.node_ids) <= idle_now or any(
            p in busy_now and busy_now[p].node_id not in d.node_ids for p in d.pods
        ):
            busy = sorted(p for p in d.pods if p in busy_now and not quiet(busy_now[p]))
            detail = f"busy or gone: {', '.join(busy) or 'a host'}"
            kept[ref] = Keep(KeepKind.NO_LONGER_IDLE, slice=d.slice_key, detail=detail)
        else:
            send.append(d)
    kept.update(_back_in_ray(decision, fresh))
    return tuple(send), kept


def _back_in_ray(decision: Decision, fresh: RayState | None) -> dict[SliceRef, Keep]:
    """Deletions with nothing to drain (hosts DEAD or long absent) confirmed by the fresh read:
    a Ray node that is back keeps its slice (never deleted over a node just seen alive)."""
    drained = {(d.group, d.slice_key) for d in decision.drains}
    deadlines = decision.evidence.deadlines if decision.evidence else {}
    now = decision.tick or decision.now or _NEVER
    alive = fresh.node_by_instance() if fresh is not None else {}
    kept: dict[SliceRef, Keep] = {}
    for g in decision.plan.groups:
        for x in g.deletions:
            ref = (g.group, x.slice_key)
            deadline = deadlines.get(x.slice_key)
            if ref in drained or (deadline is not None and deadline <= now):
                continue
            if fresh is None:
                kept[ref] = Keep(KeepKind.DRAIN_NOT_SENT, slice=x.slice_key)
            elif back := [p for p in x.pods if p in alive]:
                kept[ref] = Keep(KeepKind.RAY_NODE_BACK, slice=x.slice_key, detail=back[0])
    return kept


def after_drains(decision: Decision, results: DrainResults) -> Writes:
    """The patch once the drains answered, decided here so `plan` and tests see every rule:

    - a slice not drained (`results.not_sent`, e.g. Keep(NO_LONGER_IDLE)) is kept whole;
    - a slice no host of which accepted is kept whole (Keep(DRAIN_REFUSED)) and its drain is
      retried only once its idle state changes or a backoff passes (Memory.refused);
    - a slice some hosts of which accepted is partly drained (ScaleDown(PARTLY_DRAINED)): those
      raylets exit, so it can no longer run slice-wide work; its refusing hosts are drained for
      preemption with the drain deadline and the slice leaves whole once it passes (gate (d)),
      through the broken-slice path; never deleted over a refusing host now;
    - then the deletion gate, with what was really accepted, judged by `results.last` (the read
      after every drain answered): a pod with a live Ray node not drained now, or recreated
      since the plan, keeps its slice (Keep(GATE_...)).

    Raises PatchError when the plan no longer fits `results.base`.
    """
    now = decision.tick or decision.now or _NEVER  # the monotonic clock: timers, deadlines
    wall = decision.now or _NEVER
    result = decision.plan
    dropped: dict[SliceRef, Reason] = dict(results.not_sent)
    follow: list[Drain] = []
    preempting = dict(result.memory.preempting)
    refused = dict(result.memory.refused)
    for d in decision.drains:
        ref = (d.group, d.slice_key)
        if d.preempt or ref in dropped:
            if ref in results.not_sent:
                refused[d.slice_key] = _refused(decision, d, now)
            continue
        why = results.refused.get(ref)
        if why is None:
            refused.pop(d.slice_key, None)
            continue
        took = set(d.node_ids) & results.accepted
        if not took:
            dropped[ref] = Keep(KeepKind.DRAIN_REFUSED, slice=d.slice_key, detail=why)
            refused[d.slice_key] = _refused(decision, d, now)
            continue
        deadline = datetime.fromtimestamp(d.deadline_ms / 1000, UTC)  # what Ray was told
        preempting[d.slice_key] = shown(deadline, wall, now)  # the same instant, monotonic
        dropped[ref] = ScaleDown(
            ScaleDownKind.PARTLY_DRAINED, d.slice_key, len(d.pods), deadline=deadline
        )
        rest = tuple(n for n in d.node_ids if n not in results.accepted)
        follow.append(replace(d, node_ids=rest, preempt=True, message=_partial_message(d, why)))
    result = without(result, dropped)
    memory = replace(
        result.memory,
        preempting=MappingProxyType(preempting),
        refused=MappingProxyType(refused),
    )
    result = replace(result, memory=memory, deadline_s=_sooner(result.deadline_s, memory, now))
    ev = decision.evidence
    if ev is not None:
        judged = ev.with_fresh(results.fresh)
        if results.last is not None:
            judged = judged.after(results.last.ray, results.last.uids)
        result, blocked = gate(result, judged, results.accepted, now)
    else:
        blocked = ()
    base = results.base if results.base is not None else decision.raycluster
    ops = build_patch(base, result)
    if ops or not any(k in refused for keys in read_draining(base).values() for k in keys):
        ops += clear_ops(base)  # a record of a slice backing off stays: no rewrite on retry
    return Writes(result, Patch(tuple(ops)) if ops else None, tuple(follow), blocked)


def _sooner(deadline_s: float | None, memory: Memory, tick: datetime) -> float | None:
    """The plan's first deadline, with the ones set after the drains (a partly drained slice's
    notice, a refused drain's backoff): each is a wake-up too."""
    ends = [*memory.preempting.values(), *(r.until for r in memory.refused.values())]
    ahead = [s for s in ((e - tick).total_seconds() for e in ends) if s > 0]
    waits = [*ahead, *([deadline_s] if deadline_s is not None else [])]
    return min(waits) if waits else None


def patch_after_drains(
    decision: Decision, refused: Collection[tuple[str, str]], base: Mapping[str, Any]
) -> tuple[Plan, Patch | None]:
    """The plan and patch once some drains were refused outright (no host accepted): those
    slices stay, targets go back. `after_drains` is the full rule; this is its simple case."""
    drains = [d for d in decision.drains if not d.preempt]
    accepted = frozenset(
        n for d in drains if (d.group, d.slice_key) not in refused for n in d.node_ids
    )
    results = DrainResults(
        accepted=accepted,
        refused=MappingProxyType({ref: "refused" for ref in refused}),
        base=base,
    )
    writes = after_drains(decision, results)
    return writes.plan, writes.patch


def write_document(write: Write) -> dict[str, Any]:
    if isinstance(write, RecordIntent):
        return {
            "write": "record_intent",
            "draining": {g: list(k) for g, k in write.draining.items()},
            "ops": list(write.ops),
        }
    if isinstance(write, Drain):
        return {
            "write": "drain",
            "group": write.group,
            "slice": write.slice_key,
            "node_ids": list(write.node_ids),
            "cluster_id": write.cluster_id,
            "reason": "preemption" if write.preempt else "idle_termination",
            "deadline_ms": write.deadline_ms,
            "message": write.message,
        }
    return {"write": "patch", "ops": list(write.ops)}


def _ray_state(gcs: RayObservation | None) -> tuple[RayState | None, PlanProblem | None]:
    if gcs is None or gcs.state is not None or not gcs.unusable:
        return (gcs.state if gcs else None), None
    return None, PlanProblem(ProblemKind.RAY_STATE, gcs.error or "unusable GCS reply")


# Deletions whose joined hosts are drained (idle termination) before the patch, all or nothing.
DRAINED_FIRST = (DeleteKind.IDLE, DeleteKind.SURPLUS)


def _drained_first(x: SliceDeletion) -> bool:
    # A replaced broken slice is drained too when some host's Ray node is alive (the planner
    # keeps it if any is busy, so those are idle); hosts with no Ray node need no drain.
    return x.kind in DRAINED_FIRST or (x.kind is DeleteKind.REPLACE and bool(x.node_ids))


@dataclass(frozen=True)
class _Ref:
    group: str
    slice_key: str
    deletion: SliceDeletion


def _drained_first_deletions(result: Plan) -> list[_Ref]:
    return [
        _Ref(d.group, x.slice_key, x)
        for d in result.groups
        for x in d.deletions
        if _drained_first(x)
    ]


def _slices_to_drain(result: Plan, ev: Evidence, now: datetime) -> dict[str, list[str]]:
    """Slices to record as draining; one whose notice is over gets no drain, so no record."""
    out: dict[str, list[str]] = {}
    for ref in _drained_first_deletions(result):
        if not _notice_over(ref.deletion, ev, now):
            out.setdefault(ref.group, []).append(ref.slice_key)
    return out


def _notice_over(x: SliceDeletion, ev: Evidence, now: datetime) -> bool:
    """Its preemption notice is over (the gate's (d)): deleted without another drain."""
    deadline = ev.deadlines.get(x.slice_key)
    return deadline is not None and deadline <= now


def _recorded(raw: Mapping[str, Any], draining: Mapping[str, list[str]]) -> bool:
    """The object already records every slice about to be drained: never rewrite it."""
    held = read_draining(raw)
    return all(set(keys) <= set(held.get(g, ())) for g, keys in draining.items())


# A decision made without a time (a hand-built one in tests): no deadline counts as passed.
_NEVER = datetime.min.replace(tzinfo=UTC)


def _stale_record(raw: Mapping[str, Any], result: Plan) -> list[Op]:
    """Clear a draining record none of whose slices this plan finishes because they turned busy
    or are gone; kept while one may still be finished (its hosts absent, not yet for the
    grace), is backing off from a refused drain (so a retry never rewrites it), or while Ray's
    view is unknown (a blind daemon writes nothing)."""
    recorded = read_draining(raw)
    if not recorded or result.held is not None or result.slice_map is None:
        return []
    if any(k in result.memory.refused for keys in recorded.values() for k in keys):
        return []
    slices = {(g, s.key): s for g, gs in result.slice_map.groups.items() for s in gs.slices}
    waiting = [
        slices[(g, k)]
        for g, keys in recorded.items()
        for k in keys
        if (g, k) in slices and not slices[(g, k)].working_hosts
    ]
    return [] if waiting else clear_ops(raw)  # a slice still to finish keeps its record


def _preemptions(
    result: Plan, cluster_id: str | None, tick: datetime, now: datetime
) -> list[Drain]:
    """Busy slices to drain for preemption, with the deadline the planner keeps for them (on the
    monotonic clock; Ray is told it on the wall clock)."""
    return [
        Drain(
            group=d.group,
            slice_key=x.slice_key,
            node_ids=x.node_ids,
            cluster_id=cluster_id,
            deadline_ms=int(
                shown(result.memory.preempting[x.slice_key], tick, now).timestamp() * 1000
            ),
            message=f"kuberay-scaler: {x.reason}",
            preempt=True,
            pods=x.pods,
        )
        for d in result.groups
        for x in d.preempt
        if x.node_ids
    ]


def _drains(
    result: Plan, cluster_id: str | None, deadline_ms: int, ev: Evidence, now: datetime
) -> list[Drain]:
    out = []
    for ref in _drained_first_deletions(result):
        x = ref.deletion
        if _notice_over(x, ev, now):
            # An idle-termination drain here would find it busy and keep it, forever.
            continue
        node_ids = ev.alive_node_ids(x.pods)  # every live raylet of the pods, duplicates too
        if not node_ids:
            continue
        out.append(
            Drain(
                group=ref.group,
                slice_key=x.slice_key,
                node_ids=node_ids,
                cluster_id=cluster_id,
                deadline_ms=deadline_ms,
                message=_drain_message(x),
                broken=x.kind is DeleteKind.REPLACE,
                pods=x.pods,
            )
        )
    return out


def _drain_message(x: SliceDeletion) -> str:
    if x.kind is DeleteKind.REPLACE:
        return f"kuberay-scaler: slice {x.slice_key} broken, replaced: {x.reason}"
    return f"kuberay-scaler: slice {x.slice_key} idle"


def _partial_message(d: Drain, why: str) -> str:
    return f"kuberay-scaler: slice {d.slice_key} partly drained ({why}): its other hosts exited"


def _refused(decision: Decision, d: Drain, now: datetime) -> RefusedDrain:
    """The backoff entry of a slice whose drain no host accepted (or that was not sent)."""
    before = decision.plan.memory.refused.get(d.slice_key)
    failures = (before.failures if before else 0) + 1
    wait = exponential_delay(failures - 1, DRAIN_RETRY_S, MAX_DRAIN_RETRY_S)
    ev = decision.evidence
    since = {
        n.node_id: n.idle_since_ms
        for pod in d.pods
        for n in (ev.entries.get(pod, ()) if ev else ())
        if n.idle and n.idle_since_ms is not None
    }
    return RefusedDrain(now + timedelta(seconds=wait), MappingProxyType(since), failures)


def _blocked_doc(b: Blocked) -> dict[str, Any]:
    return {
        "group": b.group,
        "slice": b.slice_key,
        "pod": b.pod,
        "kind": b.kind.value,
        "path": b.path,
    }


def _patch_ops(base: Mapping[str, Any], result: Plan) -> list[Op]:
    # The record goes with the patch that deletes its slices (or with their drains refused).
    return build_patch(base, result) + clear_ops(base)
