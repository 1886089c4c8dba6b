#!/usr/bin/env bash
# Builds a Kubernetes version's control plane:
#   hack/build-kube-version.sh v1.36.3 [command ...]
# kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kubelet and kube-proxy (or the
# commands named) at that version, from the module graph whose go.mod requires it: hack/kube-v1.<minor>
# (the default version's, v1.37 now) or hack/kube (v1.36: the graph the API server's clients are built
# in), into .cache/bin/kubernetes-<version>/. Prints the bin folder that runs a local plane on it: for
# the default version .cache/bin itself (hack/build-binaries.sh calls this); for another, a folder
# .cache/bin-<version>/ holding its control plane beside links to everything else of the default build
# (etcd, KWOK, CoreDNS, the gang schedulers, Kueue, Helm, Prometheus: clients of the API server, built
# once on the libraries they are written for). DISTTRAIN_BIN_ROOT=.cache/bin-<version> runs the local
# plane (hack/localcluster.py) on it: `make test-matrix`, and the 1.36 -> 1.37 upgrade test.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:?usage: hack/build-kube-version.sh vMAJOR.MINOR.PATCH [command ...]}
shift
source hack/versions.env
BIN_ROOT=${DISTTRAIN_BUILD_ROOT:-$PWD/.cache/bin}
minor=${version#v1.}; minor=${minor%%.*}
graph=""
for candidate in hack/kube-v1.$minor hack/kube; do
  if grep -q "k8s.io/kubernetes $version\$" "$candidate/go.mod" 2>/dev/null; then graph=$candidate; break; fi
done
[ -n "$graph" ] || { echo "no module graph requires k8s.io/kubernetes $version (hack/kube-v1.$minor, hack/kube)" >&2; exit 2; }
GO=$(hack/ensure-go.sh)
export PATH="$(dirname "$GO"):$PATH" GOFLAGS=${GOFLAGS:--trimpath -gcflags=all=-dwarf=false} CGO_ENABLED=0 \
  GOGC=${GOGC:-400} GOMEMLIMIT=${GOMEMLIMIT:-2GiB}  # no DWARF, a rarer collector: build-binaries.sh says why

dir=$BIN_ROOT/kubernetes-$version
# One build of a version at a time: `make test` builds the previous minor's beside its lanes
# (hack/testlanes.py), and the upgrade test, run meanwhile, waits here for it and then finds it built.
mkdir -p "$BIN_ROOT"
exec 9>"$BIN_ROOT/.kubernetes-$version.lock"
flock 9
commands=("$@")
[ ${#commands[@]} -gt 0 ] || commands=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)
missing=()
for cmd in "${commands[@]}"; do [ -x "$dir/$cmd" ] || missing+=("k8s.io/kubernetes/cmd/$cmd"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "building Kubernetes $version from $graph: ${missing[*]##*/} ..." >&2
  pkg=k8s.io/component-base/version
  ldflags="-s -w -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor \
   -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z -X $pkg.gitCommit=module-proxy-$version"
  tmp=$(mktemp -d "$BIN_ROOT/.build-XXXXXX")
  trap 'rm -rf "$tmp"' EXIT  # a build stopped half-way (make test ends the lanes' background build) leaves none
  started=$SECONDS
  (cd "$graph" && go build -ldflags "$ldflags" -o "$tmp/" "${missing[@]}")
  echo "built Kubernetes $version's ${missing[*]##*/} in $((SECONDS - started)) s" >&2
  mkdir -p "$dir"; mv "$tmp"/* "$dir/"; rmdir "$tmp"
fi

if [ "$version" = "$KUBERNETES_VERSION" ]; then
  out=$BIN_ROOT
else  # the version's bin folder: its own control plane, the default build for everything else
  out=$(dirname "$BIN_ROOT")/bin-$version
  mkdir -p "$out"
  for entry in "$BIN_ROOT"/*; do
    name=$(basename "$entry")
    case $name in kubernetes-*|.build-*) continue ;; esac
    ln -sfn "$entry" "$out/$name"
  done
fi
for cmd in "${commands[@]}"; do ln -sfn "$dir/$cmd" "$out/$cmd"; done
echo "$out"
