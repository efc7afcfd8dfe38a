#!/usr/bin/env bash
# Build a real single-machine Kubernetes control plane for the e2e tier from published Go
# modules (Go module proxy only: no Docker, no binary downloads):
#
#   kube-apiserver, kube-scheduler  k8s.io/kubernetes (wrapper module, staging replaces)
#   etcd                            go.etcd.io/etcd/server/v3 (wrapper module)
#   ray-operator                    github.com/ray-project/kuberay/ray-operator (go install)
#   kwok                            sigs.k8s.io/kwok/cmd/kwok (go install)
#   crds/ray.io_*.yaml              KubeRay CRDs copied out of the ray-operator module zip
#   kwok-stages.yaml                kwok stage YAMLs copied out of the kwok module zip
#
# into a version-keyed cache directory OUTSIDE the repository:
#
#   ${KUBERAY_SCALER_CACHE:-$HOME/.cache/kuberay-scaler}/control-plane/<key>/
#       bin/  crds/  kwok-stages.yaml  versions.env  READY  logs/  work/  stamps/
#
# Idempotent: components whose binary already exists and runs are skipped; once READY exists a
# warm run only re-checks the binaries (a second or so, no network). Logs go to stderr and to
# <cache>/logs/; the LAST LINE OF STDOUT is the bin directory. Exits non-zero on failure.
#
# See docs/e2e-build.md for versions, timings, disk use and traps.
set -euo pipefail

# ----------------------------------------------------------------------------------------------
# Versions (override with environment variables; the cache key changes with them).
# Fallbacks are tried in order only when the requested version cannot be downloaded from the
# proxy (set a *_FALLBACK_VERSIONS variable to "" to disable them); the versions actually
# built are recorded in <cache>/versions.env and <cache>/READY.
K8S_VERSION="${K8S_VERSION:-v1.36.3}"
K8S_FALLBACK_VERSIONS="${K8S_FALLBACK_VERSIONS-v1.36.1}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"                    # newest 3.6 on the proxy; need >= 3.6.8
ETCD_FALLBACK_VERSIONS="${ETCD_FALLBACK_VERSIONS-v3.6.15 v3.6.14 v3.6.8}"
# KubeRay v1.7.0 is the target, but proxy.golang.org answers "403 This module version is not
# available" for its zip (only the .info/.mod are served), so the pinned default is v1.6.1, the
# newest release whose zip is available (RayMultiHostIndexing is Beta, default on, in 1.6).
KUBERAY_VERSION="${KUBERAY_VERSION:-v1.6.1}"
KUBERAY_FALLBACK_VERSIONS="${KUBERAY_FALLBACK_VERSIONS-v1.6.0 v1.5.1}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
KWOK_FALLBACK_VERSIONS="${KWOK_FALLBACK_VERSIONS-v0.7.0}"

GO="${GO:-/usr/local/go/bin/go}"
BUILD_JOBS="${BUILD_JOBS:-2}"                              # the machine has 2 cores
CACHE_BASE="${KUBERAY_SCALER_CACHE:-$HOME/.cache/kuberay-scaler}"

KWOK_STAGE_FILES=(
  kustomize/stage/node/fast/node-initialize.yaml
  kustomize/stage/node/heartbeat/node-heartbeat.yaml
  kustomize/stage/pod/fast/pod-ready.yaml
  kustomize/stage/pod/fast/pod-delete.yaml
)
REQUIRED_CRDS=(ray.io_rayclusters.yaml ray.io_rayjobs.yaml ray.io_rayservices.yaml)
# ----------------------------------------------------------------------------------------------

