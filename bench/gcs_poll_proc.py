"""One GCS poller in its own process (see bench_gcs_poll.py); prints a JSON line.

python bench/gcs_poll_proc.py ours|ray-v2 ADDRESS WINDOW_S
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

WARMUP_S = 3.0


def _ours(address: str, window_s: float) -> dict[str, float]:
    from kuberay_scaler.adapters.ray_gcs.client import GcsClient
    from kuberay_scaler.adapters.ray_gcs.poller import GcsPoller
    from kuberay_scaler.core.model.ray import RayObservation
    from kuberay_scaler.runtime.settings import Settings

    interval = Settings.model_fields["gcs_poll_interval_s"].default
    polls = 0

    def on_observation(observation: RayObservation) -> None:
        nonlocal polls
        if observation.state is not None:
            polls += 1

    async def run() -> dict[str, float]:
        client = GcsClient(address)
        poller = GcsPoller(client, interval_s=interval, on_observation=on_observation)
        task = asyncio.create_task(poller.run())
        await asyncio.sleep(WARMUP_S)

        # Older pollers parsed every reply (no `parses` counter): then parses == polls.
        def parsed() -> int:
            return int(getattr(poller, "parses", polls))

        cpu0, t0, polls0, parses0 = time.process_time(), time.monotonic(), polls, parsed()
        await asyncio.sleep(window_s)
        cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
        task.cancel()
        await client.close()
        return {
            "cpu_s": cpu,
            "wall_s": wall,
            "polls": polls - polls0,
            "parses": parsed() - parses0,
            "interval_s": interval,
        }

    return asyncio.run(run())


def _ray(address: str, window_s: float) -> dict[str, float]:
    from ray._raylet import GcsClient  # type: ignore[attr-defined]  # compiled, no stub
    from ray.autoscaler._private.constants import AUTOSCALER_UPDATE_INTERVAL_S
    from ray.autoscaler.v2.sdk import get_cluster_resource_state

    client = GcsClient(address=address)
    start = time.monotonic()
    polls, cpu0, t0 = 0, 0.0, 0.0
    while True:
        now = time.monotonic()
        if t0 == 0.0 and now - start >= WARMUP_S:
            cpu0, t0, polls = time.process_time(), now, 0
        if t0 and now - t0 >= window_s:
            break
        get_cluster_resource_state(client)
        polls += 1
        time.sleep(max(0.0, AUTOSCALER_UPDATE_INTERVAL_S - (time.monotonic() - now)))
    cpu = time.process_time() - cpu0
    return {
        "cpu_s": cpu,
        "wall_s": time.monotonic() - t0,
        "polls": polls,
        "interval_s": AUTOSCALER_UPDATE_INTERVAL_S,
    }


def main() -> None:
    kind, address, window = sys.argv[1], sys.argv[2], float(sys.argv[3])
    result = _ours(address, window) if kind == "ours" else _ray(address, window)
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()}))


if __name__ == "__main__":
    main()
