"""The planner's old home, kept as a thin re-export so callers on other branches merge
cleanly: `plan` lives in pipeline.py, `Policy` in policy.py, `next_deadline_s` in carried.py."""

from __future__ import annotations

from kuberay_scaler.core.planner.carried import next_deadline_s
from kuberay_scaler.core.planner.pipeline import plan
from kuberay_scaler.core.planner.policy import Policy

__all__ = ["Policy", "next_deadline_s", "plan"]
