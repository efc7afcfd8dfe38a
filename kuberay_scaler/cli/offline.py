"""The `plan` command: the planner on files, for what-if questions before trusting the daemon."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from kuberay_scaler.adapters.ray_gcs.state import RayStateError, parse_ray_state
from kuberay_scaler.core.decision import Observation, decide
from kuberay_scaler.core.model.plan import Memory
from kuberay_scaler.core.model.ray import RayObservation, RayState, epoch_ms
from kuberay_scaler.core.model.signals import CapacityEvent, NodeMaintenance
from kuberay_scaler.core.parse.events import capacity_events, worker_group_names
from kuberay_scaler.core.parse.nodes import node_maintenance
from kuberay_scaler.core.parse.pods import pod_items
from kuberay_scaler.core.planner.policy import Policy


class InputError(Exception):
    """A file cannot be used; the message names it."""


STDIN = Path("-")  # `-` reads standard input, as kubectl's `-f -`

# The read cap: `kubectl get pods -o json` of ~5,000 pods, far above any RayCluster. A larger
# file (or /dev/zero) is refused after reading this much, so memory stays bounded.
MAX_INPUT_BYTES = 64 << 20
# Kubernetes objects nest ~20 levels (managedFields included); JSON's parser overflows the C
# stack near 1,000 and the planner recurses on what it is given.
MAX_DEPTH = 100


def read_text(path: Path, what: str) -> str:
    """The file's text, at most `MAX_INPUT_BYTES`; `-` is standard input (read once: only one
    input may be `-`)."""
    try:
        data = _read_capped(path)
    except OSError as err:
        raise InputError(f"{what} {shown(path)}: {err.strerror or err}") from None
    if len(data) > MAX_INPUT_BYTES:
        raise InputError(
            f"{what} {shown(path)}: larger than {MAX_INPUT_BYTES} bytes (the read cap); not read"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{what} {shown(path)}: not text (UTF-8)") from None


def shown(path: Path) -> str:
    """How messages name an input."""
    return "standard input (-)" if path == STDIN else str(path)


def _read_capped(path: Path) -> bytes:
    if path != STDIN:
        with open(path, "rb") as file:  # builtins.open: one sized read
            data: bytes = file.read(MAX_INPUT_BYTES + 1)
            return data
    return _read_stdin_capped()


def _read_stdin_capped() -> bytes:
    text_stream = sys.stdin
    if text_stream is None or text_stream.closed:  # started with fd 0 closed
        raise OSError(0, "closed")
    buffer = getattr(text_stream, "buffer", None)
    if buffer is None:  # a text stream put in its place (tests, embedding)
        text: str = text_stream.read(MAX_INPUT_BYTES + 1)
        return text.encode("utf-8", "surrogatepass")
    data: bytes = buffer.read(MAX_INPUT_BYTES + 1)
    return data


def load_documents(path: Path, what: str, *, keep_empty_list: bool = False) -> list[Any]:
    """Every document of a JSON or YAML file; `kubectl get -o yaml` samples may hold several.

    JSON (what `kubectl get -o json` prints) goes through the JSON parser: YAML's is a hundred
    times slower on large pod lists. A `kind: List` is flattened into its items. Whatever the
    file holds, the result is plain, bounded data or an `InputError` naming the file.
    """
    text = read_text(path, what)
    try:
        docs = _json_documents(text)
        if docs is None:
            docs = [d for d in yaml.safe_load_all(text) if d is not None]
        for doc in docs:
            check_tree(doc, budget=len(text) + 1000)
    except yaml.YAMLError as err:
        raise InputError(f"{what} {shown(path)}: not YAML or JSON ({_first_line(err)})") from None
    except RecursionError:
        raise InputError(f"{what} {shown(path)}: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as err:  # a 4,301-digit int, a lone surrogate, the checks below
        raise InputError(f"{what} {shown(path)}: {_clip(str(err))}") from None
    if keep_empty_list and len(docs) == 1 and _flatten_list(docs[0]) == []:
        return docs  # `kubectl get pods -o json` matching no pod: an answer, not an empty file
    return [item for d in docs for item in _flatten_list(d)]


def _json_documents(text: str) -> list[Any] | None:
    """The document if `text` is JSON; None when it is not (then it is read as YAML)."""
    if not text.lstrip().startswith(("{", "[")):
        return None
    try:
        return [json.loads(text)]
    except RecursionError:
        raise
    except ValueError:
        return None  # flow-style YAML also starts with { or [


def check_tree(doc: Any, *, budget: int) -> None:
    """Raise ValueError unless `doc` nests at most `MAX_DEPTH` deep, holds at most `budget`
    values (YAML aliases can expand a few bytes into 10^9) and only valid Unicode strings."""
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        budget -= 1
        if budget < 0:
            raise ValueError("too many values for its size (YAML aliases expanding?)")
        if depth > MAX_DEPTH:
            raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, str):
            _check_text(value)
        elif isinstance(value, Mapping):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise ValueError(f"a mapping key is not a string: {_clip(repr(key))}")
                _check_text(key)
                stack.append((item, depth + 1))
        elif isinstance(value, list):
            stack.extend((item, depth + 1) for item in value)


def _check_text(text: str) -> None:
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("a string holds a lone surrogate (not valid Unicode)") from None


def _clip(text: str, limit: int = 160) -> str:
    if text.startswith("Exceeds the limit (4300 digits)"):
        return "a number has more than 4300 digits"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def check_object_meta(doc: Mapping[str, Any], where: str) -> None:
    """The `metadata` the API server would have guaranteed: a mapping (or absent), string name
    and namespace, labels and annotations maps of strings. Raises ValueError naming the field."""
    meta = doc.get("metadata", {})
    if not isinstance(meta, Mapping):
        raise ValueError(f"{where}metadata is not a mapping")
    for field in ("name", "namespace", "uid", "resourceVersion"):
        if meta.get(field) is not None and not isinstance(meta[field], str):
            raise ValueError(f"{where}metadata.{field} is not a string")
    for field in ("labels", "annotations"):
        values = meta.get(field)
        if values is None:
            continue
        if not isinstance(values, Mapping) or not all(isinstance(v, str) for v in values.values()):
            raise ValueError(f"{where}metadata.{field} is not a map of strings")


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
        raise InputError(f"{what} {shown(path)}: {len(docs)} documents, expected one")
    return docs[0] if docs else None


def load_raycluster(path: Path) -> dict[str, Any]:
    """The RayCluster among the file's documents (samples ship a ConfigMap next to it)."""
    docs = load_documents(path, "RayCluster")
    found = [d for d in docs if isinstance(d, dict) and d.get("kind", "RayCluster") == "RayCluster"]
    if len(found) != 1:
        detail = "none" if not found else f"{len(found)}"
        raise InputError(
            f"RayCluster {shown(path)}: expected one RayCluster object, found {detail}"
        )
    rc = found[0]
    if not isinstance(rc.get("spec"), Mapping):
        raise InputError(f"RayCluster {shown(path)}: the RayCluster has no spec")
    try:
        check_object_meta(rc, "")
    except ValueError as err:
        raise InputError(f"RayCluster {shown(path)}: {err}") from None
    return rc


