#!/usr/bin/env bash
# Builds hccl twice (plain, and with AddressSanitizer + UndefinedBehaviorSanitizer) and runs the
# whole test suite in the first, all but the longest (label slow) in the second; the Python
# package and its tests (label python) in the plain one.
# Installs the Debian packages it needs when run as root.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
for pkg in gcc make cmake pkg-config libevent-dev libcmocka-dev procps iproute2 libibverbs-dev librdmacm-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
# The launchers of the mpirun and srun tests (tests/mp/pmix_test.sh, slurm_test.sh).
for pkg in openmpi-bin libpmix-dev slurmctld slurmd slurm-client munge slurm-wlm-basic-plugins; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
# The Python package and the torch backend (python/, tests/python), for Debian's /usr/bin/python3.
for pkg in python3-dev python3-numpy python3-pytest python3-torch libtorch-dev pybind11-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
# clang builds the fuzz targets; without it (and not root) they are skipped, saying so.
if ! command -v clang >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
  need+=(clang)
fi
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "missing Debian packages: ${need[*]} (run as root, or install them)" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi

jobs=$(nproc)
# Another python3 may come first on PATH; the package is built for Debian's, which sees torch.
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython3_EXECUTABLE=/usr/bin/python3 >/dev/null
cmake --build build -j"$jobs"
# Unit tests two at a time; the multi-process ones alone (RUN_SERIAL).
ctest --test-dir build --no-tests=error --output-on-failure -j"$jobs"

# Release (-O3) warns about more than -O2 does, and is what bench/compare.sh builds: compile it.
# The Python extensions are built and tested once, in the main build.
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release -DHCCL_PYTHON=OFF -DHCCL_TORCH=OFF >/dev/null
cmake --build build-release -j"$jobs" --target hccl hccl_static hccl-perf hccl-run hccl-topo

cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DHCCL_ENABLE_SANITIZERS=ON -DHCCL_PYTHON=OFF \
  -DHCCL_TORCH=OFF >/dev/null
cmake --build build-asan -j"$jobs"
# Everything but the longest (label slow, run above): under the sanitizers they would take the
# test command past its time budget, and what they run is the code the others cover.
ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --no-tests=error --output-on-failure -LE slow -j"$jobs"

# The decoders of bytes from other processes under libFuzzer (clang; 12 s per target).
if command -v clang >/dev/null 2>&1; then
  tests/fuzz/run_fuzzers.sh build-fuzz 12
elif [ -n "${CI:-}" ]; then
  echo "clang is not installed: CI must run the fuzz targets" >&2
  exit 1
else
  echo "clang is not installed: the fuzz targets were not run" >&2
fi
