"""Jittered exponential backoff (pure: the random source is injectable)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Backoff:
    """Delays `initial * factor**n`, capped at `cap`, each scaled by a random factor in [0.5, 1].

    Jitter keeps many clients from retrying in lock-step after a shared outage; the lower bound
    of half the step keeps the delay from collapsing to nothing.
    """

    initial: float = 0.5
    cap: float = 30.0
    factor: float = 2.0
    uniform: Callable[[float, float], float] = field(default=random.uniform, repr=False)
    _failures: int = 0

    def next_delay(self) -> float:
        """Delay before the next attempt; each call counts one more consecutive failure."""
        # The exponent is bounded so a long outage cannot overflow the float.
        step = min(self.cap, self.initial * self.factor ** min(self._failures, 64))
        self._failures += 1
        return step * self.uniform(0.5, 1.0)

    def reset(self) -> None:
        """Forget past failures after a success."""
        self._failures = 0

    @property
    def failures(self) -> int:
        """Consecutive failures since the last `reset`."""
        return self._failures
