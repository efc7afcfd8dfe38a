"""First fit over thousands of bins without rescanning them for every bundle.

The decisions are those of a plain scan in preference order (tests hold it to that); only the
bins that provably cannot fit are passed over faster:

- a bundle with label selectors only looks at the bins whose labels match (labels never change),
  found for a one-label prefilter through an index of each order by that label's value;
- per resource, a max-tree over positions finds the next bin with enough of it left in
  O(log bins), so a shape never walks the bins that are too full for it (without it, each of
  1,000 shapes walked 100,000 half-full bins);
- a cursor per bundle shape remembers the first bin that may still fit that shape.

Free resources only shrink while demand is placed, which keeps trees (upper bounds, lowered when
a bin is seen) and cursors true. Giving resources back (an abandoned gang trial) must be followed
by `released(those bins)`.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Collection, Iterable, Sequence

from kuberay_scaler.core.model.ray import Bundle, LabelSelector, selectors_match
from kuberay_scaler.core.planner.bins import (
    EPSILON,
    Bin,
    copies_that_fit,
    free_amount,
    preference,
    take,
)
from kuberay_scaler.core.planner.needs import Need

_OrderKey = tuple[bool, bool]
_NOTHING = float("-inf")  # (demand wants an accelerator, spare new accelerator hosts)


class Pool:
    """The bins demand may use, kept in preference order per kind of demand."""

    def __init__(self, bins: Iterable[Bin]) -> None:
        self.bins: list[Bin] = list(bins)
        self._orders: dict[_OrderKey, list[Bin]] = {}
        self._indexes: dict[_OrderKey, _LabelIndex] = {}
        self._views: dict[tuple[_OrderKey, tuple[LabelSelector, ...]], _View] = {}
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

    def place(self, need: Need, count: int, spare_new_accelerators: bool) -> int:
        """Place up to `count` copies, first fit; returns how many were placed."""
        view, key = self._view_of(need, spare_new_accelerators)
        bundle = need.bundle
        needs = view.needs(bundle)
        index, left = self._cursors.get(key, 0), count
        while left:
            index = view.next_candidate(index, needs)
            if index >= len(view.bins):
                break
            bin_ = view.bins[index]
            fits = copies_that_fit(bundle, bin_.free, bin_.labels)
            if fits:
                placed = min(fits, left)
                take(bin_, bundle, placed)
                left -= placed
            view.seen(index, needs)
            if left == 0:
                break  # this bin may still fit more: the cursor stays on it
            index += 1
        self._cursors[key] = index
        return count - left

    def first_fit(
        self, need: Need, spare_new_accelerators: bool, exclude: Collection[int] = ()
    ) -> Bin | None:
        """The first bin that fits `need` and whose id is not in `exclude`."""
        view, key = self._view_of(need, spare_new_accelerators)
        unit = need.bundle
        needs = view.needs(unit)
        index = start = self._cursors.get(key, 0)
        advancing = True
        while True:
            index = view.next_candidate(index, needs)
            if index >= len(view.bins):
                break
            bin_ = view.bins[index]
            if copies_that_fit(unit, bin_.free, bin_.labels):
                if id(bin_) not in exclude:
                    if advancing:
                        self._cursors[key] = index
                    return bin_
                advancing = False  # a fitting bin held back: the cursor must not pass it
            else:
                view.seen(index, needs)
            if advancing:
                start = index + 1
            index += 1
        self._cursors[key] = start
        return None

    def released(self, given_back: Iterable[Bin]) -> None:
        """Resources of `given_back` went back: raise their bounds; remembered positions reset."""
        self._cursors.clear()
        back = list(given_back)
        for view in self._views.values():
            view.raised(back)

    def _view_of(self, need: Need, spare: bool) -> tuple[_View, tuple[_OrderKey, str]]:
        order_key = (need.accelerator, spare)
        view_key = (order_key, need.bundle.selectors)
        view = self._views.get(view_key)
        if view is None:
            order = self.ordered(*order_key)
            index = self._indexes.get(order_key)
            if index is None:
                index = self._indexes[order_key] = _LabelIndex(order)
            view = self._views[view_key] = _View(order, need.bundle.selectors, index)
        view.sync()
        return view, (order_key, need.signature)


def new_accelerator(bin_: Bin) -> bool:
    """An accelerator host this plan adds."""
    return bin_.planned and bool(bin_.accelerators)


_Required = tuple[tuple[str, frozenset[str]], ...]


def _required_labels(selectors: tuple[LabelSelector, ...]) -> _Required:
    """The labels every matching host must carry, each with one of some values."""
    if len(selectors) != 1:
        return ()  # alternatives: no single label is required
    return tuple((c.key, c.values) for c in selectors[0].constraints if not c.negated)


_Needs = list[tuple["_MaxTree", float]]


class _View:
    """The bins of one order whose labels match some selectors, with a max-tree per resource."""

    def __init__(
        self, order: list[Bin], selectors: tuple[LabelSelector, ...], index: _LabelIndex
    ) -> None:
        self._order = order
        self._selectors = selectors
        self._index = index
        self._seen = 0  # how much of `order` has been filtered into `bins`
        self.bins: list[Bin] = []
        self._trees: dict[str, _MaxTree] = {}
        self._positions: dict[int, int] = {}  # id(bin) → index in `bins`, built when needed

    def sync(self) -> None:
        """Take in bins appended to the order since the last call."""
        start, self._seen = self._seen, len(self._order)
        if start == self._seen:
            return
        required = _required_labels(self._selectors)
        # Required labels rule most bins out: the index has them by their values.
        new = self._index.matching(required, start) if required else self._order[start:]
        if self._selectors and not _only(self._selectors, required):
            new = [b for b in new if selectors_match(self._selectors, b.labels)]
        self.bins.extend(new)
        for resource, tree in self._trees.items():
            tree.extend(_left_in(new, resource))

    def raised(self, bins: Iterable[Bin]) -> None:
        """Set the bounds of `bins` (those in this view) to what they have left now."""
        if not self._trees:
            return
        for i in range(len(self._positions), len(self.bins)):  # bins are only ever appended
            self._positions[id(self.bins[i])] = i
        for bin_ in bins:
            position = self._positions.get(id(bin_))
            if position is not None:
                for resource, tree in self._trees.items():
                    tree.set(position, _left_of(bin_, resource))

    def needs(self, bundle: Bundle) -> _Needs:
        """Per resource the bundle asks for: its tree and the least amount a fitting bin has."""
        out: _Needs = []
        for resource, need in bundle.resources.items():
            if need <= 0:
                continue
            tree = self._trees.get(resource)
            if tree is None:
                tree = self._trees[resource] = _MaxTree(resource, _left_in(self.bins, resource))
            # Never above what copies_that_fit accepts (it adds EPSILON before dividing).
            out.append((tree, need - EPSILON - abs(need) * 1e-12))
        return out

    def next_candidate(self, index: int, needs: _Needs) -> int:
        """The first position at or after `index` whose bin may have enough of each resource."""
        end = len(self.bins)
        moved = True
        while moved and index < end:
            moved = False
            for tree, least in needs:
                found = tree.find(index, least)
                if found != index:
                    index, moved = found, True
                    if index >= end:
                        return end
        return index

    def seen(self, index: int, needs: _Needs) -> None:
        """Lower the trees to what the bin at `index` really has left (it may have been taken)."""
        bin_ = self.bins[index]
        for tree, _ in needs:
            tree.lower(index, _left_of(bin_, tree.resource))


class _LabelIndex:
    """One order's positions by the value of a label, per label asked for (extended as bins
    are appended to the order): the views of many selectors on one label share one pass."""

    def __init__(self, order: list[Bin]) -> None:
        self._order = order
        self._by_key: dict[str, tuple[int, dict[str | None, list[int]]]] = {}

    def matching(self, required: _Required, start: int) -> list[Bin]:
        """The bins from `start` on, in order, that carry every label of `required` with one of
        its values (through the shortest list of positions, the others checked on its bins)."""
        found = sorted(
            ((self.positions(key, values, start), key, values) for key, values in required),
            key=lambda t: len(t[0]),
        )
        (shortest, _, _), *others = found
        bins = [self._order[i] for i in shortest]
        for _, key, values in others:
            bins = [b for b in bins if b.labels.get(key) in values]
        return bins

    def positions(self, key: str, values: Collection[str], start: int) -> list[int]:
        """Ascending positions from `start` whose bin's label `key` is one of `values`."""
        seen, index = self._by_key.get(key, (0, {}))
        order = self._order
        for i in range(seen, len(order)):
            index.setdefault(order[i].labels.get(key), []).append(i)
        self._by_key[key] = (len(order), index)
        found = [tail for v in values if (tail := _from(index.get(v), start))]
        if len(found) == 1:
            return found[0]
        return list(heapq.merge(*found))


