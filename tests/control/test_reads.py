"""One reconcile reads each input once: the reads-per-reconcile measurement of issue 21.

Counted over one reconcile of the one-pipeline scenario (an idle slice drained and deleted, a
busy slice kept, CPU demand scaled up for: record → drain → patch), with the fakes:

- RayCluster parses (`parse_raycluster`): once by the observer, once by the loop of the object
  the record write returned (the patch's guards are built from it, after the drains answered);
  nothing past the parser reads the raw object (`build_patch` takes the parsed spec);
- GCS reply parses (the adapter's reply → `RayState` conversion): once per reply, by the poller
  for the pushed observation, once for the fresh read right before draining and once for the
  read after the drains answered (the deletion gate's last evidence); the loop itself parses
  none.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from kuberay_scaler.adapters.ray_gcs import poller
from kuberay_scaler.core.decision import observation
from kuberay_scaler.loop import execute, observe
from tests.control.fakes import make_loop
from tests.control.worlds import drain_busy_and_scale_up


def _count(
    monkeypatch: pytest.MonkeyPatch, reads: Counter[str], what: str, module: Any, name: str
) -> None:
    real: Callable[..., Any] = getattr(module, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        reads[what] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)


async def test_one_reconcile_reads_each_input_once(monkeypatch: pytest.MonkeyPatch) -> None:
    rc, pods, reply = drain_busy_and_scale_up()
    reads: Counter[str] = Counter()
    _count(monkeypatch, reads, "raycluster parses", observe, "parse_raycluster")
    _count(monkeypatch, reads, "raycluster parses", observation, "parse_raycluster")
    _count(monkeypatch, reads, "raycluster parses", execute, "parse_raycluster")
    # Every reply the fakes hand out is converted as the poller converts it (observation_of).
    _count(monkeypatch, reads, "gcs parses", poller, "parse_ray_state")

    loop = make_loop(rc, pods, reply)  # the poller pushes one observation: one parse
    assert reads == {"gcs parses": 1}
    await loop.reconciler.reconcile()

    assert [c.outcome.kind for c in loop.writer.calls] == ["applied", "applied"]  # record, patch
    assert loop.gcs.drained  # the idle slice was drained (the scenario ran whole)
    assert reads == {
        "raycluster parses": 2,  # the observer's, and the object the record write returned
        "gcs parses": 3,  # the pushed observation + the reads before and after draining
    }
