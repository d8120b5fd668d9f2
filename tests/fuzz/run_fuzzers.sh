#!/usr/bin/env bash
# Builds the libFuzzer targets with clang in BUILD_DIR (default build-fuzz) and runs each for
# SECONDS (default 15) through ctest (label fuzz; tests/fuzz/run_one.sh runs one target).
# Usage: tests/fuzz/run_fuzzers.sh [BUILD_DIR] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-build-fuzz}
secs=${2:-15}

CC=clang cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Debug -DHCCL_BUILD_FUZZERS=ON -DHCCL_BUILD_TESTS=OFF \
  -DHCCL_BUILD_EXAMPLES=OFF -DHCCL_BUILD_TOOLS=OFF -DHCCL_FUZZ_SECONDS="$secs" >/dev/null
cmake --build "$dir" --target hccl_fuzzers -j"$(nproc)"
ctest --test-dir "$dir" -L fuzz --no-tests=error --output-on-failure
