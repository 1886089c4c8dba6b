#!/usr/bin/env bash
# The virtualenv the real-MPI tests run their ranks with: TensorFlow (CPU) 2.15, Horovod 0.28.1
# built from source against Debian's Open MPI (TensorFlow with MPI, and Gloo for elastic
# horovodrun), and mpi4py built with Debian's mpicc. Cached: rebuilt only when the versions below
# (or the Python) change. The Horovod wheel lands in .cache/wheels/horovod, where the horovod
# image's build finds it (hack/images.py): one build for both.
#
#   hack/mpi-e2e/build-hvd-venv.sh [VENV_DIR]    (default .cache/hvd-venv)
#
# Needs hack/mpi-e2e/setup-system.sh first (cmake, g++, libopenmpi-dev). Builds with one job
# (MAKEFLAGS=-j<cores>) unless MAKEFLAGS is set; prints how long the Horovod build took.
set -euo pipefail
cd "$(dirname "$0")/../.."

VENV=${1:-.cache/hvd-venv}
PYTHON=${HVD_PYTHON:-python3.11}
TF_PACKAGE=tensorflow-cpu==2.15.1
HOROVOD_PACKAGE=horovod==0.28.1
MPI4PY_PACKAGE=mpi4py==4.1.2
MPI4PY_CFLAGS=-g0  # see its install below
BUILD_TOOLS=("setuptools>=69,<75" wheel)
# Without debug information (the toolchain file says how, and what it saves): CMake 3.21+ reads
# CMAKE_TOOLCHAIN_FILE from the environment, and Horovod's setup.py passes no flags of ours on.
HOROVOD_FLAGS=(HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_PYTORCH=1
               HOROVOD_WITHOUT_MXNET=1 CMAKE_TOOLCHAIN_FILE=$PWD/hack/mpi-e2e/horovod-release-flags.cmake)
WHEELS=${HVD_WHEELS:-.cache/wheels/horovod}

py_version=$("$PYTHON" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
case "$py_version" in
  3.11.*) ;;
  *) echo "build-hvd-venv: $PYTHON is Python $py_version; TensorFlow 2.15 + Horovod 0.28.1 need 3.11" >&2; exit 1 ;;
esac
key=$(printf '%s\n' "$py_version" "mpi4py-CFLAGS=$MPI4PY_CFLAGS" "$TF_PACKAGE" "$HOROVOD_PACKAGE" "$MPI4PY_PACKAGE" "${BUILD_TOOLS[@]}" \
        "${HOROVOD_FLAGS[@]}" "$(cat hack/mpi-e2e/horovod-release-flags.cmake)" "$(mpicc --showme:version 2>&1)" | sha1sum | cut -c1-12)
stamp="$VENV/.stamp-$key"
if [ -e "$stamp" ] && ls "$WHEELS"/horovod-0.28.1-*.whl >/dev/null 2>&1; then
  echo "build-hvd-venv: $VENV is up to date ($(cat "$stamp"))"
  exit 0
fi

export MAKEFLAGS=${MAKEFLAGS:--j$(nproc)}
started=$(date +%s)
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip
"${pip[@]}" install "${BUILD_TOOLS[@]}" "$TF_PACKAGE"

# mpi4py from source so it links Debian's libmpi (not a wheel with another MPI's ABI). Its one C
# file (Cython's) without debug information: our ranks make one Allreduce and an allgather
# (tests/mpi/allreduce.py), and Python's own flags (-O3 -g) made it 150 CPU seconds of a new machine's
# build, the most of any one file; 21 s with CFLAGS=-g0 here (the setuptools of mpi4py's isolated
# build then passed mpicc ours alone, so unoptimized; one that appends them to Python's would give
# -O3 -g0, which is no slower to run; -O2 -g0 took 94 s).
# Not from pip's wheel cache, which keys a built wheel by the sdist alone: a wheel built before
# with other flags would come back (as Horovod's below).
env MPICC=mpicc CFLAGS="$MPI4PY_CFLAGS" "${pip[@]}" install --no-cache-dir --no-binary mpi4py "$MPI4PY_PACKAGE"

# Horovod's setup.py imports the installed TensorFlow for its compile flags: no build isolation.
# Not from pip's cache: it keys a built wheel by the sdist alone, not by the flags it was built
# with, and would hand back a wheel built without Gloo (as this script built it before).
hvd_started=$(date +%s)
mkdir -p "$WHEELS"
rm -f "$WHEELS"/horovod-*.whl
env "${HOROVOD_FLAGS[@]}" "${pip[@]}" wheel --no-cache-dir --no-deps --no-build-isolation -w "$WHEELS" \
  "$HOROVOD_PACKAGE"
"${pip[@]}" install "$WHEELS"/horovod-0.28.1-*.whl
hvd_seconds=$(( $(date +%s) - hvd_started ))

# Fail here, not in a test, if Horovod came out without TensorFlow or MPI.
TF_CPP_MIN_LOG_LEVEL=2 "$VENV/bin/python" - <<'EOF'
import horovod.tensorflow as hvd
import mpi4py
import tensorflow as tf

assert hvd.mpi_built(), "Horovod was built without MPI"
assert hvd.gloo_built(), "Horovod was built without Gloo (elastic horovodrun needs it)"
print(f"build-hvd-venv: TensorFlow {tf.__version__}, Horovod (MPI, Gloo) ok, mpi4py {mpi4py.__version__}")
EOF

total_seconds=$(( $(date +%s) - started ))
summary="horovod build ${hvd_seconds}s (MAKEFLAGS=$MAKEFLAGS), whole venv ${total_seconds}s"
echo "build-hvd-venv: $summary"
echo "$summary" > "$stamp"
