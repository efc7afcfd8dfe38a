"""The pure rules behind health and giving up (loop/health.py), tabled."""

from __future__ import annotations

import pytest

from kuberay_scaler.loop.health import Access, GiveUp, Outcome, Progress, Step, target_problem

TARGET = "default/rc"


@pytest.mark.parametrize(
    ("access", "says"),
    [
        (Access(True, True), None),
        (Access(False, False), None),  # not synced yet, no failure: starting, or server down
        (Access(False, True, raycluster_failure=None), None),  # down: never "not served"
        (Access(False, True, raycluster_failure=503), None),
        (Access(True, False), "not found"),
        (Access(False, False, raycluster_failure=404), "not served"),
        (Access(False, True, raycluster_failure=403), "not allowed"),
        (Access(True, True, pods_failure=401), "not allowed to list/watch"),
        (Access(True, True, pods_failure=500), None),
    ],
)
def test_target_problem(access: Access, says: str | None) -> None:
    problem = target_problem(access, TARGET)
    if says is None:
        assert problem is None
    else:
        assert problem is not None and says in problem and TARGET in problem


def test_give_up_says_once_a_minute_and_gives_up_after_the_limit() -> None:
    give_up = GiveUp(after_s=300)
    assert give_up.check("gone", 0) == (True, False)
    assert give_up.check("gone", 30) == (False, False)
    assert give_up.check("gone", 60) == (True, False)
    assert give_up.check(None, 100) == (False, False)  # served again: the clock starts over
    assert give_up.check("gone", 200) == (True, False)
    assert give_up.check("gone", 259) == (False, False)
    assert give_up.check("gone", 499) == (True, False)
    assert give_up.check("gone", 500) == (False, True)


def progress() -> Progress:
    return Progress(started=0.0, unhealthy_after_s=20.0, unhealthy_after_failures=3)


def test_blind_without_known_work_is_not_unhealthy() -> None:
    p = progress()
    p.record(Outcome(Step.DONE, "no change"), 0)
    for t in range(5, 200, 5):
        p.record(Outcome(Step.BLIND, "blind: gcs not fresh", demand=False), t)
    assert p.health(200)[0]


@pytest.mark.parametrize(
    "outcome",
    [
        Outcome(Step.BLIND, "blind: gcs not fresh", demand=True),
        Outcome(Step.BACKOFF, "write backoff", demand=True),
    ],
)
def test_work_not_achieved_for_the_limit_is_unhealthy(outcome: Outcome) -> None:
    p = progress()
    p.record(Outcome(Step.DONE, "applied"), 0)
    p.record(outcome, 5)
    assert p.health(20)[0]
    p.record(outcome, 21)
    healthy, why = p.health(21)
    assert not healthy and "no successful reconcile for 21 s" in why


def test_failures_since_the_last_achievement_count_whatever_lies_between() -> None:
    p = progress()
    for t in range(3):
        p.record(Outcome(Step.FAILED, "patch transient: HTTP 500", "patch_transient"), t)
        p.record(Outcome(Step.BACKOFF, "write backoff", demand=True), t + 0.5)
    healthy, why = p.health(3)
    assert not healthy and "3 reconciles failed in a row" in why and "HTTP 500" in why
    p.record(Outcome(Step.DONE, "applied"), 4)
    assert p.health(4)[0] and p.last_error is not None  # the error stays for /debug/plan
