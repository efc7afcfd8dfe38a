"""Turn the slice map and Ray's nodes into bins: the capacity demand can use right now."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

from kuberay_scaler.core.model.hosts import Host, HostPhase
from kuberay_scaler.core.model.labels import LABEL_LEGACY_REPLICA, LABEL_REPLICA_NAME
from kuberay_scaler.core.model.ray import NodeStatus, RayNode, RayState
from kuberay_scaler.core.model.slices import GroupSlices, Slice, SliceMap, SliceState
from kuberay_scaler.core.planner.bins import Bin, accelerators_of, bins_for_new_slice
from kuberay_scaler.core.planner.shapes import SliceShape

COUNTED = (
    SliceState.COMPLETE,
    SliceState.PENDING,
    SliceState.PARTIAL,
    SliceState.BROKEN,
    SliceState.OUTDATED,  # a replica with its pods (of an older spec): not one launching
    SliceState.QUEUED,
)
# Slices still coming up, counted at full size: a queued one (Kueue) is capacity on its way
# too, so demand it will serve is not provisioned twice.
_COMING_UP = (SliceState.PENDING, SliceState.QUEUED)
# The slices capacity may count beyond their Ray nodes (see build_capacity's slice loop).
_ARRIVING_OR_BROKEN = frozenset(
    (SliceState.PENDING, SliceState.QUEUED, SliceState.PARTIAL, SliceState.BROKEN)
)


@dataclass
class Capacity:
    available: list[Bin] = field(default_factory=list)  # free resources now
    total: list[Bin] = field(default_factory=list)  # whole hosts, for the request_resources floor
    virtual: dict[str, int] = field(default_factory=dict)  # group → replicas without pods yet
    # Whole hosts are only needed when Ray has a request_resources floor: without one, `total`
    # stays empty (half the bins of a 100k-host frame).
    with_total: bool = True
    # The used part of worker hosts whose Ray container started less than the settle time ago,
    # with the seconds left until it stops counting (see `_settling_bin`).
    settling: list[tuple[Bin, float]] = field(default_factory=list)

    def lists(self) -> tuple[list[Bin], ...]:
        return (self.available, self.total) if self.with_total else (self.available,)


class CapacityMemo:
    """Last frame's bins of live nodes, by node id (owned by the caller's FrameMemo).

    Bins are the planner's scratch: placing work changes a bin's `free` only through
    `bins.take` (which marks it `used`) and `give_back` (after a take). So a bin the last plan
    never took from is still as `_node_bin` built it: when the next frame has the very same
    node object (the poller hands on an unchanged node as the same frozen value) in the same
    slice and state, that bin is handed out again instead of a new one for each of 10k nodes.
    A bin that was used, or got a settling twin, is built afresh; so is every bin of a node
    that changed. The plan is the same with a cold memo (tests/unit/test_frame_memo.py).
    """

    def __init__(self) -> None:
        self._bins: dict[str, _NodeBins] = {}
        self._next: dict[str, _NodeBins] = {}
        self._view: _KeptView | None = None
        self._sets: dict[frozenset[str], frozenset[str]] = {}  # few: accelerator combinations
        self._arriving: dict[str, tuple[GroupSlices, tuple[Slice, ...]]] = {}
        self._arriving_next: dict[str, tuple[GroupSlices, tuple[Slice, ...]]] = {}
        self.hits = 0  # bins handed out again (tests, the benchmark)
        self.view_hits = 0  # frames that took every node's bin at once

    def node_bins(
        self,
        node: RayNode,
        owner: tuple[str | None, str | None, SliceState | None],
        with_total: bool,
    ) -> _NodeBins:
        """The live (and, `with_total`, whole-host) bin of `node` in its slice `owner`."""
        name = node.instance_id or node.node_id
        found = self._bins.get(name)
        if (
            found is not None
            and name not in self._next  # one bin per entry of the reply, never one twice
            and found.node is node
            and found.owner == owner
            and not found.live.used
            and found.live.twin is None
            and (not with_total or (found.total is not None and not found.total.used))
        ):
            self.hits += 1
        else:
            group, key, _ = owner
            accelerators = (
                found.live.accelerators
                if found is not None and found.node.total is node.total
                else self._interned(accelerators_of(node.total))
            )
            live = _node_bin(node, group, key, node.available, accelerators)
            total = _node_bin(node, group, key, node.total, accelerators) if with_total else None
            found = _NodeBins(node, owner, live, total)
        self._next.setdefault(name, found)
        return found

    def _interned(self, accelerators: frozenset[str]) -> frozenset[str]:
        """One set per combination of accelerators, not one per node (10k of them)."""
        return self._sets.setdefault(accelerators, accelerators)

    def end_frame(self) -> None:
        """Keep only what this frame built or handed out (bounded by the live nodes)."""
        self._bins, self._next = self._next, {}

    def node_view(self, view: _NodeView) -> _KeptView | None:
        """Last frame's bins of live nodes, when `view` equals its inputs (nodes and slices by
        identity: frozen values the caller hands on), each bin the last plan took from built
        again from its node: a frame whose nodes did not change costs what the plan used."""
        kept = self._view
        if kept is None or not view.same_as(kept.view):
            return None
        available = _repaired(kept.available, kept.available_from)
        total = _repaired(kept.total, kept.total_from)
        if available is not kept.available or total is not kept.total:
            kept = self._view = replace(kept, available=available, total=total)
        self.view_hits += 1
        return kept

    def keep_view(self, view: _NodeView, cap: Capacity, sources: _Sources) -> None:
        """The node bins just built for `view` (no settling bin among them), and their sources."""
        available_from, total_from = sources
        self._view = _KeptView(
            view, tuple(cap.available), tuple(cap.total), available_from, total_from
        )

    def arriving(self, gs: GroupSlices) -> tuple[Slice, ...]:
        """The group's slices capacity may count beyond their Ray nodes (pending, queued,
        partial, broken), in order; once per group object."""
        found = self._arriving.get(gs.group.name)
        if found is None or found[0] is not gs:
            found = (gs, tuple(s for s in gs.slices if s.state in _ARRIVING_OR_BROKEN))
        self._arriving_next[gs.group.name] = found
        return found[1]

    def end_arriving(self) -> None:
        self._arriving, self._arriving_next = self._arriving_next, {}


@dataclass(frozen=True)
class _NodeView:
    """What the bins of live nodes are a function of when none is settling."""

    nodes: tuple[RayNode, ...]
    groups: tuple[GroupSlices, ...]
    unavailable: frozenset[str]
    with_total: bool

    def same_as(self, other: _NodeView) -> bool:
        return (
            self.with_total == other.with_total
            and self.unavailable == other.unavailable
            and len(self.groups) == len(other.groups)
            and all(a is b for a, b in zip(self.groups, other.groups, strict=True))
            and (self.nodes is other.nodes or self.nodes == other.nodes)
        )


@dataclass(frozen=True)
class _KeptView:
    view: _NodeView
    available: tuple[Bin, ...]
    total: tuple[Bin, ...]
    # What each bin was built from, to build it again once a plan took from it.
    available_from: tuple[_Source, ...]
    total_from: tuple[_Source, ...]


@dataclass(frozen=True)
class _Source:
    node: RayNode
    free: Mapping[str, float]  # node.available or node.total
    coming: bool  # a joined host of a slice coming up (`_coming_bin`)


_Sources = tuple[tuple[_Source, ...], tuple[_Source, ...]]  # of `available`, of `total`


def _repaired(bins: tuple[Bin, ...], sources: tuple[_Source, ...]) -> tuple[Bin, ...]:
    """`bins` with each one a plan took from built again (`bins` itself when none was)."""
    used = [i for i, b in enumerate(bins) if b.used]
    if not used:
        return bins
    out = list(bins)
    for i in used:
        old, src = bins[i], sources[i]
        if src.coming:
            out[i] = _coming_bin(src.node, old.group, old.slice_key, old.accelerators)
        else:
            out[i] = _node_bin(src.node, old.group, old.slice_key, src.free, old.accelerators)
    return tuple(out)


@dataclass(frozen=True)
class _NodeBins:
    node: RayNode
    owner: tuple[str | None, str | None, SliceState | None]
    live: Bin
    total: Bin | None


def build_capacity(
    slice_map: SliceMap,
    ray: RayState,
    shapes: Mapping[str, SliceShape],
    replacing: Collection[str] = (),
    with_total: bool = True,
    bins: bool = True,
    now: datetime | None = None,
    settle_s: float = 0.0,
    unavailable: Collection[str] = (),
    memo: CapacityMemo | None = None,
) -> Capacity:
    """Bins of live nodes, of hosts still coming up, and of replicas without pods yet.

    `replacing` names the groups whose broken slices this plan replaces: KubeRay brings up a
    fresh replica for each, so they count as launching capacity rather than nothing.
    `bins` False (no demand to place): only `virtual` is counted; no bin would be looked at.
    A slice still coming up (pending) counts at full size, its joined hosts too: it was
    launched for the demand it will serve, and Ray reports each raylet's free resources and
    the demand queued at each raylet apart, so one reply can show work that just moved onto a
    host that joined as taken there and as still pending.
    The same reply at a slice's last host's join (or a single-host worker's) is the settle:
    see `_settling_bin`, a pure function of the pod's own `startedAt` and `now`.
    `unavailable` names groups that cannot get capacity (core/planner/availability.py): what
    they have coming up (pending, partial, replicas without pods) is not capacity.
    `memo`: last frame's bins of unchanged nodes (CapacityMemo); the result is the same without.
    """
    cap = Capacity(with_total=with_total)
    unidentified = _unidentified_pods(slice_map)
    if not bins:
        _count_virtual(cap, slice_map, shapes, unidentified)
        return cap
    memo = memo if memo is not None else CapacityMemo()
    started = _started_at(slice_map, now, settle_s) if now is not None and settle_s > 0 else {}
    view = _NodeView(
        ray.nodes, tuple(slice_map.groups.values()), frozenset(unavailable), with_total
    )
    kept = memo.node_view(view) if not started else None
    if kept is not None:  # the same nodes in the same slices: last frame's untaken bins
        cap.available, cap.total = list(kept.available), list(kept.total)
    else:
        sources = _node_bins(
            cap, slice_map, ray, unavailable, unidentified, started, now, settle_s, memo
        )
        if not started:  # nothing settling: a function of `view` alone
            memo.keep_view(view, cap, sources)
    for name, gs in slice_map.groups.items():
        shape = shapes.get(name)
        if shape is None:
            continue
        if name in unavailable:
            cap.virtual[name] = _virtual(gs, unidentified)  # asked for, but none will come
            continue
        for sl in memo.arriving(gs) if not unidentified else gs.slices:
            if sl.hosts and sl.hosts[0].pod_name in unidentified:
                # No replica label: siblings unknown. Count only what each pod really is (its
                # Ray node, or one launching host), never a whole fresh slice per pod.
                _launching_hosts(cap, sl.key, name, shape, sl.nodes, list(sl.hosts))
            elif sl.state in _COMING_UP and len(sl.hosts) >= sl.expected_hosts:
                _launching_hosts(cap, sl.key, name, shape, sl.nodes, list(sl.hosts))
            elif sl.state in (SliceState.PARTIAL, SliceState.QUEUED) or (
                sl.state is SliceState.BROKEN and name in replacing and not sl.working_hosts
            ):
                # (A broken slice with busy hosts is kept, not replaced: see planner/replace.py.)
                # KubeRay deletes a replica missing pods and recreates it whole (a queued one
                # short of hosts too); a replaced one is recreated too. Either way a complete
                # fresh slice is on its way.
                _add_fresh_slice(cap, name, sl.key, shape)
        virtual = cap.virtual[name] = _virtual(gs, unidentified)
        for i in range(virtual):
            _add_fresh_slice(cap, name, f"launching:{name}:{i}", shape)
    memo.end_arriving()
    return cap


def _node_bins(
    cap: Capacity,
    slice_map: SliceMap,
    ray: RayState,
    unavailable: Collection[str],
    unidentified: set[str],
    started: Mapping[str, datetime],
    now: datetime | None,
    settle_s: float,
    memo: CapacityMemo,
) -> _Sources:
    """The bins of live nodes, in reply order (see build_capacity); what each was built from."""
    available_from: list[_Source] = []
    total_from: list[_Source] = []
    owner = _slice_of_pod(slice_map)
    nowhere = (None, None, None)
    with_total = cap.with_total
    for node in ray.nodes:
        if node.status in (NodeStatus.DEAD, NodeStatus.DRAINING):
            continue
        found = owner.get(node.instance_id, nowhere)
        group, key, state = found
        usable = state in (None, SliceState.COMPLETE, SliceState.OUTDATED) or state in _COMING_UP
        if state is SliceState.PENDING and group in unavailable:
            continue  # a stuck slice of a group that cannot get capacity: not coming
        if not usable and node.instance_id not in unidentified:
            continue  # broken, partial and terminating slices are never capacity as they are
        made = memo.node_bins(node, found, with_total)
        accelerators = made.live.accelerators
        if state in _COMING_UP:
            cap.available.append(_coming_bin(node, group, key, accelerators))
            available_from.append(_Source(node, node.total, True))
        else:
            live = made.live
            cap.available.append(live)
            available_from.append(_Source(node, node.available, False))
            since = started.get(node.instance_id) if state is SliceState.COMPLETE else None
            if since is not None and now is not None and not node.is_head:
                # A start stamped ahead of `now` (clock skew) settles no longer than settle_s.
                left = settle_s - max(0.0, (now - since).total_seconds())
                settling = _settling_bin(node, group, key, accelerators) if left > 0 else None
                if settling is not None:
                    settling.twin, live.twin = live, settling
                    cap.available.append(settling)
                    available_from.append(_Source(node, node.available, False))  # not kept
                    cap.settling.append((settling, left))
        if with_total:
            assert made.total is not None  # built with_total
            cap.total.append(made.total)
            total_from.append(_Source(node, node.total, False))
    memo.end_frame()
    return tuple(available_from), tuple(total_from)


def _count_virtual(
    cap: Capacity, slice_map: SliceMap, shapes: Mapping[str, SliceShape], unidentified: set[str]
) -> None:
    for name, gs in slice_map.groups.items():
        if name in shapes:
            cap.virtual[name] = _virtual(gs, unidentified)


def _virtual(gs: GroupSlices, unidentified: set[str]) -> int:
    """Replicas asked for that have no pods yet."""
    loose = sum(len(s.hosts) for s in gs.slices if s.hosts[0].pod_name in unidentified)
    counted = sum(
        1 for s in gs.slices if s.state in COUNTED and s.hosts[0].pod_name not in unidentified
    )
    counted += -(-loose // gs.group.num_of_hosts)  # replicas those pods may belong to
    return max(0, gs.group.effective_replicas - counted)


def _add_fresh_slice(cap: Capacity, group: str, key: str, shape: SliceShape) -> None:
    for bins in cap.lists():
        bins.extend(_as_launching(bins_for_new_slice(group, key, shape.hosts)))


def _unidentified_pods(slice_map: SliceMap) -> set[str]:
    """Live pods of multi-host groups without a replica label (their slice cannot be known)."""
    return {
        host.pod_name
        for gs in slice_map.groups.values()
        if gs.group.is_multi_host
        for sl in gs.slices
        if sl.state is SliceState.PARTIAL
        for host in sl.hosts
        if not (LABEL_REPLICA_NAME in host.labels or LABEL_LEGACY_REPLICA in host.labels)
    }


def _slice_of_pod(slice_map: SliceMap) -> dict[str, tuple[str, str, SliceState]]:
    """Each host's pod name → (group, slice key, slice state); per group from its memo."""
    out: dict[str, tuple[str, str, SliceState]] = {}
    for gs in slice_map.groups.values():
        out.update(gs.owner_of_pod)
    return out


def _node_bin(
    node: RayNode,
    group: str | None,
    key: str | None,
    resources: Mapping[str, float],
    accelerators: frozenset[str],
) -> Bin:
    return Bin(
        name=node.instance_id or node.node_id,
        group=group,
        slice_key=key,
        free=dict(resources),
        labels=node.labels,
        accelerators=accelerators,
        idle_since_ms=node.idle_since_ms if node.status is NodeStatus.IDLE else None,
    )


def _started_at(slice_map: SliceMap, now: datetime, settle_s: float) -> dict[str, datetime]:
    """When each running worker host's Ray container started (`startedAt` of its pod), for
    the groups where one started less than `settle_s` before `now` (or after it: clock skew):
    in the others no host settles."""
    out: dict[str, datetime] = {}
    for gs in slice_map.groups.values():
        latest = gs.latest_worker_start  # built once per group object (the memo hands it on)
        if latest is not None and (now - latest).total_seconds() < settle_s:
            out.update(gs.worker_started_at)
    return out


def _settling_bin(
    node: RayNode, group: str | None, key: str | None, accelerators: frozenset[str]
) -> Bin | None:
    """What of a worker host that joined just now Ray may still report as pending demand, as
    a bin of its own (None when nothing on it is used).

    Ray reports each raylet's free resources and the demand queued at each raylet apart: the
    moment work moves from the raylet it waited on to a host that just joined, one reply can
    show it taken on the host and still pending. No single reply tells that apart from other
    work that took the host, so for the settle time after the host's Ray container started
    its used resources may serve pending demand again. A resource nothing uses counts at what
    is free on it: work holds less running than it asked to be placed (an actor asks 1 CPU to
    be placed and holds none), so the pending copy of an actor on a TPU host asks CPU the host
    shows free. At most the host's total (in practice its used part), and for at most the
    settle time: demand beyond that gets its slice at once.

    Sorted after every existing and launching bin (`Bin.settling`), it only holds demand that
    would otherwise open a slice; which slices demand needs is as without it, so scale-down is
    unaffected (its own slice is busy anyway).
    """
    used = {
        name: amount - node.available.get(name, 0.0)
        for name, amount in node.total.items()
        if amount - node.available.get(name, 0.0) > 0
    }
    if not used:
        return None
    free = {name: used.get(name, node.available.get(name, 0.0)) for name in node.total}
    return Bin(
        name=f"{node.instance_id or node.node_id}/settling",
        group=group,
        slice_key=key,
        free=free,
        labels=node.labels,
        accelerators=accelerators,
        launching=True,
        settling=True,
    )


def _coming_bin(
    node: RayNode, group: str | None, key: str | None, accelerators: frozenset[str]
) -> Bin:
    """A joined host of a slice still coming up: all of it, as a launching host would be."""
    bin_ = _node_bin(node, group, key, node.total, accelerators)
    bin_.idle_since_ms, bin_.launching = None, True
    return bin_


def _launching_hosts(
    cap: Capacity,
    key: str,
    group: str,
    shape: SliceShape,
    joined: Mapping[str, RayNode],
    hosts: list[Host],
) -> None:
    """Hosts of a slice still coming up count at full size until their Ray node joins."""
    for position, host in enumerate(hosts):
        if host.pod_name in joined or host.phase is HostPhase.TERMINATING:
            continue
        index = host.host_index if host.host_index is not None else position
        _add_launching(cap, f"{key}/{host.pod_name}", group, key, shape, index)


def _add_launching(
    cap: Capacity, name: str, group: str, key: str, shape: SliceShape, index: int
) -> None:
    host = shape.hosts[min(index, len(shape.hosts) - 1)]
    for bins in cap.lists():
        bins.append(
            Bin(
                name=name,
                group=group,
                slice_key=key,
                free=dict(host.resources),
                labels=host.labels,
                accelerators=host.accelerators,
                launching=True,
            )
        )


def _as_launching(bins: list[Bin]) -> list[Bin]:
    for bin_ in bins:
        bin_.planned, bin_.launching = False, True
    return bins
