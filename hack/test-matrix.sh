#!/usr/bin/env bash
# `make test-matrix`: the integration suite on a local plane of each supported Kubernetes minor
# (KUBE_VERSIONS, newest last), KWOK nodes only. The default version's plane is the one `make test`
# builds; each other version's control plane is built by hack/build-kube-version.sh. Prints the
# pass counts per version at the end, and fails if any version had a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
source hack/versions.env
versions=${KUBE_VERSIONS:-$SUPPORTED_KUBERNETES_VERSIONS}
results=.cache/test-matrix
mkdir -p "$results"
status=0
for version in $versions; do
  bin=$(hack/build-kube-version.sh "$version") || { echo "$version: build failed" >"$results/$version.txt"; status=1; continue; }
  echo "=== Kubernetes $version ($bin) ===" >&2
  DISTTRAIN_BIN_ROOT=$bin DISTTRAIN_REAL_NODE=0 .cache/venv/bin/python -m pytest tests/integration -p no:cacheprovider \
    ${PYTEST_ARGS:-} 2>&1 | tee "$results/$version.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  tail -1 "$results/$version.log" >"$results/$version.txt"
done
echo "--- test-matrix: tests/integration per Kubernetes version ---"
for version in $versions; do printf '%s: %s\n' "$version" "$(cat "$results/$version.txt" 2>/dev/null)"; done
exit $status
