"""Token -> user -> RBAC-like rules. Rules ignore API groups and namespaces: each stand-in
resource name ("pods", "pods/status", "rayclusters", "events") is unique here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kuberay_standins._k8s_errors import ApiError, qualified, status_body

# (verbs, resources) like an rbac.authorization.k8s.io PolicyRule; "*" matches anything.
Rule = tuple[Sequence[str], Sequence[str]]

ADMIN_RULES: list[Rule] = [(["*"], ["*"])]

# Exactly the Role KubeRay creates for its autoscaler container (common/rbac.go).
RESTRICTED_RULES: list[Rule] = [
    (["get", "list", "watch", "patch"], ["pods"]),
    (["patch"], ["pods/resize"]),
    (["get", "patch"], ["rayclusters"]),
]

# The minimal Role our own manifests give the daemon when it runs as a sidecar/Deployment.
SIDECAR_RULES: list[Rule] = [
    (["get", "list", "watch"], ["pods"]),
    (["get", "list", "watch", "patch"], ["rayclusters"]),
    (["create"], ["events"]),
]


@dataclass(frozen=True)
class Subject:
    user: str
    rules: tuple[Rule, ...]

    def allows(self, verb: str, resource: str) -> bool:
        return any(_rule_allows(rule, verb, resource) for rule in self.rules)


def _rule_allows(rule: Rule, verb: str, resource: str) -> bool:
    verbs, resources = rule
    verb_ok = "*" in verbs or verb in verbs
    resource_ok = "*" in resources or resource in resources
    return verb_ok and resource_ok


def unauthorized() -> ApiError:
    return ApiError(status_body(401, "Unauthorized", "Unauthorized"))


def forbidden(
    subject: Subject,
    verb: str,
    *,
    group: str,
    resource: str,
    namespace: str,
    name: str | None,
) -> ApiError:
    """403 with the message shape kube-apiserver's RBAC authorizer produces."""
    plural = resource.split("/")[0]
    target = qualified(group, plural) + (f' "{name}"' if name else "")
    message = (
        f'{target} is forbidden: User "{subject.user}" cannot {verb} resource "{resource}" '
        f'in API group "{group}" in the namespace "{namespace}"'
    )
    details: dict[str, object] = {"kind": plural}
    if group:
        details["group"] = group
    if name:
        details["name"] = name
    return ApiError(status_body(403, "Forbidden", message, dict(details)))
