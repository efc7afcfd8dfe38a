"""Bins (hosts with free resources) and the fitting of bundles onto them.

Bins are mutable scratch state inside one call of `plan`; nothing outside the planner sees them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kuberay_scaler.core.model.ray import (
    Bundle,
    GangDemand,
    GangStrategy,
    LabelConstraint,
    LabelSelector,
    selectors_match,
)
from kuberay_scaler.core.planner.shapes import ACCELERATORS, HostShape

EPSILON = 1e-9
UNBOUNDED = 1 << 30
# Every Ray node has one unit of `node:__internal_implicit_resource_<name>` for any name, without
# reporting it (Ray Serve's max_replicas_per_node asks for fractions of it). Ray's scheduler reads
# a missing one as 1.0; so do we, on existing hosts and on hosts a plan adds.
IMPLICIT_PREFIX = "node:__internal_implicit_resource_"


def free_amount(free: Mapping[str, float], resource: str) -> float:
    """What is left of `resource`, with the implicit resources Ray never reports at 1."""
    default = 1.0 if resource.startswith(IMPLICIT_PREFIX) else 0.0
    return free.get(resource, default)


@dataclass(eq=False, slots=True)
class Bin:
    """One host that can take work: an existing Ray node, a launching pod, or a planned host."""

    name: str
    group: str | None
    slice_key: str | None
    free: dict[str, float]
    labels: Mapping[str, str]
    accelerators: frozenset[str] = frozenset()  # from total resources, not what is free now
    idle_since_ms: int | None = None  # epoch ms; None: busy, launching or planned
    planned: bool = False  # part of a slice this plan adds
    launching: bool = False  # asked for earlier, no Ray node yet (pending pod or no pod)
    # The used part of a worker host that joined just now (capacity.py `_settling_bin`): work
    # Ray may still report pending. Last of the bins there are (before planned ones), so it only
    # ever holds demand that would otherwise open a slice, never demand an existing host takes.
    settling: bool = False
    # The other bin of the same host (a settling bin and its host's live one): one host under
    # STRICT_SPREAD, never two.
    twin: Bin | None = None
    used: bool = field(default=False)
    # Its two preference keys (`preference`), worked out at its first sort: what they read is
    # set when the bin is built and never changes after (placing work changes `free`, `used`);
    # a bin the capacity memo hands on to the next frame is not keyed again.
    keys: tuple[_Key, _Key] | None = None


_NONE: frozenset[str] = frozenset()


_ACCELERATOR_KEYS = frozenset(ACCELERATORS)


def accelerators_of(resources: Mapping[str, float]) -> frozenset[str]:
    # Called for every node of a 10k-node cluster that changed: the keys it has found in C (a
    # CPU host has none, one shared empty set). The capacity memo keeps one set per combination.
    keys = _ACCELERATOR_KEYS.intersection(resources)
    if not keys:
        return _NONE
    for key in keys:
        if not resources[key] > 0:  # listed at 0: not an accelerator this host has
            keys = frozenset(k for k in keys if resources[k] > 0)
            break
    return keys if keys else _NONE


def bins_for_new_slice(
    group: str,
    key: str,
    hosts: Sequence[HostShape],
    filled: Sequence[tuple[Mapping[str, float], bool]] | None = None,
) -> list[Bin]:
    """The hosts of a slice this plan adds; `filled`: per host, what is left and if it is used."""
    if filled is None:
        return [
            Bin(
                name=f"{key}/host-{i}",
                group=group,
                slice_key=key,
                free=dict(h.resources),
                labels=h.labels,
                accelerators=h.accelerators,
                planned=True,
            )
            for i, h in enumerate(hosts)
        ]
    return [
        Bin(
            name=f"{key}/host-{i}",
            group=group,
            slice_key=key,
            free=dict(free),
            labels=h.labels,
            accelerators=h.accelerators,
            planned=True,
            used=used,
        )
        for i, (h, (free, used)) in enumerate(zip(hosts, filled, strict=True))
    ]


def needs_accelerator(bundle: Bundle) -> bool:
    return any(bundle.resources.get(k, 0) > 0 for k in ACCELERATORS) or any(
        k.startswith(("TPU-", "accelerator_type:")) for k in bundle.resources
    )


def signature(bundle: Bundle) -> str:
    """Equal for bundles that fit exactly the same bins; a string, so its hash is cached."""
    selectors = [
        [(c.key, c.negated, sorted(c.values)) for c in s.constraints] for s in bundle.selectors
    ]
    return repr((sorted(bundle.resources.items()), selectors))


def bundle_key(bundle: Bundle) -> tuple[object, ...]:
    """Equal for equal bundles (resources in any order), hashable; cheaper than `signature`."""
    return (tuple(sorted(bundle.resources.items())), bundle.selectors)


def copies_that_fit(bundle: Bundle, free: Mapping[str, float], labels: Mapping[str, str]) -> int:
    """How many copies of `bundle` fit into `free` on a host with `labels`."""
    if not selectors_match(bundle.selectors, labels):
        return 0
    copies = UNBOUNDED
    for resource, need in bundle.resources.items():
        if need <= 0:
            continue
        copies = min(copies, _whole_copies((free_amount(free, resource) + EPSILON) / need))
        if copies == 0:
            return 0
    return copies


def slices_that_host(bundle: Bundle, slices: Sequence[Sequence[HostShape]]) -> list[bool]:
    """Per slice shape, whether some host of it fits a copy of `bundle`."""
    return [any(copies_that_fit(bundle, h.resources, h.labels) for h in hosts) for hosts in slices]


def hosts_that_fit(bundle: Bundle, hosts: Sequence[HostShape]) -> list[HostShape]:
    """The hosts (of one slice shape) that fit a copy of `bundle`."""
    return [h for h in hosts if copies_that_fit(bundle, h.resources, h.labels)]


def _whole_copies(ratio: float) -> int:
    # ±inf (a subnormal need, an overdrawn bin) and NaN must not reach math.floor.
    if ratio >= UNBOUNDED:
        return UNBOUNDED
    return math.floor(ratio) if ratio > 0 else 0


def take(bin_: Bin, bundle: Bundle, copies: int = 1) -> None:
    for resource, need in bundle.resources.items():
        if need > 0:
            bin_.free[resource] = free_amount(bin_.free, resource) - need * copies
    bin_.used = True


def give_back(bin_: Bin, bundle: Bundle, copies: int = 1) -> None:
    for resource, need in bundle.resources.items():
        if need > 0:
            bin_.free[resource] = free_amount(bin_.free, resource) + need * copies


def place_copies(bundle: Bundle, count: int, bins: Iterable[Bin]) -> int:
    """Place up to `count` copies, first fit in the given order; returns how many were placed."""
    left = count
    for bin_ in bins:
        if left == 0:
            break
        fits = copies_that_fit(bundle, bin_.free, bin_.labels)
        if fits:
            placed = min(fits, left)
            take(bin_, bundle, placed)
            left -= placed
    return count - left


def gang_units(gang: GangDemand) -> list[Bundle]:
    """What must each fit on one host: STRICT_PACK is one unit of all bundles together."""
    if gang.strategy is GangStrategy.STRICT_PACK:
        return [merge_bundles(gang.bundles)]
    return list(gang.bundles)


def merge_bundles(bundles: Sequence[Bundle]) -> Bundle:
    """One bundle asking for the sum, on a host matching every bundle's selectors."""
    total: dict[str, float] = {}
    for bundle in bundles:
        for resource, need in bundle.resources.items():
            total[resource] = total.get(resource, 0.0) + need
    # Each bundle's selectors are alternatives; all bundles must hold: AND of ORs, expanded.
    alternatives: list[tuple[LabelConstraint, ...]] = [()]
    for bundle in bundles:
        if bundle.selectors:
            alternatives = [a + s.constraints for a in alternatives for s in bundle.selectors]
    selectors = tuple(LabelSelector(a) for a in alternatives if a)
    return Bundle(resources=total, selectors=selectors)


