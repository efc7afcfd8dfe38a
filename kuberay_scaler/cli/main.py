"""Command line: run | plan | capture | check-config | version (the demo: kuberay_standins)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

from pydantic import AliasChoices

from kuberay_scaler import __version__
from kuberay_scaler.runtime.settings import (
    ConfigError,
    Settings,
    credentials_hint,
    load_settings,
    range_text,
)

EXIT_CONFIG = 2
ACCESS_CHECK_TIMEOUT_S = 20.0
# KubeRay sets these in its autoscaler container (the drop-in); a sidecar sets them itself.
INJECTED = ("RAY_CLUSTER_NAME", "RAY_CLUSTER_NAMESPACE", "RAY_HEAD_POD_NAME", "KUBERAY_CRD_VER")
REQUIRED = ("RAY_CLUSTER_NAME",)


def config_rows() -> list[tuple[str, str, str, str]]:
    """(variable, default, range, meaning) of every setting, from the settings model itself: the
    one source of `run --help` and the README's configuration table."""
    rows = []
    for field, info in Settings.model_fields.items():
        alias = info.validation_alias
        names = [str(c) for c in alias.choices] if isinstance(alias, AliasChoices) else []
        if not names:
            continue
        name, meaning = names[0], str(info.description or "")
        if names[1:]:
            meaning += f" Also read from {', '.join(names[1:])}."
        if name in INJECTED:
            meaning += " KubeRay sets it."
        bounded = any(hasattr(m, attr) for m in info.metadata for attr in ("gt", "ge", "le"))
        default = "required" if name in REQUIRED else _default(info.default)
        rows.append((name, default, range_text(field) if bounded else "", meaning))
    return rows


