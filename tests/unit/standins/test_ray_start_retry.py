"""A Ray node that misses Ray's fixed 30 s registration window is started again (issue 19:
`tests/ray/test_gcs_restart.py` errored in setup with "The current node timed out during
startup" under load); any other start failure is not retried."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kuberay_standins import ray_local
from kuberay_standins.ray_local import RayStartError

MISSED = "Exception: The current node timed out during startup. This could happen because ..."


@dataclass
class FakeNode:
    error: str | None
    ip: str = "127.0.0.10"
    stopped: bool = False

    def _wait_ready(self, timeout_s: float) -> None:
        if self.error:
            raise RayStartError(f"ray start on {self.ip} exited:\n{self.error}")

    def stop(self, grace_s: float = 0.0) -> None:
        self.stopped = True


def _spawner(errors: list[str | None]) -> tuple[list[FakeNode], object]:
    made: list[FakeNode] = []

    def spawn() -> FakeNode:
        made.append(FakeNode(errors[len(made)]))
        return made[-1]

    return made, spawn


def test_a_missed_registration_window_is_started_again() -> None:
    made, spawn = _spawner([MISSED, MISSED, None])
    node = ray_local._start_with_retries(spawn, 5.0)  # type: ignore[type-var, arg-type]
    assert node is made[-1] and len(made) == 3
    assert made[0].stopped and made[1].stopped and not made[2].stopped


def test_it_gives_up_after_the_last_attempt() -> None:
    made, spawn = _spawner([MISSED] * ray_local.START_ATTEMPTS)
    with pytest.raises(RayStartError, match="timed out during startup"):
        ray_local._start_with_retries(spawn, 5.0)  # type: ignore[type-var, arg-type]
    assert len(made) == ray_local.START_ATTEMPTS and all(n.stopped for n in made)


def test_any_other_failure_is_not_retried() -> None:
    made, spawn = _spawner(["OSError: [Errno 98] Address already in use", None])
    with pytest.raises(RayStartError, match="Address already in use"):
        ray_local._start_with_retries(spawn, 5.0)  # type: ignore[type-var, arg-type]
    assert len(made) == 1


def test_start_hosts_starts_again_only_the_host_that_missed_the_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    errors = {"127.0.0.21": [None], "127.0.0.23": [MISSED, None]}
    made: list[FakeNode] = []

    class Spawned(FakeNode):
        def wait_ready(self, timeout_s: float) -> Spawned:
            ray_local._ready_or_stop(self, timeout_s)  # type: ignore[arg-type]
            return self

    def spawn(_: str, *, ip: str, **__: object) -> Spawned:
        made.append(Spawned(errors[ip].pop(0), ip))
        return made[-1]  # type: ignore[return-value]

    monkeypatch.setattr(ray_local.RayHost, "spawn", staticmethod(spawn))
    monkeypatch.setattr(ray_local, "RAY_VENV", "")
    specs = [ray_local.HostSpec(ip=ip) for ip in ("127.0.0.21", "127.0.0.23")]
    hosts = ray_local.start_hosts("127.0.0.10:6379", specs)
    assert [h.ip for h in hosts] == ["127.0.0.21", "127.0.0.23"]
    assert len(made) == 3 and made[1].stopped and not hosts[1].stopped  # type: ignore[attr-defined]
