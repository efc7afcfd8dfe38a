"""/debug/slices read by a real browser: headless Chromium (Debian's `chromium`), issue 12 item 7.

The page is served by the daemon's own web app from a real reconcile's document (fake API
server and GCS, the real loop); Chromium renders it, the test reads the rendered DOM and takes
a screenshot. Skipped, saying why, when the chromium binary is absent.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from kuberay_scaler.adapters.web.server import Probes, make_app, start_server
from kuberay_standins.ray_local import free_port
from tests.control.fakes import make_loop
from tests.factories import (
    cluster,
    cpu_nodes,
    group,
    head_node,
    pod,
    slice_pods,
    state,
    tpu_group,
    tpu_slice_nodes,
)

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _scenario() -> tuple[dict[str, Any], list[dict[str, Any]], Any]:
    rc = cluster(tpu_group(replicas=3), group("cpu", replicas=2, max_replicas=3))
    pods = [
        *slice_pods("tpu", "tpu-a", 4),  # idle for 15 min: drained and deleted
        *slice_pods("tpu", "tpu-b", 4),  # busy
        *slice_pods("tpu", "tpu-c", 4)[:3],  # 3 of 4 hosts: partial
        pod("cpu-0", "cpu"),
        pod("cpu-1", "cpu", phase="Pending", age_s=20),
    ]
    nodes = [
        head_node(),
        *tpu_slice_nodes("tpu-a", 4, idle_s=900),
        *tpu_slice_nodes("tpu-b", 4, busy_hosts=(2,)),
        *cpu_nodes(["cpu-0"], idle_s=12),
    ]
    return rc, pods, state(nodes)


@pytest.fixture
async def page_url() -> AsyncIterator[str]:
    rc, pods, ray = _scenario()
    loop = make_loop(rc, pods, ray)
    await loop.reconciler.reconcile()
    probes = Probes(lambda: (True, ""), lambda: (True, ""), loop.reconciler.document)
    app = make_app(probes, loop.reconciler.metrics)
    address = f"127.0.0.1:{free_port()}"
    runner = await start_server(app, address)
    try:
        yield f"http://{address}/debug/slices"
    finally:
        await runner.cleanup()


def _chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    env = {**os.environ, "HOME": str(tmp)}  # hermetic: no profile outside the test's dir
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",  # tests may run as root
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
            f"--user-data-dir={tmp / 'profile'}",
            *args,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (Debian package `chromium`)")
async def test_slices_page_renders_groups_slices_hosts_and_decisions(
    page_url: str, tmp_path: Path
) -> None:
    import asyncio

    def content_type() -> str:
        with urllib.request.urlopen(page_url, timeout=5) as reply:
            return str(reply.headers["Content-Type"])

    assert (await asyncio.to_thread(content_type)).startswith("text/html")  # a page, not JSON

    def plan_json() -> dict[str, Any]:
        url = page_url.replace("/debug/slices", "/debug/plan")
        with urllib.request.urlopen(url, timeout=5) as reply:
            doc: dict[str, Any] = json.loads(reply.read())
            return doc

    plan = await asyncio.to_thread(plan_json)  # the same slice states, as JSON
    states = {s["slice"]: s["state"] for g in plan["groups"] for s in g["slices"]}
    assert states == {
        "tpu-a": "complete",
        "tpu-b": "complete",
        "tpu-c": "partial",
        "cpu-0": "complete",
        "cpu-1": "pending",
    }
    dom = await asyncio.to_thread(_chromium, tmp_path, "--dump-dom", page_url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    for text in ("Group tpu", "Group cpu", "tpu-a", "tpu-b", "tpu-c", "cpu-0", "cpu-1"):
        assert text in html, text
    assert 'class="state complete"' in html and 'class="state partial"' in html
    assert 'class="state pending"' in html
    assert "3 of 4 hosts" in html  # the partial slice's reason
    assert "900 s" in html  # idle time of tpu-a's hosts
    assert "not in Ray" in html  # hosts without a Ray node
    assert "Last decisions" in html and "scale_down" in html
    assert "remove slice tpu-a" in html  # the decision's reason, as text

    shot = tmp_path / "debug-slices.png"
    done = await asyncio.to_thread(
        _chromium, tmp_path, f"--screenshot={shot}", "--window-size=1280,1600", page_url
    )
    assert done.returncode == 0, done.stderr[-2000:]
    data = shot.read_bytes()
    assert data.startswith(PNG_MAGIC)
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1280, 1600)
    keep = os.environ.get("KRS_SCREENSHOT_DIR")
    if keep:
        shutil.copy(shot, Path(keep) / shot.name)
