#!/usr/bin/env bash
# podman on the project's own image storage, the one `make image` (scripts/build-image.sh) builds
# into: ${KUBERAY_SCALER_CACHE:-$HOME/.cache/kuberay-scaler}/images/{storage,run}, not podman's
# default store, so a plain `podman images` does not list our image. Flags that work on a
# machine without Docker, systemd or cgroup v2 delegation (a CI container): runtime runc (crun
# refuses hybrid cgroups), storage driver vfs (no overlay mounts), cgroup manager cgroupfs.
#
#   scripts/podman.sh images
#   scripts/podman.sh run --rm --network host --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 \
#       localhost/kuberay-scaler:0.1.0 version
#
# (`--ulimit`s at the defaults: raising rlimits is refused in such a container.)
set -euo pipefail
CACHE="${KUBERAY_SCALER_CACHE:-$HOME/.cache/kuberay-scaler}/images"
exec podman --root "$CACHE/storage" --runroot "$CACHE/run" --storage-driver vfs \
  --runtime runc --cgroup-manager cgroupfs "$@"
