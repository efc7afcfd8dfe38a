"""The loop's settings (app.py builds them from `Settings`; tests from the defaults)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kuberay_scaler.core import defaults as D
from kuberay_scaler.core.planner.policy import Policy
from kuberay_scaler.loop.handsoff import OverrideBackoff
from kuberay_scaler.loop.observe import ObserveConfig


@dataclass(frozen=True)
class LoopConfig:
    dry_run: bool = False
    gcs_stale_after_s: float = D.GCS_STALE_AFTER_S
    expectation_timeout_s: float = D.WRITE_EXPECTATION_TIMEOUT_S
    unhealthy_after_failures: int = D.UNHEALTHY_AFTER_FAILURES
    unhealthy_after_s: float = D.UNHEALTHY_AFTER_S
    override: OverrideBackoff = field(default_factory=OverrideBackoff)

    def observing(self, policy: Policy) -> ObserveConfig:
        return ObserveConfig(
            self.gcs_stale_after_s,
            policy.deadlines.missing_node_grace_s,
            self.expectation_timeout_s,
            self.override,
        )
