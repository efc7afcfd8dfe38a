"""RayCluster and pod objects for the live benchmarks, as KubeRay v1.7 writes them."""

from __future__ import annotations

from typing import Any

GROUP = "workers"
# Every cluster lives in its own namespace with a head pod of this name: the one Ray head's node
# carries it as its cloud instance id (RAY_CLOUD_INSTANCE_ID, as KubeRay sets it), so Ray v2
# matches its node to each cluster's head pod.
HEAD_POD = "bench-head"


def raycluster(name: str, *, replicas: int = 0, max_replicas: int = 100_000) -> dict[str, Any]:
    """One CPU worker group (1 CPU per host); the head has no CPUs, so `num_cpus=1` tasks wait."""
    head = {
        "name": "ray-head",
        "image": "rayproject/ray:2.60.0",
        "resources": {"limits": {"cpu": "1", "memory": "2Gi"}},
    }
    worker = {
        "name": "ray-worker",
        "image": "rayproject/ray:2.60.0",
        "resources": {"limits": {"cpu": "1", "memory": "1Gi"}},
    }
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name, "namespace": name},
        "spec": {
            "rayVersion": "2.60.0",
            "enableInTreeAutoscaling": True,
            "autoscalerOptions": {"idleTimeoutSeconds": 60, "upscalingMode": "Default"},
            "headGroupSpec": {
                "rayStartParams": {"num-cpus": "0"},
                "template": {"spec": {"containers": [head]}},
            },
            "workerGroupSpecs": [
                {
                    "groupName": GROUP,
                    "replicas": replicas,
                    "minReplicas": replicas,
                    "maxReplicas": max(max_replicas, replicas),
                    "numOfHosts": 1,
                    "rayStartParams": {},
                    "template": {"spec": {"containers": [worker]}},
                }
            ],
        },
    }


def head_pod(cluster: str) -> dict[str, Any]:
    return _pod(cluster, HEAD_POD, head=True, index=0)


def worker_pod(cluster: str, index: int) -> dict[str, Any]:
    return _pod(cluster, f"{cluster}-{GROUP}-{index:05d}", head=False, index=index)


def _pod(cluster: str, name: str, *, head: bool, index: int) -> dict[str, Any]:
    """A Running pod with the fields a real one has (spec, status, conditions, managed fields
    are left out: the API server would send those too, so sizes here are a lower bound)."""
    container = "ray-head" if head else "ray-worker"
    labels = {
        "ray.io/cluster": cluster,
        "ray.io/node-type": "head" if head else "worker",
        "ray.io/group": "headgroup" if head else GROUP,
        "ray.io/is-ray-node": "yes",
        "app.kubernetes.io/created-by": "kuberay-operator",
        "app.kubernetes.io/name": "kuberay",
    }
    ip = f"10.{(index >> 16) & 255}.{(index >> 8) & 255}.{index & 255}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": cluster,
            "labels": labels,
            "annotations": {"ray.io/ft-enabled": "false"},
            "ownerReferences": [
                {
                    "apiVersion": "ray.io/v1",
                    "kind": "RayCluster",
                    "name": cluster,
                    "uid": "00000000-0000-0000-0000-000000000000",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "nodeName": f"node-{index % 500}",
            "restartPolicy": "Always",
            "containers": [
                {
                    "name": container,
                    "image": "rayproject/ray:2.60.0",
                    "command": ["/bin/bash", "-lc", "--"],
                    "args": ["ulimit -n 65536; ray start --block --num-cpus=1"],
                    "env": [
                        {"name": "RAY_CLUSTER_NAME", "value": cluster},
                        {"name": "RAY_IP", "value": f"{cluster}-head-svc.default.svc"},
                        {"name": "RAY_PORT", "value": "6379"},
                    ],
                    "resources": {
                        "limits": {"cpu": "1", "memory": "1Gi"},
                        "requests": {"cpu": "1", "memory": "1Gi"},
                    },
                    "ports": [{"containerPort": 8080, "name": "metrics", "protocol": "TCP"}],
                }
            ],
        },
        "status": {
            "phase": "Running",
            "podIP": ip,
            "hostIP": f"192.168.{(index // 500) % 255}.{index % 250}",
            "startTime": "2026-12-01T00:00:00Z",
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": "2026-12-01T00:00:05Z"}
                for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
            "containerStatuses": [
                {
                    "name": container,
                    "ready": True,
                    "restartCount": 0,
                    "image": "rayproject/ray:2.60.0",
                    "imageID": "docker.io/rayproject/ray@sha256:" + "0" * 64,
                    "containerID": f"containerd://{index:064x}",
                    "started": True,
                    "state": {"running": {"startedAt": "2026-12-01T00:00:04Z"}},
                }
            ],
        },
    }
