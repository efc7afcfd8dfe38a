"""Startup problems (failure catalogue row 23): one line naming the problem and the variable to
set, exit code 2, no traceback; `check-config` finds the same file problems. Real subprocesses."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kuberay_scaler.cli.main import EXIT_CONFIG, main
from tests.unit.cli.test_cli import run_cli

BASE = {"RAY_CLUSTER_NAME": "rc", "KUBERAY_SCALER_HTTP_ADDRESS": ""}
PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def assert_one_line(done: object, *names: str) -> str:
    returncode, stdout, stderr = (
        done.returncode,  # type: ignore[attr-defined]
        done.stdout,  # type: ignore[attr-defined]
        done.stderr,  # type: ignore[attr-defined]
    )
    assert returncode == EXIT_CONFIG, stderr
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    assert lines[0].startswith("kuberay-scaler: ")
    for name in names:
        assert name in lines[0], lines[0]
    assert stdout == ""
    return str(lines[0])


def kubeconfig_problems(tmp_path: Path) -> dict[str, tuple[dict[str, str], tuple[str, ...]]]:
    garbled = tmp_path / "garbled"
    garbled.write_text("apiVersion: v1\nclusters: [ {unclosed\n")
    empty = tmp_path / "empty"
    empty.write_text("")
    folder = tmp_path / "a-directory"
    folder.mkdir()
    return {
        "missing kubeconfig": (
            {"KUBERAY_SCALER_KUBECONFIG": str(tmp_path / "nope")},
            ("KUBERAY_SCALER_KUBECONFIG", "nope"),
        ),
        "garbled kubeconfig": (
            {"KUBERAY_SCALER_KUBECONFIG": str(garbled)},
            ("KUBERAY_SCALER_KUBECONFIG", "garbled"),
        ),
        "empty kubeconfig": (
            {"KUBECONFIG": str(empty)},
            ("KUBERAY_SCALER_KUBECONFIG", "empty"),
        ),
        "kubeconfig is a directory": (
            {"KUBERAY_SCALER_KUBECONFIG": str(folder)},
            ("KUBERAY_SCALER_KUBECONFIG",),
        ),
        "no in-cluster environment": ({}, ("KUBERAY_SCALER_KUBECONFIG", "in-cluster")),
    }


def tls_problems(tmp_path: Path) -> dict[str, tuple[dict[str, str], tuple[str, ...]]]:
    good = tmp_path / "good.pem"
    good.write_text(PEM)
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    tls = {
        "RAY_USE_TLS": "1",
        "RAY_TLS_CA_CERT": str(good),
        "RAY_TLS_SERVER_CERT": str(good),
        "RAY_TLS_SERVER_KEY": str(good),
        "KUBERAY_SCALER_KUBECONFIG": str(_kubeconfig(tmp_path)),
    }
    return {
        "TLS file missing": (
            {**tls, "RAY_TLS_SERVER_KEY": str(tmp_path / "gone.pem")},
            ("RAY_TLS_SERVER_KEY",),
        ),
        "TLS file not PEM": (
            {**tls, "RAY_TLS_CA_CERT": str(garbage)},
            ("RAY_TLS_CA_CERT", "PEM"),
        ),
    }


def _kubeconfig(tmp_path: Path) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'http://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    return path


FILE_CASES = [
    "missing kubeconfig",
    "garbled kubeconfig",
    "empty kubeconfig",
    "kubeconfig is a directory",
    "TLS file missing",
    "TLS file not PEM",
]


def _case(tmp_path: Path, name: str) -> tuple[dict[str, str], tuple[str, ...]]:
    return {**kubeconfig_problems(tmp_path), **tls_problems(tmp_path)}[name]


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


def run_in_process(
    command: str, env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> Done:
    """`main([command])` with exactly `env` as the environment (fast; no interpreter start)."""
    for key in list(os.environ):
        if key.startswith(("RAY_", "KUBERAY_", "KUBERNETES_")) or key == "KUBECONFIG":
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    code = main([command])
    out = capsys.readouterr()
    return Done(code, out.out, out.err)


@pytest.mark.parametrize("command", ["run", "check-config"])
@pytest.mark.parametrize("name", FILE_CASES)
def test_startup_problem_is_one_line_and_exit_2(
    tmp_path: Path, name: str, command: str, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    env, names = _case(tmp_path, name)
    assert_one_line(run_in_process(command, {**BASE, **env}, monkeypatch, capsys), *names)


def test_no_in_cluster_environment_fails_run_but_check_config_only_notes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    env, names = _case(tmp_path, "no in-cluster environment")
    assert_one_line(run_in_process("run", {**BASE, **env}, monkeypatch, capsys), *names)
    done = run_in_process("check-config", {**BASE, **env}, monkeypatch, capsys)
    assert done.returncode == 0 and "KUBERAY_SCALER_KUBECONFIG" in done.stderr


def test_a_real_process_exits_2_without_a_traceback(tmp_path: Path) -> None:
    env, names = _case(tmp_path, "garbled kubeconfig")
    assert_one_line(run_cli("run", env={**BASE, **env}), *names)


def test_in_cluster_token_file_problems_are_named(
    monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    # KUBERNETES_SERVICE_HOST set (we are "in a pod") but the service-account files are absent.
    env = {**BASE, "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "1"}
    done = run_in_process("run", env, monkeypatch, capsys)
    line = assert_one_line(done, "KUBERAY_SCALER_KUBECONFIG")
    assert "token" in line or "service account" in line
    done = run_in_process("check-config", env, monkeypatch, capsys)  # in a pod: files checked
    assert_one_line(done, "KUBERAY_SCALER_KUBECONFIG")


def test_http_port_taken_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        env = {
            **BASE,
            "KUBERAY_SCALER_HTTP_ADDRESS": f"127.0.0.1:{port}",
            "KUBERAY_SCALER_KUBECONFIG": str(_kubeconfig(tmp_path)),
        }
        assert_one_line(run_cli("run", env=env), "KUBERAY_SCALER_HTTP_ADDRESS")


def test_a_good_kubeconfig_passes_check_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    env = {**BASE, "KUBERAY_SCALER_KUBECONFIG": str(_kubeconfig(tmp_path))}
    done = run_in_process("check-config", env, monkeypatch, capsys)
    assert done.returncode == 0, done.stderr
