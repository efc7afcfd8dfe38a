"""hands_off alone (loop/handsoff.py): an override is named from the parsed spec's writers."""

from __future__ import annotations

from dataclasses import replace

from kuberay_scaler.core.model.cluster import ClusterSpec, SpecWriter
from kuberay_scaler.core.parse.raycluster import parse_raycluster
from kuberay_scaler.loop.handsoff import HandsOff, OverrideBackoff, hands_off
from tests.factories import cluster, group

BACKOFF = OverrideBackoff(initial_s=60, max_s=600, memory_s=3600)


def spec_with(replicas: int, *writers: SpecWriter) -> ClusterSpec:
    spec = parse_raycluster(cluster(group("cpu", replicas=replicas, max_replicas=5)))
    return replace(spec, spec_writers=writers)


def test_an_override_names_the_parsed_spec_writers_newest_first() -> None:
    writers = (SpecWriter("argocd", "2026-01-01T11:00:00Z"), SpecWriter("kubectl", ""))
    state = HandsOff().wrote({"cpu": 3})
    after, (notice,) = hands_off(state, spec_with(1, *writers), lambda _: False, 100.0, BACKOFF)
    assert notice.managers == ("argocd", "kubectl")
    assert (notice.group, notice.ours, notice.theirs, notice.count) == ("cpu", 3, 1, 1)
    assert notice.hands_off_s == 60 and after.overrides["cpu"].until == 160.0
    assert "cpu" not in after.written  # their value is the truth until our next write


def test_an_override_without_writers_names_none() -> None:
    _, (notice,) = hands_off(
        HandsOff().wrote({"cpu": 3}), spec_with(1), lambda _: False, 0, BACKOFF
    )
    assert notice.managers == ()


def test_replicas_as_written_or_awaited_are_no_override_whoever_wrote_the_spec() -> None:
    state = HandsOff().wrote({"cpu": 3})
    writers = (SpecWriter("argocd", "2026-01-01T11:00:00Z"),)
    assert hands_off(state, spec_with(3, *writers), lambda _: False, 0, BACKOFF) == (state, ())
    assert hands_off(state, spec_with(1, *writers), lambda _: True, 0, BACKOFF) == (state, ())
