#!/usr/bin/env bash
# Build the kuberay-scaler image without a Docker engine or a container registry (CI here):
#
#   1. a Debian base root filesystem made with mmdebstrap from Debian's package archive, cached
#      OUTSIDE the repository, keyed by suite + packages + mmdebstrap version:
#        ${KUBERAY_SCALER_CACHE:-$HOME/.cache/kuberay-scaler}/images/base-<key>.tar
#      and imported into podman as localhost/kuberay-scaler-base:<key>;
#   2. the repository's Dockerfile built on it (BASE_IMAGE build argument; the Dockerfile's own
#      default stays the registry's python:3.11-slim for users), wheels from the package
#      registry with the machine's CA bundle ($PIP_CERT) as a build secret.
#
# podman runs through scripts/podman.sh (why each flag: see there): runtime runc, storage driver
# vfs, cgroup manager cgroupfs, ulimits at the defaults; its storage lives under the cache
# directory too, so list or run the image with scripts/podman.sh. The LAST LINE OF STDOUT is the
# image reference.
# Timings go to stderr: base (cold/warm), build, total; the image size in MB.
set -euo pipefail

SUITE="${IMAGE_DEBIAN_SUITE:-bookworm}"
# bash: KubeRay's command is /bin/bash -c; python3-venv: the build stage makes a venv.
PACKAGES="${IMAGE_BASE_PACKAGES:-python3,python3-venv,ca-certificates,bash}"
VARIANT="${IMAGE_BASE_VARIANT:-minbase}"
REPO_ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE_BASE="${KUBERAY_SCALER_CACHE:-$HOME/.cache/kuberay-scaler}"
CACHE="${CACHE_BASE%/}/images"
VERSION="$(sed -nE 's/^version = "([^"]+)"/\1/p' "$REPO_ROOT/pyproject.toml" | head -1)"
IMAGE="${IMAGE:-localhost/kuberay-scaler:${VERSION}}"

log() { printf '[build-image %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

for tool in podman mmdebstrap; do
  command -v "$tool" >/dev/null \
    || die "no $tool: apt-get update && apt-get install -y podman buildah runc mmdebstrap uidmap"
done
case "$(realpath -m "$CACHE")/" in
  "$REPO_ROOT"/*) die "cache $CACHE is inside the repository; set KUBERAY_SCALER_CACHE elsewhere" ;;
esac
mkdir -p "$CACHE"

# One podman configuration for every call (build, run, inspect); tests/image uses the same flags.
PODMAN=("$REPO_ROOT/scripts/podman.sh")
ULIMITS=(--ulimit nofile=1024:1024 --ulimit nproc=1024:1024)

started=$SECONDS
MMDEBSTRAP_VERSION="$(mmdebstrap --version | awk '{print $2}')"
KEY="$(printf '%s|%s|%s|%s' "$SUITE" "$VARIANT" "$PACKAGES" "$MMDEBSTRAP_VERSION" \
       | sha256sum | cut -c1-12)"
BASE_TAR="$CACHE/base-${SUITE}-${KEY}.tar"
BASE_IMAGE="localhost/kuberay-scaler-base:${SUITE}-${KEY}"

if [[ ! -s "$BASE_TAR" ]]; then
  log "base: mmdebstrap --variant=$VARIANT --include=$PACKAGES $SUITE (cold, ~1 min)"
  mmdebstrap --quiet --variant="$VARIANT" --include="$PACKAGES" \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    "$SUITE" "${BASE_TAR%.tar}.partial.tar" >&2 || die "mmdebstrap failed"  # .tar: a tarball
  mv "${BASE_TAR%.tar}.partial.tar" "$BASE_TAR"
fi
if ! "${PODMAN[@]}" image exists "$BASE_IMAGE"; then
  log "base: podman import $(basename "$BASE_TAR") $BASE_IMAGE"
  "${PODMAN[@]}" import --quiet "$BASE_TAR" "$BASE_IMAGE" >/dev/null || die "podman import failed"
fi
base_done=$SECONDS
log "base ready in $((base_done - started)) s: $BASE_IMAGE"

SECRET=()
if [[ -n "${PIP_CERT:-}" && -s "${PIP_CERT}" ]]; then
  SECRET=(--secret "id=pip-cert,src=${PIP_CERT}")
fi
log "build: $IMAGE from $BASE_IMAGE"
"${PODMAN[@]}" build --quiet --network host "${ULIMITS[@]}" "${SECRET[@]}" \
  --build-arg "BASE_IMAGE=$BASE_IMAGE" --layers=false -f "$REPO_ROOT/Dockerfile" \
  -t "$IMAGE" "$REPO_ROOT" >&2 || die "podman build failed"
built=$SECONDS
# Intermediate (build-stage) images are not kept: vfs copies every layer in full.
"${PODMAN[@]}" image prune --force >/dev/null 2>&1 || true
size_bytes="$("${PODMAN[@]}" image inspect --format '{{.Size}}' "$IMAGE")"
log "build took $((built - base_done)) s; total $((built - started)) s"
log "image $IMAGE: $((size_bytes / 1000000)) MB"
echo "$IMAGE"
