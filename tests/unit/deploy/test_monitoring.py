"""deploy/monitoring: the Grafana dashboard loads, and every metric (and grouping label) it
queries is one the daemon's /metrics serves; the PodMonitor scrapes the port both modes name."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from kuberay_scaler.adapters.web.server import Probes, make_app
from kuberay_scaler.runtime.metrics import Metrics
from tests.kustomize import render

ROOT = Path(__file__).resolve().parents[3]
MONITORING = ROOT / "deploy" / "monitoring"
DASHBOARD = MONITORING / "grafana-dashboard.json"
METRIC = re.compile(r"\bkuberay_scaler_[a-z0-9_]+")
GROUPING = re.compile(r"\bby\s*\(([^)]*)\)")
# Labels Prometheus adds to every target (the PodMonitor's relabelling) or to histograms.
TARGET_LABELS = {"namespace", "pod", "container", "ray_cluster", "le", "instance", "job"}
SUFFIXES = ("", "_total", "_bucket", "_sum", "_count", "_created")


def _dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def _expressions(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            exprs.append(variable["definition"])
    return exprs


async def _served() -> dict[str, set[str]]:
    """Sample name -> label names, from /metrics of the daemon's own web app."""
    probes = Probes(healthy=lambda: (True, ""), ready=lambda: (True, ""), plan=lambda: None)
    async with TestClient(TestServer(make_app(probes, Metrics()))) as client:
        reply = await client.get("/metrics")
        assert reply.status == 200
        text = await reply.text()
    served: dict[str, set[str]] = {}
    families = {f.name: f for f in text_string_to_metric_families(text)}
    labels = _declared_labels()
    for name in families:
        for suffix in SUFFIXES:
            served[name + suffix] = labels.get(name, set())
    return served


def _declared_labels() -> dict[str, set[str]]:
    declared: dict[str, set[str]] = {}
    # Labelled metrics may have no samples: read what the registry declares.
    for collector in list(Metrics().registry._collector_to_names):
        name = getattr(collector, "_name", None)
        if name:
            declared[name.removesuffix("_total")] = set(getattr(collector, "_labelnames", ()))
    return declared


def test_dashboard_loads_with_panels_and_variables() -> None:
    dashboard = _dashboard()
    assert dashboard["title"] == "kuberay-scaler"
    titles = {p["title"] for p in dashboard["panels"]}
    assert {
        "Slices by state",
        "Target replicas (slices)",
        "Decisions by reason",
        "Reconcile latency",
        "Kubernetes API errors",
        "GCS RPC errors",
        "Group availability",
        "Fallbacks between groups",
    } <= titles
    assert all(p.get("targets") for p in dashboard["panels"])
    assert {v["name"] for v in dashboard["templating"]["list"]} >= {"namespace", "cluster"}


async def test_every_queried_metric_and_label_is_served() -> None:
    served = await _served()
    exprs = _expressions(_dashboard())
    queried = {m for e in exprs for m in METRIC.findall(e)}
    assert len(queried) >= 10
    missing = sorted(queried - set(served))
    assert not missing, f"queried but not in /metrics: {missing}"
    for expr in exprs:
        names = METRIC.findall(expr)
        known = set().union(*(served[n] for n in names)) | TARGET_LABELS
        for group in GROUPING.findall(expr):
            used = {label.strip() for label in group.split(",") if label.strip()}
            assert used <= known, f"{expr}: labels {sorted(used - known)} not on {names}"


@pytest.mark.parametrize("mode", ["drop-in", "sidecar"])
def test_podmonitor_port_is_named_in_both_modes(mode: str) -> None:
    monitor = yaml.safe_load((MONITORING / "podmonitor.yaml").read_text())
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    if mode == "sidecar":
        objects = render(ROOT / "deploy" / "sidecar" / "examples" / "tpu-v6e-16")
    else:
        objects = [yaml.safe_load((ROOT / "deploy/drop-in/raycluster-tpu-v6e-16.yaml").read_text())]
    [cluster] = [o for o in objects if o["kind"] == "RayCluster"]
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]
    ports = {p["name"]: p["containerPort"] for c in head["containers"] for p in c.get("ports", [])}
    assert ports[endpoint["port"]] == 44217
    assert monitor["spec"]["selector"]["matchLabels"] == {"ray.io/node-type": "head"}
