"""HTTP: health, readiness, Prometheus metrics and the last plan."""
