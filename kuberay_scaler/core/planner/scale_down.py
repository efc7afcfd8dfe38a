"""Scale-down: idle slices leave (longest idle first, never below minReplicas), and drains a
previous run recorded are finished. Above maxReplicas: surplus.py."""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass, replace

from kuberay_scaler.core.model.cluster import DEFAULT_IDLE_TIMEOUT_S, ClusterSpec, WorkerGroup
from kuberay_scaler.core.model.plan import (
    At,
    DeleteKind,
    GroupDecision,
    Plan,
    RefusedDrain,
    SliceDeletion,
)
from kuberay_scaler.core.model.reasons import (
    Keep,
    KeepKind,
    Reason,
    Replace,
    ScaleDown,
    ScaleDownKind,
)
from kuberay_scaler.core.model.slices import GroupSlices, Slice, SliceState
from kuberay_scaler.core.planner.gate import Evidence, gone_from_ray

SliceRef = tuple[str | None, str | None]  # (group, slice key) of a bin demand uses


@dataclass(frozen=True)
class IdleDeletions:
    """One group's idle stage: the idle slices that leave, and why (kept ones too)."""

    deletions: tuple[SliceDeletion, ...] = ()
    reasons: tuple[Reason, ...] = ()


def idle_deletions(
    slices: GroupSlices,
    keep_at_least: int,
    needed: Set[SliceRef],
    timeout_s: float,
    refused: Mapping[str, RefusedDrain] | None = None,
    at: At | None = None,
) -> IdleDeletions:
    """Idle slices past `timeout_s` that demand does not use, while more than `keep_at_least`
    replicas (after this plan's additions) stay. A slice whose drain was refused lately waits
    (`drain_backing_off`).

    Idle age is read on the monotonic clock (`at.mono_ms`), the clock the daemon stamps GCS
    replies on: Ray's own idle duration plus the monotonic time since the reply, so no
    wall-clock step makes a slice idle-expired early."""
    if at is None:
        return IdleDeletions()
    idle = _expired(slices, needed, timeout_s, at.mono_ms)
    reasons: list[Reason] = []
    if refused and idle:  # in slice order, as their reasons are said
        order = {s.key: i for i, s in enumerate(slices.slices)}
        idle.sort(key=lambda pair: order[pair[1].key])
        waits = [(ms, sl, drain_backing_off(sl, refused, at)) for ms, sl in idle]
        reasons += [w for _, _, w in waits if w is not None]
        idle = [(ms, sl) for ms, sl, w in waits if w is None]
    # Outdated slices first (built to an older spec), then longest idle; ties (clamped at 0)
    # by key.
    idle.sort(key=lambda pair: (pair[1].state is not SliceState.OUTDATED, -pair[0], pair[1].key))
    chosen = idle[: max(0, keep_at_least)]
    if len(chosen) < len(idle):
        floor = slices.group.min_replicas
        reasons.append(Keep(KeepKind.MIN_REPLICAS, len(idle) - len(chosen), min_replicas=floor))
    whys = [
        ScaleDown(ScaleDownKind.IDLE, sl.key, len(sl.hosts), idle_ms / 1000, timeout_s)
        for idle_ms, sl in chosen
    ]
    out = tuple(
        deletion(sl, DeleteKind.IDLE, why) for (_, sl), why in zip(chosen, whys, strict=True)
    )
    return IdleDeletions(out, (*reasons, *whys))


def _expired(
    slices: GroupSlices, needed: Set[SliceRef], timeout_s: float, now_ms: int
) -> list[tuple[int, Slice]]:
    """Idle slices past the timeout that demand does not use, with their idle age."""
    idle: list[tuple[int, Slice]] = []
    # Longest idle first; past the first one below the timeout, all the others are too.
    for since, key, sl in slices.idle_by_since:
        idle_ms = max(0, now_ms - since)
        if idle_ms < timeout_s * 1000:
            break
        if (slices.group.name, key) not in needed:
            idle.append((idle_ms, sl))
    return idle


def outdated_kept(slices: GroupSlices, leaving: list[SliceDeletion]) -> tuple[Keep, ...]:
    """One Keep(OUTDATED) per slice built to an older spec that stays: the edit named in the
    plan's reasons at once, not only when the slice leaves."""
    gone = {x.slice_key for x in leaving}
    return tuple(
        Keep(
            KeepKind.OUTDATED,
            slice=sl.key,
            detail=f"{len(sl.hosts)} hosts, numOfHosts {sl.expected_hosts} now",
        )
        for sl in slices.by_state(SliceState.OUTDATED)
        if sl.key not in gone
    )


