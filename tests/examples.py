"""The example capture the README's "Try a plan offline" runs on (examples/), built from the
project's own fixtures so it stays true: `scripts/make_example.py` writes it, and
tests/unit/cli/test_readme_example.py checks the files still equal what this builds and runs the
README's command on them as written.

v6e-16-pending: the v6e-16 sample RayCluster (one group of 4-host slices) scaled to zero, only
the head pod running, and a real Ray 2.60 GCS reply holding a slice reservation that waits for a
v6e-16 slice (tests/fixtures/ray_state/pending_slice_reservation.json).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.factories import FIXTURES, SAMPLES, pod

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "v6e-16-pending"
CLUSTER = "raycluster-tpu-v6e-multihost"


def _raycluster() -> str:
    text = (SAMPLES / "ray-cluster.tpu-v6e-16-multihost.yaml").read_text()
    scaled_to_zero = text.replace("    replicas: 1\n", "    replicas: 0\n")
    if scaled_to_zero.count("    replicas: 0\n") != 1:
        raise ValueError("the v6e-16 sample no longer has exactly one group with replicas: 1")
    return scaled_to_zero


def _pods() -> str:
    head = pod(f"{CLUSTER}-head-x7k2p", "headgroup", cluster_name=CLUSTER, head=True)
    head |= {"apiVersion": "v1", "kind": "Pod"}  # as `kubectl get pods -o json` lists them
    head["spec"]["containers"] = [{"name": "ray-head"}]
    head["status"]["containerStatuses"] = [
        {"name": "ray-head", "state": head["status"]["containerStatuses"][1]["state"]}
    ]
    podlist = {"apiVersion": "v1", "kind": "List", "items": [head], "metadata": {}}
    return json.dumps(podlist, indent=2, sort_keys=True) + "\n"


def build() -> dict[str, str]:
    """File name → content of examples/v6e-16-pending."""
    state = (FIXTURES / "ray_state" / "pending_slice_reservation.json").read_text()
    return {"rc.yaml": _raycluster(), "pods.json": _pods(), "state.json": state}
