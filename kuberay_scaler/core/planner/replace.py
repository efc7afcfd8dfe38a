"""Replacement of broken slices: deleted as a unit, at most once per backoff period per group."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from kuberay_scaler.core.backoff import exponential_delay
from kuberay_scaler.core.model.plan import At, DeleteKind, ReplaceBackoff, SliceDeletion
from kuberay_scaler.core.model.reasons import Keep, KeepKind, Reason, Replace
from kuberay_scaler.core.model.slices import GroupSlices, Slice, SliceState
from kuberay_scaler.core.planner.gate import Evidence, gone_from_ray
from kuberay_scaler.core.planner.scale_down import deletion

# Backoff entries are kept this long after they end (their failure count sets the next wait).
FORGET_AFTER_S = 3600.0


def backing_off(backoff: Mapping[str, ReplaceBackoff], group: str, mono_s: float) -> bool:
    current = backoff.get(group)
    return current is not None and current.until > mono_s


@dataclass(frozen=True)
class BrokenBusy:
    """Broken slices kept because a host is busy: bounded ("broken but busy").

    Each is kept at most `max_s` (KUBERAY_SCALER_BROKEN_BUSY_MAX_S) from when a plan first
    kept it; then its live hosts are drained for preemption with `deadline_s` (PREEMPT_DEADLINE_S)
    so Ray moves the work, and once that deadline passes the slice is replaced whole (the
    gate's (d)). On KubeRay < 1.6, which does not replace a multi-host replica itself, this is
    what frees the accelerators of a slice that can never be whole again.
    """

    max_s: float
    deadline_s: float
    since: Mapping[str, float] = field(default_factory=dict)  # from the last plan
    preempting: Mapping[str, float] = field(default_factory=dict)  # deadlines known
    # Broken slices a gang waits on (planner/stuck_gangs.py): slice key → why; not kept busy.
    stuck: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Replaced:
    """One group's replacement stage: what it deletes and drains, why, and its memory delta."""

    deletions: tuple[SliceDeletion, ...] = ()
    reasons: tuple[Reason, ...] = ()
    preempt: tuple[SliceDeletion, ...] = ()  # drain now, replace later
    # Memory delta: broken-busy slices kept (slice key → since), their preemption deadlines,
    # and the group's new replace backoff (None: unchanged).
    broken_busy_since: Mapping[str, float] = field(default_factory=dict)
    preempting: Mapping[str, float] = field(default_factory=dict)
    backoff: ReplaceBackoff | None = None


@dataclass(frozen=True)
class _Kept:
    """One broken slice kept busy this plan: why, and what that adds to memory."""

    key: str
    reason: Keep
    since: float | None = None  # first kept (broken-busy bound running; monotonic s)
    deadline: float | None = None  # drained for preemption until (monotonic s)
    preempt: SliceDeletion | None = None  # drain now, replace later


@dataclass(frozen=True)
class _Judged:
    """The group's broken slices judged: those to replace, those kept (in slice order)."""

    broken: tuple[Slice, ...]
    kept: tuple[_Kept, ...]
    reasons: tuple[Reason, ...]

    def result(
        self,
        deletions: tuple[SliceDeletion, ...] = (),
        reasons: tuple[Reason, ...] = (),
        backoff: ReplaceBackoff | None = None,
    ) -> Replaced:
        return Replaced(
            deletions=deletions,
            reasons=(*self.reasons, *reasons),
            preempt=tuple(k.preempt for k in self.kept if k.preempt is not None),
            broken_busy_since=MappingProxyType(
                {k.key: k.since for k in self.kept if k.since is not None}
            ),
            preempting=MappingProxyType(
                {k.key: k.deadline for k in self.kept if k.deadline is not None}
            ),
            backoff=backoff,
        )


def replacements(
    slices: GroupSlices,
    backoff: Mapping[str, ReplaceBackoff],
    initial_s: float,
    cap_s: float,
    at: At,
    busy: BrokenBusy | None = None,
    ev: Evidence | None = None,
) -> Replaced:
    """Delete every broken slice of the group unless it replaced some too recently.

    The backoff, the broken-busy bound and the preemption deadline all run on the monotonic
    clock (`at.mono_s`, seconds); reasons show them on the wall clock (`at.shown`).

    Each replacement round doubles the group's next wait (`initial_s`, capped at `cap_s`), so a
    slice that breaks again and again (a bad node pool, a crashing image) is not churned.
    `backoff` is read, never written: the group's new entry is `Replaced.backoff`.

    The first promise holds here too (docs/reliability.md, "Broken slices"): a broken slice any
    of whose hosts' Ray nodes is alive and not idle in this (fresh) GCS reply is kept
    (`KeepKind.BROKEN_BUT_BUSY`), for at most `BrokenBusy.max_s` (then drained for preemption
    and replaced once the deadline passes); one with a host whose Ray node is merely absent
    from the reply, not yet for the whole grace, is kept too (`KeepKind.ABSENT_FROM_RAY`). A
    replaced slice's hosts whose Ray nodes are alive (hence idle) keep their `node_ids` and are
    drained before the patch (decision.py); hosts without a Ray node need no drain.
    """
    judged = _judge_broken(slices, busy or BrokenBusy(max_s=float("inf"), deadline_s=0.0), at, ev)
    if not judged.broken:
        return judged.result()
    name = slices.group.name
    current = backoff.get(name)
    if current is not None and backing_off(backoff, name, at.mono_s):
        detail = f"replaced {current.replaced} broken slice(s)"
        return judged.result(
            reasons=(Keep(KeepKind.REPLACE_BACKING_OFF, len(judged.broken), detail=detail),)
        )
    failures = (current.failures if current else 0) + 1
    delay = exponential_delay(failures - 1, initial_s, cap_s)
    new = ReplaceBackoff(until=at.mono_s + delay, failures=failures, replaced=len(judged.broken))
    whys = tuple(Replace(sl.key, sl.fault, sl.reason) for sl in judged.broken)
    gone = tuple(
        deletion(sl, DeleteKind.REPLACE, why) for sl, why in zip(judged.broken, whys, strict=True)
    )
    return judged.result(gone, whys, new)


def _judge_broken(slices: GroupSlices, busy: BrokenBusy, at: At, ev: Evidence | None) -> _Judged:
    """Each broken slice: replaced, kept busy, or kept while a Ray node is absent."""
    broken: list[Slice] = []
    kept: list[_Kept] = []
    reasons: list[Reason] = []
    for sl in slices.by_state(SliceState.BROKEN):
        deadline = busy.preempting.get(sl.key)
        if deadline is not None and deadline <= at.mono_s:
            broken.append(replace(sl, nodes={}))  # drained for preemption, time up: no drain
        elif (held := _kept_busy(sl, busy, deadline, at)) is not None:
            kept.append(held)
            reasons.append(held.reason)
        elif (absent := _absent(sl, ev)) is not None:
            reasons.append(absent)
        else:
            broken.append(sl)
    return _Judged(tuple(broken), tuple(kept), tuple(reasons))


def _kept_busy(
    sl: Slice,
    busy: BrokenBusy,
    deadline: float | None,
    at: At,
) -> _Kept | None:
    working = sl.working_hosts
    if not working:
        return None
    share = f"{len(working)} of {len(sl.hosts)} hosts not idle in Ray; {sl.reason}"
    if deadline is not None:  # drained for preemption already: wait for its deadline
        until = at.shown(deadline).isoformat()
        detail = f"{share}; drained for preemption until {until}, then replaced"
        return _Kept(
            sl.key, Keep(KeepKind.BROKEN_BUT_BUSY, slice=sl.key, detail=detail), deadline=deadline
        )
    now = at.mono_s
    since = busy.since.get(sl.key, now)
    held_s = now - since
    stuck = busy.stuck.get(sl.key)
    if held_s < busy.max_s and stuck is None:
        detail = f"{share}; kept {held_s:.0f} s of at most {busy.max_s:.0f} s"
        return _Kept(
            sl.key, Keep(KeepKind.BROKEN_BUT_BUSY, slice=sl.key, detail=detail), since=since
        )
    deadline = now + busy.deadline_s
    kept_why = (
        stuck or f"busy for {held_s:.0f} s, the most a broken slice is kept ({busy.max_s:.0f} s)"
    )
    cause = (
        f"{sl.reason}; {kept_why}: live hosts drained for preemption until"
        f" {at.shown(deadline).isoformat()}, then replaced whole"
    )
    preempt = deletion(sl, DeleteKind.PREEMPT, Replace(sl.key, sl.fault, cause))
    keep = Keep(KeepKind.BROKEN_BUT_BUSY, slice=sl.key, detail=cause)
    return _Kept(sl.key, keep, deadline=deadline, preempt=preempt)


def _absent(sl: Slice, ev: Evidence | None) -> Keep | None:
    """A host has no live Ray node yet needs one judged (`gone_from_ray` says no): keep."""
    if ev is None:
        return None
    waiting = [
        h.pod_name for h in sl.hosts if h.pod_name not in sl.nodes and not gone_from_ray(h, ev)
    ]
    if not waiting:
        return None
    detail = f"{', '.join(waiting)}: Ray node absent, not yet for the whole grace"
    return Keep(KeepKind.ABSENT_FROM_RAY, slice=sl.key, detail=detail)


def live_backoff(backoff: Mapping[str, ReplaceBackoff], mono_s: float) -> dict[str, ReplaceBackoff]:
    # Keep expired entries for a while (an hour): the failure count decides the next delay.
    return {k: v for k, v in backoff.items() if v.until + FORGET_AFTER_S > mono_s}
