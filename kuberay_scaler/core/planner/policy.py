"""Policy: the knobs from settings that shape the planner's decisions (frozen)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kuberay_scaler.core.defaults import DISRUPTION_BUDGET
from kuberay_scaler.core.model.cluster import Budget, WorkerGroup, parse_budget
from kuberay_scaler.core.planner.availability import AvailabilityPolicy
from kuberay_scaler.core.planner.deadlines import Deadlines
from kuberay_scaler.core.planner.disruption import DisruptionRules


@dataclass(frozen=True)
class Policy:
    """Knobs from settings that shape decisions."""

    # Every timeout, backoff and deadline, in seconds (planner/deadlines.py).
    deadlines: Deadlines = field(default_factory=Deadlines)
    # Disruption defaults (a group's template annotations override them; docs/planner.md).
    disruption_budget: Budget = field(default_factory=lambda: parse_budget(DISRUPTION_BUDGET))

    def availability(self) -> AvailabilityPolicy:
        d = self.deadlines
        return AvailabilityPolicy(
            initial_s=d.unavailable_backoff_s,
            cap_s=d.unavailable_max_backoff_s,
            deadline_s=d.max_provision_s,
        )

    def disruption_rules(self, group: WorkerGroup) -> DisruptionRules:
        """The group's own budget and delay, else these defaults."""
        budget = group.disruption_budget or self.disruption_budget
        delay = group.scale_down_delay_s
        delay_s = self.deadlines.scale_down_delay_after_add_s if delay is None else delay
        return DisruptionRules(
            budget,
            delay_s,
            self.deadlines.preempt_deadline_s,
            budget_from_group=group.disruption_budget is not None,
            delay_from_group=delay is not None,
        )
