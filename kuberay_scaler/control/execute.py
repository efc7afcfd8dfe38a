"""Carry out a Decision's writes in order: record intent → drains → guarded patch.

Nothing here decides anything: the writes come from `decision.decide`; a refused drain only
removes that slice's deletion (`patch_after_drains`, pure). Each step's outcome is returned for
the loop to judge (replan on stale, back off on the rest).

Partial drains (issue 11, item 2; catalogue row 20). Right before draining, the GCS is read
afresh: a slice with a host no longer idle (or gone, or under another cluster id) is not drained
at all, which shrinks the window in which a host turns busy to the few milliseconds of the
concurrent DrainNode calls. If a host still refuses, the rule is:

- no host of the slice accepted: the slice is kept, untouched (nothing was lost);
- some hosts accepted: the slice is deleted whole in the same patch. An accepted
  IDLE_TERMINATION drain makes that raylet exit at once (tests/ray/test_tpu_hosts_and_drain.py:
  `test_idle_single_host_drain_is_accepted_and_the_node_dies`,
  `test_partly_busy_slice_is_kept_and_lists_hosts_already_drained`), so the slice can no longer
  run slice-wide work; keeping it would hold dead accelerators until the broken-slice timer and
  then delete the refused host undrained anyway. Deleting now loses at most what the refused host
  started in the last moments, and never leaves a slice with dead hosts waiting for a timer.
  The same holds for a slice adopted after a restart (recorded, drained before the kill): hosts
  already gone from Ray count as accepted (`Drain.hosts_gone`).

A broken slice being replaced (`Drain.broken`, docs/reliability.md "Broken slices") is drained
like an idle one: its live hosts only (the planner keeps a broken slice with a busy host), the
fresh read made even when some hosts are gone (a host turned busy keeps the slice), then the same
rule for refusals.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from kuberay_scaler.control.ports import ClusterView, Gcs, GcsFeed, Writer
from kuberay_scaler.decision import Decision, Drain, Patch, patch_after_drains
from kuberay_scaler.model.drains import DrainReason, SliceDrainResult
from kuberay_scaler.model.outcome import PatchOutcome
from kuberay_scaler.model.plan import Plan
from kuberay_scaler.patch.ops import Op, PatchError

log = structlog.get_logger(__name__)

SliceRef = tuple[str, str]  # (group, slice key)


@dataclass(frozen=True)
class Executed:
    """How far a decision's writes got."""

    plan: Plan  # as carried out: slices whose drain was refused are kept
    outcome: PatchOutcome | None = None  # of the last write sent; None when nothing was sent
    step: str = "patch"  # which write `outcome` belongs to: "record" or "patch"
    sent: tuple[Op, ...] = ()  # the patch ops sent
    refused: frozenset[SliceRef] = field(default_factory=frozenset)
    replan: bool = False  # the RayCluster changed under the plan: plan again

    @property
    def applied(self) -> bool:
        return self.outcome is not None and self.outcome.kind == "applied"


async def execute(
    decision: Decision, *, writer: Writer, gcs: Gcs, feed: GcsFeed, view: ClusterView
) -> Executed:
    """Send the decision's writes; stop at the first write that does not apply."""
    uid = decision.plan.uid
    base: Mapping[str, Any] = decision.raycluster
    record = decision.record
    if record is not None:
        outcome = await writer.apply(list(record.ops), expected_uid=uid)
        if outcome.kind != "applied" or outcome.obj is None:
            return Executed(decision.plan, outcome, "record", replan=outcome.kind == "stale")
        base = outcome.obj
        view.observe(base)
    stale = await not_idle_any_more(decision.drains, gcs)
    refused = stale | await drain_all(
        tuple(d for d in decision.drains if (d.group, d.slice_key) not in stale), gcs
    )
    if decision.drains:
        feed.poll_soon()
    plan, patch = decision.plan, decision.patch
    if refused:
        try:
            plan, patch = patch_after_drains(decision, refused, base)
        except PatchError as err:
            log.info("plan no longer fits the RayCluster: replanning", error=str(err))
            return Executed(decision.plan, refused=refused, replan=True)
    return await _send_patch(plan, patch, writer, uid, refused)


async def not_idle_any_more(drains: tuple[Drain, ...], gcs: Gcs) -> frozenset[SliceRef]:
    """Idle-termination drains whose slice is no longer all idle in a fresh GCS read."""
    # A slice with hosts already gone is deleted whatever the others say: no need to look —
    # except a broken slice being replaced, which is never deleted over a host turned busy.
    idle = [d for d in drains if not d.preempt and (d.broken or not d.hosts_gone)]
    if not idle:
        return frozenset()
    fresh = await gcs.fresh_state()
    if fresh.state is None:
        log.warning("fresh GCS read before draining failed: draining nothing", error=fresh.error)
        return frozenset((d.group, d.slice_key) for d in idle)
    idle_now = {n.node_id for n in fresh.state.nodes if n.idle}
    stale = set()
    for d in idle:
        if d.cluster_id != fresh.cluster_id or not set(d.node_ids) <= idle_now:
            stale.add((d.group, d.slice_key))
            log.info(
                "slice kept: no longer idle in a fresh GCS read",
                group=d.group,
                slice=d.slice_key,
                busy_or_gone=sorted(set(d.node_ids) - idle_now),
            )
    return frozenset(stale)


async def drain_all(drains: tuple[Drain, ...], gcs: Gcs) -> frozenset[SliceRef]:
    """Drain every slice concurrently (each slice's hosts concurrently too); the slices that may
    not be deleted. An idle slice some of whose hosts accepted is deleted (see the module doc)."""
    results = await asyncio.gather(*(_drain(d, gcs) for d in drains))
    refused = set()
    for d, result in zip(drains, results, strict=True):
        partly = bool(result.drained_node_ids) or d.hosts_gone > 0
        if not d.preempt and not result.may_delete and partly:
            log.warning(
                "slice partly drained: deleted whole, its drained hosts have exited",
                group=d.group,
                slice=d.slice_key,
                reason=result.reason,
                hosts_drained=list(result.drained_node_ids),
                hosts_gone_before=d.hosts_gone,
            )
            continue
        if not result.may_delete:
            refused.add((d.group, d.slice_key))
            log.warning(
                "slice kept: drain refused",
                group=d.group,
                slice=d.slice_key,
                reason=result.reason,
                hosts_already_drained=list(result.drained_node_ids),
            )
    return frozenset(refused)


async def _drain(d: Drain, gcs: Gcs) -> SliceDrainResult:
    return await gcs.drain(
        d.node_ids,
        reason=DrainReason.PREEMPTION if d.preempt else DrainReason.IDLE_TERMINATION,
        message=d.message,
        deadline_ms=d.deadline_ms,
        cluster_id=d.cluster_id,
    )


async def _send_patch(
    plan: Plan, patch: Patch | None, writer: Writer, uid: str, refused: frozenset[SliceRef]
) -> Executed:
    if patch is None:
        return Executed(plan, refused=refused)
    outcome = await writer.apply(list(patch.ops), expected_uid=uid)
    return Executed(
        plan, outcome, "patch", patch.ops, refused=refused, replan=outcome.kind == "stale"
    )
