"""Worker pods of real size: what the API server returns for a pod KubeRay created and ran.

The benchmarks' other pods carry only what the daemon reads (~2 KB with the stand-in's
rendering). A real one also has managedFields (operator and kubelet), the Ray container's full
spec (args, env, probes, mounts), the volumes, tolerations and a full status: about 3.8 KB of
JSON. `pod_json_size` reports the size actually used, so every figure can state it.
"""

from __future__ import annotations

import json
from typing import Any

CLUSTER = "bench"
TS = "2026-11-30T00:00:00Z"


def real_pod(name: str, group: str, index: int, *, phase: str = "Running") -> dict[str, Any]:
    ip = f"10.{(index >> 16) & 255}.{(index >> 8) & 255}.{index & 255}"
    labels = {
        "app.kubernetes.io/created-by": "kuberay-operator",
        "app.kubernetes.io/name": "kuberay",
        "ray.io/cluster": CLUSTER,
        "ray.io/group": group,
        "ray.io/identifier": f"{CLUSTER}-worker",
        "ray.io/is-ray-node": "yes",
        "ray.io/node-type": "worker",
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"{index:08x}-0000-4000-8000-000000000000",
            "resourceVersion": str(100_000 + index),
            "creationTimestamp": TS,
            "generateName": f"{CLUSTER}-{group}-",
            "labels": labels,
            "annotations": {
                "ray.io/ft-enabled": "false",
                "ray.io/overwrite-container-cmd": "false",
            },
            "ownerReferences": [
                {
                    "apiVersion": "ray.io/v1",
                    "kind": "RayCluster",
                    "name": CLUSTER,
                    "uid": "u-1",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [
                _managed("kuberay-operator", "Update", ["metadata", "spec"]),
                _managed("kubelet", "Update", ["status"], subresource="status"),
            ],
        },
        "spec": _spec(group),
        "status": _status(phase, ip),
    }


def _managed(
    manager: str, operation: str, parts: list[str], subresource: str | None = None
) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if "metadata" in parts:
        fields["f:metadata"] = {
            "f:annotations": {".": {}, "f:ray.io/ft-enabled": {}},
            "f:generateName": {},
            "f:labels": {".": {}, "f:ray.io/cluster": {}, "f:ray.io/group": {}},
            "f:ownerReferences": {".": {}, 'k:{"uid":"u-1"}': {}},
        }
    if "spec" in parts:
        fields["f:spec"] = {
            "f:containers": {'k:{"name":"ray-worker"}': {".": {}, "f:args": {}, "f:env": {}}},
            "f:restartPolicy": {},
            "f:volumes": {".": {}, 'k:{"name":"shared-mem"}': {".": {}, "f:emptyDir": {}}},
        }
    if "status" in parts:
        fields["f:status"] = {
            "f:conditions": {'k:{"type":"Ready"}': {".": {}, "f:status": {}}},
            "f:containerStatuses": {},
            "f:hostIP": {},
            "f:phase": {},
            "f:podIP": {},
            "f:startTime": {},
        }
    entry: dict[str, Any] = {
        "manager": manager,
        "operation": operation,
        "apiVersion": "v1",
        "time": TS,
        "fieldsType": "FieldsV1",
        "fieldsV1": fields,
    }
    if subresource:
        entry["subresource"] = subresource
    return entry


def _spec(group: str) -> dict[str, Any]:
    env = [
        {"name": "FQ_RAY_IP", "value": f"{CLUSTER}-head-svc.default.svc.cluster.local"},
        {"name": "RAY_IP", "value": f"{CLUSTER}-head-svc"},
        {"name": "RAY_CLUSTER_NAME", "value": CLUSTER},
        {
            "name": "RAY_CLOUD_INSTANCE_ID",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
        },
        {"name": "RAY_NODE_TYPE_NAME", "value": group},
        {"name": "RAY_PORT", "value": "6379"},
    ]
    probe = {
        "exec": {
            "command": [
                "bash",
                "-c",
                "wget -T 2 -q -O- http://localhost:52365/api/local_raylet_healthz | grep success",
            ]
        },
        "failureThreshold": 10,
        "periodSeconds": 5,
        "timeoutSeconds": 2,
    }
    return {
        "containers": [
            {
                "name": "ray-worker",
                "image": "rayproject/ray:2.60.0",
                "command": ["/bin/bash", "-lc", "--"],
                "args": ["ulimit -n 65536; ray start --address=bench-head-svc:6379 --block"],
                "env": env,
                "resources": {
                    "limits": {"cpu": "8", "memory": "32Gi"},
                    "requests": {"cpu": "8", "memory": "32Gi"},
                },
                "livenessProbe": probe,
                "volumeMounts": [
                    {"mountPath": "/dev/shm", "name": "shared-mem"},
                    {
                        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                        "name": "kube-api-access",
                        "readOnly": True,
                    },
                ],
                "imagePullPolicy": "IfNotPresent",
            }
        ],
        "restartPolicy": "Never",
        "nodeName": f"node-{group}",
        "serviceAccountName": "default",
        "volumes": [
            {"name": "shared-mem", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}},
            {
                "name": "kube-api-access",
                "projected": {
                    "defaultMode": 420,
                    "sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}
                    ],
                },
            },
        ],
        "tolerations": [
            {
                "effect": "NoExecute",
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "tolerationSeconds": 300,
            },
            {
                "effect": "NoExecute",
                "key": "node.kubernetes.io/unreachable",
                "operator": "Exists",
                "tolerationSeconds": 300,
            },
        ],
    }


def _status(phase: str, ip: str) -> dict[str, Any]:
    conditions = [
        {"type": kind, "status": "True", "lastProbeTime": None, "lastTransitionTime": TS}
        for kind in (
            "PodReadyToStartContainers",
            "Initialized",
            "Ready",
            "ContainersReady",
            "PodScheduled",
        )
    ]
    return {
        "phase": phase,
        "conditions": conditions,
        "hostIP": "172.18.0.2",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "startTime": TS,
        "qosClass": "Guaranteed",
        "containerStatuses": [
            {
                "name": "ray-worker",
                "ready": True,
                "restartCount": 0,
                "image": "docker.io/rayproject/ray:2.60.0",
                "started": True,
                "state": {"running": {"startedAt": "2026-11-30T00:00:10Z"}},
            }
        ],
    }


def pod_json_size(pod: dict[str, Any]) -> int:
    """Bytes of the pod as the API server sends it (compact JSON)."""
    return len(json.dumps(pod, separators=(",", ":")))


if __name__ == "__main__":
    print(pod_json_size(real_pod("bench-cpu-worker-abcde", "cpu", 1234)))
