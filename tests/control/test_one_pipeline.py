"""The daemon, `kuberay-scaler plan` and /debug/plan produce the same writes for the same input.

All three go through `decision.decide`; this holds them to it end to end: the daemon's writes as
the fake API server and fake GCS received them, the `plan` command's printed writes from files,
and /debug/plan served over HTTP.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from google.protobuf import json_format

from kuberay_scaler.adapters.web.server import Probes, make_app, start_server
from kuberay_scaler.cli.offline import plan_files
from kuberay_scaler.core.planner.policy import Policy
from kuberay_scaler.runtime.metrics import Metrics
from tests.control.fakes import make_loop
from tests.control.worlds import drain_busy_and_scale_up
from tests.factories import (
    NOW,
)


def _without_cluster_ids(writes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Offline there is no GCS to pin drains to; everything else must match."""
    return [{k: v for k, v in w.items() if k != "cluster_id"} for w in writes]


def _plan_command(tmp_path: Path, rc: Any, pods: Any, reply: Any) -> dict[str, Any]:
    rc_path, pods_path, ray_path = (tmp_path / n for n in ("rc.yaml", "pods.json", "ray.json"))
    rc_path.write_text(yaml.safe_dump(rc))
    pods_path.write_text(json.dumps({"kind": "PodList", "items": pods}))
    ray_path.write_text(json_format.MessageToJson(reply))
    return plan_files(rc_path, pods_path, ray_path, Policy(), now=NOW)


async def _debug_plan(source: Any) -> dict[str, Any]:
    probes = Probes(healthy=lambda: (True, ""), ready=lambda: (True, ""), plan=source)
    runner = await start_server(make_app(probes, Metrics()), "127.0.0.1:0")
    try:
        host, port = runner.addresses[0][:2]
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://{host}:{port}/debug/plan") as response,
        ):
            assert response.status == 200
            document: dict[str, Any] = json.loads(await response.text())
            return document
    finally:
        await runner.cleanup()


async def test_daemon_plan_command_and_debug_plan_agree_on_every_write(tmp_path: Path) -> None:
    rc, pods, reply = drain_busy_and_scale_up()
    offline = _plan_command(tmp_path, rc, pods, reply)

    loop = make_loop(rc, pods, reply)
    await loop.reconciler.reconcile()
    served = await _debug_plan(loop.reconciler.document)

    kinds = [w["write"] for w in offline["writes"]]
    assert kinds == ["record_intent", "drain", "patch"]
    # /debug/plan shows what the plan command prints (plus the GCS the drains are pinned to).
    assert _without_cluster_ids(served["writes"]) == _without_cluster_ids(offline["writes"])
    assert {w["cluster_id"] for w in served["writes"] if w["write"] == "drain"} == {"cluster-1"}
    assert served["groups"] == offline["groups"]
    # The daemon sent exactly those writes, in that order.
    record, drain, patch = offline["writes"]
    assert [c.ops for c in loop.writer.calls] == [record["ops"], patch["ops"]]
    assert all(c.outcome.kind == "applied" for c in loop.writer.calls)
    assert sorted(loop.gcs.drained) == sorted(drain["node_ids"])
    assert served["last_patch_sent"] == patch["ops"]
    # And the writes did what the plan says.
    tpu, cpu = loop.server.obj["spec"]["workerGroupSpecs"]
    assert (tpu["replicas"], cpu["replicas"]) == (1, 2)
    assert sorted(tpu["scaleStrategy"]["workersToDelete"]) == [f"tpu-a-{i}" for i in range(4)]
