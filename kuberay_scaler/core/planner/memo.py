"""What one caller's frames share to go faster: the frame memo, owned by whoever plans frame
after frame (the daemon's observer, loop/observe.py) and passed in (`decide(..., memo=)`).

Every part is keyed by values (or by the identity of frozen values the caller hands on
unchanged: the pod cache keeps a Host per unchanged pod, the poller a RayNode per unchanged
node), so a decision never depends on it: a cold memo (`None`, or a fresh FrameMemo) gives the
same plan, only slower (tests/unit/test_frame_memo.py). One memo serves one RayCluster's frames;
two callers planning different clusters each keep their own.
"""

from __future__ import annotations

from kuberay_scaler.core.planner.capacity import CapacityMemo
from kuberay_scaler.core.slicemap import SliceMemo


class FrameMemo:
    """The memos of one planner's frames (mutable, never shared between clusters).

    `slices`: last frame's complete slices and whole groups (core/slicemap.py SliceMemo).
    `capacity`: last frame's per-node facts of the capacity view (capacity.py CapacityMemo).
    """

    def __init__(self) -> None:
        self.slices = SliceMemo()
        self.capacity = CapacityMemo()
