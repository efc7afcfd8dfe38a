"""Deadlines: every time setting the planner and `decide()` read, in one frozen value.

All in seconds. Each is measured on the monotonic clock except `drain_deadline_s`, which is
handed to Ray with the drain (a wall-clock deadline Ray reads). The setting that fills each
(runtime/policy.py) is named beside it; the rest are fixed defaults (core/defaults.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from kuberay_scaler.core import defaults as D
from kuberay_scaler.core.slicemap import SliceTimeouts


@dataclass(frozen=True)
class Deadlines:
    """How long the planner waits, holds back or keeps (seconds)."""

    # Overrides every group's idle timeout when set (KUBERAY_SCALER_IDLE_TIMEOUT_S).
    idle_timeout_override_s: float | None = None
    # A slice not fully up after this is broken (KUBERAY_SCALER_MAX_PROVISION_TIME_S); also an
    # unavailable group's provisioning deadline. A group's annotation may override it.
    max_provision_s: float = D.MAX_PROVISION_TIME_S
    # A Running pod whose Ray node is missing this long makes its slice broken
    # (KUBERAY_SCALER_MISSING_NODE_GRACE_S).
    missing_node_grace_s: float = D.MISSING_NODE_GRACE_S
    # How long after its Ray container started a worker host's used resources may still be
    # work reported pending (see JOIN_SETTLE_S); 0 turns the settle off.
    join_settle_s: float = D.JOIN_SETTLE_S
    # A group's backoff after replacing a broken slice (KUBERAY_SCALER_REPLACE_BACKOFF_S),
    # doubling up to replace_max_backoff_s.
    replace_backoff_s: float = D.REPLACE_BACKOFF_S
    replace_max_backoff_s: float = D.MAX_REPLACE_BACKOFF_S
    # How long a busy slice that leaves (above maxReplicas, disrupted, broken but busy) is drained
    # (reason preemption) before deletion (KUBERAY_SCALER_PREEMPT_DEADLINE_S).
    preempt_deadline_s: float = D.PREEMPT_DEADLINE_S
    # The deadline handed to Ray's DrainNode for each host (KUBERAY_SCALER_DRAIN_DEADLINE_S;
    # the wall clock: Ray reads it).
    drain_deadline_s: float = D.DRAIN_DEADLINE_S
    # How long a broken slice with a busy host is kept before it is drained for preemption and
    # replaced (KUBERAY_SCALER_BROKEN_BUSY_MAX_S).
    broken_busy_max_s: float = D.BROKEN_BUSY_MAX_S
    # Group availability: the backoff before an unavailable group is probed
    # (KUBERAY_SCALER_UNAVAILABLE_BACKOFF_S), doubling up to ..._UNAVAILABLE_MAX_BACKOFF_S.
    unavailable_backoff_s: float = D.UNAVAILABLE_BACKOFF_S
    unavailable_max_backoff_s: float = D.UNAVAILABLE_MAX_BACKOFF_S
    # A group that added a slice removes no idle slice for this long
    # (KUBERAY_SCALER_SCALE_DOWN_DELAY_AFTER_ADD_S; a group's annotation overrides it).
    scale_down_delay_after_add_s: float = D.SCALE_DOWN_DELAY_AFTER_ADD_S
    # Unneeded slices of a group that served slice reservations are kept this long after the
    # last one was pending (KUBERAY_SCALER_RESERVATION_GRACE_S, planner/reservations.py).
    reservation_grace_s: float = D.RESERVATION_GRACE_S

    @property
    def slice_timeouts(self) -> SliceTimeouts:
        """The two the slice map judges slices by."""
        return SliceTimeouts(self.max_provision_s, self.missing_node_grace_s)
