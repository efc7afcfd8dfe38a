"""A frozen corpus of fuzz inputs and the digest of every plan made from them: a refactor of the
decision path must leave each plan byte-identical (tests/fuzz/test_plan_corpus.py).

Each case is one raw input (RayCluster dict, pod list, serialized GCS reply) drawn once from the
pipeline fuzzer's strategies and stored in tests/fixtures/plan_corpus.json.gz, so the corpus
does not move with Hypothesis versions or strategy edits. It is planned over two frames: a cold
memory, then the same input 400 s later with the memory the first frame left (so the timers and
memory deltas show in the second plan). What is hashed is what the daemon and `plan` show and
write: the decision's document, the object once the record and patch are applied, and the plan
as carried out after the drains were answered as Ray answers them.

    python -m tests.fuzz.plan_corpus --digests   # re-record the digests (an intended change)
    python -m tests.fuzz.plan_corpus --corpus    # draw the inputs anew (then the digests)
"""

from __future__ import annotations

import argparse
import base64
import copy
import dataclasses
import enum
import gzip
import hashlib
import json
import math
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jsonpatch

from kuberay_scaler.adapters.ray_gcs.poller import observation_of
from kuberay_scaler.core.decision import Observation, decide
from kuberay_scaler.core.model.plan import Memory
from kuberay_scaler.core.patch.ops import ops_json
from kuberay_scaler.core.planner.policy import Policy
from tests.fuzz.pipeline import BUSY, node_statuses, refused_outright

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "plan_corpus.json.gz"
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
MONO_S = 10_000.0
LATER_S = 400.0  # the second frame: past the default idle timeout and the settle windows
SIZE = 400


def canonical(value: Any) -> Any:
    """A JSON-able form of any plan value, independent of dict order where order means nothing."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: canonical(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        items = [(canonical(k), canonical(v)) for k, v in value.items()]
        return sorted(items, key=lambda kv: json.dumps(kv[0], sort_keys=True))
    if isinstance(value, (set, frozenset)):
        return sorted((canonical(v) for v in value), key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, enum.Enum):
        return canonical(value.value)
    if isinstance(value, float):
        return repr(value) if not math.isfinite(value) else value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).hex()
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return repr(value)


def _frame(
    rc: dict[str, Any], pods: list[Any], reply: bytes, memory: Memory, later_s: float
) -> tuple[Any, Memory]:
    from ray.core.generated import autoscaler_pb2

    mono_s = MONO_S + later_s
    parsed = autoscaler_pb2.GetClusterResourceStateReply.FromString(reply)
    gcs = observation_of(
        parsed, observed_at=mono_s, cluster_id="c0", epoch=0, read_at_ms=int(mono_s * 1000)
    )
    observed = Observation.parse(raycluster=copy.deepcopy(rc), pods=list(pods), gcs=gcs)
    now = NOW + timedelta(seconds=later_s)
    decision = decide(observed, memory, Policy(), now, mono_s=mono_s)
    base = copy.deepcopy(rc)
    if decision.record is not None:
        base = jsonpatch.apply_patch(base, ops_json(decision.record.ops))
    status = node_statuses(reply)
    refused = {
        (d.group, d.slice_key)
        for d in decision.drains
        if not d.preempt and any(status.get(n) == BUSY for n in d.node_ids)
    }
    carried, patch = refused_outright(decision, refused, base)
    after = jsonpatch.apply_patch(base, ops_json(patch.ops)) if patch is not None else base
    shown = {
        "decision": canonical(decision.document()),
        "error": decision.error,
        "carried_out": canonical(carried.summary()),
        "after": canonical(after),
    }
    return shown, carried.memory


def plan_bytes(rc: dict[str, Any], pods: list[Any], reply: bytes) -> bytes:
    """The two frames' plans of one case, as canonical JSON bytes."""
    first, memory = _frame(rc, pods, reply, Memory(), 0.0)
    second, _ = _frame(rc, pods, reply, memory, LATER_S)
    return json.dumps([first, second], sort_keys=True, allow_nan=True).encode()


def digest(rc: dict[str, Any], pods: list[Any], reply: bytes) -> str:
    return hashlib.sha256(plan_bytes(rc, pods, reply)).hexdigest()


def load() -> list[dict[str, Any]]:
    with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
        cases: list[dict[str, Any]] = json.load(f)["cases"]
    return cases


def inputs_of(case: Mapping[str, Any]) -> tuple[dict[str, Any], list[Any], bytes]:
    return case["rc"], case["pods"], base64.b64decode(case["reply"])


def _save(cases: list[dict[str, Any]]) -> None:
    text = json.dumps({"cases": cases}, sort_keys=True, allow_nan=True)
    with gzip.GzipFile(CORPUS, "wb", mtime=0) as f:
        f.write(text.encode())


def _draw(size: int) -> list[tuple[dict[str, Any], list[Any], bytes]]:
    from hypothesis import HealthCheck, Phase, given, settings

    from tests.fuzz.test_pipeline_fuzz import inputs

    drawn: list[tuple[dict[str, Any], list[Any], bytes]] = []

    @settings(
        max_examples=size,
        derandomize=True,
        database=None,
        phases=[Phase.generate],
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(inputs())
    def collect(case: tuple[dict[str, Any], list[Any], bytes]) -> None:
        drawn.append(copy.deepcopy(case))

    collect()
    return drawn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--corpus", action="store_true", help="draw the inputs anew")
    which.add_argument("--digests", action="store_true", help="re-record the digests")
    args = parser.parse_args()
    if args.corpus:
        cases = [
            {"rc": rc, "pods": pods, "reply": base64.b64encode(reply).decode()}
            for rc, pods, reply in _draw(SIZE)
        ]
    else:
        cases = load()
    for case in cases:
        case["digest"] = digest(*inputs_of(case))
    _save(cases)
    print(f"{len(cases)} cases → {CORPUS}")


if __name__ == "__main__":
    main()
