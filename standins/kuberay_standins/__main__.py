"""`kuberay-scaler-demo`: the demo on stand-ins and a local Ray cluster (not part of the daemon)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="kuberay-scaler-demo",
        description="Scale a TPU-style multi-host group on a local Ray cluster with stand-ins.",
    )
    parser.add_argument("--slices", type=int, default=1, help="slices the workload reserves")
    parser.add_argument("--hosts", type=int, default=4, help="hosts per slice (numOfHosts)")
    args = parser.parse_args(argv)

    from kuberay_scaler.runtime.logs import configure_logging
    from kuberay_standins.demo import main as demo_main

    configure_logging("console", "warning")
    return demo_main(slices=args.slices, hosts=args.hosts)


if __name__ == "__main__":
    raise SystemExit(main())
