"""The image's `ray`: KubeRay's autoscaler command becomes `kuberay-scaler run`, nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kuberay_scaler.ray_shim import UsageError, translate

SHIM = Path(sys.executable).parent / "kuberay-scaler-ray"
# What KubeRay's BuildAutoscalerContainer renders, after the kubelet expanded $(VAR).
KUBERAY_ARGS = ["kuberay-autoscaler", "--cluster-name", "rc", "--cluster-namespace", "ns"]


def test_kuberay_command_sets_the_cluster_for_run() -> None:
    env = translate(KUBERAY_ARGS, {"PATH": "/bin", "RAY_CLUSTER_NAME": "stale"})
    assert env == {"PATH": "/bin", "RAY_CLUSTER_NAME": "rc", "RAY_CLUSTER_NAMESPACE": "ns"}


def test_equals_form_and_gcs_address() -> None:
    env = translate(
        ["kuberay-autoscaler", "--cluster-name=rc", "--cluster-namespace=ns", "--gcs-address=h:1"],
        {},
    )
    assert env["KUBERAY_SCALER_GCS_ADDRESS"] == "h:1"
    assert env["RAY_CLUSTER_NAME"] == "rc"


@pytest.mark.parametrize(
    "argv,message",
    [
        (["start", "--head"], "`ray start --head` is not available"),
        ([], "`ray (no arguments)` is not available"),
        (["--version"], "`ray --version` is not available"),
        (["kuberay-autoscaler", "--cluster-name", "rc"], "missing --cluster-namespace"),
        ([*KUBERAY_ARGS, "--verbose"], "unknown argument '--verbose'"),
        (["kuberay-autoscaler", "--cluster-name"], "--cluster-name needs a value"),
    ],
)
def test_anything_else_is_refused(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        translate(argv, {})


def _clean_env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "KUBERAY_"))}
    return base | extra


def test_installed_entry_point_refuses_with_one_line() -> None:
    done = subprocess.run(
        [str(SHIM), "status"], capture_output=True, text=True, env=_clean_env(), timeout=60
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "kuberay-scaler: this image runs kuberay-scaler, not Ray: `ray status` is not available"
        " (only `ray kuberay-autoscaler`, which starts `kuberay-scaler run`)"
    ]


def test_kuberay_shell_line_reaches_kuberay_scaler_run(tmp_path: Path) -> None:
    """`/bin/bash -c -- "ray kuberay-autoscaler ..."` with our `ray` first on PATH runs
    `kuberay-scaler run` with that cluster: an invalid namespace from the command line is
    reported by run's own settings check (exit 2, one line naming the variable)."""
    (tmp_path / "ray").symlink_to(SHIM)
    line = "ray kuberay-autoscaler --cluster-name rc --cluster-namespace Not_A_Namespace"
    env = _clean_env(PATH=f"{tmp_path}:{os.environ['PATH']}")
    done = subprocess.run(
        ["/bin/bash", "-c", "--", line], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 2, done.stderr
    [message] = done.stderr.strip().splitlines()
    assert message.startswith("kuberay-scaler: ")
    assert "RAY_CLUSTER_NAMESPACE" in message and "Not_A_Namespace" in message
