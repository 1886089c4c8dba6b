#!/usr/bin/env bash
# Debian packages the tests and the demo need on a new machine; a no-op when present.
set -euo pipefail
need=()
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
for tool in curl git make unzip; do command -v $tool >/dev/null || need+=($tool); done
if [ ${#need[@]} -gt 0 ]; then
  # One apt at a time: `make test` builds its prerequisites in parallel (make -j), and dpkg takes one.
  exec 9>/tmp/disttrain-apt.lock && flock 9
  echo "installing ${need[*]} with apt" >&2
  SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