def drain_backing_off(
    sl: Slice,
    refused: Mapping[str, RefusedDrain],
    at: At,
) -> Keep | None:
    """The slice's drain was refused lately and nothing about its idleness changed since: wait
    (this Keep(DRAIN_BACKING_OFF)) instead of draining it again every round; None: drain."""
    entry = refused.get(sl.key)
    if entry is None or entry.until <= at.mono_s:
        return None
    since = {n.node_id: n.idle_since_ms if n.idle else None for n in sl.nodes.values()}
    if set(since) != set(entry.idle_since_ms):
        return None  # other raylets now: a new situation
    if any(s is None or s > entry.idle_since_ms[n] for n, s in since.items()):
        return None  # idle since later (or busy now): the host was busy since
    detail = f"{entry.failures} refused round(s); next try by {at.shown(entry.until).isoformat()}"
    return Keep(KeepKind.DRAIN_BACKING_OFF, slice=sl.key, detail=detail)


def idle_timeout(group: WorkerGroup, spec: ClusterSpec, override_s: float | None) -> float:
    """The daemon's override, else the group's, else the cluster's, else KubeRay's default."""
    for candidate in (override_s, group.idle_timeout_s, spec.autoscaler.idle_timeout_s):
        if candidate is not None:
            return candidate
    return DEFAULT_IDLE_TIMEOUT_S


def deletion(sl: Slice, kind: DeleteKind, why: ScaleDown | Replace) -> SliceDeletion:
    return SliceDeletion(
        slice_key=sl.key, pods=sl.pod_names, node_ids=sl.node_ids, kind=kind, reason=why
    )


def finish_recorded_drains(
    result: Plan,
    draining: Mapping[str, tuple[str, ...]],
    ev: Evidence | None = None,
    at: At | None = None,
) -> Plan:
    """Add a deletion for every recorded slice that still exists, is not yet being deleted and
    whose every host is idle in Ray or gone from it (`gone_from_ray`): a host that turned busy,
    or that is merely absent from a reply (a GCS restart, a partial reply), keeps the slice."""
    if not draining or result.slice_map is None or result.held:
        return result
    groups = tuple(_finish(d, result, draining.get(d.group, ()), ev, at) for d in result.groups)
    return replace(result, groups=groups)


def _finish(
    d: GroupDecision,
    result: Plan,
    keys: tuple[str, ...],
    ev: Evidence | None,
    at: At | None,
) -> GroupDecision:
    assert result.slice_map is not None
    gs = result.slice_map.groups.get(d.group)
    if not keys or gs is None or d.held:
        return d
    d = _replaced_as_recorded(d, keys, gs.group.min_replicas)
    planned = {x.slice_key for x in (*d.deletions, *d.preempt)}
    extra = [
        deletion(sl, DeleteKind.IDLE, ScaleDown(ScaleDownKind.RECORDED_DRAIN, sl.key))
        for sl in gs.slices
        if sl.key in keys
        and sl.key not in planned
        and sl.state is not SliceState.TERMINATING
        and _idle_or_gone(sl, ev)
        and not (at and drain_backing_off(sl, result.memory.refused, at) is not None)
    ]
    if not extra:
        return d
    floor = gs.group.min_replicas
    base = d.target if d.target != d.current or d.deletions else gs.group.effective_replicas
    return replace(
        d,
        deletions=(*d.deletions, *extra),
        target=max(floor, base - len(extra)),
        reasons=(*d.reasons, *(x.reason for x in extra)),
    )


def _replaced_as_recorded(d: GroupDecision, keys: tuple[str, ...], floor: int) -> GroupDecision:
    """A recorded slice that turned broken is finished as the scale-down it was (replicas go
    down), not replaced (which would have KubeRay create it again)."""
    turned = [x for x in d.deletions if x.kind is DeleteKind.REPLACE and x.slice_key in keys]
    if not turned:
        return d
    finished = tuple(
        replace(
            x, kind=DeleteKind.IDLE, reason=ScaleDown(ScaleDownKind.RECORDED_DRAIN, x.slice_key)
        )
        if x in turned
        else x
        for x in d.deletions
    )
    base = d.target if d.target != d.current or d.deletions else d.current
    return replace(
        d,
        deletions=finished,
        target=max(floor, base - len(turned)),
        reasons=(
            *d.reasons,
            *(ScaleDown(ScaleDownKind.RECORDED_DRAIN, x.slice_key) for x in turned),
        ),
    )


def _idle_or_gone(sl: Slice, ev: Evidence | None) -> bool:
    """Every host's Ray node is idle, or it has none and needs no drain (the gate's (b)/(c)):
    a record never finishes a deletion over running work nor over a node merely not seen."""
    for host in sl.hosts:
        node = sl.nodes.get(host.pod_name)
        if node is not None:
            if not node.idle:
                return False
        elif ev is None or not gone_from_ray(host, ev):
            return False
    return True
