#!/usr/bin/env bash
# Builds the local cluster's binaries from the Go module proxy into .cache/bin/<version>/.
# Every binary is keyed by its version: a second run finds them and returns at once.
set -euo pipefail
cd "$(dirname "$0")/.."
source hack/versions.env
GO=$(hack/ensure-go.sh)
export PATH="$(dirname "$GO"):$PATH"

BIN_ROOT=${DISTTRAIN_BIN_ROOT:-$PWD/.cache/bin}
# No DWARF: -ldflags -w drops it from the binaries anyway, and not making it saves ~12% of each
# compile (etcd: 45 s -> 39 s from an empty GOCACHE, twice each).
export GOFLAGS=${GOFLAGS:--trimpath -gcflags=all=-dwarf=false}
# The compiler's own garbage collector less often: 15% less compile time (etcd from an empty GOCACHE:
# 45.4 s -> 38.0 s, twice each way; its largest compile then held 359 MB). GOMEMLIMIT makes it collect
# as often as before where a compile nears 2 GiB: a machine with little memory pays in time, not swap.
export GOGC=${GOGC:-400} GOMEMLIMIT=${GOMEMLIMIT:-2GiB}
export CGO_ENABLED=0

need() { [ -x "$1" ] || { echo "building $(basename "$1") ..." >&2; return 0; }; return 1; }
# What each build cost, in CI's log: a new machine's `make test` is mostly these (issue 45).
timed() { # what command...
  local started=$SECONDS
  "${@:2}"
  echo "built $1 in $((SECONDS - started)) s" >&2
}
# go install puts a module's command in GOBIN; one folder per version keeps them apart.
install_tool() { # name module version [go build flags]
  local dir=$BIN_ROOT/$1-$3
  mkdir -p "$BIN_ROOT"
  # One build of a tool at a time (a test that needs Prometheus waits here for `make test`'s build).
  exec 8>"$BIN_ROOT/.$1-$3.lock"
  flock 8
  if need "$dir/$1"; then
    GOBIN=$dir.tmp timed "$1" go install -ldflags "-s -w" "${@:4}" "$2@$3"
    rm -rf "$dir"; mv "$dir.tmp" "$dir"
  fi
  exec 8>&-
}

# `make push` needs crane alone: `hack/build-binaries.sh crane`.
if [ "${1:-}" = crane ]; then
  install_tool crane github.com/google/go-containerregistry/cmd/crane "$GO_CONTAINERREGISTRY_VERSION"
  ln -sfn "$BIN_ROOT/crane-$GO_CONTAINERREGISTRY_VERSION/crane" "$BIN_ROOT/crane"
  exit 0
fi
# Prometheus, for the one test that runs the chart's dashboard queries
# (tests/integration/test_prometheus_dashboard.py), which runs this: `make test` builds it beside its
# lanes (hack/testlanes.py), not before them. With static targets only: remove_all_sd leaves out every
# cloud's service discovery (most of its module graph); its HTTP API, which the test queries, is all there.
if [ "${1:-}" = prometheus ]; then
  install_tool prometheus github.com/prometheus/prometheus/cmd/prometheus "$PROMETHEUS_VERSION" -tags remove_all_sd
  ln -sfn "$BIN_ROOT/prometheus-$PROMETHEUS_VERSION/prometheus" "$BIN_ROOT/prometheus"
  echo "$BIN_ROOT/prometheus"
  exit 0
fi

