#!/usr/bin/env bash
# Prints the path of a Go toolchain new enough for hack/kube (go 1.26+) and containerd v2.4.2's
# module (go 1.26.6, which `go install` of it demands). Uses the installed one when it is new
# enough, else fetches the official toolchain from the Go module proxy (golang.org/toolchain, the
# same zip `GOTOOLCHAIN` downloads) into .cache/go.
set -euo pipefail
cd "$(dirname "$0")/.."
WANT=1.26.8
if command -v go >/dev/null 2>&1; then
  have=$(go env GOVERSION 2>/dev/null | sed 's/^go//')
  if [ "$(printf '%s\n%s\n' "1.26.6" "$have" | sort -V | head -1)" = "1.26.6" ]; then
    command -v go; exit 0
  fi
fi
dest=.cache/go/go$WANT
if [ ! -x "$dest/bin/go" ]; then
  arch=$(uname -m); case $arch in x86_64) arch=amd64;; aarch64) arch=arm64;; esac
  url="https://proxy.golang.org/golang.org/toolchain/@v/v0.0.1-go$WANT.linux-$arch.zip"
  echo "fetching Go $WANT from $url" >&2
  tmp=$(mktemp -d); curl -fsSL "$url" -o "$tmp/go.zip"
  command -v unzip >/dev/null || apt-get install -y -qq unzip >&2
  unzip -q "$tmp/go.zip" -d "$tmp/x"
  mkdir -p "$(dirname "$dest")"; rm -rf "$dest"
  mv "$tmp/x/golang.org/toolchain@v0.0.1-go$WANT.linux-$arch" "$dest"; rm -rf "$tmp"
fi
echo "$PWD/$dest/bin/go"
