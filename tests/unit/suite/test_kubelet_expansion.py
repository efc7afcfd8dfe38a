"""The e2e drop-in test's stand-in for the kubelet's env resolution and $(VAR) expansion."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import pytest

from tests.e2e.kubelet import expand, resolve_env


@pytest.mark.parametrize(
    "text,expected",
    [
        ("ray --cluster-name $(NAME)", "ray --cluster-name rc"),
        ("$(NAME)-$(NS)", "rc-ns"),
        ("$(MISSING) stays", "$(MISSING) stays"),
        ("$$(NAME) is escaped", "$(NAME) is escaped"),
        ("cost $5 and $", "cost $5 and $"),
        ("$(unclosed", "$(unclosed"),
    ],
)
def test_expansion_follows_the_kubelet(text: str, expected: str) -> None:
    assert expand(text, {"NAME": "rc", "NS": "ns"}) == expected


async def test_env_resolves_field_refs_secrets_and_earlier_variables() -> None:
    pod = {
        "metadata": {"name": "rc-head-x", "namespace": "ns", "labels": {"ray.io/cluster": "rc"}},
        "spec": {"serviceAccountName": "rc"},
    }
    secrets = {"rc": {"data": {"auth_token": base64.b64encode(b"t0k").decode()}}}

    async def lookup(kind: str, name: str) -> Mapping[str, Any]:
        if kind == "secrets" and name in secrets:
            return secrets[name]
        raise LookupError(name)

    container = {
        "env": [
            {
                "name": "RAY_CLUSTER_NAME",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['ray.io/cluster']"}},
            },
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "WHERE", "value": "$(RAY_CLUSTER_NAME).$(NS)"},
            {
                "name": "RAY_AUTH_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": "rc", "key": "auth_token"}},
            },
            {
                "name": "OPTIONAL",
                "valueFrom": {"secretKeyRef": {"name": "absent", "key": "k", "optional": True}},
            },
        ]
    }
    env = await resolve_env(container, pod, lookup)
    assert env == {
        "RAY_CLUSTER_NAME": "rc",
        "NS": "ns",
        "WHERE": "rc.ns",
        "RAY_AUTH_TOKEN": "t0k",
    }
