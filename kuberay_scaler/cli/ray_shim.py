"""`ray` in our image: KubeRay < 1.7 starts its autoscaler container with
`/bin/bash -c -- "ray kuberay-autoscaler --cluster-name $(RAY_CLUSTER_NAME) --cluster-namespace
$(RAY_CLUSTER_NAMESPACE)"` (`-lc` when the operator runs with ENABLE_LOGIN_SHELL=true), in
whatever image `autoscalerOptions.image` names. This entry point, installed as `ray` first on
both a plain and a login shell's PATH, turns exactly that command into `kuberay-scaler run`, so
the image alone is the whole switch. Any other `ray` command is refused with one line: the
image has no Ray CLI, and pretending otherwise would hide a misconfiguration.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

SUBCOMMAND = "kuberay-autoscaler"
EXIT_USAGE = 2
# Ray's `ray kuberay-autoscaler` options and the variables `kuberay-scaler run` reads instead.
OPTIONS = {
    "--cluster-name": "RAY_CLUSTER_NAME",
    "--cluster-namespace": "RAY_CLUSTER_NAMESPACE",
    "--gcs-address": "KUBERAY_SCALER_GCS_ADDRESS",
}
REQUIRED = ("--cluster-name", "--cluster-namespace")


class UsageError(Exception):
    """A `ray` command line this image cannot honour; the message is one line."""


def translate(argv: Sequence[str], environ: Mapping[str, str]) -> dict[str, str]:
    """The environment `kuberay-scaler run` gets for `ray <argv>` (pure; raises UsageError)."""
    if not argv or argv[0] != SUBCOMMAND:
        shown = " ".join(argv) or "(no arguments)"
        raise UsageError(
            f"this image runs kuberay-scaler, not Ray: `ray {shown}` is not available "
            f"(only `ray {SUBCOMMAND}`, which starts `kuberay-scaler run`)"
        )
    values = _options(argv[1:])
    missing = [name for name in REQUIRED if not values.get(name)]
    if missing:
        raise UsageError(f"ray {SUBCOMMAND}: missing {', '.join(missing)}")
    env = dict(environ)
    for option, value in values.items():
        env[OPTIONS[option]] = value
    return env


def _options(tokens: Sequence[str]) -> dict[str, str]:
    values: dict[str, str] = {}
    rest = list(tokens)
    while rest:
        token = rest.pop(0)
        name, sep, value = token.partition("=")
        if name not in OPTIONS:
            raise UsageError(f"ray {SUBCOMMAND}: unknown argument {token!r}")
        if not sep:
            if not rest:
                raise UsageError(f"ray {SUBCOMMAND}: {name} needs a value")
            value = rest.pop(0)
        values[name] = value
    return values


def daemon_command() -> list[str]:
    """`kuberay-scaler run` from the same installation as this entry point."""
    script = Path(sys.executable).parent / "kuberay-scaler"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script), "run"]
    return [sys.executable, "-m", "kuberay_scaler", "run"]


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        env = translate(args, os.environ)
    except UsageError as err:
        print(f"kuberay-scaler: {err}", file=sys.stderr)
        return EXIT_USAGE
    command = daemon_command()
    sys.stdout.flush()
    # exec keeps the PID: the kubelet's SIGTERM reaches the daemon itself.
    os.execve(command[0], command, env)
    return 0  # not reached
