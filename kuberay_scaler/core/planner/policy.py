"""Policy: the knobs from settings that shape the planner's decisions (frozen)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kuberay_scaler.core.defaults import (
    BROKEN_BUSY_MAX_S,
    DISRUPTION_BUDGET,
    JOIN_SETTLE_S,
    MAX_REPLACE_BACKOFF_S,
    PREEMPT_DEADLINE_S,
    REPLACE_BACKOFF_S,
    RESERVATION_GRACE_S,
    SCALE_DOWN_DELAY_AFTER_ADD_S,
    UNAVAILABLE_BACKOFF_S,
    UNAVAILABLE_MAX_BACKOFF_S,
)
from kuberay_scaler.core.model.cluster import Budget, WorkerGroup, parse_budget
from kuberay_scaler.core.planner.availability import AvailabilityPolicy
from kuberay_scaler.core.planner.disruption import DisruptionRules
from kuberay_scaler.core.slicemap import SliceTimeouts


@dataclass(frozen=True)
class Policy:
    """Knobs from settings that shape decisions."""

    idle_timeout_override_s: float | None = None
    timeouts: SliceTimeouts = field(default_factory=SliceTimeouts)
    replace_backoff_s: float = REPLACE_BACKOFF_S
    max_backoff_s: float = MAX_REPLACE_BACKOFF_S
    # How long a busy slice above maxReplicas is drained (reason preemption) before deletion.
    preempt_deadline_s: float = PREEMPT_DEADLINE_S
    # How long a broken slice with a busy host is kept before it is drained for preemption and
    # replaced (KUBERAY_SCALER_BROKEN_BUSY_MAX_S).
    broken_busy_max_s: float = BROKEN_BUSY_MAX_S
    # How long after its Ray container started a worker host's used resources may still be
    # work reported pending (see JOIN_SETTLE_S); 0 turns the settle off.
    join_settle_s: float = JOIN_SETTLE_S
    # Group availability: the backoff before an unavailable group is probed
    # (KUBERAY_SCALER_UNAVAILABLE_BACKOFF_S), doubling up to ..._UNAVAILABLE_MAX_BACKOFF_S.
    unavailable_backoff_s: float = UNAVAILABLE_BACKOFF_S
    unavailable_max_backoff_s: float = UNAVAILABLE_MAX_BACKOFF_S

    def availability(self) -> AvailabilityPolicy:
        return AvailabilityPolicy(
            initial_s=self.unavailable_backoff_s,
            cap_s=self.unavailable_max_backoff_s,
            deadline_s=self.timeouts.max_provision_s,
        )

    # Disruption defaults (a group's template annotations override them; docs/planner.md).
    disruption_budget: Budget = field(default_factory=lambda: parse_budget(DISRUPTION_BUDGET))
    scale_down_delay_after_add_s: float = SCALE_DOWN_DELAY_AFTER_ADD_S

    def disruption_rules(self, group: WorkerGroup) -> DisruptionRules:
        """The group's own budget and delay, else these defaults."""
        budget = group.disruption_budget or self.disruption_budget
        delay = group.scale_down_delay_s
        delay_s = self.scale_down_delay_after_add_s if delay is None else delay
        return DisruptionRules(
            budget,
            delay_s,
            self.preempt_deadline_s,
            budget_from_group=group.disruption_budget is not None,
            delay_from_group=delay is not None,
        )

    # Unneeded slices of a group that served slice reservations are kept this long after the
    # last one was pending (KUBERAY_SCALER_RESERVATION_GRACE_S, planner/reservations.py).
    reservation_grace_s: float = RESERVATION_GRACE_S
