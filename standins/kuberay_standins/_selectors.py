"""Label and field selectors as kube-apiserver parses them (the string forms in query params).

Supported label forms: ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``, ``k``,
``!k``, joined by commas. Field selectors: ``path=v``, ``path==v``, ``path!=v`` on dotted paths
(``metadata.name``, ``spec.nodeName``, ``status.phase``...).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Predicate = Callable[[Mapping[str, Any]], bool]


class SelectorError(ValueError):
    """The selector string does not parse; the API server answers 400 BadRequest."""


@dataclass(frozen=True)
class _Requirement:
    key: str
    operator: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: frozenset[str]

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.operator == "exists":
            return present
        if self.operator == "!exists":
            return not present
        if self.operator in ("=", "in"):
            return present and value in self.values
        # "!=" and "notin" also match objects that lack the key, as in Kubernetes.
        return not present or value not in self.values


_SET_TERM = re.compile(r"^\s*(?P<key>[^\s!=()]+)\s+(?P<op>in|notin)\s*\((?P<values>[^)]*)\)\s*$")
_EQ_TERM = re.compile(r"^\s*(?P<key>[^\s!=()]+)\s*(?P<op>==|=|!=)\s*(?P<value>[^\s!=(),]*)\s*$")
_EXISTS_TERM = re.compile(r"^\s*(?P<neg>!?)\s*(?P<key>[^\s!=(),]+)\s*$")


def _split_terms(selector: str) -> list[str]:
    """Split on commas that are not inside parentheses (``in (a,b)`` keeps its commas)."""
    terms: list[str] = []
    depth = 0
    current: list[str] = []
    for char in selector:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            terms.append("".join(current))
            current = []
        else:
            current.append(char)
    terms.append("".join(current))
    return [term for term in terms if term.strip()]


def _parse_label_term(term: str) -> _Requirement:
    if match := _SET_TERM.match(term):
        values = frozenset(v.strip() for v in match["values"].split(",") if v.strip())
        return _Requirement(match["key"], match["op"], values)
    if match := _EQ_TERM.match(term):
        operator = "!=" if match["op"] == "!=" else "="
        return _Requirement(match["key"], operator, frozenset({match["value"]}))
    if match := _EXISTS_TERM.match(term):
        return _Requirement(match["key"], "!exists" if match["neg"] else "exists", frozenset())
    raise SelectorError(f"unable to parse requirement: {term!r}")


def parse_label_selector(selector: str | None) -> Predicate:
    """Return a predicate over an object's labels; ``None``/empty selects everything."""
    requirements = [_parse_label_term(term) for term in _split_terms(selector or "")]

    def matches(labels: Mapping[str, Any]) -> bool:
        return all(req.matches(labels) for req in requirements)

    return matches


def labels_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return labels if isinstance(labels, Mapping) else {}


# Field labels whose value lives elsewhere: an Event's `source` is its `source.component`
# (kube-apiserver pkg/registry/core/event/strategy.go ToSelectableFields).
_FIELD_ALIASES = {"source": "source.component"}


def _field_value(obj: Mapping[str, Any], path: str) -> str:
    path = _FIELD_ALIASES.get(path, path)
    current: Any = obj
    for part in path.split("."):
        if not isinstance(current, Mapping):
            return ""
        current = current.get(part)
    return "" if current is None else str(current)


def parse_field_selector(selector: str | None) -> Predicate:
    """Return a predicate over a whole object; supports equality forms only, like the server."""
    checks: list[tuple[str, bool, str]] = []
    for term in _split_terms(selector or ""):
        match = _EQ_TERM.match(term)
        if match is None:
            raise SelectorError(f"invalid field selector: {term!r}")
        checks.append((match["key"], match["op"] != "!=", match["value"]))

    def matches(obj: Mapping[str, Any]) -> bool:
        return all((_field_value(obj, path) == value) == equal for path, equal, value in checks)

    return matches


def object_selector(label_selector: str | None, field_selector: str | None) -> Predicate:
    """Combine both selectors into one predicate over a whole object."""
    label_match = parse_label_selector(label_selector)
    field_match = parse_field_selector(field_selector)
    return lambda obj: label_match(labels_of(obj)) and field_match(obj)
