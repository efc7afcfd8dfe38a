"""The part of `kubectl kustomize` our deploy/ folders use, so tests see what users apply:
`resources` (files and folders), `labels` (metadata labels only) and `patches` with a target
(kind, name) and a JSON 6902 patch of `replace`/`add` ops. Anything else fails loudly."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

SUPPORTED = {"apiVersion", "kind", "resources", "labels", "patches"}


def render(folder: Path) -> list[dict[str, Any]]:
    spec = yaml.safe_load((folder / "kustomization.yaml").read_text())
    unknown = set(spec) - SUPPORTED
    assert not unknown, f"{folder}: kustomization fields {unknown} not rendered by tests"
    objects: list[dict[str, Any]] = []
    for entry in spec.get("resources") or []:
        path = folder / entry
        if path.is_dir():
            objects += render(path)
        else:
            objects += [d for d in yaml.safe_load_all(path.read_text()) if d]
    for pair in spec.get("labels") or []:
        for obj in objects:
            obj.setdefault("metadata", {}).setdefault("labels", {}).update(pair["pairs"])
    for patch in spec.get("patches") or []:
        target = patch["target"]
        matched = [o for o in objects if _matches(o, target)]
        assert matched, f"{folder}: patch target {target} matches nothing"
        for obj in matched:
            for op in yaml.safe_load(patch["patch"]):
                _apply(obj, op)
    return objects


def _matches(obj: dict[str, Any], target: dict[str, Any]) -> bool:
    return all(
        (obj.get("kind") if key == "kind" else obj["metadata"].get(key)) == value
        for key, value in target.items()
    )


def _apply(obj: dict[str, Any], op: dict[str, Any]) -> None:
    assert op["op"] in ("replace", "add"), f"JSON patch op {op['op']} not rendered by tests"
    *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
    node: Any = obj
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if isinstance(node, list):
        index = len(node) if last == "-" else int(last)
        if op["op"] == "add":
            node.insert(index, copy.deepcopy(op["value"]))
        else:
            node[index] = copy.deepcopy(op["value"])
    else:
        assert op["op"] == "add" or last in node, f"replace of missing {op['path']}"
        node[last] = copy.deepcopy(op["value"])