log() { printf '[build-control-plane %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[[ -x "$GO" ]] || GO="$(command -v go 2>/dev/null)" || die "no Go toolchain (set GO=/path/to/go)"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOWORK=off GOFLAGS=-buildvcs=false
GO_VERSION="$("$GO" env GOVERSION)" || die "'$GO env GOVERSION' failed"
GO_MINOR="$(sed -E 's/^(go[0-9]+\.[0-9]+).*/\1/' <<<"$GO_VERSION")"

KEY="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_kuberay-${KUBERAY_VERSION}_kwok-${KWOK_VERSION}_${GO_MINOR}"
CACHE="${CACHE_BASE%/}/control-plane/${KEY}"
BIN="$CACHE/bin"
LOGS="$CACHE/logs"
WORK="$CACHE/work"
STAMPS="$CACHE/stamps"

# The cache must live outside the repository (never commit binaries or module caches).
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
CACHE_REAL="$(realpath -m "$CACHE")"
case "$CACHE_REAL/" in
  "$REPO_ROOT"/*) die "cache dir $CACHE_REAL is inside the repository $REPO_ROOT; set KUBERAY_SCALER_CACHE elsewhere" ;;
esac
mkdir -p "$BIN" "$LOGS" "$WORK" "$STAMPS" "$CACHE/crds" || die "cannot create $CACHE"

# One build per cache key at a time (a concurrent caller waits, then finds it warm).
exec 9>"$CACHE/.lock"
if ! flock -n 9; then
  log "another build holds $CACHE/.lock; waiting"
  flock -w 7200 9 || die "timed out waiting for $CACHE/.lock"
fi

# ---- helpers ---------------------------------------------------------------------------------

# bin_ok NAME ARGS...: the binary exists and `NAME ARGS` exits 0 within 30 s.
bin_ok() {
  local name="$1"; shift
  [[ -x "$BIN/$name" ]] && timeout 30 "$BIN/$name" "$@" >/dev/null 2>&1
}

# Per-binary smoke check used for skipping and verification.
check_binary() {
  case "$1" in
    kube-apiserver|kube-scheduler|etcd|kwok) bin_ok "$1" --version ;;
    ray-operator) bin_ok "$1" --help ;;   # ray-operator has no --version; Go's flag pkg exits 0 on -help
    *) return 1 ;;
  esac
}

# run LOGFILE CMD...: run CMD appending output to LOGFILE; on failure show the log tail and die.
run() {
  local logfile="$1"; shift
  printf '\n$ %s\n' "$*" >>"$logfile"
  if ! "$@" >>"$logfile" 2>&1; then
    log "command failed: $*"
    log "last lines of $logfile:"
    tail -n 40 "$logfile" | sed 's/^/    /' >&2
    die "build step failed (full log: $logfile)"
  fi
}

# mod_json MODULE@VERSION: print `go mod download -json` output (downloads the zip if needed).
mod_json() { "$GO" mod download -json "$1" 2>/dev/null || true; }

# json_field FIELD: extract a top-level string field from go's -json output on stdin.
json_field() { sed -n -E "s/^[[:space:]]*\"$1\": \"(.*)\",?$/\1/p" | head -n 1; }

# resolve MODULE PRIMARY "FALLBACKS": print the first version whose zip the proxy serves.
resolve() {
  local module="$1" primary="$2" fallbacks="$3" v out err
  for v in $primary $fallbacks; do
    out="$(mod_json "$module@$v")"
    err="$(json_field Error <<<"$out")"
    if [[ -z "$err" ]] && [[ -n "$(json_field Dir <<<"$out")" ]]; then
      [[ "$v" == "$primary" ]] || log "WARNING: $module@$primary unavailable; falling back to $v"
      printf '%s\n' "$v"
      return 0
    fi
    log "$module@$v not usable: ${err:-no Dir in go mod download output}"
  done
  return 1
}

mod_dir() { mod_json "$1" | json_field Dir; }

# install_outputs SRC_DIR NAME...: move freshly built binaries into bin/ atomically.
install_outputs() {
  local src="$1" name; shift
  for name in "$@"; do
    [[ -x "$src/$name" ]] || die "expected binary $src/$name was not produced"
    mv -f "$src/$name" "$BIN/$name.tmp.$$"
    mv -f "$BIN/$name.tmp.$$" "$BIN/$name"
  done
}

# fresh_work COMPONENT: recreate an empty per-component work dir; prints its path.
fresh_work() {
  local w="$WORK/$1"
  if [[ -d "$w" ]]; then chmod -R u+w "$w" 2>/dev/null || true; rm -rf "$w"; fi
  mkdir -p "$w/out"
  printf '%s\n' "$w"
}

component_done() {  # component_done COMPONENT BINARY...
  local c="$1" b; shift
  [[ -f "$STAMPS/$c" ]] || return 1
  for b in "$@"; do check_binary "$b" || return 1; done
}

declare -A USED=()
declare -A SECONDS_TAKEN=()

timed() {  # timed COMPONENT FUNC
  local start=$SECONDS
  cd "$WORK"   # outside any module: `go mod download`/`go install pkg@v` must not see a wrapper go.mod
  "$2"
  SECONDS_TAKEN[$1]=$((SECONDS - start))
}

# ---- components ------------------------------------------------------------------------------

build_kubernetes() {
  if component_done kubernetes kube-apiserver kube-scheduler; then
    USED[kubernetes]="$(cat "$STAMPS/kubernetes")"; log "kube-apiserver/kube-scheduler: up to date"; return 0
  fi
  local lf="$LOGS/kubernetes.log"; : >"$lf"
  log "kubernetes: resolving k8s.io/kubernetes $K8S_VERSION"
  local v; v="$(resolve k8s.io/kubernetes "$K8S_VERSION" "$K8S_FALLBACK_VERSIONS")" \
    || die "no usable k8s.io/kubernetes version among $K8S_VERSION $K8S_FALLBACK_VERSIONS"
  local staging="v0.${v#v1.}"          # v1.36.3 -> v0.36.3 (the published staging modules)
  local info gomod commit minor
  info="$(mod_json "k8s.io/kubernetes@$v")"
  gomod="$(json_field GoMod <<<"$info")"
  commit="$(json_field Hash <<<"$info")"
  minor="$(cut -d. -f2 <<<"$v")"
  [[ -f "$gomod" ]] || die "no go.mod for k8s.io/kubernetes@$v"

  local w; w="$(fresh_work kubernetes)"
  cd "$w"
  run "$lf" "$GO" mod init kuberay-scaler.invalid/build/kubernetes
  # k8s.io/kubernetes requires its staging modules at v0.0.0 with `=> ./staging/src/k8s.io/X`,
  # which only works inside the kubernetes repo; point each at its published release instead.
  local mods m n=0
  mods="$(sed -n -E 's#^[[:space:]]*(replace[[:space:]]+)?(k8s\.io/[A-Za-z0-9._-]+)[[:space:]]+=>[[:space:]]+\./staging/.*#\2#p' "$gomod")"
  [[ -n "$mods" ]] || die "found no staging replace directives in $gomod"
  for m in $mods; do
    run "$lf" "$GO" mod edit -replace "$m=$m@$staging"; n=$((n + 1))
  done
  log "kubernetes: $v, $n staging modules pinned to $staging; downloading dependencies"
  run "$lf" "$GO" get -tool "k8s.io/kubernetes/cmd/kube-apiserver@$v" "k8s.io/kubernetes/cmd/kube-scheduler@$v"
  local ld="-s -w"
  local p
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $p.gitVersion=$v -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
    [[ -n "$commit" ]] && ld+=" -X $p.gitCommit=$commit"
  done
  log "kubernetes: compiling kube-apiserver + kube-scheduler (-p $BUILD_JOBS; the long step)"
  run "$lf" "$GO" build -p "$BUILD_JOBS" -trimpath -ldflags "$ld" -o "$w/out/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler
  install_outputs "$w/out" kube-apiserver kube-scheduler
  check_binary kube-apiserver || die "built kube-apiserver does not run '--version'"
  check_binary kube-scheduler || die "built kube-scheduler does not run '--version'"
  printf '%s\n' "$v" >"$STAMPS/kubernetes"
  USED[kubernetes]="$v"
  log "kubernetes: done ($("$BIN/kube-apiserver" --version 2>&1))"
}

build_etcd() {
  if component_done etcd etcd; then
    USED[etcd]="$(cat "$STAMPS/etcd")"; log "etcd: up to date"; return 0
  fi
  local lf="$LOGS/etcd.log"; : >"$lf"
  local v; v="$(resolve go.etcd.io/etcd/server/v3 "$ETCD_VERSION" "$ETCD_FALLBACK_VERSIONS")" \
    || die "no usable go.etcd.io/etcd/server/v3 version among $ETCD_VERSION $ETCD_FALLBACK_VERSIONS"
  local w; w="$(fresh_work etcd)"
  cd "$w"
  # server/v3's go.mod has `replace ... => ../api` etc.: go install @version refuses it, but as a
  # dependency of a wrapper module those replaces are ignored and its require lines (the same
  # etcd release of api/v3, client/v3, pkg/v3, ...) are used.
  run "$lf" "$GO" mod init kuberay-scaler.invalid/build/etcd
  log "etcd: $v; downloading dependencies"
  run "$lf" "$GO" get -tool "go.etcd.io/etcd/server/v3@$v"
  log "etcd: compiling"
  run "$lf" "$GO" build -p "$BUILD_JOBS" -trimpath -ldflags "-s -w" -o "$w/out/etcd" go.etcd.io/etcd/server/v3
  install_outputs "$w/out" etcd
  check_binary etcd || die "built etcd does not run '--version'"
  printf '%s\n' "$v" >"$STAMPS/etcd"
  USED[etcd]="$v"
  log "etcd: done ($("$BIN/etcd" --version 2>&1 | head -n 1))"
}

build_kuberay() {
  local v
  if component_done kuberay ray-operator && [[ -f "$STAMPS/crds" ]] \
     && [[ -f "$CACHE/crds/${REQUIRED_CRDS[0]}" ]]; then
    USED[kuberay]="$(cat "$STAMPS/kuberay")"; log "ray-operator + CRDs: up to date"; return 0
  fi
  local lf="$LOGS/kuberay.log"; : >"$lf"
  v="$(resolve github.com/ray-project/kuberay/ray-operator "$KUBERAY_VERSION" "$KUBERAY_FALLBACK_VERSIONS")" \
    || die "no usable ray-operator version among $KUBERAY_VERSION $KUBERAY_FALLBACK_VERSIONS"
  local w; w="$(fresh_work kuberay)"
  cd "$w"
  if ! component_done kuberay ray-operator || [[ "$(cat "$STAMPS/kuberay")" != "$v" ]]; then
    log "ray-operator: $v; go install (main package is the module root)"
    GOBIN="$w/out" run "$lf" "$GO" install -p "$BUILD_JOBS" -trimpath -ldflags "-s -w" \
      "github.com/ray-project/kuberay/ray-operator@$v"
    install_outputs "$w/out" ray-operator
    check_binary ray-operator || die "built ray-operator does not run '--help'"
    printf '%s\n' "$v" >"$STAMPS/kuberay"
  fi
  # CRDs ship in the module zip. Copy every ray.io_*.yaml (the operator's cache sync needs at
  # least rayclusters, rayjobs and rayservices; 1.6 adds raycronjobs).
  local dir; dir="$(mod_dir "github.com/ray-project/kuberay/ray-operator@$v")"
  [[ -d "$dir/config/crd/bases" ]] || die "no config/crd/bases in ray-operator@$v module ($dir)"
  local c f
  for c in "${REQUIRED_CRDS[@]}"; do
    [[ -f "$dir/config/crd/bases/$c" ]] || die "ray-operator@$v module lacks config/crd/bases/$c"
  done
  rm -f "$CACHE/crds/"*.yaml
  for f in "$dir"/config/crd/bases/ray.io_*.yaml; do
    install -m 0644 "$f" "$CACHE/crds/"
  done
  printf '%s\n' "$v" >"$STAMPS/crds"
  USED[kuberay]="$v"
  log "ray-operator: done; CRDs: $(cd "$CACHE/crds" && echo *.yaml)"
}

build_kwok() {
  if component_done kwok kwok && [[ -f "$STAMPS/kwok-stages" ]] && [[ -s "$CACHE/kwok-stages.yaml" ]]; then
    USED[kwok]="$(cat "$STAMPS/kwok")"; log "kwok + stages: up to date"; return 0
  fi
  local lf="$LOGS/kwok.log"; : >"$lf"
  local v; v="$(resolve sigs.k8s.io/kwok "$KWOK_VERSION" "$KWOK_FALLBACK_VERSIONS")" \
    || die "no usable sigs.k8s.io/kwok version among $KWOK_VERSION $KWOK_FALLBACK_VERSIONS"
  local w; w="$(fresh_work kwok)"
  cd "$w"
  if ! component_done kwok kwok || [[ "$(cat "$STAMPS/kwok")" != "$v" ]]; then
    log "kwok: $v; go install"
    GOBIN="$w/out" run "$lf" "$GO" install -p "$BUILD_JOBS" -trimpath -ldflags "-s -w" \
      "sigs.k8s.io/kwok/cmd/kwok@$v"
    install_outputs "$w/out" kwok
    check_binary kwok || die "built kwok does not run '--version'"
    printf '%s\n' "$v" >"$STAMPS/kwok"
  fi
  # The standalone kwok binary has no built-in stages ("no stages found" without --config).
  local dir; dir="$(mod_dir "sigs.k8s.io/kwok@$v")"
  local f first=1 tmp="$CACHE/kwok-stages.yaml.tmp.$$"
  : >"$tmp"
  for f in "${KWOK_STAGE_FILES[@]}"; do
    [[ -f "$dir/$f" ]] || die "kwok@$v module lacks $f"
    [[ $first -eq 1 ]] || printf -- '---\n' >>"$tmp"
    first=0
    printf '# from sigs.k8s.io/kwok@%s %s\n' "$v" "$f" >>"$tmp"
    sed -e '/^---[[:space:]]*$/d' "$dir/$f" >>"$tmp"
    [[ -z "$(tail -c 1 "$tmp")" ]] || printf '\n' >>"$tmp"
  done
  mv -f "$tmp" "$CACHE/kwok-stages.yaml"
  printf '%s\n' "$v" >"$STAMPS/kwok-stages"
  USED[kwok]="$v"
  log "kwok: done ($("$BIN/kwok" --version 2>&1 | head -n 1))"
}

# ---- main ------------------------------------------------------------------------------------

ALL_BINARIES=(kube-apiserver kube-scheduler etcd ray-operator kwok)

warm_ok() {
  [[ -f "$CACHE/READY" ]] || return 1
  local b
  for b in "${ALL_BINARIES[@]}"; do check_binary "$b" || return 1; done
  [[ -s "$CACHE/kwok-stages.yaml" ]] && [[ -f "$CACHE/crds/${REQUIRED_CRDS[0]}" ]]
}

if warm_ok; then
  log "cache is ready: $CACHE"
  printf '%s\n' "$BIN"
  exit 0
fi
rm -f "$CACHE/READY"

log "building into $CACHE (Go $GO_VERSION, -p $BUILD_JOBS; build logs in $LOGS)"
TOTAL_START=$SECONDS
timed etcd build_etcd
timed kwok build_kwok
timed kuberay build_kuberay
timed kubernetes build_kubernetes

for b in "${ALL_BINARIES[@]}"; do
  check_binary "$b" || die "$BIN/$b does not run"
done

{
  printf '# versions built into this cache dir by scripts/build-control-plane.sh\n'
  printf 'CACHE_KEY=%s\n' "$KEY"
  printf 'GO_VERSION=%s\n' "$GO_VERSION"
  printf 'K8S_VERSION=%s\n' "${USED[kubernetes]}"
  printf 'ETCD_VERSION=%s\n' "${USED[etcd]}"
  printf 'KUBERAY_VERSION=%s\n' "${USED[kuberay]}"
  printf 'KWOK_VERSION=%s\n' "${USED[kwok]}"
  printf 'BIN_DIR=%s\n' "$BIN"
  printf 'CRD_DIR=%s\n' "$CACHE/crds"
  printf 'KWOK_STAGES=%s\n' "$CACHE/kwok-stages.yaml"
} >"$CACHE/versions.env.tmp"
mv -f "$CACHE/versions.env.tmp" "$CACHE/versions.env"
{
  printf 'built %(%Y-%m-%dT%H:%M:%S%z)T in %ss (per component: etcd %ss, kwok %ss, kuberay %ss, kubernetes %ss)\n' \
    -1 "$((SECONDS - TOTAL_START))" "${SECONDS_TAKEN[etcd]}" "${SECONDS_TAKEN[kwok]}" \
    "${SECONDS_TAKEN[kuberay]}" "${SECONDS_TAKEN[kubernetes]}"
  cat "$CACHE/versions.env"
} >"$CACHE/READY.tmp"
mv -f "$CACHE/READY.tmp" "$CACHE/READY"

log "all components ready in $((SECONDS - TOTAL_START))s: $CACHE"
printf '%s\n' "$BIN"