# Two module graphs, one `go build` each. The control plane, kubectl and the real node's kubelet
# and kube-proxy at KUBERNETES_VERSION, from its own graph (hack/kube-v1.<minor>, by
# hack/build-kube-version.sh): Kubernetes' modules as released, nothing else in the graph to move
# them. And hack/kube, on PREVIOUS_KUBERNETES_VERSION's libraries (1.36): the API server's clients
# that don't compile against 1.37's (versions.env says which and why): CoreDNS with the plugins the
# cluster's DNS uses (hack/kube/coredns), scheduler-plugins' Coscheduling scheduler and its PodGroup
# controller, Kueue, and kube-router (the real node's NetworkPolicy firewall;
# hack/kube/tools_kuberouter.go says why it is here). They talk to a 1.37 API server as any client
# one minor behind does. hack/kube builds 1.36's control plane too, for `make test-matrix` and the
# upgrade test (hack/build-kube-version.sh v1.36.3), sharing what those commands compile alike.
clients_dir=$BIN_ROOT/clients-k8s-$PREVIOUS_KUBERNETES_VERSION-coredns-$COREDNS_VERSION-sp-$SCHEDULER_PLUGINS_VERSION-kueue-$KUEUE_VERSION-kr-$KUBE_ROUTER_VERSION
clients=(coredns coscheduler coscheduling-controller kueue kube-router)
missing=()
for cmd in "${clients[@]}"; do need "$clients_dir/$cmd" && missing+=("$cmd"); done
if [ ${#missing[@]} -gt 0 ]; then
  minor=${PREVIOUS_KUBERNETES_VERSION#v1.}; minor=${minor%%.*}
  pkg=k8s.io/component-base/version
  ldflags="-s -w -X $pkg.gitVersion=$PREVIOUS_KUBERNETES_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor \
   -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z \
   -X $pkg.gitCommit=module-proxy-$PREVIOUS_KUBERNETES_VERSION -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION \
   -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$KUBE_ROUTER_VERSION"
  packages=()
  for cmd in "${missing[@]}"; do
    case $cmd in
      coredns|cosched*) packages+=("./$cmd") ;;
      kueue) packages+=(sigs.k8s.io/kueue/cmd/kueue) ;;
      kube-router) packages+=(github.com/cloudnativelabs/kube-router/v2/cmd/kube-router) ;;
    esac
  done
  mkdir -p "$BIN_ROOT"  # a new machine has no .cache/bin yet
  tmp=$(mktemp -d "$BIN_ROOT/.build-XXXXXX")
  (cd hack/kube && timed "${missing[*]}" go build -ldflags "$ldflags" -o "$tmp/" "${packages[@]}")
  mkdir -p "$clients_dir"
  mv "$tmp"/* "$clients_dir/"; rmdir "$tmp"
fi
DISTTRAIN_BUILD_ROOT=$BIN_ROOT hack/build-kube-version.sh "$KUBERNETES_VERSION" >/dev/null

# Volcano's scheduler: its own graph (hack/volcano), on the Kubernetes libraries it is written for.
vc_dir=$BIN_ROOT/volcano-$VOLCANO_VERSION
if need "$vc_dir/vc-scheduler"; then
  mkdir -p "$vc_dir"
  (cd hack/volcano && timed vc-scheduler go build -ldflags "-s -w" -o "$vc_dir/vc-scheduler.tmp" volcano.sh/volcano/cmd/scheduler)
  mv "$vc_dir/vc-scheduler.tmp" "$vc_dir/vc-scheduler"
fi

# The real node's DRA kubelet plugin, in the same graph (Kubernetes 1.34's libraries, as written).
dra_dir=$BIN_ROOT/dra-example-driver-$DRA_EXAMPLE_DRIVER_VERSION
if need "$dra_dir/dra-example-kubeletplugin"; then
  mkdir -p "$dra_dir"
  (cd hack/volcano && timed dra-example-kubeletplugin go build -ldflags "-s -w" -o "$dra_dir/dra-example-kubeletplugin.tmp" \
     sigs.k8s.io/dra-example-driver/cmd/dra-example-kubeletplugin)
  mv "$dra_dir/dra-example-kubeletplugin.tmp" "$dra_dir/dra-example-kubeletplugin"
fi

# The gang schedulers' CRDs, as their modules publish them.
crds=$BIN_ROOT/crds
mkdir -p "$crds/scheduler-plugins" "$crds/volcano" "$crds/kueue"
sp=$(cd hack/kube && go list -m -f '{{.Dir}}' sigs.k8s.io/scheduler-plugins)
cp "$sp"/config/crd/bases/scheduling.x-k8s.io_{podgroups,elasticquotas}.yaml "$crds/scheduler-plugins/"
vc=$(cd hack/volcano && go list -m -f '{{.Dir}}' volcano.sh/volcano)
cp "$vc"/installer/helm/chart/volcano/crd/bases/*.yaml "$crds/volcano/"
kq=$(cd hack/kube && go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)
cp "$kq"/config/components/crd/bases/*.yaml "$crds/kueue/"
# Kueue's admission webhooks, as its module publishes them (hack/kueue.py points them at the process).
mkdir -p "$BIN_ROOT/kueue-webhooks"
cp "$kq"/config/components/webhook/manifests.yaml "$BIN_ROOT/kueue-webhooks/"
chmod -R u+w "$BIN_ROOT/kueue-webhooks"
chmod -R u+w "$crds"

etcd_bin=$BIN_ROOT/etcd-$ETCD_VERSION/etcd
if need "$etcd_bin"; then
  mkdir -p "$(dirname "$etcd_bin")"
  (cd hack/etcd && timed etcd go build -ldflags "-s -w" -o "$etcd_bin.tmp" .)
  mv "$etcd_bin.tmp" "$etcd_bin"
fi

# KWOK from hack/kwok's graph, with easycel's type caches guarded (hack/kwok/tools.go says why):
# the patch is applied to the module's own source, copied into .cache/src, which go.mod replaces.
kwok_dir=$BIN_ROOT/kwok-$KWOK_VERSION-$(sha1sum hack/kwok/easycel-guard.patch | cut -c1-8)
if need "$kwok_dir/kwok"; then
  easycel=$(cd "$(mktemp -d)" && go mod download -json github.com/wzshiming/easycel@v0.6.0 |
            sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  guarded=$PWD/.cache/src/easycel-v0.6.0-guarded
  rm -rf "$guarded"; mkdir -p "$(dirname "$guarded")"; cp -r "$easycel" "$guarded"; chmod -R u+w "$guarded"
  patch_file=$PWD/hack/kwok/easycel-guard.patch
  (cd "$guarded" && git apply -p1 "$patch_file")
  mkdir -p "$kwok_dir"
  (cd hack/kwok && timed kwok go build -ldflags "-s -w" -o "$kwok_dir/kwok.tmp" sigs.k8s.io/kwok/cmd/kwok)
  mv "$kwok_dir/kwok.tmp" "$kwok_dir/kwok"
fi
# The real node's containerd, its runc shim and ctr, each from containerd's own module graph (`go
# install module@version` builds with the go.mod it was released with: the 1.37 CRI libraries and the
# gRPC it was tested on; in a graph of ours it would move the control plane's modules or be moved by
# them). Without cgo: the btrfs, ZFS and devmapper snapshotters are left out (the node uses
# overlayfs). The later -ldflags replaces install_tool's, adding containerd's version.
ctd_commands=(containerd containerd-shim-runc-v2 ctr)
for cmd in "${ctd_commands[@]}"; do
  install_tool "$cmd" "github.com/containerd/containerd/v2/cmd/$cmd" "$CONTAINERD_VERSION" \
    -tags "no_btrfs no_zfs no_devmapper" -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION"
done
install_tool helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION"
# The plane's image registry and the tool that pushes to it (hack/registry.py), each from its own graph.
install_tool registry github.com/distribution/distribution/v3/cmd/registry "$DISTRIBUTION_VERSION"
install_tool crane github.com/google/go-containerregistry/cmd/crane "$GO_CONTAINERREGISTRY_VERSION"

for cmd in "${clients[@]}"; do ln -sfn "$clients_dir/$cmd" "$BIN_ROOT/$cmd"; done
ln -sfn "$etcd_bin" "$BIN_ROOT/etcd"
ln -sfn "$vc_dir/vc-scheduler" "$BIN_ROOT/vc-scheduler"
ln -sfn "$dra_dir/dra-example-kubeletplugin" "$BIN_ROOT/dra-example-kubeletplugin"
for cmd in "${ctd_commands[@]}"; do ln -sfn "$BIN_ROOT/$cmd-$CONTAINERD_VERSION/$cmd" "$BIN_ROOT/$cmd"; done
ln -sfn "$kwok_dir/kwok" "$BIN_ROOT/kwok"
ln -sfn "$BIN_ROOT/helm-$HELM_VERSION/helm" "$BIN_ROOT/helm"
ln -sfn "$BIN_ROOT/registry-$DISTRIBUTION_VERSION/registry" "$BIN_ROOT/registry"
ln -sfn "$BIN_ROOT/crane-$GO_CONTAINERREGISTRY_VERSION/crane" "$BIN_ROOT/crane"
echo "local cluster binaries ready in $BIN_ROOT" >&2
