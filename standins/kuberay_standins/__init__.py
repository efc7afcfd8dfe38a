"""Local stand-ins for the demo and contract tests: a Kubernetes API server and a KubeRay operator.

The daemon never imports this package; tests and ``make demo`` do.
"""
