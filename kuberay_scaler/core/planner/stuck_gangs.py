"""Broken slices a gang waits on (item 4). Pure.

One host of a multi-host slice dies: the job's placement group goes RESCHEDULING, its dead
host's bundle pending again, pinned to that slice (`ray.io/tpu-slice-name`). The surviving
hosts hold the gang's other bundles, so they look busy, and a broken-but-busy slice is kept up
to BROKEN_BUSY_MAX_S — but that work cannot progress until the slice is whole again. When every
busy host of a broken slice is held only by placement groups that wait, RESCHEDULING, for a
bundle pinned to that same slice, nothing else runs there: the slice is replaced now (drained
for preemption with the preemption deadline, then whole; planner/replace.py).

"Held only by" is read from the node's resources as the GCS reports them: a placed bundle adds
`<resource>_group_<pg id>` (and `_group_<index>_<pg id>`) to the host's total and reserves the
plain resource; a host whose used plain resources exceed what its bundles reserve runs other
work too, and is not judged stuck.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType

from kuberay_scaler.core.model.labels import TPU_SLICE_LABEL
from kuberay_scaler.core.model.ray import GangDemand, RayNode, RayState
from kuberay_scaler.core.model.slices import Slice, SliceMap, SliceState

# `<resource>_group_<pg id>` (the wildcard bundle resource) and `<resource>_group_<i>_<pg id>`.
_BUNDLE = re.compile(r"(?P<res>.+?)_group_(?:(?P<index>\d+)_)?(?P<pg>[0-9a-f]{8,})")
_EPSILON = 1e-6
RESCHEDULING = "RESCHEDULING"


def gang_stuck_slices(slice_map: SliceMap, ray: RayState) -> Mapping[str, str]:
    """Broken slices whose every busy host is held only by placement groups waiting on that
    very slice: slice key → why."""
    waiting = _rescheduling_by_slice_name(ray.gangs)
    if not waiting:
        return MappingProxyType({})
    out: dict[str, str] = {}
    for gs in slice_map.groups.values():
        for sl in gs.by_state(SliceState.BROKEN):
            why = _stuck(sl, waiting)
            if why:
                out[sl.key] = why
    return MappingProxyType(out)


def _rescheduling_by_slice_name(gangs: tuple[GangDemand, ...]) -> dict[str, set[str]]:
    """TPU slice name → ids of the RESCHEDULING placement groups with a bundle pinned to it."""
    out: dict[str, set[str]] = {}
    for gang in gangs:
        pg, _, rest = gang.details.partition(":")
        if not pg or not rest.endswith(f"|{RESCHEDULING}"):
            continue
        for bundle in gang.bundles:
            for selector in bundle.selectors:
                for c in selector.constraints:
                    if c.key == TPU_SLICE_LABEL and not c.negated:
                        for name in c.values:
                            out.setdefault(name, set()).add(pg)
    return out


def _stuck(sl: Slice, waiting: Mapping[str, set[str]]) -> str:
    busy = [sl.nodes[p] for p in sl.working_hosts]
    if not busy:
        return ""
    names = {n.labels[TPU_SLICE_LABEL] for n in sl.nodes.values() if TPU_SLICE_LABEL in n.labels}
    pgs = set().union(*(waiting.get(name, set()) for name in names))
    if not pgs or not all(_held_only_by(n, pgs) for n in busy):
        return ""
    return (
        f"every busy host ({len(busy)}) is held only by placement group(s)"
        f" {', '.join(sorted(pgs))} waiting (RESCHEDULING) on this slice, which cannot be whole"
        " again: replaced now, not after the broken-but-busy bound"
    )


def _held_only_by(node: RayNode, pgs: set[str]) -> bool:
    """The node holds bundles of some of `pgs` and of no other group, and nothing beyond what
    those bundles reserve is in use."""
    reserved: dict[str, float] = {}
    held: set[str] = set()
    for key, amount in node.total.items():
        found = _BUNDLE.fullmatch(key)
        if found is None:
            continue
        held.add(found["pg"])
        if found["index"] is None:  # the wildcard resource: what the group reserves here
            res = found["res"]
            reserved[res] = reserved.get(res, 0.0) + amount
    if not held or not held <= pgs:
        return False
    for key, total in node.total.items():
        if "_group_" in key or key.startswith("node:"):
            continue
        used = total - node.available.get(key, 0.0)
        if used > reserved.get(key, 0.0) + _EPSILON:
            return False  # something outside the waiting gangs runs here
    return True
