#!/usr/bin/env bash
# Debian packages the real-MPI tests need (Open MPI 4.1, sshd/ssh, iproute2 for `ip netns`, and
# the compilers Horovod and mpi4py build with); a no-op when all are installed.
set -euo pipefail
packages=(openmpi-bin libopenmpi-dev openssh-server openssh-client cmake g++ make iproute2 util-linux)
need=()
for pkg in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  # One apt at a time: `make test` builds its prerequisites in parallel (make -j), and dpkg takes one.
  exec 9>/tmp/disttrain-apt.lock && flock 9
  echo "installing ${need[*]} with apt" >&2
  SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
  # A policy-rc.d answering 101 keeps the openssh-server package from starting a system sshd:
  # the tests run their own, one per network namespace, on private addresses.
  policy=/usr/sbin/policy-rc.d
  added_policy=
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
    $SUDO chmod 755 "$policy"
    added_policy=1
  fi
  trap '[ -z "$added_policy" ] || $SUDO rm -f "$policy"' EXIT
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
