"""What the demand fit asks about a bundle, worked out once per distinct bundle: a frozen `Need`.

The fit (scale_up.py) and the pool read these fields instead of asking bins.py about the same
bundle at every step: its key and signature, whether it needs an accelerator, its sort size,
and which groups' fresh slices can host it, best first. A group's side of that question is its
`Offer`, fixed for one fit (its room changes as slices are added; what a fresh slice is does not).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from kuberay_scaler.core.model.cluster import WorkerGroup
from kuberay_scaler.core.model.ray import Bundle, GangDemand
from kuberay_scaler.core.planner.bins import (
    bundle_key,
    bundle_size,
    gang_units,
    hosts_that_fit,
    needs_accelerator,
    signature,
    slices_that_host,
)
from kuberay_scaler.core.planner.shapes import HostShape, SliceShape

_NO_RANKS: Mapping[str, int] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Offer:
    """A fresh slice of one group as demand sees it."""

    group: str
    hosts: tuple[HostShape, ...]
    accelerators: bool  # some host of it has an accelerator
    availability_rank: int  # 0 available, suspect or probing; 1 unavailable
    order: tuple[int, float, int]  # higher priority, then the smaller slice, then spec order


@dataclass(frozen=True, slots=True)
class Need:
    """One bundle's facts for the fit."""

    bundle: Bundle
    key: tuple[object, ...]  # bins.bundle_key: equal for equal bundles
    signature: str  # bins.signature: equal for bundles that fit exactly the same bins
    accelerator: bool  # it asks for an accelerator
    size: tuple[int, float]  # bins.bundle_size: the fit places the largest first
    # Groups whose fresh slice can host it, best first (see `need_of`).
    options: tuple[str, ...] = ()
    # Per option: which of the bundle's selectors a fresh host of that group matches first.
    ranks: Mapping[str, int] = field(default_factory=lambda: _NO_RANKS)
    # Plain demand a plain group can host: it stays off accelerator hosts this plan adds.
    spares_accelerators: bool = False


def offer_of(group: WorkerGroup, shape: SliceShape | None, availability_rank: int) -> Offer:
    """A group's offer; preference among groups: higher priority, then the smaller slice, then
    spec order."""
    hosts = shape.hosts if shape is not None else ()
    size = sum(sum(h.resources.values()) for h in hosts)
    accelerators = bool(shape and shape.accelerators)
    order = (-group.priority, size, group.index)
    return Offer(group.name, hosts, accelerators, availability_rank, order)


def need_of(
    bundle: Bundle, offers: Sequence[Offer] = (), key: tuple[object, ...] | None = None
) -> Need:
    """The bundle's facts, with its options among `offers`.

    Demand that needs no accelerator never gets an accelerator group while some plain group can
    host it, whatever that group's state (contract §6: accelerators are conserved). Then, in
    Ray's order: the first of the bundle's label selectors a group matches, then availability
    (an unavailable group after the others), then the group's `order`.
    """
    accelerator = needs_accelerator(bundle)
    hosts = slices_that_host(bundle, [o.hosts for o in offers])
    able = [o for o, hosted in zip(offers, hosts, strict=True) if hosted]
    spares = not accelerator and any(not o.accelerators for o in able)
    if spares:
        able = [o for o in able if not o.accelerators]
    ranks = {o.group: _selector_rank(bundle, o.hosts) for o in able}
    able.sort(key=lambda o: (ranks[o.group], o.availability_rank, *o.order))
    return Need(
        bundle=bundle,
        key=bundle_key(bundle) if key is None else key,
        signature=signature(bundle),
        accelerator=accelerator,
        size=bundle_size(bundle),
        options=tuple(o.group for o in able),
        ranks=MappingProxyType(ranks) if ranks else _NO_RANKS,
        spares_accelerators=spares,
    )


def _selector_rank(bundle: Bundle, hosts: Sequence[HostShape]) -> int:
    """Which of the bundle's label selectors a fresh host that fits it matches first (Ray v2's
    scheduler ranks that above group priority: the selectors of a `fallback_strategy` arrive in
    order, primary first); 0 without selectors."""
    if len(bundle.selectors) < 2:
        return 0
    fitting = hosts_that_fit(bundle, hosts)
    for i, selector in enumerate(bundle.selectors):
        if any(selector.matches(h.labels) for h in fitting):
            return i
    return len(bundle.selectors)


class NeedBook:
    """The Need of each distinct bundle of one fit, worked out at its first ask: working state
    of the fitting stage, like the groups' rooms."""

    def __init__(self, offers: Sequence[Offer]) -> None:
        self._offers = tuple(offers)
        self._needs: dict[tuple[object, ...], Need] = {}

    def of(self, bundle: Bundle) -> Need:
        key = bundle_key(bundle)
        found = self._needs.get(key)
        if found is None:
            found = self._needs[key] = need_of(bundle, self._offers, key)
        return found

    def units(self, gang: GangDemand) -> list[tuple[Bundle, Need]]:
        """The gang's units (bins.gang_units), in its order, each with its need."""
        return [(unit, self.of(unit)) for unit in gang_units(gang)]
