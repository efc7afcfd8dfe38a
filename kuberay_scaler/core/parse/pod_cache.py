"""Parsed pods kept between reconciles: each pod is parsed once per change, not once per reconcile.

The informer replaces a pod's object on every watch event and never mutates one in place, so
object identity tells exactly which pods changed since the last call. What a pod parses to also
depends on the RayCluster (the Ray container's name per group, the cluster name); when that part
of the spec changes, every pod is parsed again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kuberay_scaler.core.model.cluster import ClusterSpec, Problem
from kuberay_scaler.core.model.hosts import Host
from kuberay_scaler.core.parse.pods import parse_pod


@dataclass(frozen=True)
class _Entry:
    raw: object
    parsed: Host | Problem


def _spec_key(spec: ClusterSpec) -> tuple[object, ...]:
    """The parts of the spec `parse_pod` reads."""
    return (
        spec.name,
        spec.head_container_name,
        tuple((g.name, g.container.name) for g in spec.groups),
    )


class PodCache:
    """`hosts(store, spec)` → (hosts sorted by pod name, problems), parsing only changed pods.

    `version` rises whenever the result differs from the previous call's (a new, changed or
    removed host or problem); a pod event that changes nothing the planner reads (a status
    condition's timestamp, say) re-parses that pod and leaves `version` alone.
    """

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._spec_key: tuple[object, ...] | None = None
        self._result: tuple[tuple[Host, ...], tuple[Problem, ...]] = ((), ())
        self.version = 0
        self.parsed = 0  # pods parsed so far (for tests and the benchmark)

    def hosts(
        self, store: Mapping[str, object], spec: ClusterSpec
    ) -> tuple[tuple[Host, ...], tuple[Problem, ...]]:
        key = _spec_key(spec)
        if key != self._spec_key:
            self._entries.clear()
            self._spec_key = key
        changed = self._drop_missing(store)
        for name, raw in store.items():
            entry = self._entries.get(name)
            if entry is not None and entry.raw is raw:
                continue
            parsed = parse_pod(raw, spec)
            self.parsed += 1
            if entry is None or entry.parsed != parsed:
                changed = True
            self._entries[name] = _Entry(raw, parsed)
        if changed or self.version == 0:
            self._result = self._build()
            self.version += 1
        return self._result

    def _drop_missing(self, store: Mapping[str, object]) -> bool:
        if self._entries.keys() == store.keys():  # a set comparison (C-speed for a dict)
            return False
        for name in [n for n in self._entries if n not in store]:
            del self._entries[name]
        return True

    def _build(self) -> tuple[tuple[Host, ...], tuple[Problem, ...]]:
        hosts: list[Host] = []
        problems: list[Problem] = []
        for name in sorted(self._entries):
            parsed = self._entries[name].parsed
            if isinstance(parsed, Host):
                hosts.append(parsed)
            else:
                problems.append(Problem(f"pod {name}: {parsed.message}", parsed.group))
        return tuple(hosts), tuple(problems)