def _default(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def config_table() -> str:
    """The README's configuration table (a unit test keeps the README equal to it)."""
    lines = ["| Variable | Default | Range | Meaning |", "| --- | --- | --- | --- |"]
    for name, default, bounds, meaning in config_rows():
        shown = default if default in ("required", "unset") else f"`{default}`"
        lines.append(f"| `{name}` | {shown} | {bounds} | {meaning} |")
    return "\n".join(lines)


def _run_epilog() -> str:
    width = max(len(row[0]) for row in config_rows())
    lines = [
        "Configured by environment variables only (no flags); invalid values exit 2 with one",
        "line naming the variable. `kuberay-scaler check-config` validates a configuration as",
        "`run` would and prints the effective values, secrets masked.",
        "",
        "environment:",
    ]
    for name, default, bounds, meaning in config_rows():
        shown = default if default in ("required", "unset") else f"default: {default}"
        within = f", {bounds.strip('`')}" if bounds else ""
        lines.append(f"  {name:<{width}}  [{shown}{within}]")
        lines.extend(textwrap.wrap(meaning, 96, initial_indent=" " * 6, subsequent_indent=" " * 6))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as err:
        print(f"kuberay-scaler: {err}", file=sys.stderr)
        return EXIT_CONFIG


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kuberay-scaler",
        description="Slice-aware autoscaler for Ray clusters on Kubernetes (KubeRay RayCluster).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="run the autoscaler daemon (configured by env vars: `run --help` lists them)",
        description="Run the autoscaler daemon for one RayCluster.",
        epilog=_run_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.set_defaults(func=_run)
    plan = sub.add_parser("plan", help="plan once from files and print the decision as JSON")
    plan.add_argument(
        "--raycluster",
        type=Path,
        help="RayCluster YAML or JSON (`-`: stdin; a `kind: List` holding it is fine)",
    )
    plan.add_argument(
        "--pods", type=Path, help="PodList JSON or YAML (kubectl get pods -o json; `-`: stdin)"
    )
    plan.add_argument(
        "--ray-state",
        type=Path,
        help="GetClusterResourceStateReply in proto3 JSON (`-`: stdin); without it the plan"
        " runs as 'Ray demand unknown' and still shows the slice map",
    )
    plan.add_argument(
        "--events",
        type=Path,
        help="Events (kubectl get events -o json; core/v1 or events.k8s.io/v1; `-`: stdin): the"
        " cluster-autoscaler's on the pods and KubeRay's on the RayCluster are judged as the"
        " daemon judges them (docs/capacity-signals.md)",
    )
    plan.add_argument(
        "--nodes",
        type=Path,
        help="Nodes (kubectl get nodes -o json; `-`: stdin): GKE maintenance announced on them"
        " (label cloud.google.com/scheduled-maintenance-time, taint"
        " cloud.google.com/impending-node-termination), judged as the daemon does where it may"
        " read nodes (docs/capacity-signals.md)",
    )
    plan.add_argument(
        "--capture",
        type=Path,
        help="a directory written by `capture`: its three files, replanned at the captured moment",
    )
    plan.set_defaults(func=_plan)
    capture = sub.add_parser(
        "capture",
        help="write the RayCluster, its pods and the GCS reply into a directory, for `plan`"
        " and bug reports (configured like `run`; secrets are never written)",
    )
    capture.add_argument("directory", type=Path, help="where to write the files")
    capture.add_argument("--name", help="RayCluster name (default: RAY_CLUSTER_NAME)")
    capture.add_argument("--namespace", help="namespace (default: RAY_CLUSTER_NAMESPACE)")
    capture.add_argument("--gcs-address", help="host:port (default: KUBERAY_SCALER_GCS_ADDRESS)")
    capture.add_argument(
        "--kubeconfig", help="kubeconfig file (default: KUBERAY_SCALER_KUBECONFIG, else in-cluster)"
    )
    capture.set_defaults(func=_capture)
    check = sub.add_parser(
        "check-config", help="validate env configuration as `run` would, and print it"
    )
    check.add_argument(
        "--access",
        action="store_true",
        help="also ask the API server (SelfSubjectAccessReview, as `run` does at start) what the"
        " token may do, and say the modes and capacity signals `run` would use",
    )
    check.set_defaults(func=_check_config)
    version = sub.add_parser("version", help="print the version")
    version.set_defaults(func=lambda _: print(__version__) or 0)
    return parser


CAPACITY_NOTE = (
    "capacity signals: pod conditions and the provisioning deadline always; the"
    " cluster-autoscaler's and KubeRay's Events only where the token may get/list/watch events"
    " (deploy/capacity-events); `run` asks at start and logs `capacity signals`,"
    " `check-config --access` asks now"
)


def _check_config(args: argparse.Namespace) -> int:
    """Accept exactly what `run` accepts, and show the effective values (secrets masked)."""
    settings = load_settings()
    settings.require_cluster()
    in_pod = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    if settings.kubeconfig is None and not in_pod:
        # Not a file problem: validating a pod's configuration from a laptop is allowed.
        print(
            "kuberay-scaler: note: no KUBERAY_SCALER_KUBECONFIG and not in a pod: `run` would"
            " need one of them",
            file=sys.stderr,
        )
    else:
        _check_files(settings)
    print(json.dumps(settings.masked(), indent=2, default=str))
    print(f"kuberay-scaler: note: {CAPACITY_NOTE}", file=sys.stderr)
    if getattr(args, "access", False):
        return _check_access(settings)
    return 0


def _check_access(settings: Settings) -> int:
    """What the token may do, asked now: one line (the line `run` logs as `kubernetes access`)."""
    import asyncio

    from kuberay_scaler.adapters.kube.access import Access, detect_access
    from kuberay_scaler.adapters.kube.session import SessionError, open_api

    kubeconfig = str(settings.kubeconfig) if settings.kubeconfig else None

    async def ask() -> Access:
        api = await open_api(kubeconfig, request_timeout=settings.k8s_request_timeout_s)
        try:
            async with asyncio.timeout(ACCESS_CHECK_TIMEOUT_S):
                return await detect_access(
                    api, settings.cluster_namespace, name=settings.cluster_name
                )
        finally:
            await api.close()

    try:
        access = asyncio.run(ask())
    except (TimeoutError, SessionError, OSError) as err:
        print(f"kuberay-scaler: access: cannot ask the API server: {err!r}", file=sys.stderr)
        return 1
    print(f"kuberay-scaler: access: {access.description}", file=sys.stderr)
    return 0


def _check_files(settings: Settings) -> None:
    """The Kubernetes credentials `run` would load (TLS files are checked by the settings)."""
    from kuberay_scaler.adapters.kube.session import SessionError, check_credentials

    kubeconfig = str(settings.kubeconfig) if settings.kubeconfig else None
    try:
        check_credentials(kubeconfig)
    except SessionError as err:
        raise ConfigError(credentials_hint(str(err), kubeconfig)) from None


def _plan(args: argparse.Namespace) -> int:
    from kuberay_scaler.cli.offline import InputError, plan_capture, plan_files, print_plan
    from kuberay_scaler.runtime.policy import policy_from_settings

    policy = policy_from_settings(load_settings())
    try:
        if args.capture is not None:
            if args.events is not None:
                raise InputError("--events goes with --raycluster: a capture has its events.json")
            if args.nodes is not None:
                raise InputError("--nodes goes with --raycluster: a capture has its nodes.json")
            document = plan_capture(args.capture, policy)
        elif args.raycluster is None:
            raise InputError("--raycluster (or --capture DIR) is required")
        else:
            document = plan_files(
                args.raycluster,
                args.pods,
                args.ray_state,
                policy,
                events=args.events,
                nodes=args.nodes,
            )
    except InputError as err:
        print(f"kuberay-scaler plan: {err}", file=sys.stderr)
        return EXIT_CONFIG
    return _emit(print_plan(document), "plan")


def _emit(text: str, command: str) -> int:
    """Print the result; a closed or broken standard output is one line and exit 1, not a
    traceback (nor, with `>&-`, silence and exit 0)."""
    try:
        if sys.stdout is None:
            raise OSError(0, "standard output is closed")
        print(text, flush=True)
    except OSError as err:
        print(f"kuberay-scaler {command}: cannot write the result: {err.strerror}", file=sys.stderr)
        sys.stdout = None  # nothing left to flush at exit
        return 1
    return 0


_CAPTURE_ENV = {
    "name": "RAY_CLUSTER_NAME",
    "namespace": "RAY_CLUSTER_NAMESPACE",
    "gcs_address": "KUBERAY_SCALER_GCS_ADDRESS",
    "kubeconfig": "KUBERAY_SCALER_KUBECONFIG",
}


def _capture(args: argparse.Namespace) -> int:
    import asyncio

    from kuberay_scaler.adapters.kube.session import SessionError
    from kuberay_scaler.adapters.kube.transport import ApiError, NoResponse
    from kuberay_scaler.adapters.ray_gcs.errors import GcsError
    from kuberay_scaler.cli.capture import capture

    overrides = {env: getattr(args, k) for k, env in _CAPTURE_ENV.items() if getattr(args, k)}
    settings = load_settings({**os.environ, **overrides})
    settings.require_cluster()
    _check_files(settings)
    try:
        out = asyncio.run(capture(settings, args.directory))
    except (SessionError, ApiError, NoResponse, GcsError, OSError) as err:
        print(f"kuberay-scaler capture: {err}", file=sys.stderr)
        return 1
    print(out)
    return 0


def _run(_: argparse.Namespace) -> int:
    from kuberay_scaler.runtime import heap, lightimports

    heap.tune_malloc()  # before any thread starts
    lightimports.install()  # before anything imports ray or kubernetes_asyncio
    settings = load_settings()
    settings.require_cluster()
    _check_files(settings)
    from kuberay_scaler.app import run_daemon

    return run_daemon(settings)
