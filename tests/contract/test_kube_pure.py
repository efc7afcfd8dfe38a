"""Pure parts of the Kubernetes adapter: backoff, error classification."""

from __future__ import annotations

import pytest

from kuberay_scaler.adapters.kube.access import Access
from kuberay_scaler.adapters.kube.transport import (
    MAX_RETRY_AFTER_S,
    ApiError,
    Target,
    parse_retry_after,
)
from kuberay_scaler.adapters.kube.writer import classify
from kuberay_scaler.core.backoff import Backoff

ACTION = "patch rayclusters.ray.io default/rc"


# --- backoff --------------------------------------------------------------------------------


def test_backoff_grows_caps_and_resets() -> None:
    backoff = Backoff(initial=1, cap=8, uniform=lambda low, high: high)
    assert [backoff.next_delay() for _ in range(6)] == [1, 2, 4, 8, 8, 8]
    backoff.reset()
    assert backoff.next_delay() == 1


def test_backoff_jitter_stays_within_half_to_full_step() -> None:
    low = Backoff(initial=4, cap=30, uniform=lambda low, high: low)
    assert low.next_delay() == 2
    real = Backoff(initial=4, cap=30)
    assert all(2 <= real.next_delay() <= 30 for _ in range(50))


def test_backoff_survives_a_very_long_outage() -> None:
    backoff = Backoff(initial=1, cap=30, uniform=lambda low, high: high)
    for _ in range(5000):
        delay = backoff.next_delay()
    assert delay == 30


# --- Retry-After and classification ------------------------------------------------------------


def test_retry_after_forms() -> None:
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    when = "Wed, 21 Oct 2015 07:28:10 GMT"
    assert parse_retry_after(when, now=1445412480.0) == pytest.approx(10.0)


def error(status: int, message: str = "", reason: str = "", retry: float | None = None) -> ApiError:
    return ApiError(status, reason, message, Target("patch", "rayclusters"), retry_after=retry)


@pytest.mark.parametrize(
    ("status", "message", "kind"),
    [
        (409, "the object has been modified", "stale"),
        (422, "testing value /spec/workerGroupSpecs/0/groupName failed: test failed", "stale"),
        (422, "Testing value /metadata/uid failed", "stale"),
        (422, "test operation does not apply: is missing path: /spec/x", "stale"),
        (422, "spec.workerGroupSpecs[0].replicas: Invalid value: -1", "invalid"),
        (400, "json: cannot unmarshal", "invalid"),
        (403, "rayclusters is forbidden", "forbidden"),
        (404, "not found", "gone"),
        (429, "slow down", "throttled"),
        (500, "etcd leader changed", "transient"),
        (503, "", "transient"),
        (401, "Unauthorized", "transient"),
    ],
)
def test_classify(status: int, message: str, kind: str) -> None:
    assert classify(error(status, message), ACTION).kind == kind


def test_classify_forbidden_names_verb_and_resource() -> None:
    outcome = classify(error(403, "denied", "Forbidden"), ACTION)
    assert "patch" in outcome.message
    assert "rayclusters" in outcome.message


def test_classify_throttled_carries_retry_after_with_default() -> None:
    assert classify(error(429, retry=3), ACTION).retry_after == 3
    assert classify(error(429), ACTION).retry_after == 1.0


def test_access_description_is_one_line_naming_modes() -> None:
    restricted = Access(watch_rayclusters=False, create_events=False)
    sidecar = Access(watch_rayclusters=True, create_events=True, missing=("patch rayclusters",))
    assert "GET" in restricted.description
    assert "Events off" in restricted.description
    assert "by watch" in sidecar.description
    assert "MISSING: patch rayclusters" in sidecar.description
    assert "\n" not in restricted.description + sidecar.description


def test_retry_after_is_capped() -> None:
    # A server (or a proxy in front of it) asking for a day must not stop the daemon for a day.
    assert parse_retry_after("86400") == MAX_RETRY_AFTER_S
    far = "Wed, 21 Oct 2099 07:28:00 GMT"
    assert parse_retry_after(far, now=1445412480.0) == MAX_RETRY_AFTER_S
    assert classify(error(429, retry=MAX_RETRY_AFTER_S), ACTION).retry_after == MAX_RETRY_AFTER_S
