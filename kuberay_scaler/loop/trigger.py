"""When the loop wakes: bursts of "something changed" folded into one reconcile without
delaying the first (`Trigger`), and the time a decision that time alone brings is due
(`wake_at`)."""

from __future__ import annotations

import asyncio
import contextlib
import time

# An idle slice reaches its timeout a little after the plan's idle clock says (the GCS reply
# is some way behind); waking never sooner than MIN_WAKE_S keeps a near-zero wait from spinning.
WAKE_MARGIN_S = 0.5
MIN_WAKE_S = 0.5


def wake_at(next_wake_s: float | None, now: float) -> float | None:
    """When (monotonic) the plan made at `now` wants a reconcile again: its first idle slice
    reaches its idle timeout or its first deadline passes (`Plan.next_wake_s`); None when
    nothing is due."""
    if next_wake_s is None:
        return None
    return now + max(MIN_WAKE_S, next_wake_s + WAKE_MARGIN_S)


class Schedule:
    """What the last reconciles ask of the next: when a decision that time alone brings is due
    (`planned`), and the inputs of the last settled reconcile, so one woken by a change that
    changed nothing the plan reads is skipped (`unchanged`). Time is passed in (monotonic)."""

    def __init__(self) -> None:
        self._wake_at: float | None = None
        self._settled: object | None = None

    def planned(self, next_wake_s: float | None, now: float) -> None:
        self._wake_at = wake_at(next_wake_s, now)

    def settled(self, inputs: object | None) -> None:
        """The inputs a reconcile settled with (nothing left to write); None: not settled."""
        self._settled = inputs

    def seconds_to_wake(self, now: float) -> float | None:
        return None if self._wake_at is None else max(0.0, self._wake_at - now)

    def unchanged(self, inputs: object, now: float) -> bool:
        """Nothing to plan for: the same inputs as the last settled reconcile, no wake due."""
        if self._wake_at is not None and now >= self._wake_at:
            return False
        return self._settled is not None and inputs == self._settled


class Trigger:
    """`fire(reason)` from any callback; `wait()` returns the reasons gathered since last time."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._reasons: set[str] = set()
        self._last_return = float("-inf")

    def fire(self, reason: str) -> None:
        self._reasons.add(reason)
        self._event.set()

    async def wait(self, max_wait: float, debounce: float) -> set[str]:
        """Wait up to `max_wait` for a first reason; return at once if the last return was at
        least `debounce` ago (a first event after a quiet spell adds no latency), else wait out
        the rest of `debounce` so a burst folds into one reconcile."""
        # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, max_wait)):
                await self._event.wait()
        if self._event.is_set() and debounce > 0:
            rest = self._last_return + debounce - time.monotonic()
            if rest > 0:
                await asyncio.sleep(rest)
        reasons, self._reasons = self._reasons or {"timer"}, set()
        self._event.clear()
        self._last_return = time.monotonic()
        return reasons
