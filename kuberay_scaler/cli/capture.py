"""`kuberay-scaler capture DIR`: what the daemon decides from, written to files for `plan`.

From a live cluster (kubeconfig or in-cluster, exactly as `run` is configured) and the GCS it
writes:

- `raycluster.json`: the RayCluster as the API server returns it;
- `pods.json`: a PodList of the cluster's pods (`ray.io/cluster=<name>`);
- `ray-state.json`: the GetClusterResourceStateReply in proto3 JSON;
- `events.json`: an EventList of the Events the daemon would judge (the cluster-autoscaler's on
  these pods, KubeRay's on this RayCluster; docs/capacity-signals.md), when the token may list
  events (else `capture.json` says why there is none);
- `nodes.json`: a NodeList of the nodes the pods run on, each slimmed to its name and GKE
  maintenance label/taint (core/parse/nodes.py), when the token may list nodes
  (deploy/node-maintenance; else `capture.json` says why there is none);
- `capture.json`: when, from where, and what was redacted.

Secrets are never written: every container env `value`, every annotation value (but the
draining record the planner reads), secret-looking `rayStartParams` and command-line flags
(`--redis-password=S` and `--redis-password S`) and the credentials inside any URL (user
info, query values) are replaced by a marker; `last-applied-configuration` and managed fields
are dropped, and no token or certificate of the daemon's own settings is stored. The files are
0600 in a directory created 0700. `kuberay-scaler plan --capture DIR`
replans the files at the captured moment.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from google.protobuf import json_format

from kuberay_scaler import __version__
from kuberay_scaler.adapters.kube.session import open_api
from kuberay_scaler.adapters.kube.transport import ApiError, Target, request_json
from kuberay_scaler.adapters.ray_gcs.client import GcsClient, TlsFiles
from kuberay_scaler.core.defaults import rayclusters_path
from kuberay_scaler.core.model.labels import LABEL_CLUSTER
from kuberay_scaler.core.parse.events import CLUSTER_AUTOSCALER, parse_event, worker_group_names
from kuberay_scaler.core.parse.nodes import slim_node
from kuberay_scaler.core.patch.intent import DRAINING_ANNOTATION
from kuberay_scaler.runtime.metrics import KubeCounters
from kuberay_scaler.runtime.settings import Settings

RAYCLUSTER_FILE = "raycluster.json"
PODS_FILE = "pods.json"
RAY_STATE_FILE = "ray-state.json"
EVENTS_FILE = "events.json"
NODES_FILE = "nodes.json"
META_FILE = "capture.json"
REDACTED = "<redacted by kuberay-scaler capture>"
_SECRET_WORDS = ("password", "token", "secret", "key", "credential")
_SECRET_FLAG = re.compile(
    r"(--[\w.-]*(?:" + "|".join(_SECRET_WORDS) + r")[\w.-]*)(=|\s+)('[^']*'|\"[^\"]*\"|\S+)",
    re.IGNORECASE,
)
# A flag that names a secret and takes its value as the next word: `--redis-password S`.
_SECRET_FLAG_ALONE = re.compile(r"--[\w.-]*(?:" + "|".join(_SECRET_WORDS) + r")[\w.-]*", re.I)
# A shell line (`bash -c "..."`) that exports a variable may export a secret: every exported
# value goes, and any assignment whose name names a secret (`DB_PASSWORD=... cmd`).
_SHELL_VALUE = r"('[^']*'|\"[^\"]*\"|[^\s;&|]+)"
_EXPORT = re.compile(r"(\bexport\s+[A-Za-z_][A-Za-z0-9_]*=)" + _SHELL_VALUE)
_SECRET_ASSIGNMENT = re.compile(
    r"((?<![\w.-])[A-Za-z0-9_]*(?:" + "|".join(_SECRET_WORDS) + r")[A-Za-z0-9_]*=)" + _SHELL_VALUE,
    re.I,
)
# An image reference with registry credentials: `user:pass@registry/repo:tag` (a digest,
# `repo@sha256:...`, has no `/` after its `@`).
_IMAGE_CREDENTIALS = re.compile(r"^[^/@\s]+@(?=[^/@\s]+/)")
_DROPPED_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)
# Annotations are free text anyone may fill (tokens, DSNs): only those the planner reads stay.
_KEPT_ANNOTATIONS = (DRAINING_ANNOTATION,)
# In a URL, user info (scheme://user:password@host) and query values (signatures, tokens) are
# replaced by a marker that keeps the URL one word.
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"]+")
URL_REDACTED = "redacted"


@dataclass
class Redactions:
    """What was taken out, by JSON path, so a reader knows the files are not verbatim."""

    paths: list[str] = field(default_factory=list)


async def capture(settings: Settings, out_dir: Path, now: datetime | None = None) -> Path:
    """Read the RayCluster, its pods and the GCS reply once, and write them into `out_dir`."""
    kubeconfig = str(settings.kubeconfig) if settings.kubeconfig else None
    api = await open_api(kubeconfig, request_timeout=settings.k8s_request_timeout_s)
    counters = KubeCounters.new()  # its own: a one-shot command serves no /metrics
    try:
        raycluster = await request_json(
            api,
            Target("get", "rayclusters"),
            "GET",
            f"{rayclusters_path(settings.cluster_namespace, settings.crd_version)}"
            f"/{settings.cluster_name}",
            counters=counters,
        )
        pods = await request_json(
            api,
            Target("list", "pods"),
            "GET",
            f"/api/v1/namespaces/{settings.cluster_namespace}/pods",
            query={"labelSelector": f"{LABEL_CLUSTER}={settings.cluster_name}"},
            counters=counters,
        )
        events, events_note = await _capacity_events(api, counters, settings, raycluster, pods)
        nodes, nodes_note = await _nodes(api, counters, pods)
    finally:
        await api.close()
    gcs = _gcs_client(settings)
    try:
        reply = await gcs.get_cluster_resource_state()
        cluster_id = gcs.cluster_id
    finally:
        await gcs.close()
    return write_capture(
        out_dir,
        raycluster,
        pods,
        json_format.MessageToDict(reply),
        meta={
            "captured_at": (now or datetime.now(UTC)).isoformat(),
            "cluster": settings.cluster_name,
            "namespace": settings.cluster_namespace,
            "gcs_address": settings.gcs_address,
            "gcs_cluster_id": cluster_id,
            "kuberay_scaler_version": __version__,
            "events": events_note,
            "nodes": nodes_note,
        },
        events=events,
        nodes=nodes,
    )


async def _capacity_events(
    api: Any,
    counters: KubeCounters,
    settings: Settings,
    raycluster: Mapping[str, Any],
    pods: Mapping[str, Any],
) -> tuple[list[Any] | None, str]:
    """The Events the daemon would judge, as the API returns them; None (and why) when the
    token may not list events (KubeRay's Role)."""
    path = f"/api/v1/namespaces/{settings.cluster_namespace}/events"
    selectors = (
        f"involvedObject.kind=Pod,source={CLUSTER_AUTOSCALER}",
        f"involvedObject.kind=RayCluster,involvedObject.name={settings.cluster_name}",
    )
    found: list[Any] = []
    try:
        for selector in selectors:
            reply = await request_json(
                api,
                Target("list", "events"),
                "GET",
                path,
                query={"fieldSelector": selector},
                counters=counters,
            )
            found += reply.get("items") or []
    except ApiError as err:
        if err.status != 403:
            raise
        return None, "not read: the token may not list events (deploy/capacity-events adds it)"
    names = {(p.get("metadata") or {}).get("name") for p in pods.get("items") or []}
    groups = worker_group_names(raycluster)
    judged = [
        raw
        for raw in found
        if (e := parse_event(raw, cluster=settings.cluster_name, groups=groups)) is not None
        and (e.pod is None or e.pod in names)
    ]
    return judged, f"{len(judged)} judged of {len(found)} listed"


async def _nodes(
    api: Any, counters: KubeCounters, pods: Mapping[str, Any]
) -> tuple[list[Any] | None, str]:
    """The nodes the pods run on, slimmed to their GKE maintenance facts; None (and why) when
    the token may not list nodes (KubeRay's Role)."""
    try:
        reply = await request_json(
            api, Target("list", "nodes"), "GET", "/api/v1/nodes", counters=counters
        )
    except ApiError as err:
        if err.status not in (403, 404):
            raise
        why = "may not list" if err.status == 403 else "found no nodes API to list"
        return None, f"not read: the token {why} nodes (deploy/node-maintenance adds it)"
    used = {(p.get("spec") or {}).get("nodeName") for p in pods.get("items") or []}
    listed = reply.get("items") or []
    kept = [slim_node(n) for n in listed if (n.get("metadata") or {}).get("name") in used]
    return kept, f"{len(kept)} of {len(listed)} listed (the pods' nodes)"


def write_capture(
    out_dir: Path,
    raycluster: Mapping[str, Any],
    pods: Mapping[str, Any],
    ray_state: Mapping[str, Any],
    meta: Mapping[str, Any],
    events: list[Any] | None = None,
    nodes: list[Any] | None = None,
) -> Path:
    """Write the inputs (redacted) and the meta file, readable by the owner only; returns
    `out_dir`. `events` None: none were read (no file is written)."""
    out_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # an existing directory keeps its mode
    found = Redactions()
    clean_rc = redact(raycluster, "raycluster", found)
    items = [redact(p, f"pods[{i}]", found) for i, p in enumerate(pods.get("items") or [])]
    pod_list = {"apiVersion": "v1", "kind": "PodList", "items": items}
    _dump(out_dir / RAYCLUSTER_FILE, clean_rc)
    _dump(out_dir / PODS_FILE, pod_list)
    _dump(out_dir / RAY_STATE_FILE, ray_state)
    if events is not None:
        clean = [redact(e, f"events[{i}]", found) for i, e in enumerate(events)]
        _dump(out_dir / EVENTS_FILE, {"apiVersion": "v1", "kind": "EventList", "items": clean})
    else:
        with contextlib.suppress(FileNotFoundError):  # an older capture's would mislead
            (out_dir / EVENTS_FILE).unlink()
    if nodes is not None:
        _dump(out_dir / NODES_FILE, {"apiVersion": "v1", "kind": "NodeList", "items": nodes})
    else:
        with contextlib.suppress(FileNotFoundError):  # an older capture's would mislead
            (out_dir / NODES_FILE).unlink()
    _dump(out_dir / META_FILE, {**meta, "pods": len(items), "redacted": found.paths})
    return out_dir


def read_captured_at(capture_dir: Path) -> datetime | None:
    """When a capture was taken (None when its meta file is missing or unreadable)."""
    try:
        meta = json.loads((capture_dir / META_FILE).read_text())
        return datetime.fromisoformat(meta["captured_at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def redact(obj: Any, path: str, found: Redactions) -> Any:
    """A copy without secrets: env values, annotations, secret-looking rayStartParams and
    flags, URL credentials in any string, last-applied."""
    if isinstance(obj, Mapping):
        out: dict[str, Any] = {}
        for key, value in obj.items():
            where = f"{path}.{key}"
            if key == "managedFields":
                continue
            if key == "annotations" and isinstance(value, Mapping):
                out[key] = _annotations(value, where, found)
            elif key == "env" and isinstance(value, list):
                out[key] = [_env_entry(e, f"{where}[{i}]", found) for i, e in enumerate(value)]
            elif key == "rayStartParams" and isinstance(value, Mapping):
                out[key] = _start_params(value, where, found)
            elif key in ("command", "args") and isinstance(value, list):
                out[key] = _command_line(value, where, found)
            elif key == "image" and isinstance(value, str):
                out[key] = _image(value, where, found)
            else:
                out[key] = redact(value, where, found)
        return out
    if isinstance(obj, list):
        return [redact(v, f"{path}[{i}]", found) for i, v in enumerate(obj)]
    if isinstance(obj, str):
        return _text(obj, path, found)
    return obj


def redact_urls(text: str) -> str:
    """`text` with the user info and the query values of every URL in it replaced."""
    return _URL.sub(lambda m: _clean_url(m.group(0)), text)


def _clean_url(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return URL_REDACTED  # not parseable: keep nothing of it
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{URL_REDACTED}@{netloc.rpartition('@')[2]}"
    query = "&".join(
        f"{pair.partition('=')[0]}={URL_REDACTED}" if "=" in pair else pair
        for pair in parts.query.split("&")
    )
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def _text(value: str, where: str, found: Redactions) -> str:
    clean = redact_urls(value) if "://" in value else value
    if clean != value:
        found.paths.append(where)
    return clean


def _annotations(value: Mapping[str, Any], where: str, found: Redactions) -> dict[str, Any]:
    kept: dict[str, Any] = {}
    for key, text in value.items():
        if key in _DROPPED_ANNOTATIONS:
            found.paths.append(f"{where}.{key}")
        elif key in _KEPT_ANNOTATIONS:
            kept[key] = text
        else:
            found.paths.append(f"{where}.{key}")
            kept[key] = REDACTED
    return kept


def _env_entry(entry: Any, where: str, found: Redactions) -> Any:
    if isinstance(entry, Mapping) and "value" in entry:
        found.paths.append(f"{where}.value")
        return {**entry, "value": REDACTED}
    return entry  # valueFrom names a secret or field; it holds no secret itself


def _command_line(words: list[Any], where: str, found: Redactions) -> list[Any]:
    """Container `command`/`args`: each word cleaned, and the word after a bare secret flag."""
    out: list[Any] = []
    for index, word in enumerate(words):
        at = f"{where}[{index}]"
        previous = words[index - 1] if index else None
        if isinstance(word, str) and isinstance(previous, str) and _is_bare_secret_flag(previous):
            found.paths.append(at)
            out.append(REDACTED)
        else:
            out.append(_command_word(word, at, found))
    return out


def _is_bare_secret_flag(word: str) -> bool:
    return _SECRET_FLAG_ALONE.fullmatch(word) is not None


def _command_word(word: Any, where: str, found: Redactions) -> Any:
    # KubeRay writes rayStartParams into the Ray container's `ray start` line (pod args), so a
    # `--redis-password=...` there is the same secret as in the spec.
    if not isinstance(word, str):
        return word
    clean = _SECRET_FLAG.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", word)
    for assignment in (_EXPORT, _SECRET_ASSIGNMENT):
        clean = assignment.sub(lambda m: f"{m.group(1)}{REDACTED!r}", clean)
    clean = redact_urls(clean) if "://" in clean else clean
    if clean != word:
        found.paths.append(where)
    return clean


def _image(value: str, where: str, found: Redactions) -> str:
    clean = _IMAGE_CREDENTIALS.sub(f"{URL_REDACTED}@", value)
    if clean != value:
        found.paths.append(where)
    return _text(clean, where, found)


def _start_params(value: Mapping[str, Any], where: str, found: Redactions) -> dict[str, Any]:
    out = {}
    for key, param in value.items():
        if any(word in str(key).lower() for word in _SECRET_WORDS):
            found.paths.append(f"{where}.{key}")
            out[key] = REDACTED
        else:
            out[key] = redact(param, f"{where}.{key}", found)
    return out


def _gcs_client(settings: Settings) -> GcsClient:
    tls = (
        TlsFiles(
            ca_cert=settings.ray_tls_ca_cert,
            cert=settings.ray_tls_server_cert,
            key=settings.ray_tls_server_key,
        )
        if settings.ray_use_tls
        else None
    )
    token = settings.ray_auth_token.get_secret_value() if settings.ray_auth_token else None
    return GcsClient(
        settings.gcs_address, token=token, tls=tls, rpc_timeout_s=settings.gcs_rpc_timeout_s
    )


def _dump(path: Path, obj: Any) -> None:
    text = json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    # Created 0600, and an older file of the same name made 0600 before it is rewritten.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as stream:
        os.fchmod(fd, 0o600)
        stream.write(text)
