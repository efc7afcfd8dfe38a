"""Settings → the planner's Policy (kept apart so the planner never sees pydantic)."""

from __future__ import annotations

from kuberay_scaler.core.model.cluster import parse_budget
from kuberay_scaler.core.planner.deadlines import Deadlines
from kuberay_scaler.core.planner.policy import Policy
from kuberay_scaler.runtime.settings import Settings


def deadlines_from_settings(settings: Settings) -> Deadlines:
    """Every time setting the planner and decide() read, built once (join settle and the
    replace backoff's cap have no setting: their defaults)."""
    return Deadlines(
        idle_timeout_override_s=settings.idle_timeout_s,
        max_provision_s=settings.max_provision_time_s,
        missing_node_grace_s=settings.missing_node_grace_s,
        replace_backoff_s=settings.replace_backoff_s,
        preempt_deadline_s=settings.preempt_deadline_s,
        drain_deadline_s=settings.drain_deadline_s,
        broken_busy_max_s=settings.broken_busy_max_s,
        unavailable_backoff_s=settings.unavailable_backoff_s,
        unavailable_max_backoff_s=settings.unavailable_max_backoff_s,
        scale_down_delay_after_add_s=settings.scale_down_delay_after_add_s,
        reservation_grace_s=settings.reservation_grace_s,
    )


def policy_from_settings(settings: Settings) -> Policy:
    return Policy(
        deadlines=deadlines_from_settings(settings),
        disruption_budget=parse_budget(settings.disruption_budget),
    )
