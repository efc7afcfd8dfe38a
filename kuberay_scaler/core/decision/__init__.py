"""decide(): one observation → the plan and every write it takes, in order. Pure.

The daemon executes the writes (loop/execute.py), the `plan` command prints them and
/debug/plan shows them; all three build them here, so they cannot disagree. The writes are:

1. `RecordIntent`: annotate the RayCluster with the slices about to be drained, so a restart in
   the middle finishes the scale-down instead of forgetting it;
2. one `Drain` per idle slice (every live raylet of its hosts, pinned to the GCS the plan was
   made from), one per broken slice being replaced whose hosts' Ray nodes are still alive (and
   idle: a busy broken slice is kept by the planner), and one per busy slice to drain for
   preemption (above maxReplicas, or broken and busy for too long; not deleted by this patch);
3. `Patch`: the guarded JSON patch (replicas, workersToDelete, the record cleared).

Every deletion passes the deletion gate (core/planner/gate.py) twice: in `writes_for`, with every
drain assumed accepted, and in `after_drains`, with what the drains really did.

The modules, high to low (a layers contract in pyproject.toml): `deciding` (decide) and `after`
(the rules around the drains), `document` (the Decision and what `plan` prints), `writes` (the
write types and `writes_for`) and `observation` (the parsed input).
"""

from kuberay_scaler.core.decision.after import (
    DrainResults,
    LastRead,
    Writes,
    after_drains,
    drains_to_send,
)
from kuberay_scaler.core.decision.deciding import decide
from kuberay_scaler.core.decision.document import Decision, write_document
from kuberay_scaler.core.decision.observation import Observation
from kuberay_scaler.core.decision.writes import (
    DRAINED_FIRST,
    Drain,
    Patch,
    RecordIntent,
    Write,
    writes_for,
)

__all__ = [
    "DRAINED_FIRST",
    "Decision",
    "Drain",
    "DrainResults",
    "LastRead",
    "Observation",
    "Patch",
    "RecordIntent",
    "Write",
    "Writes",
    "after_drains",
    "decide",
    "drains_to_send",
    "write_document",
    "writes_for",
]