def _from(positions: list[int] | None, start: int) -> list[int]:
    if not positions:
        return []
    return positions[bisect_left(positions, start) :]


def _left_of(bin_: Bin, resource: str) -> float:
    # As copies_that_fit reads it: an implicit resource Ray never reports is there at 1.
    return free_amount(bin_.free, resource)


def _left_in(bins: Sequence[Bin], resource: str) -> list[float]:
    """`_left_of` each bin (one list pass: the default looked up once, not per bin)."""
    default = free_amount({}, resource)
    return [b.free.get(resource, default) for b in bins]


def _only(selectors: tuple[LabelSelector, ...], required: _Required) -> bool:
    """`required` is all the selectors ask: a bin with those labels matches them."""
    return len(selectors) == 1 and len(selectors[0].constraints) == len(required)


class _MaxTree:
    """Upper bounds of one resource's free amount per position, and the first position >= some.

    A binary tree over a power-of-two number of leaves (unused ones at -inf); each node holds
    the max of its children. Bounds may be too high (a bin was taken from since), never too low.
    """

    def __init__(self, resource: str, values: list[float]) -> None:
        self.resource = resource
        self._size = 0
        self._capacity = 1
        self._nodes: list[float] = [_NOTHING, _NOTHING]
        self.extend(values)

    def extend(self, values: list[float]) -> None:
        if not values:
            return
        if self._size + len(values) > self._capacity:
            leaves = self._nodes[self._capacity : self._capacity + self._size] + values
            self._rebuild(leaves)
            return
        low = self._capacity + self._size
        high = low + len(values) - 1
        self._nodes[low : high + 1] = values
        self._size += len(values)
        while low > 1:  # only the ancestors of the new leaves change, level by level
            low, high = low >> 1, high >> 1
            self._recompute(low, high)

    def _rebuild(self, leaves: list[float]) -> None:
        capacity = 1
        while capacity < len(leaves):
            capacity *= 2
        self._nodes = [_NOTHING] * capacity + leaves + [_NOTHING] * (capacity - len(leaves))
        self._capacity, self._size = capacity, len(leaves)
        low, high = capacity, 2 * capacity - 1
        while low > 1:
            low, high = low >> 1, high >> 1
            self._recompute(low, high)

    def _recompute(self, low: int, high: int) -> None:
        nodes = self._nodes
        lefts = nodes[2 * low : 2 * high + 2 : 2]
        rights = nodes[2 * low + 1 : 2 * high + 2 : 2]
        nodes[low : high + 1] = [a if a >= b else b for a, b in zip(lefts, rights, strict=True)]

    def set(self, position: int, value: float) -> None:
        nodes = self._nodes
        i = position + self._capacity
        nodes[i] = value
        i >>= 1
        while i:
            left, right = nodes[2 * i], nodes[2 * i + 1]
            top = left if left >= right else right
            if nodes[i] == top:
                break
            nodes[i] = top
            i >>= 1

    def lower(self, position: int, value: float) -> None:
        if value < self._nodes[position + self._capacity]:
            self.set(position, value)

    def find(self, start: int, least: float) -> int:
        """The first position >= `start` whose bound is >= `least`, else the size."""
        if start >= self._size:
            return self._size
        nodes, i = self._nodes, start + self._capacity
        if nodes[i] >= least:
            return start
        while True:  # climb until a right sibling holds something big enough
            if not i & 1 and nodes[i + 1] >= least:
                i += 1
                break
            i >>= 1
            if i <= 1:
                return self._size
        while i < self._capacity:  # then descend to its leftmost such leaf
            i *= 2
            if nodes[i] < least:
                i += 1
        return min(i - self._capacity, self._size)
