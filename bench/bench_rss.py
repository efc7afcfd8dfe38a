"""Benchmark: memory of the pod cache at N real-size pods (RSS ≤ 200 MB at 10k pods).

    .venv/bin/python bench/bench_rss.py [--pods 10000]

In a fresh process that imports what the daemon imports (`kuberay_scaler.app`), the daemon's own
pod `Informer` (with the daemon's `slim_pod` transform) lists the planner benchmark's cluster at
~N hosts, every pod dressed to real size (real_pods.py, managedFields included; the size is
reported), in pages of 500, each decoded from JSON bytes as the API server sends it; then the
`PodCache` parses them, the GCS reply (a Ray node per pod) is decoded and parsed and one
`decide()` + report runs. Reported: RSS before the list (imports done the daemon's way, with
lightimports, and the input read), peak RSS (VmHWM) while listing, RSS
after each step and the peak. Only the API transport is replaced (pages come from memory).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import loadavg

HERE = Path(__file__).resolve().parent


def _status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def child(input_file: str) -> dict[str, Any]:
    from kuberay_scaler.runtime import lightimports

    lightimports.install()  # first thing, as `kuberay-scaler run` does

    import bench_frame
    import real_pods
    from ray.core.generated import autoscaler_pb2

    import kuberay_scaler.app  # noqa: F401  (what the daemon has loaded before it lists)
    from kuberay_scaler.adapters.kube import informer
    from kuberay_scaler.core.decision import Observation, decide
    from kuberay_scaler.core.model.plan import Memory
    from kuberay_scaler.core.model.ray import RayObservation
    from kuberay_scaler.core.parse.pod_cache import PodCache
    from kuberay_scaler.core.parse.pods import slim_pod
    from kuberay_scaler.core.parse.raycluster import parse_raycluster
    from kuberay_scaler.core.planner.policy import Policy
    from kuberay_scaler.loop.report import report_from_plan

    # The planner benchmark's 20-group cluster at ~N hosts, built by the parent (its build
    # would stay in this process's heap): its pods' names and labels, each dressed as a real
    # pod here; its GCS reply with a Ray node per pod, as the bytes the poller receives.
    saved = json.loads(Path(input_file).read_text())
    shapes = [(name, labels) for name, labels in saved["pods"]]
    reply_bytes = bytes.fromhex(saved["reply"])
    raycluster = saved["raycluster"]
    del saved
    gc.collect()
    out: dict[str, Any] = {"pods": len(shapes), "rss_before_list_mb": _status_mb("VmRSS")}
    out["pod_json_bytes"] = real_pods.pod_json_size(_dressed(real_pods, *shapes[-1], 0))
    page_size = 500

    async def pages(_api: Any, _target: Any, _method: str, _path: str, **kw: Any) -> Any:
        query = kw.get("query") or {}
        start = int(query.get("continue") or 0)
        end = min(len(shapes), start + page_size)
        items = [_dressed(real_pods, *shapes[i], i) for i in range(start, end)]
        body = json.dumps({"items": items}).encode()  # the bytes on the wire, then decoded
        del items
        page = json.loads(body)
        more = str(end) if end < len(shapes) else ""
        page["metadata"] = {"resourceVersion": "1", "continue": more}
        return page

    informer.request_json = pages  # type: ignore[attr-defined,assignment]  # transport only
    inf = informer.Informer(
        None,  # type: ignore[arg-type]
        informer.Source.pods("default", "bench"),
        transform=slim_pod,
        page_size=page_size,
    )
    asyncio.run(inf._relist())
    out["peak_rss_listing_mb"] = _status_mb("VmHWM")
    gc.collect()
    out["rss_after_list_mb"] = _status_mb("VmRSS")
    spec = parse_raycluster(raycluster)
    parsed = PodCache().hosts(inf.store, spec)
    assert len(parsed[0]) == len(shapes), len(parsed[0])
    gc.collect()
    out["rss_with_pod_cache_mb"] = _status_mb("VmRSS")
    reply = autoscaler_pb2.GetClusterResourceStateReply.FromString(reply_bytes)
    state = bench_frame.parse(reply, bench_frame.NOW)
    observed = Observation(
        spec=spec,
        hosts=parsed[0],
        pod_problems=parsed[1],
        gcs=RayObservation(state, 0.0, cluster_id="c"),
    )
    decision = decide(observed, Memory(), Policy(), bench_frame.NOW)
    report_from_plan(decision.plan, int(bench_frame.NOW.timestamp()))
    del decision
    gc.collect()
    out["rss_after_frame_mb"] = _status_mb("VmRSS")
    out["peak_rss_mb"] = _status_mb("VmHWM")
    return out


def _dressed(real_pods: Any, name: str, labels: dict[str, str], index: int) -> dict[str, Any]:
    """A real-size pod with the scenario pod's name and labels."""
    pod: dict[str, Any] = real_pods.real_pod(name, labels["ray.io/group"], index)
    pod["metadata"]["labels"].update(labels)
    return pod


def measure(pods: int) -> dict[str, Any]:
    """Run the child in a fresh interpreter (its peak RSS is its own)."""
    import bench_frame

    sc = bench_frame.cluster(pods, launching=False)
    saved = {
        "pods": [(p["metadata"]["name"], p["metadata"]["labels"]) for p in sc.pods],
        "reply": sc.reply().SerializeToString().hex(),
        "raycluster": sc.raycluster,
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(saved, f)
    load = loadavg()
    try:
        done = subprocess.run(
            [sys.executable, str(HERE / "bench_rss.py"), "--child", f.name],
            capture_output=True,
            text=True,
            check=True,
        )
    finally:
        Path(f.name).unlink()
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["load"] = load
    result["goal_mb"] = 200
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--child", help="(internal) measure in this process from this file")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child)))
    else:
        print(json.dumps(measure(args.pods), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
