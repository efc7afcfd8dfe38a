"""The `plan` command: the planner on files, for what-if questions before trusting the daemon."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from kuberay_scaler.decision import Observation, decide
from kuberay_scaler.model.plan import Memory
from kuberay_scaler.model.ray import RayObservation, RayState
from kuberay_scaler.parse.pods import pod_items
from kuberay_scaler.parse.ray_state import RayStateError, parse_ray_state
from kuberay_scaler.planner.core import Policy


class InputError(Exception):
    """A file cannot be used; the message names it."""


STDIN = Path("-")  # `-` reads standard input, as kubectl's `-f -`


def read_text(path: Path, what: str) -> str:
    """The file's text; `-` is standard input (read once: only one input may be `-`)."""
    try:
        if path == STDIN:
            return sys.stdin.read()
        return path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"{what} {path}: {_why(err)}") from None


def load_documents(path: Path, what: str) -> list[Any]:
    """Every document of a JSON or YAML file; `kubectl get -o yaml` samples may hold several.

    JSON (what `kubectl get -o json` prints) goes through the JSON parser: YAML's is a hundred
    times slower on large pod lists. A `kind: List` is flattened into its items.
    """
    text = read_text(path, what)
    docs = _json_documents(text)
    if docs is None:
        try:
            docs = [d for d in yaml.safe_load_all(text) if d is not None]
        except yaml.YAMLError as err:
            raise InputError(f"{what} {path}: not YAML or JSON ({_first_line(err)})") from None
    return [item for d in docs for item in _flatten_list(d)]


def _json_documents(text: str) -> list[Any] | None:
    """The document if `text` is JSON; None when it is not (then it is read as YAML)."""
    if not text.lstrip().startswith(("{", "[")):
        return None
    try:
        return [json.loads(text)]
    except ValueError:
        return None  # flow-style YAML also starts with { or [


def _flatten_list(doc: Any) -> list[Any]:
    """`kind: List` (kubectl get a b -o yaml) → its items; anything else stays as it is."""
    if (
        isinstance(doc, Mapping)
        and doc.get("kind") == "List"
        and isinstance(doc.get("items"), list)
    ):
        return [i for i in doc["items"] if i is not None]
    return [doc]


def load_document(path: Path, what: str) -> Any:
    """The one document of a file (None when it is empty)."""
    docs = load_documents(path, what)
    if len(docs) > 1:
        raise InputError(f"{what} {path}: {len(docs)} documents, expected one")
    return docs[0] if docs else None


def load_raycluster(path: Path) -> dict[str, Any]:
    """The RayCluster among the file's documents (samples ship a ConfigMap next to it)."""
    docs = load_documents(path, "RayCluster")
    found = [d for d in docs if isinstance(d, dict) and d.get("kind", "RayCluster") == "RayCluster"]
    if len(found) != 1:
        detail = "none" if not found else f"{len(found)}"
        raise InputError(f"RayCluster {path}: expected one RayCluster object, found {detail}")
    rc = found[0]
    if not isinstance(rc.get("spec"), Mapping):
        raise InputError(f"RayCluster {path}: the RayCluster has no spec")
    return rc


def load_pods(path: Path | None) -> list[Any]:
    """A PodList, Pods (a `kind: List` of them too), a list of pods or a name → pod map; no
    file means no pods."""
    if path is None:
        return []
    docs = load_documents(path, "PodList")
    if docs and all(_is_pod(d) for d in docs) and (len(docs) > 1 or docs[0].get("kind")):
        return docs  # Pods: one, a List of them (flattened), or several documents
    if len(docs) > 1:
        raise InputError(f"PodList {path}: {len(docs)} documents, expected one")
    doc = docs[0]
    if isinstance(doc, list):
        return doc
    if isinstance(doc, Mapping):
        kind = doc.get("kind")
        if kind in ("PodList", "List") or (
            kind is None and all(isinstance(v, Mapping) for v in doc.values())
        ):
            return pod_items(doc)
    raise InputError(f"PodList {path}: expected a PodList, a Pod or a list of pods")


def _is_pod(doc: Any) -> bool:
    return (
        isinstance(doc, Mapping)
        and doc.get("kind", "Pod") == "Pod"
        and isinstance(doc.get("metadata"), Mapping)
    )


def load_ray_state(path: Path | None) -> RayState | None:
    """The GCS reply (proto3 JSON); no file means Ray's demand is unknown (the plan holds)."""
    if path is None:
        return None
    text = read_text(path, "Ray state")
    try:
        return parse_ray_state(text)
    except RayStateError as err:
        raise InputError(f"Ray state {path}: {err}") from None


def plan_files(
    raycluster: Path,
    pods: Path | None,
    ray_state: Path | None,
    policy: Policy,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Plan once from files and return the document the `plan` command prints.

    The same `decide()` the daemon runs: the writes include the draining-intent record and the
    drains, exactly as the daemon would send them for these inputs.
    """
    stdin = [p for p in (raycluster, pods, ray_state) if p == STDIN]
    if len(stdin) > 1:
        raise InputError("only one input can be read from standard input (-)")
    rc = load_raycluster(raycluster)
    state = load_ray_state(ray_state)
    gcs = RayObservation(state, observed_at=0.0) if state is not None else None  # None: unknown
    observed = Observation(raycluster=rc, pods=load_pods(pods), gcs=gcs)
    decision = decide(observed, Memory(), policy, now or datetime.now(UTC))
    if decision.error is not None:  # cannot happen for a plan made from this very object
        raise InputError(decision.error)
    document = decision.document()
    return {"cluster": document.pop("cluster"), "patch": document.pop("patch"), **document}


def plan_capture(directory: Path, policy: Policy) -> dict[str, Any]:
    """Replan the files `capture` wrote, at the moment they were captured."""
    from kuberay_scaler.capture import (
        PODS_FILE,
        RAY_STATE_FILE,
        RAYCLUSTER_FILE,
        read_captured_at,
    )

    if not (directory / RAYCLUSTER_FILE).is_file():
        raise InputError(f"capture {directory}: no {RAYCLUSTER_FILE} (not a capture directory)")
    return plan_files(
        directory / RAYCLUSTER_FILE,
        directory / PODS_FILE,
        directory / RAY_STATE_FILE,
        policy,
        now=read_captured_at(directory),
    )


def _why(err: OSError | UnicodeDecodeError) -> str:
    if isinstance(err, UnicodeDecodeError):
        return "not text (UTF-8)"
    return err.strerror or str(err)


def _first_line(err: yaml.YAMLError) -> str:
    mark = getattr(err, "problem_mark", None)
    where = f" at line {mark.line + 1}" if mark is not None else ""
    return f"{getattr(err, 'problem', None) or err.__class__.__name__}{where}"


def print_plan(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, ensure_ascii=False)
