"""First fit over thousands of bins without rescanning them for every bundle.

The decisions are those of a plain scan in preference order (tests hold it to that); only the
bins that provably cannot fit are passed over faster:

- a bundle with label selectors only looks at the bins whose labels match (labels never change);
- a jump table skips bins with nothing left of the bundle's scarcest resource;
- a cursor per bundle shape remembers the first bin that may still fit that shape.

Free resources only shrink while demand is placed, which keeps jumps and cursors true. Giving
resources back (an abandoned gang trial) must be followed by `released()`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from kuberay_scaler.model.ray import Bundle, LabelSelector, selectors_match
from kuberay_scaler.planner.bins import (
    EPSILON,
    IMPLICIT_PREFIX,
    Bin,
    copies_that_fit,
    needs_accelerator,
    preference,
    signature,
    take,
)

# Which resource to skip on: the rarer it is among hosts, the more bins a jump passes over.
_SKIP_PREFERENCE = ("TPU", "GPU", "CPU")

_OrderKey = tuple[bool, bool]  # (demand wants an accelerator, spare new accelerator hosts)


class Pool:
    """The bins demand may use, kept in preference order per kind of demand."""

    def __init__(self, bins: Iterable[Bin]) -> None:
        self.bins: list[Bin] = list(bins)
        self._orders: dict[_OrderKey, list[Bin]] = {}
        self._views: dict[tuple[_OrderKey, tuple[LabelSelector, ...], str | None], _View] = {}
        self._cursors: dict[tuple[_OrderKey, str], int] = {}

    def add(self, bins: Sequence[Bin]) -> None:
        self.bins.extend(bins)
        for (_, spare), order in self._orders.items():
            # Planned bins sort last anyway, so appending keeps each order sorted.
            order.extend(b for b in bins if not (spare and new_accelerator(b)))

    def ordered(self, wants_accelerator: bool, spare_new_accelerators: bool = False) -> list[Bin]:
        """Bins in preference order; optionally without accelerator hosts this plan adds."""
        key = (wants_accelerator, spare_new_accelerators)
        if key not in self._orders:
            usable = (
                [b for b in self.bins if not new_accelerator(b)]
                if spare_new_accelerators
                else self.bins
            )
            self._orders[key] = sorted(usable, key=preference(wants_accelerator))
        return self._orders[key]

    def place(self, bundle: Bundle, count: int, spare_new_accelerators: bool) -> int:
        """Place up to `count` copies, first fit; returns how many were placed."""
        view, key = self._view_of(bundle, spare_new_accelerators)
        index, left = self._cursors.get(key, 0), count
        while left:
            index = view.next_with_some(index)
            if index >= len(view.bins):
                break
            bin_ = view.bins[index]
            fits = copies_that_fit(bundle, bin_.free, bin_.labels)
            if fits:
                placed = min(fits, left)
                take(bin_, bundle, placed)
                left -= placed
                if left == 0:
                    break  # this bin may still fit more: the cursor stays on it
            index += 1
        self._cursors[key] = index
        return count - left

    def first_fit(
        self, unit: Bundle, spare_new_accelerators: bool, exclude: Collection[int] = ()
    ) -> Bin | None:
        """The first bin that fits `unit` and whose id is not in `exclude`."""
        view, key = self._view_of(unit, spare_new_accelerators)
        index = start = self._cursors.get(key, 0)
        advancing = True
        while True:
            index = view.next_with_some(index)
            if index >= len(view.bins):
                break
            bin_ = view.bins[index]
            if copies_that_fit(unit, bin_.free, bin_.labels):
                if id(bin_) not in exclude:
                    if advancing:
                        self._cursors[key] = index
                    return bin_
                advancing = False  # a fitting bin held back: the cursor must not pass it
            if advancing:
                start = index + 1
            index += 1
        self._cursors[key] = start
        return None

    def released(self) -> None:
        """Resources were given back: remembered positions and jumps may be too far now."""
        self._cursors.clear()
        for view in self._views.values():
            view.forget_jumps()

    def _view_of(self, bundle: Bundle, spare: bool) -> tuple[_View, tuple[_OrderKey, str]]:
        order_key = (needs_accelerator(bundle), spare)
        resource = _scarcest(bundle)
        view_key = (order_key, bundle.selectors, resource)
        view = self._views.get(view_key)
        if view is None:
            order = self.ordered(*order_key)
            view = self._views[view_key] = _View(order, bundle.selectors, resource)
        view.sync()
        return view, (order_key, signature(bundle))


def new_accelerator(bin_: Bin) -> bool:
    """An accelerator host this plan adds."""
    return bin_.planned and bool(bin_.accelerators)


def _scarcest(bundle: Bundle) -> str | None:
    # Implicit resources are on every host even when not listed: no jump may skip over them.
    asked = [r for r, need in bundle.resources.items() if need > 0 and not implicit(r)]
    preferred = [r for r in _SKIP_PREFERENCE if r in asked]
    others = sorted(r for r in asked if r not in _SKIP_PREFERENCE and r != "memory")
    return next(iter(preferred + others), None)


def implicit(resource: str) -> bool:
    return resource.startswith(IMPLICIT_PREFIX)


def _required_label(selectors: tuple[LabelSelector, ...]) -> tuple[str, frozenset[str]] | None:
    """A label every matching host must carry with one of some values, if there is one."""
    if len(selectors) != 1:
        return None  # alternatives: no single label is required
    return next(((c.key, c.values) for c in selectors[0].constraints if not c.negated), None)


class _View:
    """The bins of one order whose labels match some selectors, with jumps over empty ones.

    `_jumps[i]` is a position at or after i such that no bin in between has any of `resource`
    left (a union-find over positions, compressed as it is walked).
    """

    def __init__(
        self, order: list[Bin], selectors: tuple[LabelSelector, ...], resource: str | None
    ) -> None:
        self._order = order
        self._selectors = selectors
        self._resource = resource
        self._seen = 0  # how much of `order` has been filtered into `bins`
        self.bins: list[Bin] = []
        self._jumps: list[int] = []

    def sync(self) -> None:
        """Take in bins appended to the order since the last call."""
        new = self._order[self._seen :]
        self._seen = len(self._order)
        if not self._selectors:
            self.bins.extend(new)
            return
        quick = _required_label(self._selectors)
        if quick is not None:  # a cheap look at one label rules most bins out
            key, values = quick
            new = [b for b in new if b.labels.get(key) in values]
        self.bins.extend(b for b in new if selectors_match(self._selectors, b.labels))

    def forget_jumps(self) -> None:
        self._jumps.clear()

    def next_with_some(self, index: int) -> int:
        """The first position at or after `index` whose bin has some of the resource left."""
        if self._resource is None:
            return index
        bins, resource, jumps = self.bins, self._resource, self._jumps
        jumps.extend(range(len(jumps), len(bins)))
        path = []
        while index < len(bins):
            if jumps[index] != index:
                path.append(index)
                index = jumps[index]
            elif bins[index].free.get(resource, 0.0) > EPSILON:
                break
            else:
                path.append(index)
                index += 1
        for position in path:
            jumps[position] = index
        return index
