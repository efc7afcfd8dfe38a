"""Issue 30, promise 2: health judged by outcome, on the fake clock.

/healthz fails once the oldest want the plan has had of a group (replicas, deletions) and the
cluster does not show is older than UNHEALTHY_AFTER_S, whatever the reconciles in between
returned (a write that fails and then sits in a backoff plans no write: that is not progress).
A want that cannot be evaluated (an input unknown) is unmet. Probes run every 0.5 s and a
reconcile every 2 s, as the kubelet and the resync would. Every test asserts the invariant: no
slice is deleted without an accepted drain.
"""

from __future__ import annotations

from typing import Any

from kuberay_scaler.loop.config import LoopConfig
from kuberay_scaler.loop.health import INPUTS, GroupView, Reading, Want, judge_wants
from tests.control.fakes import Loop
from tests.control.test_faults import daemon_probing
from tests.control.worlds import idle_slices_world, scale_up_world, spec_group, workers_to_delete
from tests.factories import (
    head_node,
    node_id_of,
    state,
    tpu_slice_nodes,
)

UNHEALTHY_AFTER_S = 20.0
CONFIG = LoopConfig(unhealthy_after_s=UNHEALTHY_AFTER_S)
RECONCILE_EVERY_S = 2.0
PROBE_EVERY_S = 0.5


async def probe_for(loop: Loop, seconds: float, ray: Any) -> list[tuple[float, bool, str]]:
    """Probe /healthz every 0.5 s for `seconds` and reconcile every 2 s, the GCS showing `ray`
    (None: unknown); (seconds elapsed, healthy, why) per probe."""
    probes = []
    ticks = round(seconds / PROBE_EVERY_S)
    per_reconcile = round(RECONCILE_EVERY_S / PROBE_EVERY_S)
    for tick in range(1, ticks + 1):
        loop.clock.advance(PROBE_EVERY_S)
        if tick % per_reconcile == 0:
            loop.see_ray(ray)
            await loop.reconciler.reconcile()
        healthy, why = loop.reconciler.health()
        probes.append((tick * PROBE_EVERY_S, healthy, why))
    return probes


def first_unhealthy(probes: list[tuple[float, bool, str]]) -> tuple[float, str] | None:
    return next(((at, why) for at, healthy, why in probes if not healthy), None)


def want_age(loop: Loop, group: str) -> float | None:
    metrics = loop.reconciler.metrics
    return metrics.sample("kuberay_scaler_oldest_unmet_want_seconds", {"group": group})


def assert_nothing_deleted_undrained(loop: Loop) -> None:
    drained = set(loop.gcs.drained)
    for pod in workers_to_delete(loop):
        assert node_id_of(pod) in drained, f"{pod} named for deletion without a drain"


async def test_every_patch_500_for_60_s_fails_healthz_within_bound_and_recovers() -> None:
    loop, ray = idle_slices_world("tpu-a", config=CONFIG)
    loop.writer.answer(500, times=10_000)
    probes = await probe_for(loop, 60, ray)
    assert_nothing_deleted_undrained(loop)
    assert spec_group(loop)["replicas"] == 1  # nothing applied
    unhealthy = first_unhealthy(probes)
    assert unhealthy is not None, f"/healthz 200 on all {len(probes)} probes: {probes[-1]}"
    at, why = unhealthy
    # The want began with the first reconcile (2 s in): failing by one reconcile past the bound.
    assert at <= RECONCILE_EVERY_S + UNHEALTHY_AFTER_S + RECONCILE_EVERY_S, at
    assert "group tpu" in why and "replicas 1->0" in why and "HTTP 500" in why, why
    assert all(not healthy for t, healthy, _ in probes if t > at), "flapped back to 200"
    assert (want_age(loop, "tpu") or 0) > UNHEALTHY_AFTER_S
    document = daemon_probing(loop)._plan_document()
    assert document is not None and document["unmet_wants"][0]["group"] == "tpu"

    loop.writer._script.clear()  # the API server is back
    probes = await probe_for(loop, 180, ray)
    assert probes[-1][1], f"still unhealthy after the server recovered: {probes[-1]}"
    assert spec_group(loop)["replicas"] == 0 and workers_to_delete(loop)
    assert_nothing_deleted_undrained(loop)
    assert want_age(loop, "tpu") == 0


async def test_gcs_blind_for_60_s_fails_healthz_and_recovers() -> None:
    loop, _ = idle_slices_world("tpu-a", config=CONFIG)
    busy = state([head_node(), *tpu_slice_nodes("tpu-a", 4, idle_s=None)])
    assert all(h for _, h, _ in await probe_for(loop, 10, busy))  # quiet: nothing wanted
    probes = await probe_for(loop, 60, None)
    unhealthy = first_unhealthy(probes)
    assert unhealthy is not None, f"/healthz 200 after 60 s blind: {probes[-1]}"
    at, why = unhealthy
    assert at <= UNHEALTHY_AFTER_S + 2 * RECONCILE_EVERY_S, at
    assert "gcs not fresh" in why, why
    assert loop.writer.calls == [] and loop.gcs.drains == []  # blind: nothing written
    assert (want_age(loop, INPUTS) or 0) > UNHEALTHY_AFTER_S
    probes = await probe_for(loop, 10, busy)
    assert probes[-1][1], probes[-1]
    assert want_age(loop, INPUTS) == 0


