"""The image's `ray`: KubeRay's autoscaler command becomes `kuberay-scaler run`, nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kuberay_scaler.cli.ray_shim import UsageError, translate

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


LINE = "ray kuberay-autoscaler --cluster-name rc --cluster-namespace Not_A_Namespace"
# The command lines KubeRay's BuildAutoscalerContainer renders (after $(VAR) expansion):
# v1.1 execs `ray` with split args, v1.2-1.3 `/bin/bash -lc --`, v1.4-1.7 `/bin/bash -c --`
# (`-cl` with the operator's ENABLE_LOGIN_SHELL=true). Login shells reset PATH from
# /etc/profile, so that form is run in the image (tests/image), not here.
KUBERAY_FORMS = {
    "v1.1": LINE.split(),
    "v1.4-v1.7": ["/bin/bash", "-c", "--", LINE],
}


@pytest.mark.parametrize("form", sorted(KUBERAY_FORMS))
def test_kuberay_command_line_reaches_kuberay_scaler_run(tmp_path: Path, form: str) -> None:
    """With our `ray` first on PATH the command KubeRay renders runs `kuberay-scaler run` with
    that cluster: an invalid namespace from the command line is reported by run's own settings
    check (exit 2, one line naming the variable)."""
    (tmp_path / "ray").symlink_to(SHIM)
    env = _clean_env(PATH=f"{tmp_path}:{os.environ['PATH']}")
    argv = KUBERAY_FORMS[form]
    if argv[0] == "ray":
        argv = [str(tmp_path / "ray"), *argv[1:]]  # the runtime resolves it on the image PATH
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2, done.stderr
    [message] = done.stderr.strip().splitlines()
    assert message.startswith("kuberay-scaler: ")
    assert "RAY_CLUSTER_NAMESPACE" in message and "Not_A_Namespace" in message
