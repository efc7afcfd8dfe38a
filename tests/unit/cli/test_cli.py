"""The command line as a user runs it: a real subprocess, a real environment, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kuberay_scaler import __version__
from kuberay_scaler.cli.main import EXIT_CONFIG, main

ROOT = Path(__file__).resolve().parents[3]
TOKEN = "tok-do-not-print-0123456789"
GOOD_ENV = {
    "RAY_CLUSTER_NAME": "raycluster-tpu",
    "RAY_CLUSTER_NAMESPACE": "ml",
    "RAY_AUTH_MODE": "token",
    "RAY_AUTH_TOKEN": TOKEN,
    "KUBERAY_SCALER_DRY_RUN": "1",
}


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # Only PATH from our own environment: no stray RAY_* or KUBERAY_SCALER_* leaks in.
    clean = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT), **env}
    return subprocess.run(
        [sys.executable, "-m", "kuberay_scaler", *args],
        env=clean,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_check_config_prints_effective_settings_with_the_token_masked(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:6443'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    done = run_cli("check-config", env={**GOOD_ENV, "KUBERAY_SCALER_KUBECONFIG": str(kubeconfig)})

    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["RAY_CLUSTER_NAME"] == "raycluster-tpu"
    assert shown["RAY_CLUSTER_NAMESPACE"] == "ml"
    assert shown["KUBERAY_SCALER_DRY_RUN"] is True
    assert shown["RAY_AUTH_TOKEN"] == "********"
    assert TOKEN not in done.stdout + done.stderr


def test_check_config_exits_2_with_one_clear_line_on_a_bad_value() -> None:
    done = run_cli("check-config", env={**GOOD_ENV, "KUBERAY_SCALER_GCS_POLL_INTERVAL_S": "-3"})

    assert done.returncode == EXIT_CONFIG == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert lines == [
        "kuberay-scaler: invalid configuration: KUBERAY_SCALER_GCS_POLL_INTERVAL_S: "
        "Input should be greater than or equal to 0.1 (got '-3')"
    ]
    assert TOKEN not in done.stderr


def test_check_config_requires_what_run_requires() -> None:
    env = {k: v for k, v in GOOD_ENV.items() if k != "RAY_CLUSTER_NAME"}

    done = run_cli("check-config", env=env)

    assert done.returncode == 2
    assert "RAY_CLUSTER_NAME" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_run_refuses_bad_configuration_before_doing_anything() -> None:
    done = run_cli("run", env={**GOOD_ENV, "KUBERAY_SCALER_LOG_LEVEL": "loud"})

    assert done.returncode == 2
    assert "KUBERAY_SCALER_LOG_LEVEL" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("variable", "raw"),
    [
        ("RAY_AUTH_TOKEN", "tok\nen"),
        ("RAY_AUTH_TOKEN", "t\u00f6ken"),
        ("KUBERAY_SCALER_DRAIN_DEADLINE_S", "1e300"),
        ("KUBERAY_SCALER_UNHEALTHY_AFTER_FAILURES", "1" * 4301),
    ],
    ids=["token-newline", "token-non-ascii", "deadline-1e300", "count-4301-digits"],
)
def test_run_refuses_values_that_would_fail_later_with_one_line(variable: str, raw: str) -> None:
    """Before: a token with a newline died in gRPC with a traceback; 1e300 s overflowed int64 ms
    in every drain request."""
    done = run_cli("run", env={**GOOD_ENV, variable: raw})

    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"kuberay-scaler: invalid configuration: {variable}"
    )
    assert "tok" not in lines[0] and "ken" not in lines[0] and TOKEN not in lines[0]
    assert len(lines[0]) < 300


def test_version_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["version"]) == 0
    assert capsys.readouterr().out.strip() == __version__


def test_config_error_in_process_returns_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBERAY_SCALER_TYPO", "1")

    assert main(["check-config"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kuberay-scaler: invalid configuration: KUBERAY_SCALER_TYPO")


def test_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["frobnicate"])
    assert caught.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