def load_pods(path: Path | None) -> list[Any]:
    """A PodList, Pods (a `kind: List` of them too), a list of pods or a name → pod map; no
    file means no pods."""
    if path is None:
        return []
    pods = _pod_documents(path, load_documents(path, "PodList", keep_empty_list=True))
    for index, pod in enumerate(pods):
        try:
            if not isinstance(pod, Mapping):
                raise ValueError(f"item {index} is not a Pod object")
            check_object_meta(pod, f"item {index}: ")
        except ValueError as err:
            raise InputError(f"PodList {shown(path)}: {err}") from None
    return pods


def _pod_documents(path: Path, docs: list[Any]) -> list[Any]:
    if docs and all(_is_pod(d) for d in docs) and (len(docs) > 1 or docs[0].get("kind")):
        return docs  # Pods: one, a List of them (flattened), or several documents
    if not docs:
        raise InputError(f"PodList {shown(path)}: empty; expected a PodList (or `[]`)")
    if len(docs) > 1:
        raise InputError(f"PodList {shown(path)}: {len(docs)} documents, expected one")
    doc = docs[0]
    if isinstance(doc, list):
        return doc
    if isinstance(doc, Mapping):
        kind = doc.get("kind")
        if kind in ("PodList", "List") or (
            kind is None and all(isinstance(v, Mapping) for v in doc.values())
        ):
            return pod_items(doc)
    raise InputError(f"PodList {shown(path)}: expected a PodList, a Pod or a list of pods")


def _is_pod(doc: Any) -> bool:
    return (
        isinstance(doc, Mapping)
        and doc.get("kind", "Pod") == "Pod"
        and isinstance(doc.get("metadata"), Mapping)
    )


def load_ray_state(path: Path | None, read_at: datetime) -> RayState | None:
    """The GCS reply (proto3 JSON) as read at `read_at` (its idle durations end then); no file
    means Ray's demand is unknown (the plan holds)."""
    if path is None:
        return None
    text = read_text(path, "Ray state")
    try:
        check_tree(json.loads(text), budget=len(text) + 1000)
    except RecursionError:
        raise InputError(
            f"Ray state {shown(path)}: nested deeper than {MAX_DEPTH} levels"
        ) from None
    except json.JSONDecodeError as err:
        raise InputError(f"Ray state {shown(path)}: not JSON: {_clip(str(err))}") from None
    except ValueError as err:
        raise InputError(f"Ray state {shown(path)}: {_clip(str(err))}") from None
    try:
        return parse_ray_state(text, read_at_ms=epoch_ms(read_at))
    except RayStateError as err:
        raise InputError(f"Ray state {shown(path)}: {_clip(str(err))}") from None


