"""What became of one RayCluster patch, in one word (adapters/kube/writer.py classifies it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

OutcomeKind = Literal["applied", "stale", "invalid", "forbidden", "throttled", "transient", "gone"]


@dataclass(frozen=True)
class PatchOutcome:
    """Result of one patch; `obj` only for `applied`, `retry_after` only for `throttled`."""

    kind: OutcomeKind
    message: str = ""
    obj: dict[str, Any] | None = None
    retry_after: float | None = None
