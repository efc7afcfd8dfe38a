"""Every time setting reaches the one Deadlines value the planner and decide() read."""

from __future__ import annotations

from kuberay_scaler.core import defaults as D
from kuberay_scaler.core.planner.deadlines import Deadlines
from kuberay_scaler.runtime.policy import policy_from_settings
from kuberay_scaler.runtime.settings import load_settings

# Setting (env var suffix) → the Deadlines field it fills.
TIME_SETTINGS = {
    "IDLE_TIMEOUT_S": "idle_timeout_override_s",
    "MAX_PROVISION_TIME_S": "max_provision_s",
    "MISSING_NODE_GRACE_S": "missing_node_grace_s",
    "REPLACE_BACKOFF_S": "replace_backoff_s",
    "PREEMPT_DEADLINE_S": "preempt_deadline_s",
    "DRAIN_DEADLINE_S": "drain_deadline_s",
    "BROKEN_BUSY_MAX_S": "broken_busy_max_s",
    "UNAVAILABLE_BACKOFF_S": "unavailable_backoff_s",
    "UNAVAILABLE_MAX_BACKOFF_S": "unavailable_max_backoff_s",
    "SCALE_DOWN_DELAY_AFTER_ADD_S": "scale_down_delay_after_add_s",
    "RESERVATION_GRACE_S": "reservation_grace_s",
}


def test_each_time_setting_fills_its_own_deadline() -> None:
    values = {name: 101.0 + i for i, name in enumerate(TIME_SETTINGS)}
    env = {f"KUBERAY_SCALER_{name}": f"{v:g}" for name, v in values.items()}
    deadlines = policy_from_settings(load_settings(env)).deadlines
    got = {name: getattr(deadlines, field) for name, field in TIME_SETTINGS.items()}
    assert got == values
    # The two without a setting keep their defaults.
    assert (deadlines.join_settle_s, deadlines.replace_max_backoff_s) == (
        D.JOIN_SETTLE_S,
        D.MAX_REPLACE_BACKOFF_S,
    )


def test_the_defaults_are_the_settings_defaults() -> None:
    assert policy_from_settings(load_settings({})).deadlines == Deadlines()
