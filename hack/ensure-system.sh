#!/usr/bin/env bash
# Debian packages the tests and the demo need on a new machine; a no-op when present.
set -euo pipefail
need=()
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
for tool in curl git make unzip; do command -v $tool >/dev/null || need+=($tool); done
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]} with apt" >&2
  SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