async def test_a_drain_ray_refuses_for_minutes_is_no_unmet_want() -> None:
    """Busy hosts refuse idle drains (the slice turned busy): the plan rightly keeps the slice.
    Nothing failed, so the dropped deletion is withdrawn, not an unmet want."""
    loop, ray = idle_slices_world("tpu-a", config=CONFIG)
    loop.gcs.refuse = {node_id_of(p) for p in workers_names(loop)}
    probes = await probe_for(loop, 180, ray)
    assert loop.gcs.drains, "no drain was tried"
    assert workers_to_delete(loop) == [] and spec_group(loop)["replicas"] == 1
    assert all(h for _, h, _ in probes), first_unhealthy(probes)


async def test_a_quiet_cluster_has_no_wants() -> None:
    loop, _ = idle_slices_world("tpu-a", config=CONFIG)
    busy = state([head_node(), *tpu_slice_nodes("tpu-a", 4, idle_s=None)])
    probes = await probe_for(loop, 120, busy)
    assert all(h for _, h, _ in probes) and loop.writer.calls == []
    assert loop.reconciler.status.progress.wants == {}


async def test_a_dry_run_wants_nothing_of_the_cluster() -> None:
    loop, ray = idle_slices_world(
        "tpu-a", config=LoopConfig(unhealthy_after_s=UNHEALTHY_AFTER_S, dry_run=True)
    )
    probes = await probe_for(loop, 120, ray)
    assert all(h for _, h, _ in probes), first_unhealthy(probes)
    assert loop.writer.calls == [] and loop.gcs.drains == []


def workers_names(loop: Loop) -> list[str]:
    return list(loop.pods.store)


# --- the pure judgement -------------------------------------------------------------------------


def view(
    current: int, target: int, *, deleted: str = "", present: str = "a b", retrying: bool = False
) -> GroupView:
    return GroupView(
        current, target, frozenset(deleted.split()), frozenset(present.split()), retrying
    )


def test_a_want_keeps_its_age_until_the_cluster_shows_it() -> None:
    wants = judge_wants({}, Reading({"g": view(0, 2)}, {}), now=10)
    wants = judge_wants(wants, Reading({"g": view(0, 3)}, {}), now=30)  # a newer want
    assert wants["g"].since == 10 and wants["g"].target == 3
    assert judge_wants(wants, Reading({"g": view(3, 3)}, {}), now=40) == {}


def test_a_failed_want_the_plan_retries_later_is_kept() -> None:
    wants = judge_wants({}, Reading({"g": view(1, 0, deleted="a")}, {}, failed=True), now=10)
    retrying = view(1, 1, present="a", retrying=True)
    assert judge_wants(wants, Reading({"g": retrying}, {}), now=50)["g"].since == 10
    # Not retried any more (the slice left the refused memory): withdrawn.
    assert judge_wants(wants, Reading({"g": view(1, 1)}, {}), now=50) == {}


def test_a_deletion_is_shown_once_the_pod_is_gone_or_named() -> None:
    wants = judge_wants({}, Reading({"g": view(2, 1, deleted="a")}, {}, failed=True), now=10)
    unshown = view(1, 1, present="a b", retrying=True)
    assert judge_wants(wants, Reading({"g": unshown}, {}), now=11)["g"].since == 10
    shown = view(1, 1, present="b", retrying=True)
    assert judge_wants(wants, Reading({"g": shown}, {}), now=11) == {}


def test_blind_keeps_every_want_and_counts_from_when_it_began() -> None:
    before = {"g": Want("g", "replicas 0->2", 5.0, 2)}
    wants = judge_wants(before, Reading(None, {"gcs": 16.0}), now=100)
    assert wants["g"] == before["g"] and wants[INPUTS].since == 84
    assert judge_wants(wants, Reading(None, {"gcs": 18.0}), now=102)[INPUTS].since == 84
    assert INPUTS not in judge_wants(wants, Reading({"g": view(0, 2)}, {}), now=104)


async def test_a_failed_want_whose_slice_turned_busy_is_withdrawn_once_the_retry_is_due() -> None:
    """The record write fails (500), the slice waits in its refused-drain backoff; meanwhile it
    turns busy. Once the backoff ends the plan no longer wants it: withdrawn, healthy, kept."""
    loop, ray = idle_slices_world("tpu-a", config=LoopConfig(unhealthy_after_s=300))
    loop.writer.answer(500, times=1)
    await probe_for(loop, 2, ray)
    assert loop.reconciler.status.progress.wants, "the failed deletion is an unmet want"
    busy = state([head_node(), *tpu_slice_nodes("tpu-a", 4, idle_s=None)])
    probes = await probe_for(loop, 200, busy)
    assert loop.reconciler.status.progress.wants == {}, loop.reconciler.status.progress.wants
    assert all(h for _, h, _ in probes) and spec_group(loop)["replicas"] == 1
    assert_nothing_deleted_undrained(loop)


async def test_a_cluster_suspended_after_a_failed_write_wants_nothing_more() -> None:
    loop, demand = scale_up_world(config=CONFIG)
    loop.writer.answer(500, times=1)
    await probe_for(loop, 2, demand)
    assert loop.reconciler.status.progress.wants, "the failed scale-up is an unmet want"
    loop.server.edit(["spec", "suspend"], True)
    loop.view.observe(loop.server.obj)
    probes = await probe_for(loop, 60, demand)
    assert loop.reconciler.status.progress.wants == {}
    assert all(h for _, h, _ in probes), first_unhealthy(probes)