def load_events(
    path: Path | None, raycluster: Mapping[str, Any], pods: list[Any]
) -> tuple[CapacityEvent, ...]:
    """The capacity news in an Event list (`kubectl get events -o json`, core/v1 or
    events.k8s.io/v1), judged as the daemon judges what it watches: the newest per (pod, reason)
    of the pods given, and the RayCluster's own. No file means none (the daemon without Events)."""
    if path is None:
        return ()
    docs = load_documents(path, "Events")
    items = docs[0].get("items") if len(docs) == 1 and isinstance(docs[0], Mapping) else None
    if isinstance(items, list):  # an EventList (a `kind: List` is flattened already)
        docs = items
    elif len(docs) == 1 and isinstance(docs[0], list):
        docs = docs[0]
    for index, doc in enumerate(docs):
        if not isinstance(doc, Mapping) or doc.get("kind", "Event") != "Event":
            raise InputError(f"Events {shown(path)}: item {index} is not an Event object")
    meta = raycluster.get("metadata") or {}
    names = {str((p.get("metadata") or {}).get("name")) for p in pods if isinstance(p, Mapping)}
    judged = capacity_events(
        docs, cluster=str(meta.get("name") or ""), groups=worker_group_names(raycluster)
    )
    return tuple(e for e in judged if e.pod is None or e.pod in names)


def load_nodes(path: Path | None) -> dict[str, NodeMaintenance]:
    """GKE maintenance announced by the nodes in a NodeList (`kubectl get nodes -o json`), as
    the daemon reads it where it may read nodes. No file means none (the daemon without the
    nodes ClusterRole)."""
    if path is None:
        return {}
    docs = load_documents(path, "Nodes")
    items = docs[0].get("items") if len(docs) == 1 and isinstance(docs[0], Mapping) else None
    if isinstance(items, list):
        docs = items
    elif len(docs) == 1 and isinstance(docs[0], list):
        docs = docs[0]
    found: dict[str, NodeMaintenance] = {}
    for index, doc in enumerate(docs):
        if not isinstance(doc, Mapping) or doc.get("kind", "Node") != "Node":
            raise InputError(f"Nodes {shown(path)}: item {index} is not a Node object")
        if (m := node_maintenance(doc)) is not None:
            found[m.node] = m
    return found


def plan_files(
    raycluster: Path,
    pods: Path | None,
    ray_state: Path | None,
    policy: Policy,
    now: datetime | None = None,
    events: Path | None = None,
    nodes: Path | None = None,
) -> dict[str, Any]:
    """Plan once from files and return the document the `plan` command prints.

    The same `decide()` the daemon runs: the writes include the draining-intent record and the
    drains, exactly as the daemon would send them for these inputs.
    """
    stdin = [p for p in (raycluster, pods, ray_state, events, nodes) if p == STDIN]
    if len(stdin) > 1:
        raise InputError("only one input can be read from standard input (-)")
    rc = load_raycluster(raycluster)
    now = now or datetime.now(UTC)
    state = load_ray_state(ray_state, now)  # read at the moment planned: durations as given
    gcs = RayObservation(state, observed_at=0.0) if state is not None else None  # None: unknown
    pod_list = load_pods(pods)
    capacity = load_events(events, rc, pod_list)
    windows = load_nodes(nodes)
    # Parsed as the daemon parses them (loop/observe.py): decide() takes only parsed input.
    observed = Observation.parse(
        rc, pod_list, gcs, capacity_events=capacity, node_maintenance=windows
    )
    decision = decide(observed, Memory(), policy, now)
    if decision.error is not None:  # cannot happen for a plan made from this very object
        raise InputError(decision.error)
    document = decision.document()
    judged = {"capacity_events": [_event_document(e) for e in capacity]} if events else {}
    if nodes is not None:  # the node facts judged, as /debug/plan's node_maintenance says them
        judged["node_maintenance"] = [
            {"node": m.node, "window": m.describe()} for m in windows.values()
        ]
    return {
        "cluster": document.pop("cluster"),
        "patch": document.pop("patch"),
        **document,
        **judged,
    }


def _event_document(event: CapacityEvent) -> dict[str, Any]:
    return {
        "signal": event.signal.value,
        "source": event.source,
        "reason": event.reason,
        "message": event.message,
        "last_seen": datetime.fromtimestamp(event.last_seen_ms / 1000, UTC).isoformat(),
        "pod": event.pod,
        "group": event.group,
        "count": event.count,
    }


def plan_capture(directory: Path, policy: Policy) -> dict[str, Any]:
    """Replan the files `capture` wrote, at the moment they were captured."""
    from kuberay_scaler.cli.capture import (
        EVENTS_FILE,
        NODES_FILE,
        PODS_FILE,
        RAY_STATE_FILE,
        RAYCLUSTER_FILE,
        read_captured_at,
    )

    if not (directory / RAYCLUSTER_FILE).is_file():
        raise InputError(f"capture {directory}: no {RAYCLUSTER_FILE} (not a capture directory)")
    events = directory / EVENTS_FILE  # absent in captures older than it, or without the Role
    nodes = directory / NODES_FILE  # absent without the nodes ClusterRole
    return plan_files(
        directory / RAYCLUSTER_FILE,
        directory / PODS_FILE,
        directory / RAY_STATE_FILE,
        policy,
        now=read_captured_at(directory),
        events=events if events.is_file() else None,
        nodes=nodes if nodes.is_file() else None,
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
