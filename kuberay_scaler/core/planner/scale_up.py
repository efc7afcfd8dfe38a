"""Fit pending demand onto what exists, then onto whole new slices of the best group."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kuberay_scaler.core.model.cluster import WorkerGroup
from kuberay_scaler.core.model.plan import Infeasible
from kuberay_scaler.core.model.ray import Bundle, GangDemand, GangStrategy, RayNode, TaskDemand
from kuberay_scaler.core.model.reasons import Demand, DemandKind, Hold, HoldKind, InfeasibleKind
from kuberay_scaler.core.planner.bins import (
    UNBOUNDED,
    Bin,
    bins_for_new_slice,
    bundle_key,
    copies_that_fit,
    give_back,
    place_copies,
    take,
)
from kuberay_scaler.core.planner.needs import Need, NeedBook, Offer
from kuberay_scaler.core.planner.pool import Pool
from kuberay_scaler.core.planner.shapes import SliceShape


@dataclass
class GroupRoom:
    """How many slices a group may still add in this plan, and what it added."""

    group: WorkerGroup
    shape: SliceShape | None
    room: int
    offer: Offer  # what a fresh slice of it is to demand (needs.offer_of), fixed for the fit
    blocked: Hold | None = None  # why room is 0, for "waiting" reasons
    exhausted: Hold = field(default_factory=lambda: Hold(HoldKind.NO_ROOM))  # what limits room
    # Blocked only for now (its own write in flight, rate limit): demand it would serve waits
    # for it instead of launching a slice of another group (that would be counted twice).
    holds_demand: bool = False
    added: int = 0
    reasons: Counter[Demand] = field(default_factory=Counter)  # demand → units served
    waiting: Counter[tuple[Demand, Hold]] = field(default_factory=Counter)
    # Availability (core/planner/availability.py): the cause while the group is unavailable
    # (probing or not); its rank among groups is the offer's.
    unavailable_cause: str | None = None
    # Slices added here for demand whose better group is unavailable: (from, cause, demand) → n.
    fell_back: Counter[tuple[str, str, Demand]] = field(default_factory=Counter)
    _filled: dict[object, tuple[int, list[tuple[dict[str, float], bool]]]] = field(
        default_factory=dict, repr=False
    )

    def filled_hosts(self, need: Need) -> tuple[int, list[tuple[dict[str, float], bool]]]:
        """Copies of `need` a fresh slice takes, and per host what is left and if it is used."""
        found = self._filled.get(need.key)
        if found is None:
            hosts = self.shape.hosts if self.shape else ()
            scratch = bins_for_new_slice(self.group.name, "scratch", hosts)
            placed = place_copies(need.bundle, UNBOUNDED, scratch)
            found = self._filled[need.key] = (placed, [(b.free, b.used) for b in scratch])
        return found

    def next_key(self, offset: int = 0) -> str:
        return f"new:{self.group.name}:{self.added + offset}"

    def new_slice(self, filled: Sequence[tuple[dict[str, float], bool]] | None = None) -> list[Bin]:
        """The bins of one more slice of this group, counted against its room."""
        assert self.shape is not None
        bins = bins_for_new_slice(self.group.name, self.next_key(), self.shape.hosts, filled)
        self.adopt()
        return bins

    def adopt(self) -> None:
        """Count a slice whose bins were built with `next_key()` (a gang's trial)."""
        self.added += 1
        self.room -= 1


@dataclass
class DemandFit:
    infeasible: list[Infeasible] = field(default_factory=list)
    waiting_on_existing: Counter[Demand] = field(default_factory=Counter)


def options_of(need: Need, rooms: Mapping[str, GroupRoom]) -> list[GroupRoom]:
    """The groups whose fresh slice can host `need`, best first (needs.need_of)."""
    return [rooms[name] for name in need.options]


def _fell_back_from(
    options: Sequence[GroupRoom], chosen: GroupRoom, need: Need
) -> GroupRoom | None:
    """The unavailable group the demand would have gone to before `chosen`, if any."""
    mine = (need.ranks[chosen.group.name], *chosen.offer.order)
    return next(
        (
            r
            for r in options
            if r is not chosen
            and r.unavailable_cause is not None
            and (need.ranks[r.group.name], *r.offer.order) < mine
        ),
        None,
    )


def _note_fallback(
    options: Sequence[GroupRoom], chosen: GroupRoom, need: Need, demand: Demand, slices: int
) -> None:
    skipped = _fell_back_from(options, chosen, need) if slices > 0 else None
    if skipped is not None:
        cause = skipped.unavailable_cause or ""
        chosen.fell_back[(skipped.group.name, cause, demand)] += slices


def _first_with_room(options: Sequence[GroupRoom]) -> GroupRoom | None:
    """The best group that may add a slice now; None when the demand must wait."""
    for room in options:
        if room.room > 0:
            return room
        if room.holds_demand:
            return None
    return None


def fit_tasks(
    tasks: Sequence[TaskDemand],
    pool: Pool,
    rooms: Mapping[str, GroupRoom],
    book: NeedBook,
    nodes: Sequence[RayNode],
    fit: DemandFit,
    what: DemandKind = DemandKind.TASK,
) -> None:
    needs = [(demand, book.of(demand.bundle)) for demand in merge_tasks(tasks)]
    for demand, need in sorted(needs, key=lambda dn: dn[1].size, reverse=True):
        options = options_of(need, rooms)
        left = demand.count - pool.place(need, demand.count, need.spares_accelerators)
        label = Demand(what, demand.bundle.describe()) if left > 0 else None
        while left > 0 and label is not None:
            room = _first_with_room(options)
            if room is None:
                _unserved(demand.bundle, left, options, nodes, fit, what)
                break
            opened = room.added
            placed = _fill_new_slices(room, need, left, pool)
            _note_fallback(options, room, need, label, room.added - opened)
            room.reasons[label] += placed
            left -= placed
            if placed == 0:  # cannot happen for a candidate; guard against looping forever
                break


def _fill_new_slices(room: GroupRoom, need: Need, left: int, pool: Pool) -> int:
    """Open new slices of `room` for up to `left` copies; returns how many were placed.

    First fit gives every slice the demand fills the same copies on each host, so those slices
    are built with their resources already taken (the same bins slice-by-slice fitting would
    leave, at a fraction of the cost); only a last, partly filled slice is fitted copy by copy.
    """
    per_slice, filled = room.filled_hosts(need)
    full = min(room.room, left // per_slice) if per_slice else 0
    if full == 0:
        new_bins = room.new_slice()
        pool.add(new_bins)
        return place_copies(need.bundle, left, new_bins)
    opened: list[Bin] = []
    for _ in range(full):
        opened += room.new_slice(filled)
    pool.add(opened)
    return full * per_slice


def merge_tasks(tasks: Iterable[TaskDemand]) -> list[TaskDemand]:
    """One entry per distinct bundle with the summed count, in order of first appearance.

    The GCS reports demand per raylet and shape, so one shape arrives once per node: packing
    entry by entry would make planning cost grow with nodes × shapes (or with task count).
    """
    first: dict[object, TaskDemand] = {}
    counts: dict[object, int] = {}
    for demand in tasks:
        key = bundle_key(demand.bundle)
        if key in counts:
            counts[key] += demand.count
        else:
            first[key], counts[key] = demand, demand.count
    return [
        d if d.count == counts[k] else TaskDemand(d.bundle, counts[k]) for k, d in first.items()
    ]


def fit_gangs(
    gangs: Sequence[GangDemand],
    pool: Pool,
    rooms: Mapping[str, GroupRoom],
    book: NeedBook,
    nodes: Sequence[RayNode],
    fit: DemandFit,
) -> None:
    # A gang that found no room finds none when it comes again as long as no gang was placed
    # since (a failed trial is undone), so a copy is recorded as the first was, without another
    # trial: 10^4 identical waiting placement groups cost one trial, not 10^4 over every bin.
    unserved: dict[tuple[object, ...], Callable[[], None]] = {}
    live = _LiveNodes(nodes)
    for gang in sorted(gangs, key=_gang_order, reverse=True):
        key = gang_key(gang)
        again = unserved.get(key)
        if again is not None:
            again()
            continue
        units = book.units(gang)
        if _place_gang_with_new_slices(gang, units, pool, rooms):
            unserved.clear()  # what it took or opened may change what first fit does next
            continue
        record, waits = _unserved_gang(gang, units, rooms, live, fit)
        unserved[key] = record
        record()
        if waits:
            _keep_for_waiting_gang(gang, units, pool)


def gang_key(gang: GangDemand) -> tuple[object, ...]:
    """Equal for gangs the planner cannot tell apart."""
    return (gang.strategy, tuple(bundle_key(b) for b in gang.bundles))


def _largest_first(units: Sequence[tuple[Bundle, Need]]) -> list[tuple[Bundle, Need]]:
    return sorted(units, key=lambda un: un[1].size, reverse=True)


def _keep_for_waiting_gang(
    gang: GangDemand, units: Sequence[tuple[Bundle, Need]], pool: Pool
) -> None:
    """Mark the existing bins a waiting gang would use as needed, without taking them.

    The gang still needs them once the rest of its room appears; scaling them down meanwhile
    would only bring them back later (and more demand elsewhere must never mean fewer replicas).
    """
    trial = _GangTrial()
    distinct = gang.strategy is GangStrategy.STRICT_SPREAD
    for unit, need in _largest_first(units):
        used = _hosts_taken(trial) if distinct else set()
        target = pool.first_fit(need, False, used)
        if target is not None:
            take(target, unit)
            trial.taken.append((target, unit))
    trial.undo()  # resources go back; the `used` marks stay
    pool.released(trial.bins())


@dataclass
class _GangTrial:
    """Bins taken and slices opened while trying one gang; undone unless every unit fits."""

    taken: list[tuple[Bin, Bundle]] = field(default_factory=list)
    opened: list[tuple[GroupRoom, list[Bin]]] = field(default_factory=list)
    passed_over: list[tuple[Sequence[GroupRoom], GroupRoom, Need]] = field(default_factory=list)

    def opened_by(self, room: GroupRoom) -> int:
        return sum(1 for r, _ in self.opened if r is room)

    def new_bins(self) -> list[Bin]:
        return [b for _, bins in self.opened for b in bins]

    def bins(self) -> list[Bin]:
        return [b for b, _ in self.taken]

    def undo(self) -> None:
        for bin_, unit in self.taken:
            give_back(bin_, unit)


def _place_gang_with_new_slices(
    gang: GangDemand,
    units: Sequence[tuple[Bundle, Need]],
    pool: Pool,
    rooms: Mapping[str, GroupRoom],
) -> bool:
    """All units on existing bins or on new slices (of any groups), or nothing at all.

    Units go largest first; each takes the first bin that fits (a distinct one under
    STRICT_SPREAD), and a unit that fits nowhere opens one slice of its best group.
    """
    trial = _GangTrial()
    distinct = gang.strategy is GangStrategy.STRICT_SPREAD
    for unit, need in _largest_first(units):
        used = _hosts_taken(trial) if distinct else set()
        options = options_of(need, rooms)
        target = pool.first_fit(need, need.spares_accelerators, used)
        if target is None:
            target = _first_fit(unit, trial.new_bins(), used)
        if target is None:
            target = _open_slice_for(need, options, trial, used)
        if target is None:
            trial.undo()
            pool.released(trial.bins())
            return False
        take(target, unit)
        trial.taken.append((target, unit))
    _commit(gang, trial, pool)
    return True


def _hosts_taken(trial: _GangTrial) -> set[int]:
    """Ids of the bins a STRICT_SPREAD unit may no longer take: those taken, and their twins
    (the other bin of the same host, see `Bin.twin`)."""
    out = {id(b) for b, _ in trial.taken}
    out.update(id(b.twin) for b, _ in trial.taken if b.twin is not None)
    return out


def _first_fit(unit: Bundle, bins: Iterable[Bin], used: set[int]) -> Bin | None:
    return next(
        (b for b in bins if id(b) not in used and copies_that_fit(unit, b.free, b.labels)), None
    )


def _open_slice_for(
    need: Need, options: Sequence[GroupRoom], trial: _GangTrial, used: set[int]
) -> Bin | None:
    for room in options:
        if room.room - trial.opened_by(room) > 0:
            assert room.shape is not None
            key = room.next_key(trial.opened_by(room))
            bins = bins_for_new_slice(room.group.name, key, room.shape.hosts)
            trial.opened.append((room, bins))
            trial.passed_over.append((options, room, need))
            return _first_fit(need.bundle, bins, used)
        if room.holds_demand:
            return None
    return None


def _commit(gang: GangDemand, trial: _GangTrial, pool: Pool) -> None:
    demand = _gang_demand(gang)
    for room, planned in trial.opened:
        room.adopt()  # slices are adopted in the order their keys were given out
        pool.add(planned)
        room.reasons[demand] += 1
    for options, room, need in trial.passed_over:
        _note_fallback(options, room, need, demand, 1)


def _gang_order(gang: GangDemand) -> tuple[int, int]:
    strict = gang.strategy in (GangStrategy.STRICT_PACK, GangStrategy.STRICT_SPREAD)
    return (int(strict), len(gang.bundles))


def _unserved(
    bundle: Bundle,
    count: int,
    options: Sequence[GroupRoom],
    nodes: Sequence[RayNode],
    fit: DemandFit,
    what: DemandKind,
) -> None:
    demand = Demand(what, bundle.describe())
    if options:
        room = _blocking(options)
        room.waiting[(demand, room.blocked or room.exhausted)] += count
    elif _fits_a_live_node(bundle, nodes):
        # Only an existing node (e.g. a bundle pinned to one TPU slice) can serve it: never launch.
        fit.waiting_on_existing[demand] += count
    else:
        fit.infeasible.append(
            Infeasible(
                demand,
                InfeasibleKind.NO_GROUP_OFFERS,
                count=count,
                request=TaskDemand(bundle, count),
            )
        )


def _unserved_gang(
    gang: GangDemand,
    units: Sequence[tuple[Bundle, Need]],
    rooms: Mapping[str, GroupRoom],
    live: _LiveNodes,
    fit: DemandFit,
) -> tuple[Callable[[], None], bool]:
    """What records one gang like this as waiting (True) or as never placeable (False)."""
    demand = _gang_demand(gang)
    options = [options_of(n, rooms) for _, n in units]
    unservable = [u for (u, n), o in zip(units, options, strict=True) if not o and not live.fit(n)]
    missing = unservable[0] if unservable else None
    if missing is not None:
        kind = (
            InfeasibleKind.NO_GROUP_OFFERS_PACKED
            if gang.strategy is GangStrategy.STRICT_PACK
            else InfeasibleKind.NO_GROUP_OFFERS_BUNDLE
        )
        infeasible = Infeasible(demand, kind, missing=missing.describe(), request=gang)
        return (lambda: fit.infeasible.append(infeasible)), False  # entries merge later
    if not any(options):
        return (lambda: fit.waiting_on_existing.update({demand: 1})), True
    room = _blocking([r for o in options for r in o])
    waiting = (demand, room.blocked or room.exhausted)
    return (lambda: room.waiting.update({waiting: 1})), True


def _blocking(options: Sequence[GroupRoom]) -> GroupRoom:
    """The group to blame for demand left waiting: the first blocked one, else the best."""
    return next((r for r in options if r.blocked), options[0])


class _LiveNodes:
    """The live nodes, asked once per bundle shape in one `fit_gangs`: a unit no group offers
    is checked against every node (10^5 of them), and gangs repeat their units."""

    def __init__(self, nodes: Sequence[RayNode]) -> None:
        self._nodes = nodes
        self._fits: dict[tuple[object, ...], bool] = {}
        self._by_label: dict[str, dict[str | None, list[RayNode]]] = {}

    def fit(self, need: Need) -> bool:
        found = self._fits.get(need.key)
        if found is None:
            bundle = need.bundle
            found = self._fits[need.key] = _fits_a_live_node(bundle, self._candidates(bundle))
        return found

    def _candidates(self, bundle: Bundle) -> Sequence[RayNode]:
        """The nodes that may match the bundle's selectors: those carrying a label its one
        selector requires (every node when it requires none)."""
        if len(bundle.selectors) != 1:
            return self._nodes
        required = [c for c in bundle.selectors[0].constraints if not c.negated]
        if not required:
            return self._nodes
        label = required[0].key
        index = self._by_label.get(label)
        if index is None:
            index = self._by_label[label] = {}
            for node in self._nodes:
                index.setdefault(node.labels.get(label), []).append(node)
        return [n for value in required[0].values for n in index.get(value, ())]


def _fits_a_live_node(bundle: Bundle, nodes: Sequence[RayNode]) -> bool:
    return any(copies_that_fit(bundle, n.total, n.labels) for n in nodes if n.alive)


def _gang_demand(gang: GangDemand) -> Demand:
    counts = Counter(b.describe() for b in gang.bundles)
    shape = " + ".join(f"{n}× {text}" if n > 1 else text for text, n in counts.items())
    return Demand(DemandKind.PLACEMENT_GROUP, shape, strategy=gang.strategy.value)
