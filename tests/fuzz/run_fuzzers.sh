#!/usr/bin/env bash
# Builds the libFuzzer targets with clang in BUILD_DIR (default build-fuzz) and runs each for
# SECONDS (default 15) from the checked-in seed corpus (copied: the corpus in git is not
# changed). Fails on the first crash, leak, timeout or invariant broken; prints the executions.
# Usage: tests/fuzz/run_fuzzers.sh [BUILD_DIR] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-build-fuzz}
secs=${2:-15}

CC=clang cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Debug -DHCCL_BUILD_FUZZERS=ON -DHCCL_BUILD_TESTS=OFF \
  -DHCCL_BUILD_EXAMPLES=OFF -DHCCL_BUILD_TOOLS=OFF >/dev/null
cmake --build "$dir" --target hccl_fuzzers -j"$(nproc)"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for src in tests/fuzz/corpus/*/; do
  t=$(basename "$src")
  mkdir -p "$work/$t"
  log="$work/$t.log"
  if ! (cd "$work" && "$OLDPWD/$dir/tests/fuzz/fuzz_$t" -max_total_time="$secs" -timeout=10 \
        -rss_limit_mb=2048 -print_final_stats=1 "$work/$t" "$OLDPWD/$src") >"$log" 2>&1; then
    tail -n 60 "$log" >&2
    echo "fuzz_$t: FAILED (the reproducer is in the log above)" >&2
    exit 1
  fi
  echo "fuzz_$t: $(grep -Eo 'Done [0-9]+ runs in [0-9]+ second' "$log" | tail -1)"
done
