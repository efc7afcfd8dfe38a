"""How long the GCS poller waits before its next poll: short while it is cheap or things move.

Pure: the poller measures what its last polls cost (CPU seconds of its own synchronous work:
decode, body, parse; not what other coroutines ran during the RPC) and whether anything is going
on, and asks for the next interval.

- **Idle**: a target interval (`IDLE_INTERVAL_S`, 0.4 s) while polls are cheap: a small cluster
  (~0.2 ms a poll) sees new demand within 0.4 s (reaction p99 under 0.5 s). A poll that is not
  cheap keeps to `IDLE_MID_CAP` of a core, waiting at most `IDLE_MID_MAX_S` for it (a 1k-node
  reply, ~2 ms: ~0.4 s apart, under Ray v1's 0.81 CPU s/min at 1k pods; a 10k-node one,
  ~18 ms quiet: 0.6 s apart, so new demand is seen within 0.6 s and patched within 1 s); past
  that, only `IDLE_CAP` stretches it (`cost / IDLE_CAP`: 40-60 ms under load, 0.8-1.2 s apart,
  3-4 s of CPU a minute, under Ray v1's 5.35 at 10k pods).
- **Moving** (the content changed in the last `BUSY_FOR_S`) or **demand pending**: faster, down
  to `BUSY_FLOOR_S`, within a budget of a core (`MOVING_BUDGET`, `PENDING_BUDGET`); never slower
  than idle would be.

Never longer than the configured ceiling (KUBERAY_SCALER_GCS_POLL_INTERVAL_S), which also wins
when it is shorter than the target.
"""

from __future__ import annotations

from dataclasses import dataclass

BUSY_FLOOR_S = 0.1  # never faster than this
IDLE_INTERVAL_S = 0.4  # idle: the target wait (small clusters: ~150 polls a minute)
IDLE_MID_CAP = 0.005  # idle polls that are not cheap: at most 0.5 % of a core ...
IDLE_MID_MAX_S = 0.6  # ... but never waiting longer than this for that (10k: p99 <= 1 s)
IDLE_CAP = 0.05  # and whatever the cost, at most 5 % of a core
MOVING_BUDGET = 0.05  # the state just moved: up to 5 % of a core
PENDING_BUDGET = 0.01  # demand waits (pods launching, say), nothing moves: up to 1 %
BUSY_FOR_S = 5.0  # "the state moved" lasts this long after the last change


@dataclass(frozen=True)
class Cadence:
    ceiling_s: float  # the configured longest interval (KUBERAY_SCALER_GCS_POLL_INTERVAL_S)

    def next_interval(
        self, *, cost_s: float, demand_pending: bool, last_change: float, now: float
    ) -> float:
        mid = min(IDLE_MID_MAX_S, cost_s / IDLE_MID_CAP)
        idle = max(IDLE_INTERVAL_S, mid, cost_s / IDLE_CAP)
        if now - last_change < BUSY_FOR_S:
            wait = min(idle, max(BUSY_FLOOR_S, cost_s / MOVING_BUDGET))
        elif demand_pending:
            wait = min(idle, max(BUSY_FLOOR_S, cost_s / PENDING_BUDGET))
        else:
            wait = idle
        return min(self.ceiling_s, wait)
