"""A Ray driver that adds one pending `num_cpus=1` task per `up` line on stdin.

    python bench/demand_driver.py GCS_ADDRESS NODE_IP [RESOURCES_JSON]

The head has no CPUs, so each task waits in the GCS as demand for one more worker host. With
RESOURCES_JSON (e.g. `{"TPU": 4}`) each task asks for those resources and no CPU instead.
"""

from __future__ import annotations

import json
import logging
import sys


def main() -> None:
    gcs_address, node_ip = sys.argv[1:3]
    resources = json.loads(sys.argv[3]) if len(sys.argv) > 3 else None
    import ray

    ray.init(
        address=gcs_address,
        _node_ip_address=node_ip,
        log_to_driver=False,
        logging_level=logging.WARNING,
    )

    @ray.remote(num_cpus=1)
    def wait() -> None:
        return None

    if resources is not None:
        wait = wait.options(num_cpus=0, resources=resources)

    pending = []
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "up":
            pending.append(wait.remote())
            print(f"ok {len(pending)}", flush=True)


if __name__ == "__main__":
    main()
