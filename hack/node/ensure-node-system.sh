#!/usr/bin/env bash
# Debian packages the real node and the image builds need: runc and the CNI plugins (the node; its
# containerd is built from the Go module proxy, hack/build-binaries.sh), iptables and conntrack
# (kube-proxy), ipset (kube-router's NetworkPolicy firewall), buildah and debootstrap (make
# images), gcc (the static pause). A no-op when present. Needs root, as the node itself does.
set -euo pipefail
need=()
for pair in runc:runc containernetworking-plugins:/usr/lib/cni/bridge iptables:iptables \
            conntrack:conntrack ipset:ipset buildah:buildah debootstrap:debootstrap gcc:gcc libc6-dev:/usr/lib/x86_64-linux-gnu/libc.a; do
  package=${pair%%:*}; probe=${pair#*:}
  if [[ $probe == /* ]]; then [ -e "$probe" ] || need+=("$package"); else command -v "$probe" >/dev/null || need+=("$package"); fi
done
if [ ${#need[@]} -gt 0 ]; then
  # One apt at a time: `make test` builds its prerequisites in parallel (make -j), and dpkg takes one.
  exec 9>/tmp/disttrain-apt.lock && flock 9
  echo "installing ${need[*]} with apt" >&2
  SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
