"""The poll-mode RayCluster GET schedule (adapters/kube/raycluster.py::PollCadence), on a fake
clock.

Under KubeRay's Role (get/patch on rayclusters, no watch) a user's spec edit is seen only by a
GET. Issue 22: edits acted on within p50 <= 2 s, p99 <= 5 s, with no more API requests than Ray's
own autoscaler (GET RayCluster + LIST pods every 5 s loop).
"""

from __future__ import annotations

import itertools
import statistics

import pytest

from kuberay_scaler.adapters.kube.raycluster import PollCadence
from kuberay_scaler.core import defaults as D

# Time from the GET that brings an edit to the patch acting on it, allowed for in the budget:
# the loop's debounce plus a generous plan-and-patch (measured ~0.05 s; bench_spec_edit.py).
REACT_S = D.DEBOUNCE_S + 0.5


def get_times(cadence: PollCadence, until: float, nudges: list[float]) -> list[float]:
    """The GETs a poller following `cadence` makes until `until`, given nudge times."""
    gets = [0.0]
    pending = sorted(nudges)
    while gets[-1] < until:
        last = gets[-1]
        nudged = next((n for n in pending if n >= last), None)
        at = cadence.next_get(last, nudged)
        if nudged is not None and nudged > at:
            at = cadence.next_get(last, None)  # the nudge comes after the due GET
        gets.append(at)
    return gets


def test_without_pod_events_gets_come_every_interval() -> None:
    cadence = PollCadence(interval_s=2.5, min_gap_s=1.0, debounce_s=0.2)
    assert cadence.next_get(10.0, None) == 12.5


def test_a_nudge_brings_the_get_forward_but_not_closer_than_the_gap() -> None:
    cadence = PollCadence(interval_s=2.5, min_gap_s=1.0, debounce_s=0.2)
    assert cadence.next_get(10.0, 10.1) == 11.0  # the gap, not 10.3
    assert cadence.next_get(10.0, 11.5) == pytest.approx(11.7)  # debounce after the nudge
    assert cadence.next_get(10.0, 12.4) == 12.5  # never later than the interval


def test_default_cadence_acts_on_an_edit_within_the_issue_budget() -> None:
    cadence = PollCadence()
    gets = get_times(cadence, 200.0, nudges=[])
    edits = [i * 0.01 for i in range(1, 15_000)]  # an edit at every 10 ms of 150 s
    latency = []
    for edit in edits:
        seen = next(g for g in gets if g >= edit)
        latency.append(seen - edit + REACT_S)
    p50 = statistics.median(latency)
    p99 = statistics.quantiles(latency, n=100)[98]
    assert p50 <= 2.0, p50
    assert p99 <= 5.0, p99


def test_default_cadence_makes_no_more_requests_than_rays_loop() -> None:
    # Ray's autoscaler: GET the RayCluster and LIST every pod once per 5 s loop.
    rays_requests_per_s = 2 / 5.0
    gets = get_times(PollCadence(), 1000.0, nudges=[])
    assert (len(gets) - 1) / gets[-1] <= rays_requests_per_s


def test_pod_churn_cannot_raise_the_rate_above_one_per_gap() -> None:
    cadence = PollCadence(interval_s=2.5, min_gap_s=1.0, debounce_s=0.2)
    churn = [i * 0.05 for i in range(20_000)]  # a pod event every 50 ms for 1000 s
    gets = get_times(cadence, 1000.0, churn)
    gaps = [b - a for a, b in itertools.pairwise(gets)]
    assert min(gaps) >= 1.0
