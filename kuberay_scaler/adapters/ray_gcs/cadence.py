"""How long the GCS poller waits before its next poll: short while it is cheap or things move.

Pure: the poller measures what its last poll cost (CPU seconds: RPC, decode, fingerprint) and
whether anything is going on, and asks for the next interval. Polling is given a budget, a
fraction of one core, so a 10k-node reply is polled seconds apart while a small cluster is
polled several times a second, and demand that just appeared is seen within a fraction of a
second (the reaction time of the whole daemon is mostly this wait).
"""

from __future__ import annotations

from dataclasses import dataclass

BUSY_FLOOR_S = 0.1  # never faster than this
IDLE_FLOOR_S = 0.25  # idle: still fast enough that new demand is seen within ~0.25 s
MOVING_BUDGET = 0.05  # the state just moved: up to 5 % of a core
PENDING_BUDGET = 0.01  # demand waits (pods launching, say), nothing moves: up to 1 %
IDLE_BUDGET = 0.004  # idle: up to 0.4 % of a core
BUSY_FOR_S = 5.0  # "the state moved" lasts this long after the last change


@dataclass(frozen=True)
class Cadence:
    ceiling_s: float  # the configured longest interval (KUBERAY_SCALER_GCS_POLL_INTERVAL_S)

    def next_interval(
        self, *, cost_s: float, demand_pending: bool, last_change: float, now: float
    ) -> float:
        if now - last_change < BUSY_FOR_S:
            floor, budget = BUSY_FLOOR_S, MOVING_BUDGET
        elif demand_pending:
            floor, budget = BUSY_FLOOR_S, PENDING_BUDGET
        else:
            floor, budget = IDLE_FLOOR_S, IDLE_BUDGET
        return min(self.ceiling_s, max(floor, cost_s / budget))
