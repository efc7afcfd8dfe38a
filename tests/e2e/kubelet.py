"""What the kubelet does with a container spec before it starts the process, for the parts the
drop-in test needs: resolve `env` (values, fieldRefs, secretKeyRef/configMapKeyRef, in order,
each value expanded against the variables before it) and expand `$(VAR)` in command and args.

Expansion follows the kubelet's rules (k8s.io/kubernetes third_party/forked/golang/expansion):
`$(NAME)` becomes the value of a defined variable and stays as written otherwise, `$$` is a
literal `$`, any other `$` is kept.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

Lookup = Callable[[str, str], Awaitable[Mapping[str, Any]]]  # (kind, name) -> object
_LABEL_REF = re.compile(r"metadata\.(labels|annotations)\['([^']+)'\]")


def expand(text: str, env: Mapping[str, str]) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] != "$" or i + 1 == len(text):
            out.append(text[i])
            i += 1
        elif text[i + 1] == "$":
            out.append("$")
            i += 2
        elif text[i + 1] == "(" and (end := text.find(")", i + 2)) != -1:
            name = text[i + 2 : end]
            out.append(env[name] if name in env else text[i : end + 1])
            i = end + 1
        else:
            out.append("$")
            i += 1
    return "".join(out)


def field_ref(pod: Mapping[str, Any], path: str) -> str:
    """The downward-API fields the kubelet resolves for env vars (those a pod spec can name)."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    simple = {
        "metadata.name": metadata.get("name"),
        "metadata.namespace": metadata.get("namespace"),
        "metadata.uid": metadata.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
    }
    if path in simple:
        return str(simple[path] or "")
    keyed = _LABEL_REF.fullmatch(path)
    if keyed:
        return str((metadata.get(keyed.group(1)) or {}).get(keyed.group(2), ""))
    raise AssertionError(f"fieldRef {path!r}: not resolved by this test's kubelet")


async def resolve_env(
    container: Mapping[str, Any], pod: Mapping[str, Any], lookup: Lookup
) -> dict[str, str]:
    """The container's environment as the kubelet builds it (envFrom first, then env)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        env |= await _env_from(source, lookup)
    for entry in container.get("env") or []:
        name = entry["name"]
        if "value" in entry:
            env[name] = expand(str(entry["value"]), env)
        elif "valueFrom" in entry:
            value = await _value_from(entry["valueFrom"], pod, lookup)
            if value is not None:
                env[name] = value
        else:
            env[name] = ""
    return env


async def _value_from(
    source: Mapping[str, Any], pod: Mapping[str, Any], lookup: Lookup
) -> str | None:
    if "fieldRef" in source:
        return field_ref(pod, source["fieldRef"]["fieldPath"])
    for kind, key in (("secrets", "secretKeyRef"), ("configmaps", "configMapKeyRef")):
        if key in source:
            ref = source[key]
            data = await _data(kind, ref["name"], lookup, optional=bool(ref.get("optional")))
            if ref["key"] not in data:
                if ref.get("optional"):
                    return None
                raise AssertionError(f"{kind} {ref['name']} has no key {ref['key']}")
            return data[ref["key"]]
    raise AssertionError(f"valueFrom {dict(source)} not resolved by this test's kubelet")


async def _env_from(source: Mapping[str, Any], lookup: Lookup) -> dict[str, str]:
    prefix = str(source.get("prefix") or "")
    for kind, key in (("secrets", "secretRef"), ("configmaps", "configMapRef")):
        if key in source:
            ref = source[key]
            data = await _data(kind, ref["name"], lookup, optional=bool(ref.get("optional")))
            return {prefix + k: v for k, v in data.items()}
    raise AssertionError(f"envFrom {dict(source)} not resolved by this test's kubelet")


async def _data(kind: str, name: str, lookup: Lookup, *, optional: bool) -> dict[str, str]:
    try:
        obj = await lookup(kind, name)
    except LookupError:
        if optional:
            return {}
        raise
    raw = dict(obj.get("data") or {})
    if kind == "secrets":
        return {k: base64.b64decode(v).decode() for k, v in raw.items()}
    return {k: str(v) for k, v in raw.items()}
