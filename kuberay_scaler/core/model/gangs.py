"""A gang as the report shows it: k slices of one type wanted together."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GangLine:
    """One pending placement group's slices in one group: how many are up, how many still
    coming and for how long, and its deadline (the group's provisioning deadline)."""

    group: str
    pod_type: str  # the slice type (`v6e-16`), else the group's name
    slices: int  # k: the slices of this group the gang needs
    up: int  # of them, up and idle (a pending placement group holds nothing yet)
    pending: int  # coming up (pending or partial)
    pending_s: float  # how long the oldest of them has been coming (the daemon's clock)
    queued: int = 0  # held by a scheduling gate (Kueue): waiting for admission, not capacity
    age_s: float = 0.0  # how long the gang's oldest slice has existed: what the deadline judges
    deadline_s: float = 0.0
    elastic: bool = False  # request_resources asks for the same slices: never released
    released: bool = False  # past the deadline: its slices are handed back this plan

    def __str__(self) -> str:
        parts = [f"{self.up} up"]
        if self.pending:
            parts.append(f"{self.pending} pending {_minutes(self.pending_s)}")
        if self.queued:
            parts.append(f"{self.queued} queued")
        missing = self.slices - self.up - self.pending - self.queued
        if missing > 0:
            parts.append(f"{missing} not launched")
        parts.append(f"deadline {_minutes(self.deadline_s)}")
        text = f"gang {self.slices} × {self.pod_type}: {', '.join(parts)}"
        if self.released:
            return f"{text}; past it after {_minutes(self.age_s)}: released, re-planned whole"
        if self.elastic:
            past = self.age_s > self.deadline_s and self.up < self.slices
            return f"{text}; elastic (request_resources){': past it, kept' if past else ''}"
        return text


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"
