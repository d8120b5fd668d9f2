#!/usr/bin/env bash
# Runs one libFuzzer target for SECONDS from a copy of its seed corpus (the corpus in git is
# not changed). Fails on the first crash, leak, timeout or invariant broken, printing the end
# of the log with the reproducer; prints the executions otherwise.
# Usage: run_one.sh FUZZER CORPUS_DIR SECONDS
set -euo pipefail
fuzzer=$1 corpus=$2 secs=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/corpus"
log="$work/log"
if ! (cd "$work" && "$fuzzer" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 "$work/corpus" "$corpus") >"$log" 2>&1; then
  tail -n 60 "$log" >&2
  echo "$(basename "$fuzzer"): FAILED (the reproducer is in the log above)" >&2
  exit 1
fi
echo "$(basename "$fuzzer"): $(grep -Eo 'Done [0-9]+ runs in [0-9]+ second' "$log" | tail -1)"
