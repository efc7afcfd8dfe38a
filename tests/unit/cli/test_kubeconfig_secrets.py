"""`check-config` and `run` never echo a kubeconfig secret, whatever is wrong with the file.

Each kubeconfig here is broken in a way whose library message (or our own) quoted a secret:
credentials in the server URL, an exec plugin's stderr, a YAML error's snippet of the line that
holds a token or a client key ("secrets").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.unit.cli.test_startup_errors import BASE, assert_one_line, run_in_process

SECRET = "s3cr3t-Zq8xV2pL"  # every secret below contains it


def _config(user: str, server: str = "https://127.0.0.1:6443", extra: str = "") -> str:
    return (
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: k, cluster: {{server: '{server}'}}}}]\n"
        f"users: [{{name: u, user: {user}}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n" + extra
    )


def _exec_plugin(tmp_path: Path) -> str:
    plugin = tmp_path / "plugin.sh"
    plugin.write_text(f"#!/bin/sh\necho 'refreshing token {SECRET} failed' >&2\nexit 1\n")
    plugin.chmod(0o755)
    return (
        "{exec: {apiVersion: client.authentication.k8s.io/v1, command: '" + str(plugin) + "',"
        " interactiveMode: Never}}"
    )


CASES = [
    "password in a cleartext remote server URL",
    "token in a cleartext remote server URL's query",
    "exec plugin failing with the token on stderr",
    "YAML error on the token's line",
    "YAML error on a client key's line",
    "tab on a password's line",
]


def leaky_kubeconfigs(tmp_path: Path) -> dict[str, str]:
    return {
        "password in a cleartext remote server URL": _config(
            "{token: t}", server=f"http://admin:{SECRET}@10.0.0.1:8080"
        ),
        "token in a cleartext remote server URL's query": _config(
            "{token: t}", server=f"http://10.0.0.1:8080/?access_token={SECRET}"
        ),
        "exec plugin failing with the token on stderr": _config(_exec_plugin(tmp_path)),
        "YAML error on the token's line": _config("{token: " + SECRET + ", [}"),
        "YAML error on a client key's line": _config(
            "{client-key-data: " + SECRET + "AAAA, client-certificate-data: {]}"
        ),
        "tab on a password's line": _config("{username: u, password: " + SECRET + "}")
        + f"\tpassword: {SECRET}\n",
    }


@pytest.mark.parametrize("command", ["check-config", "run"])
@pytest.mark.parametrize("case", CASES)
def test_a_broken_kubeconfig_is_one_line_without_its_secret(
    tmp_path: Path, case: str, command: str, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(leaky_kubeconfigs(tmp_path)[case])

    done = run_in_process(
        command, {**BASE, "KUBERAY_SCALER_KUBECONFIG": str(kubeconfig)}, monkeypatch, capsys
    )

    line = assert_one_line(done, "KUBERAY_SCALER_KUBECONFIG", str(kubeconfig))
    assert SECRET not in line
    assert SECRET[:8] not in done.stderr + done.stdout


def test_the_exec_plugin_failure_still_says_what_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(_config(_exec_plugin(tmp_path)))

    done = run_in_process(
        "check-config", {**BASE, "KUBERAY_SCALER_KUBECONFIG": str(kubeconfig)}, monkeypatch, capsys
    )

    line = assert_one_line(done, "exec", "returned 1")
    assert "stderr not shown" in line


def test_a_yaml_error_still_names_the_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(_config("{token: " + SECRET + ", [}"))

    done = run_in_process(
        "check-config", {**BASE, "KUBERAY_SCALER_KUBECONFIG": str(kubeconfig)}, monkeypatch, capsys
    )

    assert "line 5" in assert_one_line(done)


def test_a_good_kubeconfig_with_url_credentials_prints_no_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(_config("{token: t}", server=f"https://admin:{SECRET}@127.0.0.1:6443"))

    done = run_in_process(
        "check-config", {**BASE, "KUBERAY_SCALER_KUBECONFIG": str(kubeconfig)}, monkeypatch, capsys
    )

    assert done.returncode == 0, done.stderr
    assert SECRET not in done.stdout + done.stderr


@pytest.mark.parametrize("command", ["check-config", "run"])
def test_a_gcs_address_with_a_password_is_refused_without_showing_it(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """Issue 30: `check-config` accepted `user:password@host:port` and printed it."""
    address = f"ray:{SECRET}@10.0.0.2:6379"
    done = run_in_process(
        command, {**BASE, "KUBERAY_SCALER_GCS_ADDRESS": address}, monkeypatch, capsys
    )

    assert_one_line(done, "KUBERAY_SCALER_GCS_ADDRESS", "user info")
    assert SECRET[:8] not in done.stderr + done.stdout


def test_a_kubeconfig_token_file_path_is_not_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """A missing `tokenFile` was named in the one-line error, path and all."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(_config("{tokenFile: /var/run/" + SECRET + "/token}"))

    done = run_in_process(
        "check-config", {**BASE, "KUBERAY_SCALER_KUBECONFIG": str(kubeconfig)}, monkeypatch, capsys
    )

    assert_one_line(done, "KUBERAY_SCALER_KUBECONFIG", str(kubeconfig))
    assert SECRET[:8] not in done.stderr + done.stdout
