"""Folds bursts of "something changed" into one reconcile, without delaying the first."""

from __future__ import annotations

import asyncio
import contextlib
import time


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
