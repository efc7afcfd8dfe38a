"""The README's "Try a plan offline" runs as written, on the example capture shipped in
examples/ (built from the test fixtures by tests/examples.py: it stays what they say)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.examples import EXAMPLE, REPO, build


def _offline_block() -> str:
    """The first code block of the README's "Try a plan offline" section."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Try a plan offline", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```[a-z]*\n(.*?)```", section, re.S)
    assert match, "no code block under 'Try a plan offline'"
    return match.group(1)


def test_the_example_capture_is_what_the_fixtures_make() -> None:
    for name, text in build().items():
        assert (EXAMPLE / name).read_text() == text, f"run scripts/make_example.py ({name})"


def test_the_readmes_plan_command_runs_as_written_on_the_example() -> None:
    block = _offline_block()
    assert f"cd {EXAMPLE.relative_to(REPO)}" in block
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "-euc", block],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    (tpu,) = doc["groups"]
    assert tpu["name"] == "tpu-group" and tpu["num_of_hosts"] == 4
    assert tpu["replicas"] == {"current": 0, "target": 1}  # one whole 4-host slice
    assert [r["type"] for r in tpu["reasons"]] == ["ScaleUp"]
    assert {"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 1} in doc[
        "patch"
    ]
    assert doc["problems"] == [] and doc["infeasible"] == []


def test_kubectls_answer_for_no_pods_is_no_pods(tmp_path: Path) -> None:
    """`kubectl get pods -l ray.io/cluster=X -o json` matching nothing prints an empty
    `kind: List`: the README's first step on a cluster with no pods yet must not exit 2."""
    empty = tmp_path / "pods.json"
    empty.write_text(
        json.dumps({"apiVersion": "v1", "items": [], "kind": "List", "metadata": {}}) + "\n"
    )
    done = subprocess.run(
        [
            *(sys.executable, "-m", "kuberay_scaler", "plan"),
            *("--raycluster", str(EXAMPLE / "rc.yaml"), "--pods", str(empty)),
            *("--ray-state", str(EXAMPLE / "state.json")),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["groups"][0]["replicas"] == {"current": 0, "target": 1}
