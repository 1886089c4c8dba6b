#!/usr/bin/env bash
# Builds another Kubernetes minor's control plane for `make test-matrix`:
#   hack/build-kube-version.sh v1.37.2
# kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kubelet and kube-proxy at that
# version from hack/kube-v1.<minor>'s module graph, into .cache/bin/kubernetes-<version>/, and a bin
# folder .cache/bin-<version>/ holding them beside links to everything else of the default build
# (etcd, KWOK, CoreDNS, the gang schedulers, Kueue, Helm, Prometheus: clients of the API server,
# built once on the libraries they are written for). DISTTRAIN_BIN_ROOT=.cache/bin-<version> runs the
# local plane (hack/localcluster.py) on it. The default version's folder is .cache/bin itself.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:?usage: hack/build-kube-version.sh vMAJOR.MINOR.PATCH}
source hack/versions.env
BIN_ROOT=$PWD/.cache/bin
if [ "$version" = "$KUBERNETES_VERSION" ]; then echo "$BIN_ROOT"; exit 0; fi
minor=${version#v1.}; minor=${minor%%.*}
graph=hack/kube-v1.$minor
[ -f "$graph/go.mod" ] || { echo "no module graph for $version: $graph/go.mod" >&2; exit 2; }
grep -q "k8s.io/kubernetes $version\$" "$graph/go.mod" || {
  echo "$graph/go.mod does not require k8s.io/kubernetes $version" >&2; exit 2; }
GO=$(hack/ensure-go.sh)
export PATH="$(dirname "$GO"):$PATH" GOFLAGS=${GOFLAGS:--trimpath} CGO_ENABLED=0

dir=$BIN_ROOT/kubernetes-$version
commands=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)
missing=()
for cmd in "${commands[@]}"; do [ -x "$dir/$cmd" ] || missing+=("k8s.io/kubernetes/cmd/$cmd"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "building Kubernetes $version: ${missing[*]##*/} ..." >&2
  pkg=k8s.io/component-base/version
  ldflags="-s -w -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor \
   -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z -X $pkg.gitCommit=module-proxy-$version"
  mkdir -p "$BIN_ROOT"
  tmp=$(mktemp -d "$BIN_ROOT/.build-XXXXXX")
  (cd "$graph" && go build -ldflags "$ldflags" -o "$tmp/" "${missing[@]}")
  mkdir -p "$dir"; mv "$tmp"/* "$dir/"; rmdir "$tmp"
fi

# The version's bin folder: its own control plane, the default build for everything else.
out=$PWD/.cache/bin-$version
mkdir -p "$out"
for entry in "$BIN_ROOT"/*; do
  name=$(basename "$entry")
  case $name in kubernetes-*|.build-*) continue ;; esac
  ln -sfn "$entry" "$out/$name"
done
for cmd in "${commands[@]}"; do ln -sfn "$dir/$cmd" "$out/$cmd"; done
echo "$out"
