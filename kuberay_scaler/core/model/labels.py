"""Every label and node-selector key the daemon reads or predicts, in one place.

Pod labels are set by KubeRay; Ray node labels by Ray on KubeRay (RAY_NODE_TYPE_NAME, the TPU
environment); node selectors by the user for GKE TPU node pools.
"""

from __future__ import annotations

# Pod labels KubeRay sets.
LABEL_CLUSTER = "ray.io/cluster"
LABEL_NODE_TYPE = "ray.io/node-type"
LABEL_GROUP = "ray.io/group"
LABEL_REPLICA_NAME = "ray.io/worker-group-replica-name"
LABEL_REPLICA_INDEX = "ray.io/worker-group-replica-index"
LABEL_HOST_INDEX = "ray.io/replica-host-index"
LABEL_LEGACY_REPLICA = "replicaIndex"  # set by the GKE TPU webhook on older operators

# Annotation on a worker group's template metadata: its own provisioning deadline in seconds (a
# slice not up by then makes the group unavailable; the cluster default is
# KUBERAY_SCALER_MAX_PROVISION_TIME_S).
# Our record of the slices about to be drained (core/patch/intent.py): group → slice keys, JSON.
DRAINING_ANNOTATION = "kuberay-scaler.ray.io/draining"
ANNOTATION_MAX_PROVISION = "kuberay-scaler.ray.io/max-provision-time-s"

# Ray node labels. KubeRay sets RAY_NODE_TYPE_NAME=<groupName>; Ray turns it into NODE_GROUP.
NODE_GROUP_LABEL = "ray.io/node-group"
TPU_SLICE_LABEL = "ray.io/tpu-slice-name"
TPU_WORKER_LABEL = "ray.io/tpu-worker-id"
TPU_POD_TYPE_LABEL = "ray.io/tpu-pod-type"
TPU_TOPOLOGY_LABEL = "ray.io/tpu-topology"
ACCELERATOR_TYPE_LABEL = "ray.io/accelerator-type"

# GKE TPU node selectors.
GKE_TPU_ACCELERATOR = "cloud.google.com/gke-tpu-accelerator"
GKE_TPU_TOPOLOGY = "cloud.google.com/gke-tpu-topology"

# Annotations on a worker group's template metadata (KubeRay v1.7.0's CRD keeps
# template.metadata.annotations; unknown keys of the group spec itself are pruned).
ANNOTATION_DISRUPTION_BUDGET = "kuberay-scaler.ray.io/disruption-budget"
ANNOTATION_SCALE_DOWN_DELAY = "kuberay-scaler.ray.io/scale-down-delay-after-add-seconds"

# Pod annotations users set for node autoscalers; either keeps its slice from voluntary removal.
POD_DO_NOT_DISRUPT = ("karpenter.sh/do-not-disrupt", "true")
POD_SAFE_TO_EVICT = ("cluster-autoscaler.kubernetes.io/safe-to-evict", "false")
# The pod condition the API server sets before a disruption (eviction, preemption, taints).
CONDITION_DISRUPTION_TARGET = "DisruptionTarget"
