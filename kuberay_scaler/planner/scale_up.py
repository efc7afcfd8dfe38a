"""Fit pending demand onto what exists, then onto whole new slices of the best group."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kuberay_scaler.model.cluster import WorkerGroup
from kuberay_scaler.model.plan import Infeasible
from kuberay_scaler.model.ray import Bundle, GangDemand, GangStrategy, RayNode, TaskDemand
from kuberay_scaler.planner.capacity import (
    Bin,
    bins_for_new_slice,
    bundle_size,
    copies_that_fit,
    merge_bundles,
    needs_accelerator,
    place_copies,
    place_gang,
    preference,
)
from kuberay_scaler.planner.shapes import SliceShape


@dataclass
class GroupRoom:
    """How many slices a group may still add in this plan, and what it added."""

    group: WorkerGroup
    shape: SliceShape | None
    room: int
    blocked: str | None = None  # why room is 0, for "waiting" reasons
    added: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    waiting: Counter[str] = field(default_factory=Counter)

    def can_host(self, bundle: Bundle) -> bool:
        hosts = self.shape.hosts if self.shape else ()
        return any(copies_that_fit(bundle, h.resources, h.labels) for h in hosts)

    def new_slice(self) -> list[Bin]:
        assert self.shape is not None
        key = f"new:{self.group.name}:{self.added}"
        self.added += 1
        self.room -= 1
        return bins_for_new_slice(self.group.name, key, self.shape.hosts)


@dataclass
class DemandFit:
    infeasible: list[Infeasible] = field(default_factory=list)
    waiting_on_existing: Counter[str] = field(default_factory=Counter)


class Pool:
    """The bins demand may use, kept in preference order per kind of demand."""

    def __init__(self, bins: Iterable[Bin]) -> None:
        self.bins: list[Bin] = list(bins)
        self._orders: dict[bool, list[Bin]] = {}

    def add(self, bins: Sequence[Bin]) -> None:
        self.bins.extend(bins)
        for order in self._orders.values():
            order.extend(bins)  # planned bins sort last anyway

    def ordered(self, wants_accelerator: bool) -> list[Bin]:
        if wants_accelerator not in self._orders:
            key: Callable[[Bin], tuple[int, int, int, str]] = preference(wants_accelerator)  # type: ignore[assignment]
            self._orders[wants_accelerator] = sorted(self.bins, key=key)
        return self._orders[wants_accelerator]


def candidates(bundle: Bundle, rooms: Iterable[GroupRoom]) -> list[GroupRoom]:
    """Groups whose fresh slice can host `bundle`, best first.

    Accelerator slices come last for demand that needs no accelerator (never spend a TPU slice
    on CPU work a plain group can take), then higher `priority`, then the smaller slice.
    """
    wants = needs_accelerator(bundle)

    def key(room: GroupRoom) -> tuple[int, int, float, int]:
        assert room.shape is not None
        wasted = int(not wants and bool(room.shape.accelerators))
        size = sum(sum(h.resources.values()) for h in room.shape.hosts)
        return (wasted, -room.group.priority, size, room.group.index)

    return sorted((r for r in rooms if r.can_host(bundle)), key=key)


def fit_tasks(
    tasks: Sequence[TaskDemand],
    pool: Pool,
    rooms: Mapping[str, GroupRoom],
    nodes: Sequence[RayNode],
    fit: DemandFit,
    what: str = "pending task/actor",
) -> None:
    for demand in sorted(tasks, key=lambda d: bundle_size(d.bundle), reverse=True):
        wants = needs_accelerator(demand.bundle)
        left = demand.count - place_copies(demand.bundle, demand.count, pool.ordered(wants))
        while left > 0:
            room = _first_with_room(demand.bundle, rooms)
            if room is None:
                _unserved(demand.bundle, left, rooms, nodes, fit, what)
                break
            bins = room.new_slice()
            pool.add(bins)
            placed = place_copies(demand.bundle, left, bins)
            room.reasons[f"{what} {demand.bundle.describe()}"] += placed
            left -= placed
            if placed == 0:  # cannot happen for a candidate; guard against looping forever
                break


def fit_gangs(
    gangs: Sequence[GangDemand],
    pool: Pool,
    rooms: Mapping[str, GroupRoom],
    nodes: Sequence[RayNode],
    fit: DemandFit,
) -> None:
    for gang in sorted(gangs, key=_gang_order, reverse=True):
        merged = merge_bundles(gang.bundles)
        wants = needs_accelerator(merged)
        if place_gang(gang, pool.ordered(wants)):
            continue
        if not _gang_on_new_slices(gang, pool, rooms, wants):
            _unserved_gang(gang, rooms, nodes, fit)


def _gang_on_new_slices(
    gang: GangDemand, pool: Pool, rooms: Mapping[str, GroupRoom], wants: bool
) -> bool:
    for room in _gang_candidates(gang, rooms.values()):
        if room.room <= 0:
            continue
        assert room.shape is not None
        for count in range(1, min(room.room, len(gang.bundles)) + 1):
            trial = [
                bins_for_new_slice(
                    room.group.name, f"new:{room.group.name}:{room.added + i}", room.shape.hosts
                )  # fmt: skip
                for i in range(count)
            ]
            flat = [b for bins in trial for b in bins]
            if place_gang(gang, [*pool.ordered(wants), *flat]):
                for _ in range(count):
                    room.new_slice()
                pool.add(flat)
                room.reasons[f"placement group ({gang.strategy.value}) {_gang_text(gang)}"] += 1
                return True
    return False


def _gang_candidates(gang: GangDemand, rooms: Iterable[GroupRoom]) -> list[GroupRoom]:
    eligible = [r for r in rooms if all(r.can_host(b) for b in gang.bundles)]
    return candidates(merge_bundles(gang.bundles), eligible) if eligible else []


def _gang_order(gang: GangDemand) -> tuple[int, int]:
    strict = gang.strategy in (GangStrategy.STRICT_PACK, GangStrategy.STRICT_SPREAD)
    return (int(strict), len(gang.bundles))


def _first_with_room(bundle: Bundle, rooms: Mapping[str, GroupRoom]) -> GroupRoom | None:
    return next((r for r in candidates(bundle, rooms.values()) if r.room > 0), None)


def _unserved(
    bundle: Bundle,
    count: int,
    rooms: Mapping[str, GroupRoom],
    nodes: Sequence[RayNode],
    fit: DemandFit,
    what: str,
) -> None:
    able = candidates(bundle, rooms.values())
    text = f"{what} {bundle.describe()}"
    if able:
        able[0].waiting[f"{text}: {able[0].blocked or 'no room'}"] += count
    elif any(copies_that_fit(bundle, n.total, n.labels) for n in nodes if n.alive):
        # Only an existing node (e.g. a bundle pinned to one TPU slice) can serve it: never launch.
        fit.waiting_on_existing[text] += count
    else:
        fit.infeasible.append(Infeasible(text, "no worker group's host offers this", count))


def _unserved_gang(
    gang: GangDemand, rooms: Mapping[str, GroupRoom], nodes: Sequence[RayNode], fit: DemandFit
) -> None:
    text = f"placement group ({gang.strategy.value}) {_gang_text(gang)}"
    able = _gang_candidates(gang, rooms.values())
    if able:
        able[0].waiting[f"{text}: {able[0].blocked or 'needs more slices than allowed'}"] += 1
    elif all(
        any(copies_that_fit(b, n.total, n.labels) for n in nodes if n.alive) for b in gang.bundles
    ):
        fit.waiting_on_existing[text] += 1
    else:
        missing = next(b for b in gang.bundles if not any(r.can_host(b) for r in rooms.values()))
        fit.infeasible.append(
            Infeasible(text, f"no worker group's host offers bundle {missing.describe()}")
        )


def _gang_text(gang: GangDemand) -> str:
    counts = Counter(b.describe() for b in gang.bundles)
    return " + ".join(f"{n}× {text}" if n > 1 else text for text, n in counts.items())
