"""Exponential backoff: the one delay rule, and a jittered retry counter (pure: the random
source is injectable). The planner's replacement backoff and every retry loop use this rule."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field


def exponential_delay(failures: int, initial: float, cap: float, factor: float = 2.0) -> float:
    """`initial * factor**failures`, capped: the delay after `failures` earlier failures."""
    # The exponent is bounded so a long outage cannot overflow the float.
    return min(cap, initial * factor ** min(max(failures, 0), 64))


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
        step = exponential_delay(self._failures, self.initial, self.cap, self.factor)
        self._failures += 1
        return step * self.uniform(0.5, 1.0)

    def reset(self) -> None:
        """Forget past failures after a success."""
        self._failures = 0

    @property
    def failures(self) -> int:
        """Consecutive failures since the last `reset`."""
        return self._failures
