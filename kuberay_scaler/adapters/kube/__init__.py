"""Kubernetes adapter: the only package that talks to the API server.

It moves raw `dict` objects in and out (pods, the RayCluster, Events) and decides nothing about
scaling. Modules:

- `session`: build an `ApiClient` from a kubeconfig or the in-cluster service account.
- `transport`: one JSON request / one watch stream, with metrics and error classification.
- `informer`: generic list-then-watch cache (pods, and the RayCluster in watch mode).
- `access`: SelfSubjectAccessReview once at start (watch vs poll mode, Events or not).
- `raycluster`: the current RayCluster, by watch or by debounced GET.
- `writer`: JSON-patch the RayCluster and classify the outcome.
- `events`: best-effort core/v1 Events on the RayCluster.
"""
