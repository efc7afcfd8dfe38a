"""Slice-aware autoscaler for KubeRay RayClusters."""

__version__ = "0.1.0"
