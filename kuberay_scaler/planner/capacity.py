"""Bins (hosts with free resources) and the fitting of bundles onto them.

Bins are mutable scratch state inside one call of `plan`; nothing outside the planner sees them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kuberay_scaler.model.ray import Bundle, GangDemand, GangStrategy, selectors_match
from kuberay_scaler.planner.shapes import ACCELERATORS, HostShape

EPSILON = 1e-9
UNBOUNDED = 1 << 30


@dataclass(eq=False)
class Bin:
    """One host that can take work: an existing Ray node, a launching pod, or a planned host."""

    name: str
    group: str | None
    slice_key: str | None
    free: dict[str, float]
    labels: Mapping[str, str]
    accelerators: frozenset[str] = frozenset()  # from total resources, not what is free now
    idle_ms: int | None = None  # None: busy, launching or planned
    planned: bool = False  # part of a slice this plan adds
    used: bool = field(default=False)


def accelerators_of(resources: Mapping[str, float]) -> frozenset[str]:
    return frozenset(k for k in ACCELERATORS if resources.get(k, 0) > 0)


def bins_for_new_slice(group: str, key: str, hosts: Sequence[HostShape]) -> list[Bin]:
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


def needs_accelerator(bundle: Bundle) -> bool:
    return any(bundle.resources.get(k, 0) > 0 for k in ACCELERATORS) or any(
        k.startswith(("TPU-", "accelerator_type:")) for k in bundle.resources
    )


def copies_that_fit(bundle: Bundle, free: Mapping[str, float], labels: Mapping[str, str]) -> int:
    """How many copies of `bundle` fit into `free` on a host with `labels`."""
    if not selectors_match(bundle.selectors, labels):
        return 0
    copies = UNBOUNDED
    for resource, need in bundle.resources.items():
        if need <= 0:
            continue
        copies = min(copies, math.floor((free.get(resource, 0.0) + EPSILON) / need))
        if copies == 0:
            return 0
    return copies


def take(bin_: Bin, bundle: Bundle, copies: int = 1) -> None:
    for resource, need in bundle.resources.items():
        if need > 0:
            bin_.free[resource] = bin_.free.get(resource, 0.0) - need * copies
    bin_.used = True


def give_back(bin_: Bin, bundle: Bundle, copies: int = 1) -> None:
    for resource, need in bundle.resources.items():
        if need > 0:
            bin_.free[resource] = bin_.free.get(resource, 0.0) + need * copies


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


def place_gang(gang: GangDemand, bins: Sequence[Bin]) -> bool:
    """All bundles or none, honouring the strategy; on failure every bin is as it was."""
    if gang.strategy is GangStrategy.STRICT_PACK:
        merged = merge_bundles(gang.bundles)
        for bin_ in bins:
            if copies_that_fit(merged, bin_.free, bin_.labels):
                take(bin_, merged)
                return True
        return False
    distinct = gang.strategy is GangStrategy.STRICT_SPREAD
    placed: list[tuple[Bin, Bundle]] = []
    for bundle in sorted(gang.bundles, key=bundle_size, reverse=True):
        taken = {id(b) for b, _ in placed} if distinct else set()
        target = next(
            (b for b in bins if id(b) not in taken and copies_that_fit(bundle, b.free, b.labels)),
            None,
        )
        if target is None:
            for bin_, done in placed:
                give_back(bin_, done)
            return False
        take(target, bundle)
        placed.append((target, bundle))
    return True


def merge_bundles(bundles: Sequence[Bundle]) -> Bundle:
    total: dict[str, float] = {}
    for bundle in bundles:
        for resource, need in bundle.resources.items():
            total[resource] = total.get(resource, 0.0) + need
    selectors = next((b.selectors for b in bundles if b.selectors), ())
    return Bundle(resources=total, selectors=selectors)


def bundle_size(bundle: Bundle) -> tuple[int, float]:
    """Sort key: accelerator demand first, then the sum of what it asks for."""
    return (int(needs_accelerator(bundle)), sum(bundle.resources.values()))


def preference(bundle_wants_accelerator: bool) -> object:
    """Order existing bins for one kind of demand.

    Busy hosts first and idle ones least-idle first, so the longest-idle slices stay free to be
    scaled down; accelerator hosts last for demand that needs no accelerator, so they are not
    held up by CPU work a plain host can take.
    """

    def key(bin_: Bin) -> tuple[int, int, int, str]:
        wasted = int(not bundle_wants_accelerator and bool(bin_.accelerators))
        idle = bin_.idle_ms if bin_.idle_ms is not None else -1
        return (int(bin_.planned), wasted, idle, bin_.name)

    return key
