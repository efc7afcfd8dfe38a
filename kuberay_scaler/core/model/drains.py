"""How a slice's drain went, host by host (node ids in hex, the one form they take here).

The ray_gcs adapter fills these from `DrainNode` replies; the loop and the rules that decide
what a refused or partial drain means read them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal


class DrainReason(StrEnum):
    # Refused by Ray for a busy node; once accepted, that raylet exits at once.
    IDLE_TERMINATION = "idle_termination"
    # Accepted for a busy node: Ray stops scheduling there and moves what it can by the deadline.
    PREEMPTION = "preemption"


DrainOutcome = Literal["accepted", "rejected", "error"]


@dataclass(frozen=True)
class HostDrain:
    """How one host's drain went; `message` is the GCS's rejection reason or the error."""

    node_id: str  # hex
    outcome: DrainOutcome
    message: str = ""


@dataclass(frozen=True)
class SliceDrainResult:
    hosts: tuple[HostDrain, ...]

    @property
    def may_delete(self) -> bool:
        """True only when every host accepted (vacuously true for a slice with no Ray nodes)."""
        return all(h.outcome == "accepted" for h in self.hosts)

    @property
    def drained_node_ids(self) -> tuple[str, ...]:
        """Hosts whose raylets are exiting: in a cancelled slice these are lost anyway."""
        return tuple(h.node_id for h in self.hosts if h.outcome == "accepted")

    @property
    def refused(self) -> tuple[HostDrain, ...]:
        return tuple(h for h in self.hosts if h.outcome != "accepted")

    @property
    def reason(self) -> str:
        """One line for decisions and logs: why deletion may or may not go ahead."""
        if self.may_delete:
            return f"all {len(self.hosts)} hosts drained"
        details = "; ".join(f"{h.node_id[:12]} {h.outcome}: {h.message}" for h in self.refused)
        return f"{len(self.refused)}/{len(self.hosts)} hosts refused: {details}"
