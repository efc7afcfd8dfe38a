"""Replacement of broken slices: deleted as a unit, at most once per backoff period per group."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

from kuberay_scaler.backoff import exponential_delay
from kuberay_scaler.model.plan import DeleteKind, ReplaceBackoff, SliceDeletion
from kuberay_scaler.model.reasons import Keep, KeepKind, Reason, Replace
from kuberay_scaler.model.slices import GroupSlices, Slice, SliceState
from kuberay_scaler.planner.scale_down import deletion


def backing_off(backoff: Mapping[str, ReplaceBackoff], group: str, now: datetime) -> bool:
    current = backoff.get(group)
    return current is not None and current.until > now


def replacements(
    slices: GroupSlices,
    backoff: dict[str, ReplaceBackoff],
    initial_s: float,
    cap_s: float,
    now: datetime,
    reasons: list[Reason],
) -> list[SliceDeletion]:
    """Delete every broken slice of the group unless it replaced some too recently.

    Each replacement round doubles the group's next wait (`initial_s`, capped at `cap_s`), so a
    slice that breaks again and again (a bad node pool, a crashing image) is not churned.

    The first promise holds here too (docs/reliability.md, "Broken slices"): a broken slice any
    of whose hosts' Ray nodes is alive and not idle in this (fresh) GCS reply is kept
    (`KeepKind.BROKEN_BUT_BUSY`), never deleted over running work. KubeRay itself deletes a whole
    multi-host replica when one of its pods fails, so nothing is gained by racing it. A replaced
    slice's hosts whose Ray nodes are alive (hence idle) keep their `node_ids` and are drained
    before the patch (decision.py); hosts without a Ray node need no drain.
    """
    broken = [sl for sl in slices.by_state(SliceState.BROKEN) if not _kept_busy(sl, reasons)]
    if not broken:
        return []
    name = slices.group.name
    current = backoff.get(name)
    if current is not None and backing_off(backoff, name, now):
        detail = f"replaced {current.replaced} broken slice(s)"
        reasons.append(Keep(KeepKind.REPLACE_BACKING_OFF, len(broken), detail=detail))
        return []
    failures = (current.failures if current else 0) + 1
    delay = exponential_delay(failures - 1, initial_s, cap_s)
    backoff[name] = ReplaceBackoff(
        until=now + timedelta(seconds=delay), failures=failures, replaced=len(broken)
    )
    out = []
    for sl in broken:
        why = Replace(sl.key, sl.fault, sl.reason)
        reasons.append(why)
        out.append(deletion(sl, DeleteKind.REPLACE, why))
    return out


def _kept_busy(sl: Slice, reasons: list[Reason]) -> bool:
    working = sl.working_hosts
    if working:
        detail = f"{len(working)} of {len(sl.hosts)} hosts not idle in Ray; {sl.reason}"
        reasons.append(Keep(KeepKind.BROKEN_BUT_BUSY, slice=sl.key, detail=detail))
    return bool(working)


def live_backoff(backoff: Mapping[str, ReplaceBackoff], now: datetime) -> dict[str, ReplaceBackoff]:
    # Keep expired entries for a while: the failure count decides the next delay.
    return {k: v for k, v in backoff.items() if v.until + timedelta(hours=1) > now}
