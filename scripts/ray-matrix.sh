#!/usr/bin/env bash
# The GCS client's core tests (state + parse, report + `ray status`, drain, GCS restart) against
# Ray heads of other versions than the one in .venv: each version's Ray runs from its own venv,
# cached OUTSIDE the repository (${KUBERAY_SCALER_CACHE:-$HOME/.cache/kuberay-scaler}/ray-venvs/),
# while the tests and our client keep .venv's Ray 2.60 stubs. The newest (.venv's) runs too.
#   RAY_MATRIX_VERSIONS="2.49.2" scripts/ray-matrix.sh
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VERSIONS="${RAY_MATRIX_VERSIONS:-2.49.2}"
CACHE="${KUBERAY_SCALER_CACHE:-$HOME/.cache/kuberay-scaler}/ray-venvs"
PYTEST="$REPO_ROOT/.venv/bin/pytest"
TESTS=(tests/ray/test_demand_and_report.py tests/ray/test_tpu_hosts_and_drain.py
       tests/ray/test_gcs_restart.py)
log() { printf '[ray-matrix %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

cd "$REPO_ROOT"
newest="$(.venv/bin/python -c 'import ray; print(ray.__version__)')"
log "Ray $newest (.venv): ${TESTS[*]}"
started=$SECONDS
"$PYTEST" -q "${TESTS[@]}"   # exit 5 (nothing collected) fails like any other non-zero
log "Ray $newest: passed in $((SECONDS - started)) s"
for version in $VERSIONS; do
  venv="$CACHE/ray-$version"
  if [[ ! -f "$venv/.ready" ]]; then
    log "Ray $version: creating $venv (cold, ~1 min)"
    rm -rf "$venv"
    python3 -m venv "$venv"
    # [client]: `ray start --head` starts the Ray Client server, which needs grpcio.
    "$venv/bin/pip" install --quiet --disable-pip-version-check "ray[client]==$version"
    touch "$venv/.ready"
  fi
  started=$SECONDS
  log "Ray $version ($venv): ${TESTS[*]}"
  KUBERAY_STANDINS_RAY_VENV="$venv" "$PYTEST" -q "${TESTS[@]}"
  log "Ray $version: passed in $((SECONDS - started)) s"
done