def bundle_size(bundle: Bundle) -> tuple[int, float]:
    """Sort key: accelerator demand first, then the sum of what it asks for."""
    return (int(needs_accelerator(bundle)), sum(bundle.resources.values()))


_Key = tuple[int, int, int, int, int, str]


def preference(bundle_wants_accelerator: bool) -> Callable[[Bin], _Key]:
    """Order bins for one kind of demand.

    Running hosts before launching ones (work that fits a running host must not keep a
    launching replica alive while that host is scaled down), busy hosts first and idle ones
    least-idle first, so the longest-idle slices stay free to be scaled down; accelerator hosts
    last for demand that needs no accelerator, so they are not held up by CPU work a plain
    host can take. The used part of a host that just joined (`settling`) after every other
    existing or launching bin: what it holds would otherwise be a new slice.
    """

    which = int(bundle_wants_accelerator)

    def key(bin_: Bin) -> _Key:
        keys = bin_.keys
        if keys is None:
            keys = bin_.keys = (_key(bin_, False), _key(bin_, True))
        return keys[which]

    return key


def _key(bin_: Bin, bundle_wants_accelerator: bool) -> _Key:
    wasted = int(not bundle_wants_accelerator and bool(bin_.accelerators))
    # Least idle first: the latest idle-since first, busy ones before every idle one.
    since = bin_.idle_since_ms
    idle = -since if since is not None else -(1 << 62)
    return (int(bin_.planned), int(bin_.settling), wasted, int(bin_.launching), idle, bin_.name)
