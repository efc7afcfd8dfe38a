"""Run Ray's own KubeRay autoscaler, v1 or v2, from the installed wheel, unmodified.

    python bench/ray_autoscaler.py v1|v2 CLUSTER NAMESPACE GCS_ADDRESS

What `ray.autoscaler._private.kuberay.run_autoscaler.run_kuberay_autoscaler` does, except that the
version is chosen by the argument instead of the head's flag (so one head serves both) and the
`ray health-check` wait and log-file setup are skipped (the bench starts it on a ready head; logs
go to stderr). The Kubernetes side is Ray's: `KubeRayNodeProvider` (v1) or `KubeRayProvider` (v2),
configured by the environment the bench sets (API server address, client certificate, CA).
"""

from __future__ import annotations

import logging
import sys


def main() -> None:
    version, cluster, namespace, gcs_address = sys.argv[1:5]
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

    from ray.autoscaler._private.kuberay.autoscaling_config import AutoscalingConfigProducer

    producer = AutoscalingConfigProducer(cluster, namespace)  # type: ignore[no-untyped-call]
    monitor_ip = gcs_address.rsplit(":", 1)[0]
    if version == "v2":
        from ray.autoscaler.v2.instance_manager.config import KubeRayConfigReader
        from ray.autoscaler.v2.monitor import AutoscalerMonitor

        AutoscalerMonitor(
            address=gcs_address,
            config_reader=KubeRayConfigReader(producer),
            log_dir=None,
            monitor_ip=monitor_ip,
        ).run()  # type: ignore[no-untyped-call]
    else:
        from ray.autoscaler._private.monitor import Monitor

        Monitor(
            address=gcs_address,
            autoscaling_config=producer,
            monitor_ip=monitor_ip,
            retry_on_failure=False,
        ).run()  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    main()
