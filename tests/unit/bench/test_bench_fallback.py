"""bench/bench_fallback.py's measurement: what it records from the stand-in's store, the
intervals it derives, its summary and the rows it gives docs/benchmarks.md (issue 29's goals).
No timing is asserted: times are fed in."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from kuberay_scaler.core.model.labels import ANNOTATION_MAX_PROVISION
from kuberay_standins._k8s_store import StoredEvent
from kuberay_standins.ca_standin import ACCELERATOR, failed_scale_up, triggered

BENCH = Path(__file__).resolve().parents[3] / "bench"
sys.path.insert(0, str(BENCH))

import report  # noqa: E402
from bench_fallback import (  # noqa: E402
    FALLBACK,
    FALLBACK_TPU,
    STUCK,
    STUCK_TPU,
    Stamps,
    StoreClient,
    measure,
    no_node_fits,
    recorder,
    summary,
    tpu_cluster,
    unavailable_said,
)
from common import BenchApiServer  # noqa: E402


def pod(name: str, tpu: str, ns: str = "c1", *, stuck: bool = False) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Pending"}
    if stuck:
        status["conditions"] = [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
        ]
    return {
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}"},
        "spec": {"nodeSelector": {ACCELERATOR: tpu}},
        "status": status,
    }


def cluster(ns: str, replicas: dict[str, int]) -> dict[str, Any]:
    groups = [{"groupName": g, "replicas": r} for g, r in replicas.items()]
    return {"metadata": {"name": ns, "namespace": ns}, "spec": {"workerGroupSpecs": groups}}


def test_the_recorder_notes_firsts_and_every_replicas_write_per_cluster() -> None:
    stamps = {"c1": Stamps()}
    listen = recorder(stamps)
    listen(StoredEvent(1, "pods", "ADDED", pod("p0", STUCK_TPU), None))
    assert stamps["c1"].unschedulable is None  # Pending but not yet marked
    listen(StoredEvent(2, "pods", "MODIFIED", pod("p0", STUCK_TPU, stuck=True), None))
    first = stamps["c1"].unschedulable
    listen(StoredEvent(3, "pods", "MODIFIED", pod("p1", STUCK_TPU, stuck=True), None))
    assert first is not None and stamps["c1"].unschedulable == first  # the first stays
    listen(StoredEvent(4, "events", "ADDED", triggered(pod("p0", STUCK_TPU), "g", 0, 1, 4), None))
    assert stamps["c1"].failed_event is None  # TriggeredScaleUp is not a failure
    listen(StoredEvent(5, "events", "ADDED", failed_scale_up(pod("p0", STUCK_TPU), "z"), None))
    assert stamps["c1"].failed_event is not None
    old, new = cluster("c1", {STUCK: 1, FALLBACK: 0}), cluster("c1", {STUCK: 0, FALLBACK: 1})
    listen(StoredEvent(6, "rayclusters", "MODIFIED", new, old))
    assert [(g, n) for _, g, n in stamps["c1"].replicas] == [(STUCK, 0), (FALLBACK, 1)]
    listen(StoredEvent(7, "pods", "MODIFIED", pod("x", STUCK_TPU, "other", stuck=True), None))
    assert set(stamps) == {"c1"}  # other namespaces are not ours to record


def test_measure_gives_each_path_its_interval() -> None:
    seen = Stamps(
        unschedulable=100.0,
        failed_event=103.0,
        replicas=[(99.0, STUCK, 1), (104.5, STUCK, 0), (104.5, FALLBACK, 1)],
    )
    events = measure("ours-events", seen, end=110.0, deadline_s=20)
    assert events["fallback_s"] == 1.5  # from the FailedScaleUp Event
    assert events["from_unschedulable_s"] == 4.5
    assert events["opened_stuck"] and events["cancelled_stuck"]
    assert events["window_s"] == 10.0
    late = Stamps(unschedulable=100.0, replicas=[(99.0, STUCK, 1), (123.0, FALLBACK, 1)])
    deadline = measure("ours-deadline", late, end=130.0, deadline_s=20)
    assert (deadline["fallback_s"], deadline["over_deadline_s"]) == (23.0, 3.0)
    assert not deadline["cancelled_stuck"]
    stuck = Stamps(unschedulable=100.0, replicas=[(99.0, STUCK, 1)])
    ray = measure("ray-v2", stuck, end=160.0, deadline_s=20)
    assert ray["fallback_s"] is None and ray["window_s"] == 60.0 and ray["opened_stuck"]


def _row(events: float | None, deadline: float | None, ray: float | None) -> dict[str, Any]:
    def cell(value: float | None, over: float | None = None) -> dict[str, Any]:
        out = {"fallback_s": value, "opened_stuck": True, "window_s": 40.0, "said": []}
        if value is not None:
            out["from_unschedulable_s"] = value + 2  # the Event comes ~2 s after

        return out | ({"over_deadline_s": over} if over is not None else {})

    return {
        "trial": 1,
        "load1": 3.0,
        "ours-events": cell(events),
        "ours-deadline": cell(deadline, None if deadline is None else deadline - 20),
        "ray-v2": cell(ray),
        "ray-v2-timeout": cell(
            None if deadline is None else deadline + 5, deadline and deadline - 15
        ),
    }


def test_summary_and_the_goal_rows() -> None:
    rows = [_row(0.5, 22.0, None), _row(1.5, 23.0, None), _row(1.0, 30.0, None)]
    data = {"trials": rows, "summary": summary(rows, 20)}
    s = data["summary"]
    assert (s["ours-events"]["n"], s["ours-events"]["p50"], s["ours-events"]["max"]) == (
        3,
        1.0,
        1.5,
    )
    assert s["ours-deadline"]["over_p50"] == 3.0 and s["ours-deadline"]["max"] == 30.0
    assert (s["ray-v2"]["n"], s["ray-v2"]["missed"], s["ray-v2"]["min_window_s"]) == (0, 3, 40.0)
    goals = report._goals_29(data)
    assert [(name.split(" ≤")[0], ok) for name, _, _, ok in goals] == [
        ("FailedScaleUp Event → fallback PATCH p99", True),
        ("Unschedulable alone → fallback PATCH", False),  # deadline + ~10 s
        ("fallback, Ray v2 / ours (events path, p99)", None),
        (
            "fallback, Ray v2 with its allocate timeout = the deadline / ours (deadline path, p50)",
            None,
        ),
    ]
    assert goals[2][1].startswith("> 11× (from the first Unschedulable pod: ours 3.5 s")
    assert goals[2][1].endswith("Ray v2 no fallback within 40 s)")
    assert goals[3][0].startswith("fallback, Ray v2 with its allocate timeout")
    assert goals[3][1] == "1.22× (Ray v2 deadline + 8.0 s)"  # 28 s / 23 s at p50
    assert s["ray-v2-timeout"]["over_p50"] == 8.0
    text = "\n".join(report._fallback(data))
    assert "(3 trials, side by side on one world)" in text
    assert "| Ray v2 | first Unschedulable | — | — | — | 3 |" in text
    assert "fell back in 0" in text


def test_what_the_daemon_said_is_read_from_its_json_log() -> None:
    lines = [
        json.dumps({"event": "capacity", "change": "suspected", "text": "v6e-16 suspect"}),
        "not json",
        json.dumps(
            {"event": "capacity", "change": "marked_unavailable", "text": "v6e-16 unavailable"}
        ),
    ]
    assert unavailable_said("\n".join(lines)) == ["v6e-16 unavailable"]


def test_only_the_stuck_type_never_schedules_only_the_deadline_cluster_is_annotated() -> None:
    assert no_node_fits(pod("a", STUCK_TPU)) and no_node_fits(pod("b", FALLBACK_TPU)) is None
    plain = tpu_cluster("x", deadline_s=None)["spec"]["workerGroupSpecs"]
    timed = tpu_cluster("x", deadline_s=20)["spec"]["workerGroupSpecs"]
    assert [(g["groupName"], g["priority"], g["numOfHosts"]) for g in plain] == [
        (STUCK, 10, 4),
        (FALLBACK, 0, 4),
    ]
    assert all("metadata" not in g["template"] for g in plain)
    assert timed[0]["template"]["metadata"]["annotations"] == {ANNOTATION_MAX_PROVISION: "20"}


async def test_the_autoscaler_stand_ins_client_lists_pending_pods_and_posts_events() -> None:
    api = BenchApiServer()
    api.create("pods", "c1", pod("p0", STUCK_TPU, stuck=True))
    running = pod("p1", FALLBACK_TPU)
    running["status"] = {"phase": "Running"}
    api.create("pods", "c1", running)
    client = StoreClient(api)
    reply = await client.request("GET", "/api/v1/namespaces/c1/pods")
    assert [p["metadata"]["name"] for p in reply.body["items"]] == ["p0"]
    event = failed_scale_up(pod("p0", STUCK_TPU), "us-east5-b")
    posted = await client.request("POST", "/api/v1/namespaces/c1/events", event)
    assert posted.status == 201
    assert [e["reason"] for e in api.list("events", "c1")] == ["FailedScaleUp"]
