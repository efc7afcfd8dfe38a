"""The stand-ins' port picker never hands one process the same port twice.

Found in CI: Ray 2.49.2 refused `ray start` because the dashboard port and the agent's HTTP port,
picked by two bind(0) calls, were the same number.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kuberay_standins import ports
from kuberay_standins.ports import LOWEST, ephemeral_range, free_port


def test_ports_handed_out_are_distinct_and_bindable() -> None:
    picked = [free_port() for _ in range(150)] + [free_port("127.0.0.1") for _ in range(150)]
    assert len(set(picked)) == len(picked)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", picked[-1]))


def test_ports_come_from_below_the_ephemeral_range() -> None:
    """Outgoing connections take their local ports from the ephemeral range: a port picked
    there may be taken before its listener binds it (an e2e head's Ray client server failed
    to bind so, and `ray start --block` stopped the head)."""
    low, _ = ephemeral_range()
    if low - LOWEST <= 1000:
        pytest.skip(f"this kernel's ephemeral range starts at {low}: no room below it")
    picked = [free_port("127.0.0.1") for _ in range(100)]
    assert all(LOWEST <= p < low for p in picked), sorted(p for p in picked if p >= low)[:5]


def test_a_port_another_process_claimed_is_not_handed_out_until_its_claim_is_old(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Sessions beside each other pick from the same range: a port another process picked (its
    head not yet bound to it) is skipped for CLAIM_S, however free it looks now."""
    monkeypatch.setattr(ports, "CLAIMS", tmp_path / "claims")
    assert ports._claim(24_001, now=1_000.0)
    claimed = ports.CLAIMS / "24001"
    os.utime(claimed, (1_000.0, 1_000.0))
    assert not ports._claim(24_001, now=1_000.0 + ports.CLAIM_S - 1)
    assert ports._claim(24_001, now=1_000.0 + ports.CLAIM_S + 1)  # an old claim is taken over


def test_a_claim_made_in_another_process_is_seen_here(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(ports, "CLAIMS", tmp_path / "claims")
    script = (
        "import sys; from pathlib import Path; from kuberay_standins import ports; "
        f"ports.CLAIMS = Path({str(ports.CLAIMS)!r}); sys.exit(0 if ports._claim(24_002) else 1)"
    )
    assert subprocess.run([sys.executable, "-c", script], timeout=60).returncode == 0
    assert not ports._claim(24_002)
